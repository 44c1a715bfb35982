"""The layering rules, checked on the source: no import cycles, a runtime that never reaches the
compiler, and a library that never imports the benchmarks or the CLI."""
import ast
import os

import networkx as nx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# source folder -> package name (relay_passes/ and codegen/ install as tvm_nimble.relay_passes / .codegen)
PACKAGES = {"tvm_nimble": "tvm_nimble", "relay_passes": "tvm_nimble.relay_passes", "codegen": "tvm_nimble.codegen"}


def project_modules() -> dict[str, str]:
    """module name -> file path, for every project module."""
    mods = {}
    for folder, pkg in PACKAGES.items():
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            for f in files:
                if not f.endswith(".py"):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, f), os.path.join(ROOT, folder))[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                mods[".".join([pkg, *rel])] = os.path.join(dirpath, f)
    return mods


_MODULES = frozenset(project_modules())


def imports_of(name: str, path: str) -> set[str]:
    """Absolute names of everything ``path`` imports (relative imports resolved), at any depth."""
    out = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            mod = resolved(name, path, node)
            named = {f"{mod}.{a.name}" for a in node.names}
            out.update(named)
            if not named <= _MODULES:  # ``from pkg import submodule`` imports the submodule, not all of pkg
                out.add(mod)
    return out


def import_graph() -> nx.DiGraph:
    mods = project_modules()
    g = nx.DiGraph()
    g.add_nodes_from(mods)
    for name, path in mods.items():
        for imp in imports_of(name, path):
            if imp in mods and imp != name:
                g.add_edge(name, imp)
    return g


def test_no_import_cycles():
    g = import_graph()
    # a package's __init__ importing its own submodules is how packages export names, not a cycle
    g.remove_edges_from([(a, b) for a, b in list(g.edges) if b.startswith(a + ".")])
    cycles = list(nx.simple_cycles(g))
    assert not cycles, f"import cycles: {cycles[:5]}"


def test_runtime_never_reaches_the_compiler():
    mods = project_modules()
    runtime = [m for m in mods if m.startswith("tvm_nimble.runtime")]
    g = import_graph()
    reachable = set().union(*(nx.descendants(g, m) | {m} for m in runtime))
    allowed = {"tvm_nimble", "tvm_nimble.errors", "tvm_nimble.env", "tvm_nimble.native_libs"} | {
        m for m in mods if m.startswith(("tvm_nimble.runtime", "tvm_nimble.contract"))}
    assert reachable <= allowed, f"the runtime imports compiler-side modules: {sorted(reachable - allowed)}"
    for m in runtime:
        bad = {i for i in imports_of(m, mods[m]) if i.startswith(("tvm.relax", "tvm.tirx", "tvm.s_tir", "tvm.script",
                                                                    "onnx", "torch"))}
        assert not bad, f"{m} imports {sorted(bad)}"


def test_library_never_imports_bench_or_cli():
    mods = project_modules()
    for m, path in mods.items():
        if m.startswith(("tvm_nimble.bench", "tvm_nimble.cli")):
            continue
        bad = {i for i in imports_of(m, path) if i.startswith(("tvm_nimble.bench", "tvm_nimble.cli"))}
        assert not bad, f"{m} imports {sorted(bad)}"


# --- private reaches across modules (issue #29) ---------------------------------------------------

#: The compiler's stage functions (tvm_nimble/compiler/stages.py and build.py): callers name them, none
#: receives one as an argument. (``offload`` is left out: vendor_offload.py has a local of that name.)
STAGE_FUNCTIONS = frozenset({"build", "lower", "schedule", "select_kernels", "compile_kernels", "build_one_stream",
                             "import_model", "apply_precision", "generate_kernels", "build_fixed", "build_with"})
#: Parameter names a function of tvm_nimble/compiler may not take (a stage passed in under its own name).
STAGE_PARAMETERS = frozenset({"build", "schedule"})
#: The top-level names of TVM's Python packages.
TVM_ROOTS = ("tvm", "tvm_ffi")
#: The modules allowed to use TVM's private API (each use a named, commented function there).
COMPAT_MODULE = "tvm_compat"


def checked_sources() -> list[tuple[str, str]]:
    """(module name, path) of every project module and every script (scripts/*.py, scripts/**/*.py)."""
    return sorted(project_modules().items()) + files_under("scripts")


def files_under(folder: str) -> list[tuple[str, str]]:
    """(dotted path from the repository root, path) of every .py file under ``folder``."""
    out = []
    for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
        for f in sorted(files):
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, f), ROOT)[:-3].split(os.sep)
                out.append((".".join(rel), os.path.join(dirpath, f)))
    return out


