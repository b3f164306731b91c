"""The pure layers (DESIGN §3) import no trio and read no clock: enforced here, not by memory."""

from __future__ import annotations

import ast
from pathlib import Path

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
