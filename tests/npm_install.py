"""Node.js packages for the tests that drive JavaScript clients (rhea in ``tests/interop``, ``@azure/service-bus``
in ``tests/servicebus``): each installed once with npm into its own git-ignored cache directory and reused on
later runs, safe under pytest-xdist (a file lock serialises the workers). A machine without node or npm fails
those tests: they are never skipped."""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

INSTALL_TIMEOUT = 120.0


def node_and_npm(purpose: str) -> tuple[str, str]:
    """The paths of ``node`` and ``npm``; the test fails (never skips) when either is missing."""
    node = shutil.which("node")
    npm = shutil.which("npm")
    if node is None or npm is None:
        missing = " and ".join(name for name, path in (("node", node), ("npm", npm)) if path is None)
        pytest.fail(
            f"{missing} not found on PATH: {purpose} need Node.js (>= 14) with npm; "
            "install them (e.g. `apt-get install nodejs npm`)",
            pytrace=False,
        )
    return node, npm


def installed_version(cache: Path, package: str) -> str | None:
    """The version of ``package`` in ``cache / "node_modules"``, None when it is not there."""
    manifest = cache / "node_modules" / package / "package.json"
    try:
        version = json.loads(manifest.read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None
    return version if isinstance(version, str) else None


@contextmanager
def _install_lock(cache: Path) -> Iterator[None]:
    """Serialise installs between pytest-xdist workers (each one runs session fixtures)."""
    cache.mkdir(exist_ok=True)
    with (cache / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def ensure_package(npm: str, cache: Path, package: str, spec: str, version_prefix: str) -> str:
    """Install ``spec`` (e.g. ``rhea@3``) into ``cache`` unless ``package`` is there already in a version that
    starts with ``version_prefix`` (e.g. ``"3."``); return the installed version."""
    with _install_lock(cache):
        version = installed_version(cache, package)
        if version is not None and version.startswith(version_prefix):
            return version
        command = [npm, "install", "--no-audit", "--no-fund", "--prefix", str(cache), spec]
        try:
            proc = subprocess.run(
                command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT, check=False, cwd=cache
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"`{' '.join(command)}` did not finish within {INSTALL_TIMEOUT} s", pytrace=False)
        if proc.returncode != 0:
            pytest.fail(
                f"`{' '.join(command)}` failed with exit code {proc.returncode}:\n{proc.stdout}\n{proc.stderr}",
                pytrace=False,
            )
        version = installed_version(cache, package)
        if version is None:
            pytest.fail(f"npm reported success but {cache}/node_modules/{package} is missing", pytrace=False)
        return version
