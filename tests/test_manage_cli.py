"""``minibroker queues | peek | purge | send | txns | reset`` (issue 14 item 7): the commands, as a user runs
them, against a real broker process with its HTTP management API on."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from proton import Message
from proton.utils import BlockingConnection

import minibroker

LISTENING = re.compile(r"^minibroker listening on (amqp://127\.0\.0\.1:\d+)$")
HTTP = re.compile(r"^minibroker http on (http://127\.0\.0\.1:\d+)$")


@pytest.fixture(scope="module")
def urls() -> Iterator[tuple[str, str]]:
    """(AMQP URL, HTTP URL) of a broker process serving both on free ports."""
    command = [sys.executable, "-m", "minibroker", "--port", "0", "--http-port", "0"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            amqp = LISTENING.match(proc.stdout.readline().rstrip("\n"))
            http = HTTP.match(proc.stdout.readline().rstrip("\n"))
            assert amqp, proc.stderr.read() if proc.stderr else ""
            assert http, proc.stderr.read() if proc.stderr else ""
            yield amqp.group(1), http.group(1)
        finally:
            proc.terminate()
            proc.wait(10)


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MINIBROKER_")}
    return subprocess.run(
        [sys.executable, "-m", "minibroker", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**environ, **(env or {})},
    )


def ok(*args: str, env: dict[str, str] | None = None) -> str:
    result = run(*args, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return result.stdout


def test_send_queues_peek_purge_as_tables_and_json(urls: tuple[str, str]) -> None:
    _amqp, http = urls
    assert ok("send", "cli.q", "hello", "--http", http) == "sent 1 message to cli.q\n"
    ok("send", "cli.q", "world", "-p", "colour=red", "--http", http)

    lines = ok("queues", "--http", http).splitlines()
    assert lines[0].split() == ["QUEUE", "DEPTH", "ACQUIRED", "STAGED", "CONSUMERS", "KIND"]
    assert ["cli.q", "2", "0", "0", "0"] in [line.split()[:5] for line in lines[1:]]
    [listed] = [q for q in json.loads(ok("queues", "--json", "--http", http)) if q["name"] == "cli.q"]
    assert (listed["depth"], listed["acquired"], listed["staged"]) == (2, 0, 0)

    table = ok("peek", "cli.q", "--http", http).splitlines()
    assert table[0].split() == ["#", "MESSAGE-ID", "BODY", "APPLICATION-PROPERTIES"]
    assert "hello" in table[1]
    assert "world" in table[2]
    assert '{"colour": "red"}' in table[2]
    peeked = json.loads(ok("peek", "cli.q", "--limit", "1", "--json", "--http", http))
    assert [(m["body"], m["application_properties"]) for m in peeked] == [("hello", {})]

    assert ok("purge", "cli.q", "--http", http) == "purged 2 message(s) from cli.q\n"
    assert json.loads(ok("purge", "cli.q", "--json", "--http", http)) == {"purged": 0}


def test_the_url_comes_from_the_environment_and_reset_empties_the_broker(urls: tuple[str, str]) -> None:
    amqp, http = urls
    env = {"MINIBROKER_HTTP_URL": http}
    conn = BlockingConnection(amqp, timeout=5)
    conn.create_sender("cli.reset").send(Message(body="x"))
    assert "cli.reset" in ok("queues", env=env)
    assert ok("reset", env=env) == "reset namespace default\n"
    assert json.loads(ok("queues", "--json", env=env)) == []
    with pytest.raises(Exception, match=r"forced|reset|closed|aborted"):
        conn.create_sender("cli.reset").send(Message(body="y"))
    conn.close()


def test_txns_lists_open_transactions(urls: tuple[str, str]) -> None:
    _amqp, http = urls
    assert ok("txns", "--http", http).splitlines()[0].split() == [
        "TXN-ID",
        "CONNECTION",
        "AGE-S",
        "POSTS",
        "RETIREMENTS",
        "ACQUISITIONS",
        "STATE",
        "FAILED",
    ]
    assert json.loads(ok("txns", "--json", "--http", http)) == []


def test_an_unreachable_broker_is_exit_1_with_a_clear_message() -> None:
    with socket.socket() as sock:  # bound, never listening: nothing answers there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        result = run("queues", "--http", f"http://admin:s3cret@127.0.0.1:{port}")
    assert result.returncode == 1
    assert result.stdout == ""
    assert f"minibroker queues: cannot reach the broker's HTTP API at http://127.0.0.1:{port}" in result.stderr
    assert "s3cret" not in result.stderr


def test_an_error_answer_is_exit_1_with_the_status(urls: tuple[str, str]) -> None:
    _amqp, http = urls
    result = run("peek", "no.such.queue", "--http", http)
    assert result.returncode == 1
    assert "HTTP 404" in result.stderr


def test_bad_arguments_are_exit_2() -> None:
    assert run("peek").returncode == 2  # no QUEUE
    assert run("send", "q", "body", "-p", "novalue").returncode == 2
    result = run("queues", "--http", "ftp://127.0.0.1:1")
    assert result.returncode == 2
    assert "not an http" in result.stderr


def test_namespace_selects_where_the_command_acts(urls: tuple[str, str]) -> None:
    _amqp, http = urls
    created = minibroker.connect(http).create_namespace()
    try:
        ok("send", "ns.q", "inside", "--namespace", created.namespace_name, "--http", http)
        assert [
            q["name"] for q in json.loads(ok("queues", "--json", "--namespace", created.namespace_name, "--http", http))
        ] == ["ns.q"]
        assert "ns.q" not in ok("queues", "--http", http)
        assert created.queue("ns.q").depth == 1
    finally:
        created.drop_namespace()


def test_credentials_come_from_the_options_or_the_environment_and_are_never_printed(tmp_path: Path) -> None:
    config = tmp_path / "users.toml"
    config.write_text('[auth.users]\nadmin = "Xyzzy-9"\n')
    command = [sys.executable, "-m", "minibroker", "--port", "0", "--http-port", "0", "--config", str(config)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            proc.stdout.readline()
            found = HTTP.match(proc.stdout.readline().rstrip("\n"))
            assert found, proc.stderr.read() if proc.stderr else ""
            http = found.group(1)
            refused = run("queues", "--http", http)
            assert refused.returncode == 1
            assert "HTTP 401" in refused.stderr
            assert ok("queues", "--json", "--http", http, "--user", "admin", "--password", "Xyzzy-9") == "[]\n"
            env = {"MINIBROKER_HTTP_USER": "admin", "MINIBROKER_HTTP_PASSWORD": "Xyzzy-9"}
            assert ok("txns", "--json", "--http", http, env=env) == "[]\n"
            wrong = run("reset", "--http", http.replace("://", "://admin:Wrong-7@"))
            assert wrong.returncode == 1
            assert "HTTP 401" in wrong.stderr
            assert "Wrong-7" not in wrong.stderr
        finally:
            proc.terminate()
            proc.wait(10)
