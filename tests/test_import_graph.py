"""The import graph, drawn from the code: no module of the package reaches itself through its imports.

Every `import` and `from ... import` in the package's files counts, at any depth (a command line's
import inside `main` runs as surely as one at the top), except those under `if TYPE_CHECKING:`,
which never run. Edges go to modules of this package only; `from pkg import name` is an edge to
`pkg.name` when that is a module, else to `pkg`. A parent package's `__init__` that a submodule's
import runs first is not an edge: it is imported before, never in the middle of, its child.

    python tests/test_import_graph.py     # the rooms (top-level folders), their arrows and any circles
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "llmserve_env"
NOT_PACKAGE = {"tests", "bench", "scripts", "outputs", "build", "docs", "weights", "artifacts", "runs"}


def module_files() -> dict[str, Path]:
    """Every module of the package (dotted name -> file), as the wheel maps the folders."""
    found: dict[str, Path] = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0].startswith(".") or rel.parts[0] in NOT_PACKAGE or "data" in rel.parts[:-1]:
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join([PACKAGE, *parts])] = path
    return found


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node except those under `if TYPE_CHECKING:` (annotations only; they never run)."""
    out: list[ast.AST] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        out.append(node)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                stack.extend(child.orelse)
                continue
            stack.append(child)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                           for a in node.names]
            for target in targets:
                if target in modules and target != name:
                    graph[name].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def one_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest path from the component's first module back to itself, to name in a failure."""
    members = set(component)
    start = component[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    return [*paths[node], start]
                if child not in paths:
                    paths[child] = [*paths[node], child]
                    nxt.append(child)
        frontier = nxt
    return component


def _short(name: str) -> str:
    return name.removeprefix(PACKAGE + ".")


def describe(graph: dict[str, set[str]]) -> str:
    # a room is a top-level folder; the modules at the repository root (the package's own) are "(root)"
    files = module_files()
    room = {name: (parts[0] if len(parts := files[name].relative_to(ROOT).parts) > 1 else "(root)")
            for name in graph}
    arrows: dict[str, set[str]] = defaultdict(set)
    for name, targets in graph.items():
        for target in targets:
            if room[target] != room[name]:
                arrows[room[name]].add(room[target])
    lines = [f"{len(graph)} modules, {sum(map(len, graph.values()))} imports between them", "rooms and arrows:"]
    for r in sorted(set(room.values())):
        lines.append(f"  {r:10s} ({sum(1 for v in room.values() if v == r):2d} modules) -> "
                     f"{', '.join(sorted(arrows[r])) or '-'}")
    found = circles(graph)
    lines.append(f"circles: {len(found)}")
    for component in found:
        lines.append(f"  {len(component)} modules: " + " -> ".join(map(_short, one_cycle(graph, component))))
    return "\n".join(lines)


def test_no_module_imports_itself_through_others() -> None:
    graph = import_graph()
    assert len(graph) > 50  # the walk found the package
    found = [" -> ".join(map(_short, one_cycle(graph, c))) + f" ({len(c)} modules)" for c in circles(graph)]
    assert found == [], "import circles:\n" + "\n".join(found)


def test_the_cycle_finder_finds_a_planted_circle() -> None:
    planted = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(planted) == [["a", "b", "c"]]
    assert one_cycle(planted, ["a", "b", "c"]) == ["a", "b", "c", "a"]


if __name__ == "__main__":
    print(describe(import_graph()))
    sys.exit(1 if circles(import_graph()) else 0)
