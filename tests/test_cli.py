"""The command line (DESIGN §2): the listening line, clean exit on signals, exit 2 on bad input,
environment variables and their precedence, and --trace-frames."""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from proton import Message
from proton.utils import BlockingConnection

from minibroker import serve
from minibroker.amqp.definitions import Close
from minibroker.amqp.errors import Condition
from minibroker.broker.personality import get, names
from minibroker.cli import build_parser, resolve_config
from minibroker.testing.peer import ScriptedPeer

ROOT = Path(__file__).parent.parent
LISTENING = re.compile(r"^minibroker listening on amqp://127\.0\.0\.1:(\d+)$")


@contextmanager
def broker_process(*args: str, env: dict[str, str] | None = None) -> Iterator[tuple[subprocess.Popen[str], int]]:
    command = [sys.executable, "-m", "minibroker", *args]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **(env or {})},
    ) as proc:  # fmt: skip
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline().rstrip("\n")
            match = LISTENING.match(line)
            assert match, f"unexpected first line {line!r}; stderr: {proc.stderr.read() if proc.stderr else ''}"
            yield proc, int(match.group(1))
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


def _round_trip(port: int) -> None:
    conn = BlockingConnection(f"127.0.0.1:{port}", timeout=5)
    try:
        conn.create_sender("orders").send(Message(body="hello"))
        receiver = conn.create_receiver("orders")
        assert receiver.receive(timeout=5).body == "hello"
        receiver.accept()
    finally:
        conn.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serves_then_exits_zero_on_signal(sig: signal.Signals) -> None:
    """... and a client still connected is told why: a close with amqp:connection:forced before its socket ends."""
    with broker_process("--port", "0") as (proc, port), ScriptedPeer.connect("127.0.0.1", port) as peer:
        assert port != 0
        _round_trip(port)
        peer.open()
        proc.send_signal(sig)
        close = peer.expect(Close)
        assert close.error is not None
        assert close.error.condition == Condition.CONNECTION_FORCED
        assert proc.wait(10) == 0
        assert proc.stdout is not None
        assert proc.stdout.read() == "", "only one line may be printed to stdout"


def test_console_script_is_installed() -> None:
    script = shutil.which("minibroker")
    assert script is not None
    result = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=20, check=False)
    assert result.returncode == 0
    assert "--trace-frames" in result.stdout


def test_environment_port_and_cli_precedence() -> None:
    with broker_process(env={"MINIBROKER_PORT": "0", "MINIBROKER_HOST": "127.0.0.1"}) as (proc, port):
        _round_trip(port)
        proc.terminate()
        assert proc.wait(10) == 0


def test_cli_beats_config_file(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[server]\nport = 1\n")  # a port we could not bind: the command line must win
    with broker_process("--config", str(config), "--port", "0") as (proc, _port):
        proc.terminate()
        assert proc.wait(10) == 0


def _exits_2(args: list[str], env: dict[str, str], expected: str) -> subprocess.CompletedProcess[str]:
    """Run ``minibroker ARGS`` with ``env`` added; assert it exits 2 naming ``expected`` on stderr."""
    result = subprocess.run(
        [sys.executable, "-m", "minibroker", *args], capture_output=True, text=True, timeout=20,
        env={**os.environ, **env}, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert expected in result.stderr
    return result


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["--port", "x"], {}, "--port"),
        (["--port", "70000"], {}, "--port"),
        (["--log-level", "loud"], {}, "--log-level"),
        (["--bogus"], {}, "unrecognized arguments"),
        ([], {"MINIBROKER_PORT": "nope"}, "MINIBROKER_PORT"),
        (["--clock", "sundial"], {}, "--clock"),
        ([], {"MINIBROKER_CLOCK": "sundial"}, "MINIBROKER_CLOCK"),
    ],
)
def test_bad_arguments_exit_2(args: list[str], env: dict[str, str], expected: str) -> None:
    result = _exits_2(args, env, expected)
    assert result.stdout == ""


