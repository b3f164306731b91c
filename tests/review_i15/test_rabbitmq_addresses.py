"""Review of issue 15: the rabbitmq personality's RabbitMQ 4 address format (``rabbitmq_address``) against
rabbit_amqp_session.erl (parse_target_v2_string0 and the source's ``/queues/`` clause), its producer ``route`` on
exchanges, its rcv-settle-mode answer, and permissions read through its addresses."""

from __future__ import annotations

from typing import Any

import pytest

from minibroker.amqp.definitions import Accepted, Properties, Rejected, Released
from minibroker.amqp.types import Symbol, UInt
from minibroker.broker.permissions import Permissions
from minibroker.testing import frames
from tests.broker.txn_driver import BrokerView, census, payload
from tests.personalities.harness import answer, peer, world

NOT_FOUND = Symbol("amqp:not-found")
INVALID = Symbol("amqp:invalid-field")
UNAUTHORIZED = Symbol("amqp:unauthorized-access")


def attach_producer(address: str, **settings: Any) -> tuple[Any, Any]:
    """A rabbitmq broker with queues ``q`` and ``a/b``; a producer attached to ``address`` and one message sent on
    it when the attach was taken: (the error the attach was refused with or None, the answer to the message)."""
    w = world("rabbitmq", **settings)
    w.broker.declare_queue("q")
    w.broker.declare_queue("a/b")
    p = peer(w)
    p.attach_producer("out", address)
    seen = w.settle()[p]
    if seen.detached:
        return seen.detached[0][1], None
    return None, answer(w, p, p.transfer("out", payload("m")))


@pytest.mark.parametrize("address", ["/exchanges/amq.direct/", "/exchanges/amq.direct"])
def test_exchange_with_empty_or_no_routing_key_is_attached(address: str) -> None:
    """RabbitMQ parses ``/exchanges/X/`` (an empty routing key) and ``/exchanges/X`` (no key: the empty one) as
    valid v2 targets (parse_target_v2_string0: ``[XNameBinQuoted]`` and ``[XNameBinQuoted, RKeyQuoted]``); a
    message that routes nowhere is released. The personality must not claim that amq.direct does not exist."""
    err, reply = attach_producer(address)
    assert err is None, err
    assert reply == (Released(), True)


def test_queue_name_with_a_slash_is_one_queue() -> None:
    """``/queues/a/b`` names queue "a/b" in RabbitMQ (the rest of the address after ``/queues/`` is the name)."""
    err, reply = attach_producer("/queues/a/b")
    assert err is None, err
    assert reply == (Accepted(), True)


@pytest.mark.parametrize("address", ["/queues/%zz", "/exchanges/amq.direct/%g1", "/queues/"])
def test_bad_percent_encoding_is_a_bad_address(address: str) -> None:
    """cow_uri:urldecode fails on a malformed escape, which RabbitMQ answers as a bad address (invalid-field)."""
    err, _ = attach_producer(address)
    assert err is not None
    assert err.condition == INVALID, err


def test_nul_in_a_queue_name_is_not_found_not_a_crash() -> None:
    """``/queues/%00`` names a queue called NUL: not found (never created), no internal error."""
    w = world("rabbitmq")
    p = peer(w)
    p.attach_producer("out", "/queues/%00")
    p.attach_consumer("in", "/queues/%00", presettled=False, default_outcome=None)
    seen = w.settle()[p]
    assert [err.condition for _, err in seen.detached] == [NOT_FOUND, NOT_FOUND]
    assert w.broker.internal_errors == 0


def test_exchange_producer_routes_by_key_and_anonymous_relay_reads_v2_addresses() -> None:
    """A producer on ``/exchanges/amq.direct/q`` routes each message by key q (q is bound with it) whatever its
    ``to``; the anonymous relay routes ``to: /exchanges/amq.direct/q`` and ``to: /queues/q`` to q, and releases
    (exchange) or rejects an address that names nothing."""
    w = world("rabbitmq")
    w.broker.declare_queue("q")
    w.broker.rabbit.bind_queue(None, "q", "amq.direct", "q", {})
    p = peer(w)
    p.attach_producer("x", "/exchanges/amq.direct/q")
    p.attach_producer("anon", None)
    w.settle()
    assert answer(w, p, p.transfer("x", payload("m1", to="/queues/other")))[0] == Accepted()
    assert answer(w, p, p.transfer("anon", payload("m2", to="/exchanges/amq.direct/q")))[0] == Accepted()
    assert answer(w, p, p.transfer("anon", payload("m3", to="/queues/q")))[0] == Accepted()
    assert isinstance(answer(w, p, p.transfer("anon", payload("m4", to="/queues/none")))[0], Rejected | Released)
    assert isinstance(
        answer(w, p, p.transfer("anon", payload("m5", to="/exchanges/amq.direct/")))[0], Rejected | Released
    )
    assert [n for n, _ in census(BrokerView(w))["q"].ready] == ["m1", "m2", "m3"]
    assert w.broker.internal_errors == 0


