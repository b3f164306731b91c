"""The pcap of captured frames, read by Debian's tshark, and ``minibroker replay`` of a captured session.

tshark comes from Debian (``apt-get install tshark``): when it is missing, the session fixture installs it, as the
console's test does chromium; when it cannot be installed, the test fails saying why (never a skip).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from proton import Message

from minibroker.amqp.framing import EMPTY_FRAME, SASL_HEADER
from minibroker.server.capture import ConnectionCapture
from minibroker.server.pcap import PcapError, read_pcap, write_pcap
from minibroker.testing.thread import ThreadedBroker, run_in_thread
from tests.capture.test_frames import CAPTURING, finished, send_and_receive
from tests.integration.helpers import run
from tests.integration.test_transactions_proton import SendInTransactions

APT_TIMEOUT = 600.0
ROOT = Path(__file__).parents[2]
pytestmark = pytest.mark.timeout(2 * APT_TIMEOUT + 60)


def _install_tshark() -> str | None:
    """Install Debian's tshark; the reason it could not, or None."""
    if shutil.which("apt-get") is None:
        return "no apt-get to install Debian's tshark with"
    if os.geteuid() != 0:
        return "not root: cannot apt-get install tshark"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    lock = ["-o", "DPkg::Lock::Timeout=120"]
    for command in (["apt-get", "update", "-q", *lock], ["apt-get", "install", "-y", "-q", *lock, "tshark"]):
        try:
            subprocess.run(command, env=env, capture_output=True, text=True, timeout=APT_TIMEOUT, check=True)
        except subprocess.TimeoutExpired:
            return f"{' '.join(command[:2])} took over {APT_TIMEOUT:.0f} s"
        except subprocess.CalledProcessError as exc:
            return f"{' '.join(command[:2])} failed ({exc.returncode}): {exc.stderr.strip()[-300:]}"
    return None


