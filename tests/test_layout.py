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


def imports_of(name: str, path: str) -> set[str]:
    """Absolute names of everything ``path`` imports (relative imports resolved), at any depth."""
    is_pkg = path.endswith("__init__.py")
    out = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[:len(base) - node.level + (1 if is_pkg else 0)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
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
    allowed = {"tvm_nimble", "tvm_nimble.errors"} | {m for m in mods if m.startswith("tvm_nimble.runtime")}
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
