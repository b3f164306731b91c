"""The ``strict`` personality against ``minibroker``: each quirk of ``STRICT`` (minibroker/broker/personality.py),
a client mistake minibroker tolerates, answered under strict as an error naming the rule it breaks."""

from __future__ import annotations

from typing import Any

import pytest

from minibroker.amqp.definitions import (
    Accepted,
    AmqpValue,
    Coordinator,
    Declare,
    Declared,
    Error,
    Rejected,
    Source,
    TransactionalState,
)
from minibroker.amqp.framing import encode_frame
from minibroker.amqp.types import Symbol
from minibroker.testing import frames
from tests.broker.txn_driver import TXN_ID, BrokerView, Observed, Peer, World, census, payload
from tests.personalities.harness import peer, world

STR_KEY = "x-str-key"


def with_string_key(performative: Any, key: str = STR_KEY) -> bytes:
    """The frame of ``performative`` whose fields map key ``key`` is encoded as a string, not a symbol (the codec
    writes a fields map's ``str`` keys as symbols, §2.8.13, so the bytes are patched: same length, other code)."""
    data = encode_frame(0, performative)
    symbol = b"\xa3" + bytes([len(key)]) + key.encode()  # sym8
    assert data.count(symbol) == 1, data
    return data.replace(symbol, b"\xa1" + symbol[1:])  # str8-utf8


def rejected_error(seen: Observed, delivery_id: int) -> Error:
    """The error of a declare or discharge the broker answered ``rejected`` (settled)."""
    state, settled = seen.answers[delivery_id]
    assert settled
    assert isinstance(state, Rejected), state
    assert isinstance(state.error, Error)
    return state.error


def detach_error(seen: Observed, link: str) -> Error:
    """The error the broker detached ``link`` with, on its own initiative."""
    errors = [err for name, err in seen.detached if name == link]
    assert len(errors) == 1, seen.detached
    assert errors[0] is not None
    return errors[0]


def declared_id(p: Peer, controller: str = "ctl") -> bytes:
    """Declare a transaction on ``controller`` (attached); its txn-id."""
    delivery = p.declare(controller)
    state, _ = p.world.settle()[p].answers[delivery]
    assert isinstance(state, Declared), state
    assert isinstance(state.txn_id, bytes)
    return state.txn_id


def producer_and_controller(w: World) -> Peer:
    """A peer with a producer ``p`` on queue ``q`` (declared) and a controller ``ctl`` on one session."""
    w.broker.declare_queue("q")
    p = peer(w)
    p.attach_producer("p", "q")
    p.attach_controller("ctl")
    w.settle()
    return p


def transfer_and_declare_in_one_read(w: World) -> tuple[Observed, int, int]:
    """An unsettled transfer on ``p`` and a declare on ``ctl`` written together: the broker reads both before it
    answers the transfer. The peer's view, and the delivery ids of the transfer and the declare."""
    p = producer_and_controller(w)
    transfer = p.client.next_delivery_id()
    declare = transfer + 1
    p.send_together(
        (frames.transfer(p.handle("p"), transfer), payload("m")),
        (frames.transfer(p.handle("ctl"), declare), frames.message(AmqpValue(Declare()))),
    )
    return w.settle()[p], transfer, declare


def test_15_error_declare_unsettled_outgoing() -> None:
    """Qpid Proton's tx_tester script tests/cpp/tx_tests/15_error_declare_unsettled_outgoing.tx_test ("send 1",
    then "declare", expecting an error), at the frame level. The Proton C++ client checks this rule itself
    (cpp/src/session.cpp, session::transaction_declare) and never sends such a declare; a client that does sends
    the declare before the broker settled the message. minibroker declares; strict flags it: rejected
    amqp:illegal-state, naming Qpid Proton's transaction rules (quirk 1)."""
    ours, transfer, declare = transfer_and_declare_in_one_read(world("minibroker"))
    assert isinstance(ours.answers[transfer][0], Accepted)
    assert isinstance(ours.answers[declare][0], Declared)
    theirs, transfer, declare = transfer_and_declare_in_one_read(world("strict"))
    assert isinstance(theirs.answers[transfer][0], Accepted)
    err = rejected_error(theirs, declare)
    assert err.condition == Symbol("amqp:illegal-state")
    assert "Qpid Proton's transaction rules" in (err.description or "")
    assert "1 unsettled" in (err.description or "")


