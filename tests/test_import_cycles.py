"""No import circle among the project's Python modules (realformer_fairseq, realformer_pipelines,
studies): a static scan of every ``import`` statement, at module level and inside functions,
read with ``ast`` (nothing is imported). An edge goes to the module an import names (``from
pkg import mod`` to ``pkg.mod`` where that is a module); a package's ``__init__`` is a node of
its own, reached only where an import names the package itself."""

import ast
from pathlib import Path
from typing import Dict, List, Set

from harness import REPO_ROOT

PACKAGES = ("realformer_fairseq", "realformer_pipelines", "studies")


def project_modules(root: Path) -> Dict[str, Path]:
    """Dotted name -> file of every module of :data:`PACKAGES` under ``root``."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def imports_of(name: str, path: Path, modules: Dict[str, Path]) -> Set[str]:
    """The project modules that the module ``name`` (file ``path``) imports anywhere in it:
    ``import a.b`` -> ``a.b``; ``from a import b`` -> ``a.b`` where that is a module, else
    ``a``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + [base] * bool(base))
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


def import_cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def import_graph(root: Path) -> Dict[str, Set[str]]:
    modules = project_modules(root)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def test_no_import_cycle_among_the_project_modules():
    graph = import_graph(REPO_ROOT)
    assert len(graph) > 100 and "realformer_pipelines.model_info" in graph
    assert import_cycles(graph) == []


def test_the_scan_finds_a_function_level_cycle(tmp_path):
    for package in PACKAGES:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "studies" / "a.py").write_text("from . import b\n")
    (tmp_path / "studies" / "b.py").write_text("def f():\n    from .a import g\n")
    (tmp_path / "studies" / "c.py").write_text("import studies.a\n")
    assert import_cycles(import_graph(tmp_path)) == [["studies.a", "studies.b"]]
