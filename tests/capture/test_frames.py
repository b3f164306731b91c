"""Frame capture (issue 16 §3): every frame in and out, decoded, bounded, from Python and from the HTTP API."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import pytest
from proton import Message
from proton.utils import BlockingConnection

import minibroker
from minibroker.amqp.definitions import Open, SaslInit
from minibroker.amqp.framing import AMQP_HEADER, EMPTY_FRAME, SASL_FRAME, SASL_HEADER, encode_frame
from minibroker.amqp.types import Symbol
from minibroker.cli import build_parser, resolve_config
from minibroker.config import Config, ConfigError
from minibroker.handles import CaptureOff
from minibroker.server.capture import FrameSplitter, describe, redact
from minibroker.testing.thread import ThreadedBroker, run_in_thread
from tests.http.client import call, http_broker

CAPTURING: dict[str, Any] = {"server": {"port": 0}, "broker": {"capture": True}}


@pytest.fixture
def capturing() -> Iterator[ThreadedBroker]:
    with run_in_thread(CAPTURING) as broker:
        yield broker


def send_and_receive(url: str, *, user: str | None = None, expect: str = "hello") -> None:
    """A python-qpid-proton session: send "hello" to "q", receive (``expect``) and accept one message, close."""
    conn = BlockingConnection(url, timeout=10, user=user, password="s3cret" if user else None)
    try:
        conn.create_sender("q").send(Message(body="hello"))
        receiver = conn.create_receiver("q")
        assert receiver.receive(timeout=10).body == expect
        receiver.accept()
    finally:
        conn.close()


def finished(broker: ThreadedBroker) -> None:
    broker.wait_for(lambda: not broker.connections, timeout=10)


def test_the_splitter_gives_the_same_frames_however_the_stream_is_cut() -> None:
    stream = SASL_HEADER + encode_frame(0, SaslInit(mechanism=Symbol("ANONYMOUS")), frame_type=SASL_FRAME)
    stream += AMQP_HEADER + encode_frame(0, Open(container_id="c")) + EMPTY_FRAME
    expected = FrameSplitter().feed(stream)
    assert len(expected) == 5
    rng = random.Random(16)
    for _ in range(50):
        splitter = FrameSplitter()
        cuts = sorted(rng.sample(range(1, len(stream)), 6))
        pieces = []
        for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
            pieces += splitter.feed(stream[start:end])
        assert pieces == expected
    assert [describe(1, 0.0, "in", p)["kind"] for p in expected] == ["header", "sasl", "header", "amqp", "heartbeat"]


def test_garbage_is_kept_as_one_undecodable_piece() -> None:
    splitter = FrameSplitter()
    pieces = splitter.feed(AMQP_HEADER + b"\x00\x00\x00\x02junk") + splitter.feed(b"more")
    assert pieces[0] == AMQP_HEADER
    assert [describe(1, 0.0, "in", p)["kind"] for p in pieces[1:]] == ["undecodable", "undecodable"]


def test_a_plain_password_never_stays_in_a_capture() -> None:
    init = SaslInit(mechanism=Symbol("PLAIN"), initial_response=b"\x00alice\x00s3cret")
    masked = redact(encode_frame(0, init, frame_type=SASL_FRAME))
    assert b"s3cret" not in masked
    assert describe(1, 0.0, "in", masked)["fields"]["initial-response"] == b"\x00alice\x00******".hex()


def test_every_frame_in_and_out_is_recorded_decoded(capturing: ThreadedBroker) -> None:
    send_and_receive(capturing.url, user="alice")
    finished(capturing)
    records = capturing.frames(1)
    assert records == capturing.frames()  # one connection: all of them
    json.dumps(records)  # JSON as it is
    assert "s3cret" not in json.dumps(records)
    assert b"s3cret".hex() not in json.dumps(records)
    seen = [(r["direction"], r["kind"], r["performative"]) for r in records if r["kind"] != "heartbeat"]
    assert seen[:5] == [
        ("in", "header", None),
        ("out", "header", None),
        ("out", "sasl", "sasl-mechanisms"),
        ("in", "sasl", "sasl-init"),
        ("out", "sasl", "sasl-outcome"),
    ]
    performatives = [(d, p) for d, _k, p in seen]
    for expected in [("in", "open"), ("out", "open"), ("in", "attach"), ("out", "attach"), ("in", "transfer")]:
        assert expected in performatives
    assert performatives[-2:] == [("in", "close"), ("out", "close")]
    sent = next(r for r in records if r["direction"] == "in" and r["performative"] == "transfer")
    delivered = next(r for r in records if r["direction"] == "out" and r["performative"] == "transfer")
    assert sent["payload_size"] == delivered["payload_size"] > 0
    assert delivered["fields"]["delivery-tag"] == "0000000000000001"  # binary as hex
    broker_open = next(r for r in records if r["direction"] == "out" and r["performative"] == "open")
    assert broker_open["fields"]["container-id"] == "minibroker"
    assert "ANONYMOUS-RELAY" in broker_open["fields"]["offered-capabilities"]  # symbols as strings
    attach = next(r for r in records if r["direction"] == "out" and r["performative"] == "attach")
    assert attach["fields"]["target"]["@type"] == "target"  # described types by name
    accepted = next(r for r in records if r["direction"] == "in" and r["performative"] == "disposition")
    assert accepted["fields"]["state"] == {"@type": "accepted"}
    times = [r["time"] for r in records]
    assert times == sorted(times)
    assert all(abs(t - times[0]) < 60 for t in times)
    assert all(r["connection"] == 1 for r in records)
    assert bytes.fromhex(records[0]["raw"]) == SASL_HEADER


def test_capture_keeps_the_last_frames_and_counts_the_dropped(tmp_path: Any) -> None:
    with run_in_thread({**CAPTURING, "broker": {"capture": True, "capture_limit": 4}}) as broker:
        send_and_receive(broker.url)
        finished(broker)
        capture = broker.capture(1)
        assert capture is not None
        assert len(capture["frames"]) == 4
        assert capture["dropped"] > 10
        assert capture["closed"] is True
        assert capture["frames"][-1]["performative"] == "close"
        assert capture["client"].startswith("127.0.0.1:")
        assert capture["server"] == f"127.0.0.1:{broker.port}"


def test_capture_is_off_by_default_and_says_so() -> None:
    with run_in_thread({"server": {"port": 0}}) as broker:
        send_and_receive(broker.url)
        with pytest.raises(CaptureOff, match=r"--capture or \[broker\] capture = true"):
            broker.frames()
        with pytest.raises(CaptureOff):
            broker.pcap()


def test_an_unknown_connection_is_a_lookup_error(capturing: ThreadedBroker) -> None:
    with pytest.raises(LookupError, match="no captured connection 7"):
        capturing.frames(7)
    assert capturing.capture(7) is None


def test_the_config_and_the_command_line_turn_it_on() -> None:
    assert Config.from_dict({"broker": {"capture": True, "capture_limit": 10}}).broker.capture_limit == 10
    with pytest.raises(ConfigError, match=r"broker\.capture_limit: must be at least 1"):
        Config.from_dict({"broker": {"capture": True, "capture_limit": 0}})
    with pytest.raises(ConfigError, match=r"broker\.capture: expected true or false"):
        Config.from_dict({"broker": {"capture": "yes"}})
    assert Config().broker.capture is False
    assert resolve_config(build_parser().parse_args(["--capture"]), {}).broker.capture is True


def test_the_http_api_serves_a_connections_frames() -> None:
    with http_broker(broker={"capture": True}) as broker:
        send_and_receive(broker.url)
        finished(broker)
        answer = call(broker, "GET", "/api/connections/1/frames")
        assert answer.status == 200
        body = answer.json
        assert body["connection"] == 1
        assert body["closed"] is True
        assert body["dropped"] == 0
        assert body["frames"] == json.loads(json.dumps(broker.frames(1)))
        assert call(broker, "GET", "/api/frames").json == body["frames"]
        assert call(broker, "GET", "/api/connections/99/frames").status == 404
        assert call(broker, "GET", "/api/connections/x/frames").status == 400
        pcap = call(broker, "GET", "/api/capture.pcap")
        assert pcap.status == 200
        assert pcap.headers["content-type"] == "application/vnd.tcpdump.pcap"
        assert pcap.body == broker.pcap()
        remote = minibroker.connect(broker.http_url or "")
        assert remote.frames(1) == body["frames"]
        assert remote.frames() == body["frames"]
        assert remote.pcap() == pcap.body
        with pytest.raises(LookupError):
            remote.frames(99)


def test_the_http_api_says_when_capture_is_off() -> None:
    with http_broker() as broker:
        answer = call(broker, "GET", "/api/connections/1/frames")
        assert answer.status == 409
        assert "capture is off" in answer.json["error"]
        assert call(broker, "GET", "/api/capture.pcap").status == 409


@pytest.mark.timeout(30)
def test_the_readme_example_runs(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_readme_examples import python_block

    monkeypatch.chdir(tmp_path)
    exec(compile(python_block("### Frame capture and replay"), "README.md (capture)", "exec"), {})
    assert json.loads((tmp_path / "orders.json").read_text())["connection"] == 1
    assert (tmp_path / "orders.pcap").read_bytes()[:4] == b"\xd4\xc3\xb2\xa1"


def test_a_connection_keeps_at_most_its_byte_budget_of_frames() -> None:
    """Large transfers cannot make a capture hold more than ``byte_limit`` bytes: the oldest frames go (and are
    counted), whatever ``capture_limit`` allows."""
    from minibroker.server.capture import ConnectionCapture

    capture = ConnectionCapture(1, limit=10000, byte_limit=100_000)
    frame = (40_000).to_bytes(4, "big") + bytes([2, 0, 0, 0]) + b"\x00" * (40_000 - 8)
    for _ in range(10):
        capture.sent(frame, 0.0)
    assert capture.bytes <= 100_000
    assert len(capture.frames) == 2
    assert capture.dropped == 8
