"""The layering (DESIGN §3) is enforced here, not by memory.

The import rules are import-linter contracts in pyproject.toml (``[tool.importlinter]``), run by
``lint-imports``: the layers from ``amqp`` up to ``testing`` and the pytest plugin; the pure layers (amqp, engine,
broker, and the journal's pure modules ``store.records`` and ``store.state``) import no trio, socket, thread,
clock, randomness or file module, nor the journal's file I/O; the broker components' chain (message, queue,
topic, namespace, links, transactions: each imports only those before it) and no import cycle among broker
modules. What import-linter cannot express is checked below.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
BROKER = ROOT / "minibroker" / "broker"


@pytest.mark.timeout(150)
def test_the_import_contracts_hold() -> None:
    """``lint-imports`` finds every contract in pyproject.toml kept."""
    command = shutil.which("lint-imports")
    assert command is not None, "lint-imports is not installed (it comes with the test extra: pip install -e '.[test]')"
    # this checkout's minibroker, whatever is installed (lint-imports also puts its working directory first)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    result = subprocess.run(
        [command, "--no-cache"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"lint-imports exited with {result.returncode}:\n{result.stdout}{result.stderr}"


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
