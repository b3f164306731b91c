"""Interoperability with a second AMQP 1.0 client: rhea, the JavaScript one, run with node.

The ``rhea`` fixture installs rhea once with npm into ``tests/interop/.node`` (git-ignored; reused on
later runs) and returns a ``RheaClient``, which runs ``rhea_client.js`` for one scenario and returns the
JSON lines it printed. A machine without node or npm fails these tests: they are never skipped.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "rhea_client.js"
CACHE = HERE / ".node"
"""npm ``--prefix`` of the rhea install: rhea lands in ``CACHE / "node_modules"``."""
RHEA_SPEC = "rhea@3"
RHEA_MAJOR = "3"
INSTALL_TIMEOUT = 120.0
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


def _installed_version() -> str | None:
    manifest = CACHE / "node_modules" / "rhea" / "package.json"
    try:
        version = json.loads(manifest.read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None
    return version if isinstance(version, str) else None


@contextmanager
def _install_lock() -> Iterator[None]:
    """Serialise installs between pytest-xdist workers (each one runs session fixtures)."""
    CACHE.mkdir(exist_ok=True)
    with (CACHE / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _ensure_rhea(npm: str) -> str:
    """Install rhea into ``CACHE`` unless it is there already; return its version."""
    with _install_lock():
        version = _installed_version()
        if version is not None and version.split(".")[0] == RHEA_MAJOR:
            return version
        command = [npm, "install", "--no-audit", "--no-fund", "--prefix", str(CACHE), RHEA_SPEC]
        try:
            proc = subprocess.run(
                command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT, check=False, cwd=CACHE
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"`{' '.join(command)}` did not finish within {INSTALL_TIMEOUT} s", pytrace=False)
        if proc.returncode != 0:
            pytest.fail(
                f"`{' '.join(command)}` failed with exit code {proc.returncode}:\n{proc.stdout}\n{proc.stderr}",
                pytrace=False,
            )
        version = _installed_version()
        if version is None:
            pytest.fail(f"npm reported success but {CACHE}/node_modules/rhea is missing", pytrace=False)
        return version


@pytest.fixture(scope="session")
def rhea() -> RheaClient:
    """rhea, installed once, behind a callable that plays one scenario (see ``RheaClient``)."""
    node = shutil.which("node")
    npm = shutil.which("npm")
    if node is None or npm is None:
        missing = " and ".join(name for name, path in (("node", node), ("npm", npm)) if path is None)
        pytest.fail(
            f"{missing} not found on PATH: the rhea interoperability tests need Node.js (>= 14) with npm; "
            "install them (e.g. `apt-get install nodejs npm`)",
            pytrace=False,
        )
    _ensure_rhea(npm)
    return RheaClient(node, CACHE / "node_modules")