@pytest.fixture(scope="session")
def tshark() -> str:
    """The path of Debian's tshark, installed if need be; the test fails, with why, if it cannot be."""
    with (Path(tempfile.gettempdir()) / "minibroker-tshark-install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if shutil.which("tshark") is None:
            reason = _install_tshark()
            if reason is not None:
                pytest.fail(f"Debian's tshark is not installed and cannot be: {reason}")
    path = shutil.which("tshark")
    assert path is not None, "tshark installed, yet not on PATH"
    return path


def transactional_session(broker: ThreadedBroker) -> None:
    """python-qpid-proton: two transactions posting to "q" (one committed, one rolled back); then another
    connection sends "hello" and receives the committed message."""
    scenario = SendInTransactions(broker.url, ["q"], [True, False])
    run(scenario)
    assert scenario.outcomes == ["committed", "aborted"]
    send_and_receive(broker.url, expect="txn1-q")
    finished(broker)


def test_tshark_reads_the_pcap_as_amqp(tshark: str, tmp_path: Path) -> None:
    with run_in_thread(CAPTURING) as broker:
        transactional_session(broker)
        path = tmp_path / "capture.pcap"
        broker.write_pcap(path)
        port = broker.port
    fields = ["amqp.performative", "amqp.performative.arguments.containerId"]
    fields += ["amqp.performative.arguments.address.string", "amqp.performative.arguments.deliveryId"]
    fields += ["amqp.performative.arguments.settled", "amqp.performative.arguments.first", "tcp.srcport"]
    command = [tshark, "-r", str(path), "-d", f"tcp.port=={port},amqp", "-T", "fields", "-E", "separator=|"]
    result = subprocess.run(
        [*command, *(arg for field in fields for arg in ("-e", field))],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    rows = [line.split("|") for line in result.stdout.splitlines() if line.split("|")[0]]
    # tshark lists a packet's fields comma-separated when it holds several frames; ours hold one each
    by_code: dict[str, list[list[str]]] = {}
    for row in rows:
        by_code.setdefault(row[0], []).append(row)
    opens, attaches, transfers, dispositions = (by_code.get(code, []) for code in ("16", "18", "20", "21"))
    assert any(row[1] == "minibroker" and row[6] == str(port) for row in opens)  # the broker's open
    assert any(row[2] == "q" for row in attaches)
    assert any(row[2] == "" for row in attaches)  # the coordinator's target has no address
    assert len(transfers) >= 5  # 2 declares, 2 posts, 2 discharges, a send and a delivery
    assert any(row[3] == "0" and row[6] == str(port) for row in transfers)  # delivery-id 0 from the broker
    assert any(row[4] == "1" and row[5] == "0" for row in dispositions)  # settled, first=0
    verbose = subprocess.run(
        [tshark, "-r", str(path), "-d", f"tcp.port=={port},amqp", "-V", "-Y", "amqp.performative == 21"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "Declared" in verbose  # the answer to a declare, decoded
    assert "Accepted" in verbose


def test_the_pcap_reads_back_into_the_same_frames() -> None:
    with run_in_thread(CAPTURING) as broker:
        send_and_receive(broker.url)
        finished(broker)
        streams = read_pcap(broker.pcap())
        records = broker.frames(1)
        capture = broker.capture(1)
    assert capture is not None
    assert len(streams) == 1
    assert f"{streams[0].client[0]}:{streams[0].client[1]}" == capture["client"]
    assert [(d, raw.hex()) for _t, d, raw in streams[0].frames] == [(r["direction"], r["raw"]) for r in records]


# -- replay ------------------------------------------------------------------------------------------------------
def replay(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "minibroker", "replay", *args], capture_output=True, text=True, env=env, timeout=60
    )


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A python-qpid-proton session with transactions, captured: its JSON per connection, and the pcap."""
    folder = tmp_path_factory.mktemp("captured")
    with run_in_thread(CAPTURING) as broker:
        transactional_session(broker)
        files = {"pcap": folder / "session.pcap"}
        broker.write_pcap(files["pcap"])
        for conn in (1, 2):
            files[f"json{conn}"] = folder / f"connection-{conn}.json"
            files[f"json{conn}"].write_text(json.dumps(broker.capture(conn)))
    return files


@pytest.mark.parametrize("form", ["json", "pcap"])
def test_replay_against_a_fresh_broker_gives_the_same_answers(captured: dict[str, Path], form: str) -> None:
    # connection 2 takes the message connection 1 committed: replayed in the same order, the answers are the same
    with run_in_thread({"server": {"port": 0}}) as fresh:
        for conn in (1, 2):
            args = (
                [str(captured[f"json{conn}"])] if form == "json" else [str(captured["pcap"]), "--connection", str(conn)]
            )
            result = replay(*args, "--url", fresh.url)
            assert result.returncode == 0, result.stdout + result.stderr
            assert "the same answers" in result.stdout
            # the committed message arrived, the rolled-back one did not; then "hello" came and "txn1-q" went
            assert [m.body for m in fresh.queue("q").peek()] == ["txn1-q" if conn == 1 else "hello"]


def test_replay_substitutes_the_txn_ids_another_broker_declares(captured: dict[str, Path]) -> None:
    # artemis's txn-ids are longer than minibroker's: the client's frames are encoded again with them
    with run_in_thread({"server": {"port": 0}, "broker": {"personality": "artemis"}}) as other:
        result = replay(str(captured["json1"]), "--url", other.url)
        assert result.returncode == 0, result.stdout + result.stderr
        assert other.queue("q").depth == 1


def test_replay_against_a_broker_configured_differently_shows_the_difference(captured: dict[str, Path]) -> None:
    config: dict[str, Any] = {"server": {"port": 0}, "queues": {"q": {"max_messages": 1}}}
    with run_in_thread(config) as full:
        full.post("q", bytes(Message(body="already there").encode()))
        result = replay(str(captured["json1"]), "--url", full.url)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "minibroker replay: the broker answered differently:"
    assert "--- captured broker" in lines
    assert "+++ replayed broker" in lines
    changed = [line for line in lines if line.startswith(("-disposition", "+disposition"))]
    assert any("amqp:resource-limit-exceeded" in line for line in changed if line.startswith("+"))
    assert any('"txn-id": "<txn-1>"' in line for line in changed)


def test_replay_of_a_bad_capture_or_url_exits_2(captured: dict[str, Path], tmp_path: Path) -> None:
    url = "amqp://127.0.0.1:1"
    cases: dict[str, str | bytes | None] = {
        "missing.json": None,
        "bad.json": "{not json",
        "wrong.json": '{"frames": [{"direction": "sideways", "raw": "00"}]}',
        "empty.json": "[]",
        "cut.pcap": captured["pcap"].read_bytes()[:100],
    }
    for name, text in cases.items():
        path = tmp_path / name
        if isinstance(text, bytes):
            path.write_bytes(text)
        elif text is not None:
            path.write_text(text)
        result = replay(str(path), "--url", url)
        assert result.returncode == 2, (name, result.stderr)
        assert result.stderr.startswith("minibroker replay: "), result.stderr
    several = replay(str(captured["pcap"]), "--url", url)
    assert several.returncode == 2
    assert "several connections (1, 2): pick one with --connection" in several.stderr
    unreachable = replay(str(captured["json1"]), "--url", url)
    assert unreachable.returncode == 2
    assert "cannot connect to 127.0.0.1:1" in unreachable.stderr
    assert replay(str(captured["json1"]), "--url", "http://127.0.0.1:8672").returncode == 2
    assert replay(str(captured["json1"])).returncode == 2  # no --url


@pytest.mark.parametrize(
    ("client", "server"),
    [(("::1", 40001), ("::1", 5672)), (("127.0.0.1", 40002), ("::1", 5672)), (None, None)],
)
def test_ipv6_mixed_and_socketless_connections_read_back(
    client: tuple[str, int] | None, server: tuple[str, int] | None
) -> None:
    capture = ConnectionCapture(3, 100, client, server)
    capture.received(SASL_HEADER[:5], 1.0)
    capture.received(SASL_HEADER[5:] + EMPTY_FRAME, 1.5)
    capture.sent(SASL_HEADER + EMPTY_FRAME * 2, 2.0)
    capture.closed = True
    (stream,) = read_pcap(write_pcap([capture]))
    assert [(t, d, raw) for t, d, raw in stream.frames] == [
        (1.5, "in", SASL_HEADER),
        (1.5, "in", EMPTY_FRAME),
        (2.0, "out", SASL_HEADER),
        (2.0, "out", EMPTY_FRAME),
        (2.0, "out", EMPTY_FRAME),
    ]
    if client is not None and server is not None and client[0] == server[0]:
        assert (stream.client, stream.server) == (client, server)
    elif client is not None:
        assert stream.client == ("::ffff:7f00:1", 40002)  # one IP version per packet: v4 mapped into v6


def test_a_file_that_is_no_pcap_of_ours_is_refused() -> None:
    with pytest.raises(PcapError, match="not a classic pcap"):
        read_pcap(b"\x0a\x0d\x0d\x0a" + bytes(40))  # pcapng
    capture = ConnectionCapture(1, 10, None, None)
    capture.received(SASL_HEADER, 1.0)
    data = write_pcap([capture])
    with pytest.raises(PcapError, match="cut short"):
        read_pcap(data[:-3])
    with pytest.raises(PcapError, match="link type 113"):
        read_pcap(data[:20] + (113).to_bytes(4, "little") + data[24:])


def test_replay_authenticates_with_the_urls_credentials(tmp_path: Path) -> None:
    users: dict[str, Any] = {"server": {"port": 0}, "auth": {"users": {"alice": "s3cret"}, "failure_delay": 0.0}}
    with run_in_thread({**users, "broker": {"capture": True}}) as broker:
        send_and_receive(broker.url, user="alice")
        finished(broker)
        path = tmp_path / "alice.json"
        path.write_text(json.dumps(broker.capture(1)))
    assert "s3cret" not in path.read_text()  # the password was masked: the capture alone cannot log in
    with run_in_thread(users) as other:
        host_port = other.url.removeprefix("amqp://")
        assert replay(str(path), "--url", f"amqp://alice:s3cret@{host_port}").returncode == 0
        refused = replay(str(path), "--url", other.url)
        assert refused.returncode == 1
        assert '-sasl-outcome channel=0 {"code": 0}' in refused.stdout
        assert '+sasl-outcome channel=0 {"code": 1}' in refused.stdout
