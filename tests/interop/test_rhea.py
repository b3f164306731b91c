"""rhea (the JavaScript AMQP 1.0 client) against the real broker, alone and with python-qpid-proton.

Each test starts a broker in a thread and drives rhea through ``rhea_client.js`` (see its header for the
spec and the typed JSON it reads and prints). Values are checked with their AMQP types where the
receiving client shows them: proton's Python types, and rhea's JSON tags for binaries and data sections.
"""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Iterator
from typing import Any, Protocol

import pytest
from proton import Delivery, Message, int32, symbol, uint
from proton.utils import BlockingConnection

from minibroker.testing.thread import ThreadedBroker, run_in_thread

pytestmark = pytest.mark.timeout(20, func_only=True)  # the one-time npm install is outside this bound


class Rhea(Protocol):
    """The ``rhea`` fixture: play one scenario of ``rhea_client.js``, return the JSON lines it printed."""

    def __call__(self, scenario: str, **spec: Any) -> list[dict[str, Any]]: ...

    def run(self, spec: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        """Run the script for ``spec`` whatever its exit code."""
        ...


@pytest.fixture
def broker() -> Iterator[ThreadedBroker]:
    """A broker with the topic ``news`` declared in its config."""
    with run_in_thread({"server": {"port": 0}, "topics": {"news": {}}}) as running:
        yield running


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def received(lines: list[dict[str, Any]], receiver: int = 0) -> list[dict[str, Any]]:
    """The messages one receiver printed, in arrival order."""
    return [line for line in lines if "body" in line and line["receiver"] == receiver]


def sent_outcomes(lines: list[dict[str, Any]]) -> list[str]:
    return [line["outcome"] for line in lines if "sent" in line]


# -- python-qpid-proton, the other client ---------------------------------------------------------------
PROTON_TIMEOUT = 5.0
"""Upper bound, in seconds, of each blocking proton call."""


def as_bytes(value: Any) -> bytes:
    """A binary value as proton hands it out (``bytes`` or a ``memoryview``) as ``bytes``."""
    assert isinstance(value, bytes | memoryview), f"not a binary: {value!r}"
    return bytes(value)


def send_with_proton(broker: ThreadedBroker, address: str, messages: list[Message]) -> None:
    """Send ``messages`` to ``address`` with a proton ``BlockingConnection``; each must be accepted."""
    conn = BlockingConnection(broker.url, timeout=PROTON_TIMEOUT)
    try:
        sender = conn.create_sender(address)
        for message in messages:
            assert sender.send(message).remote_state == Delivery.ACCEPTED
    finally:
        conn.close()


def receive_with_proton(broker: ThreadedBroker, address: str, count: int) -> list[Message]:
    """Receive and accept ``count`` messages from ``address`` with a proton ``BlockingConnection``."""
    messages: list[Message] = []
    conn = BlockingConnection(broker.url, timeout=PROTON_TIMEOUT)
    try:
        receiver = conn.create_receiver(address, credit=count)
        for _ in range(count):
            messages.append(receiver.receive())
            receiver.accept()
    finally:
        conn.close()  # sends the accept dispositions ahead of the close
    return messages


# -- (a) rhea to rhea ---------------------------------------------------------------------------------
def test_rhea_sends_rhea_receives(broker: ThreadedBroker, rhea: Rhea) -> None:
    messages = [
        {
            "body": f"hello {i} from rhea \u2713",
            "subject": f"subject-{i}",
            "message_id": f"rhea-{i}",
            "application_properties": {"color": "red", "n": i, "ratio": 0.5, "flag": i % 2 == 0, "neg": -i - 1},
            "message_annotations": {"x-opt-origin": "rhea"},
        }
        for i in range(3)
    ]
    lines = rhea("send", url=broker.url, address="rhea.roundtrip", messages=messages)
    assert sent_outcomes(lines) == ["accepted"] * 3

    queue = broker.queue("rhea.roundtrip")
    assert queue.depth == 3
    stored = queue.peek()
    assert [m.body for m in stored] == [m["body"] for m in messages]
    assert [m.subject for m in stored] == ["subject-0", "subject-1", "subject-2"]
    assert [m.id for m in stored] == ["rhea-0", "rhea-1", "rhea-2"]
    assert stored[2].properties == {"color": "red", "n": 2, "ratio": 0.5, "flag": True, "neg": -3}

    got = received(rhea("receive", url=broker.url, address="rhea.roundtrip", count=3))
    assert got == [
        {
            "receiver": 0,
            "body": m["body"],
            "subject": m["subject"],
            "message_id": m["message_id"],
            "application_properties": m["application_properties"],
            "message_annotations": m["message_annotations"],
        }
        for m in messages
    ]
    assert queue.depth == 0
    assert queue.acquired == 0


def test_large_message_both_ways(broker: ThreadedBroker, rhea: Rhea) -> None:
    """A 300 KB data section spans several transfer frames (the broker's max-frame-size is 64 KiB)."""
    payload = bytes(range(256)) * 1200
    rhea("send", url=broker.url, address="rhea.large", messages=[{"body": {"$data": b64(payload)}}])
    [message] = receive_with_proton(broker, "rhea.large", 1)
    assert as_bytes(message.body) == payload
    assert message.inferred

    send_with_proton(broker, "rhea.large", [Message(body=payload[::-1], inferred=True)])
    [got] = received(rhea("receive", url=broker.url, address="rhea.large", count=1))
    assert base64.b64decode(got["body"]["$data"]) == payload[::-1]


# -- (b) across clients -------------------------------------------------------------------------------
BINARY = b"\x00\x01binary\xff\xfe\x80"


def test_rhea_sends_proton_receives(broker: ThreadedBroker, rhea: Rhea) -> None:
    body_map = {
        "s": "text \u00e9",
        "n": 7,
        "neg": -3,
        "pi": 3.25,
        "flag": True,
        "none": None,
        "list": [1, "a"],
        "nested": {"bin": {"$binary": b64(BINARY)}, "sym": {"$symbol": "a-symbol"}},
        "big": {"$long": 2**40},
    }
    messages = [
        {"body": "a string from rhea \u2713", "subject": "str", "application_properties": {"kind": "string"}},
        {"body": {"$data": b64(BINARY)}, "subject": "data"},
        {"body": {"$binary": b64(BINARY)}, "subject": "binary-value"},
        {"body": body_map, "subject": "map", "message_id": "rhea-map"},
    ]
    lines = rhea("send", url=broker.url, address="rhea.to.proton", messages=messages)
    assert sent_outcomes(lines) == ["accepted"] * 4

    got = receive_with_proton(broker, "rhea.to.proton", 4)
    assert [m.subject for m in got] == ["str", "data", "binary-value", "map"]

    assert got[0].body == "a string from rhea \u2713"
    assert type(got[0].body) is str
    assert got[0].properties == {"kind": "string"}
    assert not got[0].inferred

    assert as_bytes(got[1].body) == BINARY
    assert got[1].inferred  # a data section, not an amqp-value

    assert as_bytes(got[2].body) == BINARY
    assert not got[2].inferred  # an amqp-value holding a binary

    assert got[3].id == "rhea-map"
    body = got[3].body
    assert isinstance(body, dict)
    assert set(body) == set(body_map)
    assert body["s"] == "text \u00e9"
    # rhea encodes a positive JS integer as uint, a negative one as int
    assert (body["n"], type(body["n"])) == (7, uint)
    assert (body["neg"], type(body["neg"])) == (-3, int32)
    assert (body["pi"], type(body["pi"])) == (3.25, float)
    assert body["flag"] is True
    assert body["none"] is None
    assert body["list"] == [1, "a"]
    assert type(body["list"][0]) is uint
    assert as_bytes(body["nested"]["bin"]) == BINARY
    assert (body["nested"]["sym"], type(body["nested"]["sym"])) == ("a-symbol", symbol)
    assert (body["big"], type(body["big"])) == (2**40, int)
    assert broker.queue("rhea.to.proton").depth == 0


def test_proton_sends_rhea_receives(broker: ThreadedBroker, rhea: Rhea) -> None:
    body_map = {
        "s": "text \u00e9",
        "n": 7,
        "neg": -3,
        "pi": 3.25,
        "flag": False,
        "none": None,
        "bin": BINARY,
        "list": [1, "a", [2]],
        "nested": {"x": "y"},
        symbol("sym-key"): symbol("sym-value"),
    }
    send_with_proton(
        broker,
        "proton.to.rhea",
        [
            Message(
                body="a string from proton \u2713",
                subject="str",
                id="proton-0",
                properties={"kind": "string", "n": 5, "ok": True},
                annotations={symbol("x-opt-origin"): "proton"},
            ),
            Message(body=BINARY, inferred=True, subject="data"),
            Message(body=BINARY, subject="binary-value"),
            Message(body=body_map, subject="map"),
        ],
    )
    got = received(rhea("receive", url=broker.url, address="proton.to.rhea", count=4))
    assert [m["subject"] for m in got] == ["str", "data", "binary-value", "map"]

    assert got[0]["body"] == "a string from proton \u2713"
    assert got[0]["message_id"] == "proton-0"
    assert got[0]["application_properties"] == {"kind": "string", "n": 5, "ok": True}
    assert got[0]["message_annotations"] == {"x-opt-origin": "proton"}

    assert got[1]["body"] == {"$data": b64(BINARY)}  # a data section
    assert got[2]["body"] == {"$binary": b64(BINARY)}  # an amqp-value holding a binary

    assert got[3]["body"] == {
        "s": "text \u00e9",
        "n": 7,
        "neg": -3,
        "pi": 3.25,
        "flag": False,
        "none": None,
        "bin": {"$binary": b64(BINARY)},
        "list": [1, "a", [2]],
        "nested": {"x": "y"},
        "sym-key": "sym-value",
    }
    assert got[3]["application_properties"] is None
    assert broker.queue("proton.to.rhea").depth == 0


# -- (c) topic fan-out --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("address", "capabilities"),
    [
        pytest.param("news", None, id="declared-in-config"),
        pytest.param("topic://alerts", None, id="address-prefix"),
        pytest.param("events", ["topic"], id="topic-capability"),
    ],
)
def test_topic_fan_out(broker: ThreadedBroker, rhea: Rhea, address: str, capabilities: list[str] | None) -> None:
    messages = [{"body": f"bulletin {i}", "application_properties": {"seq": i}} for i in range(5)]
    spec: dict[str, Any] = {"url": broker.url, "address": address, "messages": messages}
    if capabilities is not None:
        spec["capabilities"] = capabilities
    lines = rhea("fanout", **spec)

    assert sent_outcomes(lines) == ["accepted"] * 5
    for receiver in (0, 1):
        got = received(lines, receiver)
        assert [m["body"] for m in got] == [f"bulletin {i}" for i in range(5)], f"receiver {receiver}"
        assert [m["application_properties"] for m in got] == [{"seq": i} for i in range(5)]
    assert len([line for line in lines if "body" in line]) == 10


