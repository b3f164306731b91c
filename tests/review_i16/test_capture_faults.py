"""Review of issue 16: frame capture meeting fault injection: a connection cut by ``lose-outcome`` (no close
frame) is captured as closed, its pcap still decodes in tshark, and its replay neither crashes nor hangs."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from minibroker.amqp.definitions import AmqpValue, Discharge
from minibroker.server.pcap import read_pcap
from minibroker.testing import frames
from minibroker.testing.peer import ScriptedPeer
from minibroker.testing.thread import ThreadedBroker, run_in_thread
from tests.capture.test_frames import CAPTURING
from tests.capture.test_pcap_and_replay import replay
from tests.http.client import open_transaction

ROOT = Path(__file__).parents[2]


def lost_commit(broker: ThreadedBroker) -> None:
    """A scripted client declares, posts to ``staging`` and commits; ``lose-outcome`` applies the commit and
    cuts the connection with no answer."""
    broker.faults.add("discharge", "lose-outcome")
    with ScriptedPeer.connect("127.0.0.1", broker.port) as peer:
        txn_id = open_transaction(peer, container_id="orders-app")
        peer.transfer(0, 1, frames.message(AmqpValue(Discharge(txn_id=txn_id, fail=False))))
        peer.expect_closed()
    broker.wait_for(lambda: not broker.connections)
    broker.wait_for(queue="staging", depth=1)
    # the capture is marked closed when the connection's task ends, a moment after the core forgot it
    broker.wait_for(lambda: (broker.capture(1) or {}).get("closed") is True, timeout=10)


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("cut")
    with run_in_thread(CAPTURING) as broker:
        lost_commit(broker)
        capture = broker.capture(1)
        assert capture is not None
        files = {"json": folder / "cut.json", "pcap": folder / "cut.pcap"}
        files["json"].write_text(json.dumps(capture))
        broker.write_pcap(files["pcap"])
        files["port"] = Path(str(broker.port))
    return files


def test_a_dropped_connection_is_captured_closed_with_its_last_frame_in(captured: dict[str, Path]) -> None:
    """The capture of a connection a fault cut: ``closed``, the discharge the last frame in, no close frame out."""
    capture = json.loads(captured["json"].read_text())
    assert capture["closed"] is True
    amqp = [(f["direction"], f["performative"]) for f in capture["frames"] if f["kind"] == "amqp"]
    assert amqp[-1] == ("in", "transfer")
    assert ("out", "close") not in amqp
    streams = read_pcap(captured["pcap"].read_bytes())
    assert len(streams) == 1
    assert [r["raw"] for r in capture["frames"]] == [raw.hex() for _t, _d, raw in streams[0].frames]


def test_tshark_decodes_the_cut_connection_without_errors(captured: dict[str, Path]) -> None:
    """tshark reads the pcap of the cut connection: no malformed packet, and the FIN is there. (tshark's AMQP
    dissector reports every amqp-value holding a described type, such as a discharge, as "Unknown AMQP type 0":
    its own limit, the same for any client's declare or discharge, so expert errors are not checked.)"""
    tshark = shutil.which("tshark")
    if tshark is None:
        pytest.skip("no tshark")
    port = captured["port"].name
    result = subprocess.run(
        [tshark, "-r", str(captured["pcap"]), "-d", f"tcp.port=={port},amqp", "-z", "expert,error", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "Malformed" not in result.stdout + result.stderr
    listing = subprocess.run(
        [tshark, "-r", str(captured["pcap"]), "-d", f"tcp.port=={port},amqp"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "FIN" in listing


def test_replay_of_a_cut_session_against_the_same_fault_is_the_same(captured: dict[str, Path]) -> None:
    """Replayed against a broker with the same ``lose-outcome`` rule, the answers are the same (exit 0): the fault
    became a regression test."""
    with run_in_thread({"server": {"port": 0}}) as fresh:
        fresh.faults.add("discharge", "lose-outcome")
        result = replay(str(captured["json"]), "--url", fresh.url)
        assert result.returncode == 0, result.stdout + result.stderr
        assert fresh.queue("staging").depth == 1


def test_replay_of_a_cut_session_without_the_fault_shows_the_answer(captured: dict[str, Path]) -> None:
    """Replayed against a broker without the rule, the broker answers the discharge: exit 1, and the diff shows
    the extra disposition (never exit 2, never a hang)."""
    with run_in_thread({"server": {"port": 0}}) as fresh:
        result = replay(str(captured["json"]), "--url", fresh.url)
        assert result.returncode == 1, result.stdout + result.stderr
        assert any(line.startswith("+disposition") for line in result.stdout.splitlines()), result.stdout
        assert fresh.queue("staging").depth == 1
