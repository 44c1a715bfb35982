"""The layers and their contract, checked on the source (AST scans, nothing imported but the contract's names):

- one import spelling: ``tvm_nimble.relay_passes`` / ``tvm_nimble.codegen``, never the top-level folder names;
- the passes and codegen never import the runtime or the compiler, the runtime never imports the compiler side;
- ``tvm_nimble.contract`` imports only the standard library and ``tvm_nimble.errors``;
- every vendor function name is spelled once, in ``tvm_nimble/contract/vendor_abi.py``, and equals what the
  CUDA sources of the extension register.

Each check is a function from one parsed file to its violations; ``test_each_check_can_fail`` runs them on
planted sources, so none passes by finding nothing to look at.
"""
import ast
import os
import re
import sys

import pytest
from test_layout import ROOT, checked_sources, files_under, parsed, project_modules, resolved, where

#: the source folders whose top-level names must not be imported (they install as tvm_nimble.<name>)
STAGE_FOLDERS = ("relay_passes", "codegen")
CONTRACT = "tvm_nimble.contract"
CONTRACT_DIR = os.path.join(ROOT, "tvm_nimble", "contract")
VENDOR_ABI = os.path.join(CONTRACT_DIR, "vendor_abi.py")
VENDOR_SOURCES = os.path.join(ROOT, "codegen", "vendor")


def all_sources() -> list[tuple[str, str]]:
    """(module name, path) of every project module, script and test."""
    return checked_sources() + files_under("tests")


def imported(tree, name: str, path: str) -> list[tuple[ast.AST, str]]:
    """(node, absolute module) for every import in the file, at any depth; ``from pkg import x`` gives
    ``pkg.x`` (x may be a module)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = resolved(name, path, node)
            out += [(node, f"{mod}.{a.name}") for a in node.names]
    return out


def under(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


# ---- the checks: (tree, module name, path) -> violations ----------------------------------------------------
def top_level_stage_imports(tree, name: str, path: str) -> list[str]:
    """Imports of ``relay_passes`` / ``codegen`` by their source folder's name."""
    return [f"{where(path, node)} imports {mod}" for node, mod in imported(tree, name, path)
            if not getattr(node, "level", 0) and under(mod, *STAGE_FOLDERS)]


def forbidden_imports(forbidden: tuple[str, ...]):
    def check(tree, name: str, path: str) -> list[str]:
        return [f"{where(path, node)} imports {mod}" for node, mod in imported(tree, name, path)
                if under(mod, *forbidden)]

    return check


passes_or_codegen_reach_up = forbidden_imports(("tvm_nimble.runtime", "tvm_nimble.compiler"))
runtime_reaches_compiler = forbidden_imports(("tvm_nimble.compiler", "tvm_nimble.relay_passes", "tvm_nimble.codegen"))


def contract_imports_beyond_stdlib(tree, name: str, path: str) -> list[str]:
    """Imports of the contract other than the standard library, ``tvm_nimble.errors`` and the contract itself."""
    bad = []
    for node, mod in imported(tree, name, path):
        if under(mod, CONTRACT, "tvm_nimble.errors"):
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in sys.stdlib_module_names:
            continue
        if isinstance(node, ast.Import) and mod.split(".")[0] in sys.stdlib_module_names:
            continue
        bad.append(f"{where(path, node)} imports {mod}")
    return bad


def vendor_prefixes() -> tuple[str, ...]:
    """``nimble.<library>.`` for every ``VendorLibrary("<library>", ...)`` of the contract, read from its source."""
    names = [call.args[0].value for call in ast.walk(parsed(VENDOR_ABI))
             if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "VendorLibrary"]
    root = next(n.value.value for n in parsed(VENDOR_ABI).body
                if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "ROOT")
    return tuple(f"{root}{n}." for n in names)


def docstrings(tree) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def vendor_names_spelled(tree, name: str, path: str) -> list[str]:
    """String literals (f-string parts included, docstrings not) that spell a vendor function or its library's
    prefix: those names belong to the contract."""
    prefixes, docs = vendor_prefixes(), docstrings(tree)
    return [f"{where(path, node)} spells {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
            and node.value.startswith(prefixes)]


def violations(check, sources) -> list[str]:
    return [v for name, path in sources for v in check(parsed(path), name, path)]


# ---- the rules ---------------------------------------------------------------------------------------------
def test_one_import_spelling_for_the_stages():
    bad = violations(top_level_stage_imports, all_sources())
    assert not bad, f"import the stages as tvm_nimble.relay_passes / tvm_nimble.codegen: {bad}"


def test_passes_and_codegen_never_import_the_runtime_or_the_compiler():
    mods = project_modules()
    sources = [(m, p) for m, p in mods.items() if under(m, "tvm_nimble.relay_passes", "tvm_nimble.codegen")]
    assert len(sources) > 20
    bad = violations(passes_or_codegen_reach_up, sources)
    assert not bad, f"the passes and codegen take the plan, markers and vendor names from {CONTRACT}: {bad}"