def test_a_declare_after_the_transfer_was_answered_is_declared() -> None:
    """Quirk 1's limit: once the broker answered (and settled) the transfer, in an earlier read, strict declares as
    minibroker does: the rule is about the session's unsettled transfers, not about having sent any."""
    for name in ("minibroker", "strict"):
        w = world(name)
        p = producer_and_controller(w)
        transfer = p.transfer("p", payload("m"))
        assert w.settle()[p].answers[transfer] == (Accepted(), True)
        assert len(declared_id(p)) > 0


def discharge(p: Peer, txn_id: bytes) -> tuple[Observed, int]:
    """A commit of ``txn_id`` on ``ctl``: what the peer saw, and the discharge's delivery id."""
    delivery = p.discharge("ctl", txn_id, fail=False)
    return p.world.settle()[p], delivery


def attach_controller_without_outcomes(w: World) -> tuple[Peer, Observed]:
    """A coordinator link whose source lists no outcomes (python-qpid-proton's shape)."""
    p = peer(w)
    target = Coordinator(capabilities=[Symbol("amqp:local-transactions")])
    p.send(frames.attach_sender(None, p.new_handle("ctl"), "ctl", target=target, source=Source()))
    return p, w.settle()[p]


def test_a_coordinator_source_without_outcomes_is_refused() -> None:
    """Quirk 2 (part 4 §4.3: errors travel as rejected only if the source offers it): strict refuses the attach
    (null target, detach amqp:invalid-field naming §4.3); minibroker accepts it and answers errors as rejected."""
    p, ours = attach_controller_without_outcomes(world("minibroker"))
    assert isinstance(ours.attached["ctl"].target, Coordinator)
    assert ours.detached == []
    err = rejected_error(*discharge(p, b"\x07" * 4))
    assert err.condition == Symbol("amqp:transaction:unknown-id")
    _, theirs = attach_controller_without_outcomes(world("strict"))
    assert theirs.attached["ctl"].target is None
    err = detach_error(theirs, "ctl")
    assert err.condition == Symbol("amqp:invalid-field")
    assert "§4.3" in (err.description or "")


def retire_in_two_transactions(w: World) -> tuple[Peer, bytes, bytes]:
    """A consumer receives message ``m`` of queue ``q`` unsettled; its outcome is staged in transaction A
    (transactional-state(A, accepted), unsettled), then retired again naming transaction B (settled)."""
    p = producer_and_controller(w)
    p.transfer("p", payload("m"), settled=True)
    p.attach_consumer("c", "q", presettled=False, default_outcome=None)
    p.flow("c", 1)
    [started] = w.settle()[p].started
    a, b = declared_id(p), declared_id(p)
    p.dispose(started.delivery_id, TransactionalState(txn_id=a, outcome=Accepted()), settled=False)
    w.settle()
    p.dispose(started.delivery_id, TransactionalState(txn_id=b, outcome=Accepted()), settled=True)
    return p, a, b


def test_an_outcome_retired_in_a_second_transaction() -> None:
    """Quirk 3 (part 4 §4.4.2: a delivery's outcome belongs to one transaction; "the control link MUST be
    terminated with transaction-rollback"). minibroker moves the outcome to B: A's commit leaves the message
    acquired, B's consumes it. strict rolls back A and B and detaches their controller with
    amqp:transaction:rollback naming §4.4.2."""
    w = world("minibroker")
    p, a, b = retire_in_two_transactions(w)
    seen = w.settle()[p]
    assert seen.detached == []
    assert census(BrokerView(w))["q"].acquired == 1
    seen, commit_a = discharge(p, a)
    assert seen.answers[commit_a] == (Accepted(), True)
    assert census(BrokerView(w))["q"].acquired == 1  # A held nothing of it any more
    seen, commit_b = discharge(p, b)
    assert seen.answers[commit_b] == (Accepted(), True)
    assert census(BrokerView(w))["q"].acquired == 0
    assert census(BrokerView(w))["q"].ready == ()

    w = world("strict")
    p, a, b = retire_in_two_transactions(w)
    seen = w.settle()[p]
    err = detach_error(seen, "ctl")
    assert err.condition == Symbol("amqp:transaction:rollback")
    assert "§4.4.2" in (err.description or "")
    assert BrokerView(w).transactions == []


def attach_with_string_key(w: World) -> Observed:
    """A producer attach to ``q`` whose properties have a string key."""
    p = peer(w)
    attach = frames.attach_sender("q", p.new_handle("p"), "p", properties={Symbol(STR_KEY): 1})
    p.send_encoded(with_string_key(attach), attach)
    return w.settle()[p]


