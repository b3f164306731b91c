"""The ``ENTITY/$management`` node frame by frame (the in-memory driver, no sockets): status keys in both
spellings, correlation-id the request's message-id, the answers' bodies."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from minibroker.amqp import codec
from minibroker.amqp.definitions import Accepted, AmqpValue, ApplicationProperties, Properties, Transfer
from minibroker.amqp.types import Int, Long
from tests.broker.txn_driver import Peer, World
from tests.personalities.harness import payload, peer, rejected_with, world

pytestmark = pytest.mark.timeout(30)

NODE = "amqps://127.0.0.1:5672/orders/$management"


def _request(message_id: uuid.UUID, operation: str, body: dict[str, Any]) -> bytes:
    """A request as azure-servicebus sends it (``_base_handler.py`` ``_mgmt_request_response``)."""
    return (
        codec.encode(Properties(message_id=message_id, reply_to=NODE))
        + codec.encode(ApplicationProperties({"operation": operation}))
        + codec.encode(AmqpValue(body))
    )


def _mgmt_world() -> tuple[World, Peer]:
    w = world("servicebus")
    p = peer(w)
    p.attach_producer("orders-in", "orders")
    p.attach_producer("mgmt-req", NODE)
    p.attach_consumer("mgmt-resp", NODE, presettled=False, default_outcome=None)
    w.settle()
    p.flow("mgmt-resp", 10)
    w.settle()
    return w, p


def _answers(p: Peer) -> list[tuple[Any, dict[Any, Any], Any]]:
    """(correlation-id, application-properties, body value) of each answer on ``mgmt-resp``."""
    found = []
    for completed in p.observed.completed:
        if completed.link != "mgmt-resp":
            continue
        properties, pos = codec.decode(completed.payload)
        application, pos = codec.decode(completed.payload, pos)
        body, _ = codec.decode(completed.payload, pos)
        assert isinstance(properties, Properties)
        assert isinstance(application, ApplicationProperties)
        assert isinstance(body, AmqpValue)
        found.append((properties.correlation_id, application.value, body.value))
    return found


def test_peek_empty_is_204_in_both_spellings() -> None:
    w, p = _mgmt_world()
    message_id = uuid.uuid4()
    delivery_id = p.transfer(
        "mgmt-req",
        _request(message_id, "com.microsoft:peek-message", {"from-sequence-number": Long(1), "message-count": Int(5)}),
    )
    w.settle()
    assert p.observed.answers[delivery_id][0] == Accepted()
    ((correlation, status, body),) = _answers(p)
    assert correlation == message_id
    assert status["statusCode"] == status["status-code"] == 204
    assert status["statusDescription"] == status["status-description"]
    assert body is None
    assert not p.observed.violations


def test_peek_answers_messages_encoded() -> None:
    w, p = _mgmt_world()
    p.transfer("orders-in", payload("first"))
    p.transfer("orders-in", payload("second"))
    w.settle()
    message_id = uuid.uuid4()
    p.transfer(
        "mgmt-req",
        _request(message_id, "com.microsoft:peek-message", {"from-sequence-number": Long(0), "message-count": Int(1)}),
    )
    w.settle()
    ((correlation, status, body),) = _answers(p)
    assert correlation == message_id
    assert status["statusCode"] == 200
    (entry,) = body["messages"]
    assert b"first" in entry["message"]
    assert b"x-opt-sequence-number" in entry["message"]


def test_unknown_operation_is_501() -> None:
    w, p = _mgmt_world()
    message_id = uuid.uuid4()
    p.transfer("mgmt-req", _request(message_id, "com.microsoft:no-such-operation", {}))
    w.settle()
    ((correlation, status, _body),) = _answers(p)
    assert correlation == message_id
    assert status["statusCode"] == status["status-code"] == 501


def test_receive_unknown_sequence_number_is_404() -> None:
    w, p = _mgmt_world()
    p.transfer(
        "mgmt-req",
        _request(uuid.uuid4(), "com.microsoft:receive-by-sequence-number", {"sequence-numbers": [Long(7)]}),
    )
    w.settle()
    ((_correlation, status, _body),) = _answers(p)
    assert status["statusCode"] == 404
    assert status["errorCondition"] == "com.microsoft:message-not-found"


def test_lock_runs_out_and_late_settlement_is_lock_lost() -> None:
    """A peek-lock runs out after 60 s of broker time: the message is delivered again (delivery-count 1), and the
    first delivery's settlement is answered rejected with com.microsoft:message-lock-lost; renew-lock of a live
    lock answers its new expiration."""
    w, p = _mgmt_world()
    p.transfer("orders-in", payload("m"))
    w.settle()
    p.attach_consumer("orders-out", "orders", presettled=False, default_outcome=None)
    p.flow("orders-out", 5)
    (first,) = w.settle()[p].started
    w.advance(59)
    assert w.settle()[p].started == []
    w.advance(2)
    after = w.settle()[p]
    (second,) = after.started
    second_frames = after.performatives
    assert second.delivery_id != first.delivery_id
    p.dispose(first.delivery_id, Accepted(), settled=False)
    (settled,) = w.settle()[p].settled_by_broker
    assert settled[0] == first.delivery_id
    assert rejected_with(settled[1]) == ("com.microsoft:message-lock-lost", "The lock supplied is invalid: it expired.")
    observed = w.settle()[p]
    w.advance(30)
    (tag,) = [  # the lock token: the second delivery's tag
        f.delivery_tag for f in second_frames if isinstance(f, Transfer) and f.delivery_id == second.delivery_id
    ]
    message_id = uuid.uuid4()
    p.transfer("mgmt-req", _request(message_id, "com.microsoft:renew-lock", {"lock-tokens": [uuid.UUID(bytes_le=tag)]}))
    w.settle()
    ((correlation, status, body),) = _answers(p)
    assert correlation == message_id
    assert status["statusCode"] == 200
    assert body["expirations"].items == [(61 + 30 + 60) * 1000]  # broker time 151 s (the world's wall offset is 0)
    w.advance(40)  # 131 s: past the second delivery's first lock (121 s), within the renewed one
    assert w.settle()[p].started == []
    p.dispose(second.delivery_id, Accepted(), settled=False)
    (settled,) = w.settle()[p].settled_by_broker
    assert settled == (second.delivery_id, Accepted())
    assert not observed.violations


def test_other_personalities_take_no_locks() -> None:
    """Only a Service Bus delivery is locked: a broker of another personality arms no timer per delivery."""
    for personality, timers in (("minibroker", 0), ("servicebus", 1)):
        w = world(personality)
        p = peer(w)
        p.attach_producer("in", "orders")
        p.transfer("in", payload("m"))
        p.attach_consumer("out", "orders", presettled=False, default_outcome=None)
        p.flow("out", 1)
        assert len(w.settle()[p].started) == 1
        assert len(w.broker.dispatcher.timers) == timers
