"""Interoperability with a second AMQP 1.0 client: rhea, the JavaScript one, run with node.

The ``rhea`` fixture installs rhea once with npm into ``tests/interop/.node`` (git-ignored; reused on
later runs) and returns a ``RheaClient``, which runs ``rhea_client.js`` for one scenario and returns the
JSON lines it printed. A machine without node or npm fails these tests: they are never skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.npm_install import ensure_package, node_and_npm

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "rhea_client.js"
CACHE = HERE / ".node"
"""npm ``--prefix`` of the rhea install: rhea lands in ``CACHE / "node_modules"``."""
RHEA_SPEC = "rhea@3"
RHEA_MAJOR = "3"
RUN_TIMEOUT = 30.0
"""Upper bound of one node run (the script has its own 10 s guard)."""
ARGV_LIMIT = 64 * 1024
"""Specs this big or bigger go to the script on standard input (Linux caps one argument at 128 KiB)."""


def _clip(value: object, limit: int = 2000) -> str:
    """``repr``/``str`` of ``value`` cut to ``limit`` characters, for failure messages."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class RheaError(AssertionError):
    """The rhea client failed: it exited non-zero or printed something that is not JSON."""


class RheaClient:
    """Runs ``rhea_client.js`` with one JSON spec (see the script's header for the fields)."""

    def __init__(self, node: str, node_path: Path) -> None:
        self.node = node
        self.node_path = node_path

    def run(self, spec: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        """Run the script for ``spec``; return the finished process whatever its exit code."""
        env = {**os.environ, "NODE_PATH": str(self.node_path)}
        env.pop("DEBUG", None)  # rhea logs through the debug module: keep stderr to real errors
        text = json.dumps(spec)
        on_argv = len(text.encode()) < ARGV_LIMIT
        try:
            return subprocess.run(
                [self.node, str(SCRIPT), text if on_argv else "-"],
                input=None if on_argv else text,
                capture_output=True, text=True, timeout=RUN_TIMEOUT, env=env, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise RheaError(f"rhea client still running after {RUN_TIMEOUT} s: {_clip(spec)}\n{exc.stderr!r}") from exc

    def __call__(self, scenario: str, **spec: Any) -> list[dict[str, Any]]:
        """Play ``scenario`` and return every JSON line printed; fail unless it ended cleanly."""
        spec = {"scenario": scenario, **spec}
        proc = self.run(spec)
        if proc.returncode != 0:
            raise RheaError(
                f"rhea client exited {proc.returncode} for {_clip(spec)}\n"
                f"stderr: {_clip(proc.stderr)}\nstdout: {_clip(proc.stdout)}"
            )
        try:
            lines: list[dict[str, Any]] = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
        except json.JSONDecodeError as exc:
            raise RheaError(f"rhea client printed something else than JSON lines: {_clip(proc.stdout)}") from exc
        if not lines or lines[-1] != {"done": True}:
            raise RheaError(f"rhea client did not report a clean end: {_clip(proc.stdout)}")
        return lines[:-1]


@pytest.fixture(scope="session")
def rhea() -> RheaClient:
    """rhea, installed once, behind a callable that plays one scenario (see ``RheaClient``)."""
    node, npm = node_and_npm("the rhea interoperability tests")
    ensure_package(npm, CACHE, "rhea", RHEA_SPEC, f"{RHEA_MAJOR}.")
    return RheaClient(node, CACHE / "node_modules")
