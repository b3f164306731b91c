"""``minibroker check`` against a running and a missing broker, and the Dockerfile: a static check of its
instructions, and its entrypoint command run as a subprocess the way the container runs it."""

from __future__ import annotations

import http.client
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minibroker.health import NotHealthy, check
from minibroker.testing.thread import ThreadedBroker

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def _check(*args: str) -> tuple[int, float, str]:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "minibroker", "check", *args], capture_output=True, text=True, timeout=20, check=False
    )
    return result.returncode, time.monotonic() - started, result.stdout + result.stderr


def test_check_a_running_broker(broker: ThreadedBroker) -> None:
    code, _elapsed, output = _check("--url", broker.url)
    assert code == 0, output
    assert "ok" in output


def test_check_a_missing_broker_fails_fast() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # a port nobody listens on once this socket is closed
    code, elapsed, output = _check("--url", f"amqp://127.0.0.1:{port}")
    assert code == 1
    assert "not healthy" in output
    assert elapsed < 5  # the interpreter start dominates; the check itself gives up within a second


def test_check_a_silent_peer_gives_up_within_a_second() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(NotHealthy, match="no answer in time"):
            check(f"amqp://127.0.0.1:{port}", timeout=1.0)
        assert time.monotonic() - started < 1.5


def _instructions() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in DOCKERFILE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and not line.startswith("&&"):
            keyword, _, rest = line.partition(" ")
            found.setdefault(keyword.upper(), []).append(rest.strip())
    return found


def test_dockerfile_instructions() -> None:
    found = _instructions()
    (base,) = found["FROM"]
    assert re.fullmatch(r"python:3\.1[1-9]-slim", base), base
    assert found["USER"] == ["1001"]
    assert "--uid 1001" in DOCKERFILE.read_text()
    assert found["EXPOSE"] == ["5672 5671 8672"]
    assert _environment(found) == {
        "MINIBROKER_HOST": "0.0.0.0",
        "MINIBROKER_HTTP_HOST": "0.0.0.0",
        "MINIBROKER_HTTP_PORT": "8672",
    }
    (healthcheck,) = found["HEALTHCHECK"]
    assert healthcheck.endswith('CMD ["minibroker", "check"]')
    assert found["STOPSIGNAL"] == ["SIGTERM"]
    assert json.loads(found["ENTRYPOINT"][0]) == ["minibroker"]


def test_image_entrypoint_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    """Run the ENTRYPOINT with the image's ENV, as the container would (port 0 instead of 5672 here)."""
    found = _instructions()
    entrypoint = json.loads(found["ENTRYPOINT"][0])
    env = {**os.environ, **_environment(found)}
    env["MINIBROKER_PORT"] = "0"
    env["MINIBROKER_HTTP_PORT"] = "0"  # the image's 8672 may be taken here
    with subprocess.Popen(entrypoint, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            match = re.fullmatch(r"minibroker listening on amqp://0\.0\.0\.0:(\d+)", line)
            assert match, line
            port = match.group(1)
            http_line = proc.stdout.readline().strip()
            http_on = re.fullmatch(r"minibroker http on http://0\.0\.0\.0:(\d+)", http_line)
            assert http_on, http_line
            conn = http.client.HTTPConnection("127.0.0.1", int(http_on.group(1)), timeout=5)
            try:
                conn.request("GET", "/healthz")
                assert conn.getresponse().status == 200
            finally:
                conn.close()
            healthcheck = json.loads(found["HEALTHCHECK"][0].split("CMD", 1)[1])
            code, _elapsed, output = _check(*healthcheck[2:], "--url", f"amqp://127.0.0.1:{port}")
            assert code == 0, output
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(10) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def _environment(found: dict[str, list[str]]) -> dict[str, str]:
    """The image's ENV assignments (several may share one ENV line)."""
    pairs = [assignment.partition("=") for line in found["ENV"] for assignment in shlex.split(line)]
    return {key: value for key, _, value in pairs}


def test_readme_documents_docker_usage() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "docker run" in readme
    assert "/etc/minibroker/minibroker.toml" in readme
