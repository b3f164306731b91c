"""The pure layers (DESIGN §3) import no trio and read no clock: enforced here, not by memory."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "minibroker"
PURE = ["amqp", "engine", "broker"]
FORBIDDEN_MODULES = {"trio", "time", "random", "socket", "threading", "asyncio"}


def _pure_files() -> list[Path]:
    return sorted(p for layer in PURE for p in (PACKAGE / layer).rglob("*.py"))


@pytest.mark.parametrize("path", _pure_files(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_pure_module_has_no_io_imports(path: Path) -> None:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            assert name.split(".")[0] not in FORBIDDEN_MODULES, f"{path.name} imports {name}"


def test_there_are_pure_modules() -> None:
    assert len(_pure_files()) >= 10


# -- the broker core: components that import downward only (issue 11) --------------------------------------
BROKER = PACKAGE / "broker"
CHAIN = ["message", "queue", "topic", "namespace", "links", "transactions"]
"""The order the issue fixes: each module may import those before it, never one after it."""


def _broker_imports() -> dict[str, set[str]]:
    """Each ``minibroker.broker`` module -> the broker modules it imports anywhere (``TYPE_CHECKING`` blocks and
    function bodies included)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(BROKER.glob("*.py")):
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            imported |= {n.split(".")[2] for n in names if n.startswith("minibroker.broker.")}
        graph[path.stem] = imported - {path.stem}
    return graph


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for child in graph.get(todo.pop(), ()):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen


def test_no_broker_module_imports_one_that_imports_it_back() -> None:
    graph = _broker_imports()
    cycles = sorted(module for module in graph if module in _reachable(graph, module))
    assert cycles == [], f"modules on an import cycle: {cycles}"


@pytest.mark.parametrize("lower", CHAIN[:-1])
def test_the_broker_chain_imports_downward(lower: str) -> None:
    graph = _broker_imports()
    higher = set(CHAIN[CHAIN.index(lower) + 1 :])
    assert not (_reachable(graph, lower) & higher), f"{lower} reaches {_reachable(graph, lower) & higher}"


def test_a_queue_knows_nothing_of_links() -> None:
    assert "links" not in _reachable(_broker_imports(), "queue")


def test_no_stub_methods_in_the_broker() -> None:
    """Components, not mixins declaring ``raise NotImplementedError`` for each other."""
    stubs = [p.name for p in BROKER.glob("*.py") if "NotImplementedError" in p.read_text()]
    assert stubs == []


def test_the_engine_boundary_guard_refuses_a_broker_write() -> None:
    """The autouse guard in ``tests/conftest.py`` (engine records refuse writes from ``minibroker.broker``)
    really fires: code whose module is a broker module cannot assign a link's field."""
    from minibroker.amqp.definitions import Attach
    from minibroker.engine.endpoints import Link, Session

    link = Link(Session(0, 0, 0, 10), Attach(name="x", handle=0, role=False), 0)
    namespace: dict[str, Any] = {"__name__": "minibroker.broker.example"}
    exec("def write(link):\n    link.context = 'mine'\n", namespace)
    with pytest.raises(AssertionError, match="never writes the engine's fields"):
        namespace["write"](link)
    link.context = "a test may"  # this module is not the broker