def flow_with_string_key(p: Peer, key: str, value: Any) -> Observed:
    """Message ``m`` sent to queue ``q``, then a consumer of ``q`` granting credit 1 by a flow whose properties
    have the string key ``key`` (``value``)."""
    p.transfer("p", payload("m"), settled=True)
    p.attach_consumer("c", "q", presettled=False, default_outcome=None)
    p.world.settle()
    flow = p.flow_frame("c", 1, properties={Symbol(key): value})
    p.send_encoded(with_string_key(flow, key), flow)
    return p.world.settle()[p]


def test_a_fields_map_with_a_string_key() -> None:
    """Quirk 4 (part 2 §2.8.13: a fields map's keys are symbols): an attach's or a flow's properties with a string
    key are refused by strict (the attach with a null target, the flow's link detached; amqp:invalid-field naming
    §2.8.13); minibroker accepts both."""
    ours = attach_with_string_key(world("minibroker"))
    assert ours.detached == []
    assert ours.attached["p"].target is not None
    theirs = attach_with_string_key(world("strict"))
    assert theirs.attached["p"].target is None
    err = detach_error(theirs, "p")
    assert err.condition == Symbol("amqp:invalid-field")
    assert "§2.8.13" in (err.description or "")
    assert repr(STR_KEY) in (err.description or "")

    ours = flow_with_string_key(producer_and_controller(world("minibroker")), STR_KEY, 1)
    assert ours.detached == []
    assert [s.name for s in ours.started] == ["m"]
    theirs = flow_with_string_key(producer_and_controller(world("strict")), STR_KEY, 1)
    err = detach_error(theirs, "c")
    assert err.condition == Symbol("amqp:invalid-field")
    assert "§2.8.13" in (err.description or "")
    assert theirs.started == []


def test_a_txn_id_flow_key_given_as_a_string() -> None:
    """Quirk 4's lenient side: minibroker honours a flow's ``txn-id`` sent as a string key (the delivery is
    acquired under the transaction: transactional-state on the transfer, §4.4.3); strict detaches the link."""
    p = producer_and_controller(world("minibroker"))
    txn = declared_id(p)
    [started] = flow_with_string_key(p, str(TXN_ID), txn).started
    assert started.state == TransactionalState(txn_id=txn)
    p = producer_and_controller(world("strict"))
    theirs = flow_with_string_key(p, str(TXN_ID), declared_id(p))
    assert detach_error(theirs, "c").condition == Symbol("amqp:invalid-field")
    assert theirs.started == []


def test_a_txn_id_longer_than_32_octets() -> None:
    """Quirk 5 (part 4 §4.5.4: txn-id is binary of at most 32 octets): a discharge naming a 40-octet id is rejected
    by strict with amqp:invalid-field naming §4.5.4, by minibroker with amqp:transaction:unknown-id."""
    long_id = b"\x01" * 40
    for name, condition, names_section in [
        ("minibroker", "amqp:transaction:unknown-id", False),
        ("strict", "amqp:invalid-field", True),
    ]:
        p = peer(world(name))
        p.attach_controller("ctl")
        p.world.settle()
        err = rejected_error(*discharge(p, long_id))
        assert err.condition == Symbol(condition), name
        assert ("§4.5.4" in (err.description or "")) is names_section, err


def send_settled(p: Peer, what: str) -> int:
    """A declare, or a discharge of a transaction just declared, sent settled on ``ctl``; its delivery id."""
    if what == "declare":
        return p.declare("ctl", settled=True)
    return p.discharge("ctl", declared_id(p), fail=False, settled=True)


@pytest.mark.parametrize("what", ["declare", "discharge"])
def test_a_settled_declare_or_discharge(what: str) -> None:
    """Quirk 6 (part 4 §4.3: declare and discharge MUST NOT be sent settled): both detach the controller with
    amqp:not-allowed, unanswered; strict's description names §4.3, minibroker's names no section."""
    for name, names_section in [("minibroker", False), ("strict", True)]:
        p = peer(world(name))
        p.attach_controller("ctl")
        p.world.settle()
        delivery = send_settled(p, what)
        seen = p.world.settle()[p]
        assert delivery not in seen.answers
        err = detach_error(seen, "ctl")
        assert err.condition == Symbol("amqp:not-allowed")
        assert ("§4.3" in (err.description or "")) is names_section, err