def project_roots() -> set[str]:
    """First components of the names a project module or script can be imported under: the installed
    packages, their source folders, scripts/ and the scripts themselves (``import gpu_args`` from beside it)."""
    roots = {"scripts"} | set(PACKAGES) | {p.split(".")[0] for p in PACKAGES.values()}
    roots |= {name.split(".")[-1] for name, path in checked_sources() if name.startswith("scripts.")}
    return roots


def is_private(name: str) -> bool:
    """``_x`` but not ``__x__``."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def where(path: str, node) -> str:
    return f"{os.path.relpath(path, ROOT)}:{node.lineno}"


def resolved(name: str, path: str, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` in module ``name`` (at ``path``) imports from."""
    if not node.level:
        return node.module
    base = name.split(".")
    base = base[:len(base) - node.level + (1 if path.endswith("__init__.py") else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def bound_modules(tree, name: str, path: str, roots) -> dict[str, str]:
    """Local name -> dotted name, for every name an import in the file binds to something under one
    of ``roots`` (a module, or a name from one). Flow-insensitive: good enough for import-time names."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in roots:
                    bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            mod = resolved(name, path, node)
            if mod and mod.split(".")[0] in roots:
                for a in node.names:
                    if a.name != "*":
                        bound[a.asname or a.name] = f"{mod}.{a.name}"
    return bound


def attribute_chain(node) -> tuple[str, list[tuple[str, ast.AST]]] | None:
    """``a.b.c`` -> ("a", [("b", node of a.b), ("c", node of a.b.c)]); None unless rooted at a plain name."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append((node.attr, node))
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return node.id, attrs[::-1]


def private_reaches(tree, name: str, path: str, roots) -> list[str]:
    """``file:line what`` for every private name this file takes from a module under ``roots``: in an
    import statement, as an attribute of a name bound to one, or through ``getattr``/``setattr``/
    ``hasattr``/``delattr`` with a literal private name."""
    bound = bound_modules(tree, name, path, roots)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in roots and any(is_private(p) for p in a.name.split(".")):
                    found.append(f"{where(path, node)} import {a.name}")
        elif isinstance(node, ast.ImportFrom):
            mod = resolved(name, path, node)
            if not mod or mod.split(".")[0] not in roots:
                continue
            if any(is_private(p) for p in mod.split(".")):
                found.append(f"{where(path, node)} from {mod} import ...")
            for a in node.names:
                if is_private(a.name):
                    found.append(f"{where(path, node)} from {mod} import {a.name}")
        elif isinstance(node, ast.Attribute) and is_private(node.attr):
            chain = attribute_chain(node)
            # a chain a._b._c is reported once, at its first private step
            if chain and chain[0] in bound and not any(is_private(a) for a, _ in chain[1][:-1]):
                dotted = ".".join([bound[chain[0]], *(a for a, _ in chain[1])])
                found.append(f"{where(path, node)} {dotted}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and is_private(node.args[1].value)):
            chain = attribute_chain(node.args[0])
            if chain and chain[0] in bound:
                dotted = ".".join([bound[chain[0]], *(a for a, _ in chain[1]), node.args[1].value])
                found.append(f"{where(path, node)} {node.func.id}(..., {node.args[1].value!r}) on {dotted}")
    return sorted(found, key=lambda f: int(f.split(" ")[0].rsplit(":", 1)[1]))


def parsed(path: str):
    with open(path) as f:
        return ast.parse(f.read(), path)


def test_no_private_names_imported_across_project_modules():
    roots = project_roots()
    found = []
    for name, path in checked_sources():
        found += private_reaches(parsed(path), name, path, roots)
    assert not found, ("module-private names taken from another project module (make them public, or move the "
                       "code that needs them):\n  " + "\n  ".join(found))


def test_private_tvm_api_only_in_tvm_compat():
    found = []
    for name, path in checked_sources():
        if name.split(".")[-1] == COMPAT_MODULE:
            continue
        found += private_reaches(parsed(path), name, path, TVM_ROOTS)
    assert not found, (f"private TVM API used outside the {COMPAT_MODULE} modules (relay_passes/tvm_compat.py for the "
                       "compiler, tvm_nimble/runtime/tvm_compat.py for the runtime):\n  " + "\n  ".join(found))


def test_private_reach_checks_can_fail():
    """The two checks above flag what they are meant to (so that their passing means something)."""
    source = ("import tvm.rpc.server as server\nfrom tvm.s_tir.meta_schedule.builder.local_builder import _worker_func\n"
              "import tvm_ffi\nfrom tvm import _ffi\nfrom tvm._ffi import base\nfrom tvm_nimble.runtime.executor import _x\n"
              "from .lowered_ir import _op_name\nimport tvm_nimble.runtime.executor as ex\n"
              "server._serve_loop = None\ntvm_ffi.core._Tensor._x\ngetattr(server, '_serve_loop')\nex._y\n"
              "from .lowered_ir import op_name\ntvm_ffi.Shape\n__name__.__len__\n")
    path = os.path.join(ROOT, "relay_passes", "probe.py")
    tvm = private_reaches(ast.parse(source), "tvm_nimble.relay_passes.probe", path, TVM_ROOTS)
    assert [f.split(":")[1].split()[0] for f in tvm] == ["2", "4", "5", "9", "10", "11"], tvm
    ours = private_reaches(ast.parse(source), "tvm_nimble.relay_passes.probe", path, project_roots())
    assert [f.split(":")[1].split()[0] for f in ours] == ["6", "7", "12"], ours
    assert "from tvm_nimble.relay_passes.lowered_ir import _op_name" in ours[1]


def stage_function_passes(tree, path: str) -> list[str]:
    """``file:line`` for every call that passes a stage function (by its name) as an argument."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        values = [(a, None) for a in node.args] + [(k.value, k.arg) for k in node.keywords]
        for value, keyword in values:
            if isinstance(value, ast.Starred):
                value = value.value
            if isinstance(value, ast.Name) and value.id in STAGE_FUNCTIONS:
                func = ast.unparse(node.func)
                found.append(f"{where(path, value)} {func}(... {keyword + '=' if keyword else ''}{value.id} ...)")
    return sorted(found, key=lambda f: int(f.split(" ")[0].rsplit(":", 1)[1]))


def stage_parameters(tree, path: str) -> list[str]:
    """``file:line`` for every function taking a parameter named like a stage it should call instead."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            params = a.posonlyargs + a.args + a.kwonlyargs + [p for p in (a.vararg, a.kwarg) if p]
            for p in params:
                if p.arg in STAGE_PARAMETERS:
                    found.append(f"{where(path, p)} {getattr(node, 'name', 'lambda')}({p.arg})")
    return found


def test_no_stage_function_passed_as_argument():
    found = []
    for name, path in checked_sources():
        tree = parsed(path)
        found += stage_function_passes(tree, path)
        if name.startswith("tvm_nimble.compiler"):
            found += stage_parameters(tree, path)
    assert not found, (f"stage functions ({', '.join(sorted(STAGE_FUNCTIONS))}) passed as arguments, or taken as "
                       f"parameters in tvm_nimble/compiler: call the stage where it is needed instead:\n  "
                       + "\n  ".join(found))


def test_stage_check_can_fail():
    source = ("def f(x, build, *, schedule=None):\n    pass\n"
              "choose_streams(result, schedule)\nmeasure(mod, build=build)\ng(lower(x), build_one_stream)\n"
              "rescheduled(result, schedule=1)\nh(lambda schedule: 0)\n")
    path = os.path.join(ROOT, "tvm_nimble", "compiler", "probe.py")
    tree = ast.parse(source)
    passes = [f.split(":")[1].split()[0] for f in stage_function_passes(tree, path)]
    assert passes == ["3", "4", "5"], passes
    params = [f.split(":")[1].split()[0] for f in stage_parameters(tree, path)]
    assert sorted(params) == ["1", "1", "7"], params