def test_bad_config_exits_2_naming_file_and_key(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[server]\nport = -5\n")
    for args, env in ((["--config", str(config)], {}), ([], {"MINIBROKER_CONFIG": str(config)})):
        result = subprocess.run(
            [sys.executable, "-m", "minibroker", *args], capture_output=True, text=True, timeout=20,
            env={**os.environ, **env}, check=False,
        )  # fmt: skip
        assert result.returncode == 2
        assert str(config) in result.stderr
        assert "server.port" in result.stderr


def test_trace_frames_prints_decoded_frames_without_credentials() -> None:
    with broker_process("--port", "0", "--trace-frames") as (proc, port):
        conn = BlockingConnection(f"127.0.0.1:{port}", timeout=5, user="alice", password="s3cret-pw")
        conn.create_sender("orders").send(Message(body="traced"))
        conn.close()
        proc.terminate()
        assert proc.wait(10) == 0
        assert proc.stderr is not None
        trace = proc.stderr.read()
    assert re.search(r"\[1\]:0 <- @open\(16\) \[container-id=", trace)
    assert re.search(r"\[1\]:0 -> @open\(16\) \[container-id=\"minibroker\"", trace)
    assert re.search(r"<- @transfer\(20\) \[handle=0, delivery-id=0, .*\] \(\d+ bytes\)", trace)
    assert "-> @disposition(21) [role=true, first=0, settled=true, state=@accepted(36) []]" in trace
    assert "s3cret-pw" not in trace
    assert "sasl-init" in trace


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (["--personality", "nobody"], {}, "--personality"),
        ([], {"MINIBROKER_PERSONALITY": "nobody"}, "MINIBROKER_PERSONALITY"),
    ],
)
def test_an_unknown_personality_exits_2_listing_the_known_ones(
    args: list[str], env: dict[str, str], expected: str
) -> None:
    result = _exits_2(args, env, expected)
    assert "'nobody'" in result.stderr
    for name in names():
        assert name in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("args", "env", "in_file", "expected"),
    [
        ([], {}, None, "minibroker"),
        ([], {}, "strict", "strict"),
        ([], {"MINIBROKER_PERSONALITY": "strict"}, "minibroker", "strict"),
        (["--personality", "minibroker"], {"MINIBROKER_PERSONALITY": "strict"}, "strict", "minibroker"),
        (["--personality", "strict"], {}, None, "strict"),
    ],
)
def test_personality_precedence_command_line_environment_file_default(
    tmp_path: Path, args: list[str], env: dict[str, str], in_file: str | None, expected: str
) -> None:
    if in_file is not None:
        config = tmp_path / "c.toml"
        config.write_text(f'[broker]\npersonality = "{in_file}"\n')
        args = [*args, "--config", str(config)]
    resolved = resolve_config(build_parser().parse_args(args), env)
    assert resolved.broker.personality == expected


@pytest.mark.parametrize(
    ("args", "env"), [(["--personality", "strict"], {}), ([], {"MINIBROKER_PERSONALITY": "strict"})]
)
def test_a_broker_started_with_a_personality_has_it(args: list[str], env: dict[str, str]) -> None:
    with broker_process("--port", "0", "--http-port", "0", *args, env=env) as (proc, port):
        assert proc.stdout is not None
        http_line = proc.stdout.readline().rstrip("\n")
        assert http_line.startswith("minibroker http on http://"), http_line
        http_url = http_line.removeprefix("minibroker http on ")
        with urllib.request.urlopen(f"{http_url}/api/info", timeout=5) as answer:
            info = json.load(answer)
        assert info["personality"] == "strict"
        assert info["url"] == f"amqp://127.0.0.1:{port}"
        _round_trip(port)
        proc.terminate()
        assert proc.wait(10) == 0


def test_personalities_prints_each_with_its_quirks_and_exits_0() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "minibroker", "personalities"], capture_output=True, text=True, timeout=20, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "\n\n".join(get(name).describe() for name in names()) + "\n"
    headings = [line.split(":", 1)[0] for line in result.stdout.splitlines() if line and not line.startswith(" ")]
    assert headings == names()
    assert "minibroker personalities" in (build_parser().epilog or "")