# -- (d) selectors ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("selector", "matching"),
    [
        pytest.param("color = 'red'", [0, 2, 4], id="string-equality"),
        pytest.param("n > 2 AND color = 'blue'", [3, 5], id="numeric-and"),
        pytest.param("JMSMessageID IN ('ID:m-1', 'ID:m-4')", [1, 4], id="jms-message-id"),
    ],
)
def test_selector(broker: ThreadedBroker, rhea: Rhea, selector: str, matching: list[int]) -> None:
    address = "rhea.selector"
    messages = [
        {
            "body": f"message {i}",
            "message_id": f"ID:m-{i}",
            "application_properties": {"color": "red" if i % 2 == 0 else "blue", "n": i},
        }
        for i in range(6)
    ]
    rhea("send", url=broker.url, address=address, messages=messages)
    queue = broker.queue(address)
    assert queue.depth == 6

    # credit for every message: anything that does not match must stay put, not just wait for credit
    lines = rhea(
        "receive", url=broker.url, address=address, selector=selector, count=len(matching), credit=10, quiet_ms=300
    )
    assert [m["body"] for m in received(lines)] == [f"message {i}" for i in matching]

    others = [i for i in range(6) if i not in matching]
    assert queue.depth == len(others)
    assert queue.acquired == 0
    assert [m.body for m in queue.peek()] == [f"message {i}" for i in others]

    # the rest is still there for a receiver without a selector, in order
    rest = received(rhea("receive", url=broker.url, address=address, count=len(others)))
    assert [m["body"] for m in rest] == [f"message {i}" for i in others]
    assert queue.depth == 0


def test_invalid_selector_is_refused(broker: ThreadedBroker, rhea: Rhea) -> None:
    """A selector that does not parse must not attach a receiver that would deliver everything."""
    rhea("send", url=broker.url, address="rhea.badsel", messages=[{"body": "keep me"}])
    proc = rhea.run(
        {"scenario": "receive", "url": broker.url, "address": "rhea.badsel", "selector": "color = = 'x'", "count": 1}
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "receiver error: invalid selector" in proc.stderr  # the broker's detach names the problem
    assert "body" not in proc.stdout
    assert broker.queue("rhea.badsel").depth == 1