def test_runtime_never_imports_the_compiler_side():
    sources = [(m, p) for m, p in project_modules().items() if under(m, "tvm_nimble.runtime")]
    assert len(sources) > 10
    bad = violations(runtime_reaches_compiler, sources)
    assert not bad, f"the runtime needs only the TVM runtime and {CONTRACT}: {bad}"


def test_contract_imports_only_the_standard_library_and_errors():
    sources = [(m, p) for m, p in project_modules().items() if under(m, CONTRACT)]
    assert {m.rsplit(".", 1)[-1] for m, _ in sources} >= {"plan", "markers", "vendor_abi"}
    bad = violations(contract_imports_beyond_stdlib, sources)
    assert not bad, f"the contract sits below every layer: {bad}"


def test_vendor_function_names_are_spelled_only_in_the_contract():
    assert len(vendor_prefixes()) >= 8
    sources = [(m, p) for m, p in all_sources() if not p.startswith(CONTRACT_DIR + os.sep)]
    bad = violations(vendor_names_spelled, sources)
    assert not bad, f"take vendor function names from tvm_nimble.contract.vendor_abi: {bad}"


_CONSTANT = re.compile(r'constexpr\s+const\s+char\s*\*\s*(\w+)\s*=\s*"([^"]+)"\s*;')
_REGISTER = re.compile(r'\bRegister\(\s*(?:"([^"]+)"|(\w+))\s*,')


def registered_by_vendor_sources() -> set[str]:
    """Every name a ``Register(name, f)`` of ``codegen/vendor/*.cu`` and ``*.cpp`` registers (a literal, or a named
    ``constexpr const char*`` of the same file)."""
    names = set()
    for f in sorted(os.listdir(VENDOR_SOURCES)):
        if not f.endswith((".cu", ".cpp")):
            continue
        text = re.sub(r"//[^\n]*", "", open(os.path.join(VENDOR_SOURCES, f)).read())
        constants = dict(_CONSTANT.findall(text))
        for literal, ident in _REGISTER.findall(text):
            assert literal or ident in constants, f"{f}: Register({ident}, ...) of a name not defined in the file"
            names.add(literal or constants[ident])
    return names


def test_the_vendor_sources_register_exactly_the_contract_functions():
    from tvm_nimble.contract.vendor_abi import FUNCTIONS

    registered = registered_by_vendor_sources()
    assert len(FUNCTIONS) == len(set(FUNCTIONS))
    assert registered == set(FUNCTIONS), (f"registered, not in the contract: {sorted(registered - set(FUNCTIONS))}; "
                                          f"in the contract, not registered: {sorted(set(FUNCTIONS) - registered)}")


# ---- the checks find what they look for --------------------------------------------------------------------
PLANTED = [
    (top_level_stage_imports, "tvm_nimble.bench.x", "from codegen.vendor_build import build_vendor_library\n"),
    (top_level_stage_imports, "tests.test_x", "def f():\n    import relay_passes.annotate\n"),
    (passes_or_codegen_reach_up, "tvm_nimble.relay_passes.x", "from tvm_nimble.runtime.vendor import FUNCTIONS\n"),
    (passes_or_codegen_reach_up, "tvm_nimble.codegen.x", "from tvm_nimble import compiler\n"),
    (runtime_reaches_compiler, "tvm_nimble.runtime.x", "from tvm_nimble.relay_passes import providers\n"),
    (runtime_reaches_compiler, "tvm_nimble.runtime.x", "from ..codegen.vendor_build import vendor_paths\n"),
    (contract_imports_beyond_stdlib, "tvm_nimble.contract.x", "import numpy as np\n"),
    (contract_imports_beyond_stdlib, "tvm_nimble.contract.x", "from tvm_nimble import env\n"),
    (vendor_names_spelled, "tests.test_x", "'''nimble.cudnn.conv2d is fine in a docstring'''\nK = 'nimble.cudnn.conv2d'\n"),
    (vendor_names_spelled, "scripts.x", "def f(op):\n    return f'nimble.attention.{op}'\n"),
]


@pytest.mark.parametrize("check,name,source", PLANTED, ids=[f"{c.__name__}-{i}" for i, (c, _, _) in enumerate(PLANTED)])
def test_each_check_can_fail(tmp_path, check, name, source):
    path = tmp_path / "planted.py"
    path.write_text(source)
    assert len(check(ast.parse(source), name, str(path))) == 1


def test_allowed_imports_pass_the_checks(tmp_path):
    path = str(tmp_path / "ok.py")
    ok = "from tvm_nimble.relay_passes import annotate\nfrom . import lowered_ir\n"
    assert top_level_stage_imports(ast.parse(ok), "tvm_nimble.relay_passes.x", path) == []
    ok = "from __future__ import annotations\nimport json\nfrom tvm_nimble.errors import NimbleError\nfrom .vendor_abi import ROOT\n"
    assert contract_imports_beyond_stdlib(ast.parse(ok), "tvm_nimble.contract.plan", path) == []
