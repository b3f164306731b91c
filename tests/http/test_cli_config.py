"""``[http]`` in the configuration, ``--http-port`` and ``MINIBROKER_HTTP_PORT``, and the CLI's ``http on`` line."""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from minibroker.cli import build_parser, resolve_config
from minibroker.config import Config, ConfigError

LISTENING = re.compile(r"^minibroker listening on amqp://127\.0\.0\.1:(\d+)$")
HTTP_ON = re.compile(r"^minibroker http on http://127\.0\.0\.1:(\d+)$")


def test_http_is_off_by_default_and_on_loopback() -> None:
    config = Config()
    assert config.http.port is None
    assert config.http.host == "127.0.0.1"


def test_http_values_are_read() -> None:
    config = Config.from_dict(
        {"http": {"host": "::1", "port": 0, "max_body_size": 10, "request_timeout": 2, "max_connections": 3}}
    )
    assert config.http.host == "::1"
    assert config.http.port == 0
    assert config.http.max_body_size == 10
    assert config.http.request_timeout == 2.0
    assert config.http.max_connections == 3


@pytest.mark.parametrize(
    ("http", "expected"),
    [
        ({"port": 70000}, "http.port: 70000 is not a TCP port"),
        ({"port": "80"}, "http.port: expected an integer"),
        ({"max_body_size": 0}, "http.max_body_size: must be at least 1"),
        ({"request_timeout": 0}, "http.request_timeout: must be positive"),
        ({"bind": "x"}, "http.bind: unknown key"),
    ],
)
def test_bad_http_values_name_the_key(http: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(expected)):
        Config.from_dict({"http": http}, source="c.toml")


def test_manage_permission_defaults_to_false() -> None:
    config = Config.from_dict({"auth": {"permissions": {"a": {}, "b": {"manage": True}}}})
    assert config.auth.permissions["a"].manage is False
    assert config.auth.permissions["b"].manage is True


def _resolve(args: list[str], env: dict[str, str]) -> Config:
    return resolve_config(build_parser().parse_args(args), env)


def test_http_port_precedence_and_host_independent_of_amqp() -> None:
    assert _resolve([], {}).http.port is None
    assert _resolve([], {"MINIBROKER_HTTP_PORT": "8081"}).http.port == 8081
    assert _resolve(["--http-port", "8082"], {"MINIBROKER_HTTP_PORT": "8081"}).http.port == 8082
    exposed = _resolve(["--host", "0.0.0.0", "--http-port", "0"], {})
    assert exposed.server.host == "0.0.0.0"
    assert exposed.http.host == "127.0.0.1"  # --host alone does not expose management
    with pytest.raises(ConfigError, match="MINIBROKER_HTTP_PORT"):
        _resolve([], {"MINIBROKER_HTTP_PORT": "x"})
    # only its own variable exposes management (the container image sets it)
    assert _resolve([], {"MINIBROKER_HTTP_HOST": "0.0.0.0"}).http.host == "0.0.0.0"


def test_cli_prints_the_http_line_and_serves_the_api() -> None:
    command = [sys.executable, "-m", "minibroker", "--port", "0", "--http-port", "0"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            assert LISTENING.match(proc.stdout.readline().rstrip("\n"))
            match = HTTP_ON.match(proc.stdout.readline().rstrip("\n"))
            assert match, proc.stderr.read() if proc.stderr else ""
            conn = http.client.HTTPConnection("127.0.0.1", int(match.group(1)), timeout=5)
            try:
                conn.request("GET", "/readyz")
                response = conn.getresponse()
                assert response.status == 200
                assert json.loads(response.read()) == {"status": "ready"}
            finally:
                conn.close()
            proc.terminate()
            assert proc.wait(10) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


def test_bad_http_port_argument_exits_2() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "minibroker", "--http-port", "99999"],
        capture_output=True,
        text=True,
        timeout=20,
        env=dict(os.environ),
        check=False,
    )
    assert result.returncode == 2
    assert "--http-port" in result.stderr


def test_example_config_documents_http() -> None:
    example = Path(__file__).parents[2] / "conf" / "minibroker.toml"
    text = example.read_text()
    assert "[http]" in text
    assert "manage" in text


@pytest.mark.parametrize(
    ("option", "expected"), [("--http-port", "cannot listen for HTTP on 127.0.0.1:"), ("--port", "cannot listen on")]
)
def test_a_port_in_use_exits_1_naming_the_listener(option: str, expected: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        args = ["--port", "0", option, port] if option != "--port" else [option, port]
        result = subprocess.run(
            [sys.executable, "-m", "minibroker", *args], capture_output=True, text=True, timeout=20, check=False
        )
    assert result.returncode == 1
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_a_broker_without_the_http_listener_never_loads_h11() -> None:
    """The management API costs nothing when it is off: neither h11 nor minibroker.http is imported by the
    package, the command line or a broker that serves AMQP only (start-up time, issue 19); nor are frame capture,
    the pcap writer and ``minibroker replay`` when capture is off."""
    code = (
        "import sys, trio, minibroker, minibroker.cli\n"
        "async def main():\n"
        "    async with minibroker.serve({'server': {'port': 0}}):\n"
        "        pass\n"
        "trio.run(main)\n"
        "lazy = ('h11.', 'minibroker.http', 'minibroker.replay', 'minibroker.server.capture',\n"
        "        'minibroker.server.pcap')\n"
        "loaded = sorted(m for m in sys.modules if m == 'h11' or m.startswith(lazy))\n"
        "print(loaded)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True)
    assert result.stdout.strip() == "[]", result.stdout