def test_permissions_apply_to_the_queue_an_address_names() -> None:
    """A user allowed to send only to ``q``: attaching ``/queues/q`` is allowed, ``/queues/secret`` and
    ``/exchanges/amq.direct/secret`` are refused (unauthorized-access), and the anonymous relay refuses a message to
    ``/queues/secret``."""
    w = world("rabbitmq", permissions={"alice": Permissions(send=("q",), receive=("q",))})
    w.broker.declare_queue("q")
    w.broker.declare_queue("secret")
    p = peer(w)
    p.conn.user = "alice"
    for name, address in [("ok", "/queues/q"), ("s1", "/queues/secret"), ("s2", "/exchanges/amq.direct/secret")]:
        p.attach_producer(name, address)
    p.attach_producer("anon", None)
    seen = w.settle()[p]
    assert {link: err.condition for link, err in seen.detached} == {"s1": UNAUTHORIZED, "s2": UNAUTHORIZED}
    state, _ = answer(w, p, p.transfer("anon", payload("m", to="/queues/secret")))
    assert isinstance(state, Rejected)
    assert state.error.condition == UNAUTHORIZED
    assert census(BrokerView(w))["secret"].ready == ()


def test_consumer_sending_settled_asking_second_keeps_second() -> None:
    """RabbitMQ answers a consumer's attach (it is the sender) with the rcv-settle-mode the client asked for
    (handle_attach, role receiver: ``rcv_settle_mode = RcvSettleMode``) once validate_attach let it through (the
    client asked snd-settle-mode settled); only its producer replies say first."""
    w = world("rabbitmq")
    w.broker.declare_queue("q")
    p = peer(w)
    p.send(
        frames.attach_receiver("/queues/q", p.new_handle("c"), "c", snd_settle_mode=UInt(1), rcv_settle_mode=UInt(1))
    )
    p.send(frames.attach_sender("/queues/q", p.new_handle("s"), "s", snd_settle_mode=UInt(1), rcv_settle_mode=UInt(1)))
    seen = w.settle()[p]
    assert seen.detached == []
    assert seen.attached["c"].rcv_settle_mode == 1
    assert seen.attached["s"].rcv_settle_mode == 0


def test_exchange_message_to_field_unused() -> None:
    """A message with properties naming another ``to`` on an exchange producer still follows the link's key."""
    w = world("rabbitmq")
    w.broker.declare_queue("q")
    w.broker.rabbit.bind_queue(None, "q", "amq.direct", "q", {})
    p = peer(w)
    p.attach_producer("x", "/exchanges/amq.direct/q")
    w.settle()
    data = frames.message("<<m>>", Properties(to="/exchanges/amq.fanout/zzz"))
    assert answer(w, p, p.transfer("x", data))[0] == Accepted()


def test_coordinator_asking_second_is_refused_for_transactions_first() -> None:
    """validate_attach's first clause refuses any coordinator target ("Transactions not supported") before the
    rcv-settle-mode clause is reached: a coordinator attach asking rcv-settle-mode second gets that error."""
    from minibroker.amqp.definitions import Coordinator, Source

    w = world("rabbitmq")
    p = peer(w)
    target = Coordinator(capabilities=[Symbol("amqp:local-transactions")])
    second = UInt(1)
    handle = p.new_handle("ctl")
    attach = frames.attach_sender(None, handle, "ctl", target=target, source=Source(), rcv_settle_mode=second)
    p.send(attach)
    ((link, err),) = w.settle()[p].detached
    assert link == "ctl"
    assert err is not None
    assert (err.condition, err.description) == (Symbol("amqp:not-implemented"), "Transactions not supported")
