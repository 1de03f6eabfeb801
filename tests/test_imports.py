"""The import graph of grpo_sentinel, read from the source (every import, a function's lazy ones too):
no module reaches itself again, and telemetry/ never imports service/."""

import ast

import pytest

from helpers import REPO

pytestmark = pytest.mark.unit  # the inner loop: pure code, no model, no process (README, Tests)

# The installed package names of the repository's folders (pyproject.toml's package-dir).
FOLDERS = {"grpo_sentinel.service": REPO / "service", "grpo_sentinel.telemetry": REPO / "telemetry",
           "grpo_sentinel.integrations": REPO / "telemetry" / "integrations"}


def modules() -> dict[str, ast.Module]:
    """Module name -> its parsed source. integrations/ is listed once, as grpo_sentinel.integrations."""
    out = {}
    for package, folder in FOLDERS.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            if package == "grpo_sentinel.telemetry" and parts[0] == "integrations":
                continue
            name = ".".join((package, *parts))
            out[name.removesuffix(".__init__")] = ast.parse(path.read_text(), str(path))
    return out


def graph() -> dict[str, set[str]]:
    """Module -> the grpo_sentinel modules it imports (`from pkg import sub` is an edge to pkg.sub)."""
    mods = modules()
    edges: dict[str, set[str]] = {name: set() for name in mods}
    for name, tree in mods.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module
                           for a in node.names]
            else:
                continue
            edges[name] |= {t for t in targets if t in mods and t != name}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_the_checker_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_has_no_circle():
    edges = graph()
    assert len(edges) > 40 and "grpo_sentinel.service.daemon.serve" in edges  # it read the whole package
    assert cycles(edges) == []


def _reach(edges: dict[str, set[str]], a: str) -> set[str]:
    seen, todo = set(), [a]
    while todo:
        for b in edges[todo.pop()] - seen:
            seen.add(b)
            todo.append(b)
    return seen


HEALTH = "grpo_sentinel.telemetry.health"


def test_health_never_imports_a_module_above_it():
    """An arrow back up: a health module importing a telemetry module that itself reads the health code
    (health/runbook.py -> dashboard.py was one: the panels a row shows are monitoring.PANEL_ROWS now)."""
    edges = graph()
    up = [(a, b) for a in sorted(edges) if a.startswith(HEALTH) for b in sorted(edges[a])
          if not b.startswith(HEALTH) and any(x.startswith(HEALTH) for x in _reach(edges, b))]
    assert up == []  # a piece both need moves down into health/


def test_telemetry_never_imports_the_service():
    up = {(a, b) for a, bs in graph().items() if not a.startswith("grpo_sentinel.service")
          for b in bs if b.startswith("grpo_sentinel.service")}
    assert not up