def test_personalities_takes_no_arguments() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "minibroker", "personalities", "strict"], capture_output=True, text=True, timeout=20,
        check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "usage: minibroker personalities" in result.stderr
    assert "unrecognized arguments: strict" in result.stderr


@pytest.mark.parametrize(
    ("args", "env", "in_file", "expected"),
    [
        ([], {}, None, "real"),
        ([], {}, "virtual", "virtual"),
        ([], {"MINIBROKER_CLOCK": "virtual"}, "real", "virtual"),
        (["--clock", "real"], {"MINIBROKER_CLOCK": "virtual"}, "virtual", "real"),
        (["--clock", "virtual"], {}, None, "virtual"),
    ],
)
def test_clock_precedence_command_line_environment_file_default(
    tmp_path: Path, args: list[str], env: dict[str, str], in_file: str | None, expected: str
) -> None:
    if in_file is not None:
        config = tmp_path / "c.toml"
        config.write_text(f'[broker]\nclock = "{in_file}"\n')
        args = [*args, "--config", str(config)]
    assert resolve_config(build_parser().parse_args(args), env).broker.clock == expected


def test_a_broker_started_with_a_virtual_clock_is_advanced_over_http() -> None:
    with broker_process("--port", "0", "--http-port", "0", "--clock", "virtual") as (proc, port):
        assert proc.stdout is not None
        http_url = proc.stdout.readline().rstrip("\n").removeprefix("minibroker http on ")
        with urllib.request.urlopen(f"{http_url}/api/clock", timeout=5) as answer:
            clock = json.load(answer)
        assert clock["mode"] == "virtual"
        request = urllib.request.Request(
            f"{http_url}/api/clock/advance", data=b'{"seconds": 3600}', headers={"content-type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=5) as answer:
            assert json.load(answer)["now"] == pytest.approx(clock["now"] + 3600)
        _round_trip(port)
        proc.terminate()
        assert proc.wait(10) == 0


WATCH_COLLECTOR = """
import gc, importlib, os, signal, sys, threading, time
program = importlib.import_module(sys.argv[1])

def watch():
    before = gc.get_threshold()
    deadline = time.monotonic() + 20
    while gc.get_threshold() == before and time.monotonic() < deadline:
        time.sleep(0.01)
    print("collector", *gc.get_threshold(), gc.get_freeze_count(), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)

threading.Thread(target=watch, daemon=True).start()
sys.exit(program.main(["--port", "0", "--log-level", "warning"]))
"""


@pytest.mark.parametrize("program", ["minibroker.cli", "bench.introspect"])
def test_the_broker_process_tunes_the_collector_once_it_serves(program: str) -> None:
    """``python -m minibroker`` (cli.main) freezes what start-up made and collects the youngest generation every
    10,000 allocations (``tune_collector``); an application embedding the broker keeps its own settings. The broker
    whose leaks ``bench.soak`` reads (``bench.introspect``) runs on the same settings. (stdin stays open: the end of
    it stops ``bench.introspect``.)"""
    command = [sys.executable, "-c", WATCH_COLLECTOR, program]
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT) as proc:
        assert proc.stdout is not None
        listening, collector = proc.stdout.readline().strip(), proc.stdout.readline()
        assert proc.wait(30) == 0
    assert LISTENING.match(listening)
    _, young, middle, old, frozen = collector.split()
    assert (int(young), int(middle), int(old)) == (10_000, 10, 10)
    assert int(frozen) > 10_000  # trio, minibroker and the configured broker


async def test_an_embedded_broker_leaves_the_collector_alone() -> None:
    threshold, frozen = gc.get_threshold(), gc.get_freeze_count()
    async with serve({"server": {"port": 0}}):
        pass
    assert (gc.get_threshold(), gc.get_freeze_count()) == (threshold, frozen)
