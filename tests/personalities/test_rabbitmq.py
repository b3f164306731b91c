"""The ``rabbitmq`` personality against ``minibroker``: each quirk of ``RABBITMQ`` (minibroker/broker/personality.py)
as the same client steps answered differently on the wire (rabbitmq/rabbitmq-server deps/rabbit/src/
rabbit_amqp_session.erl: validate_attach, parse_target_v2_string0, ensure_target, link_error_not_found)."""

from __future__ import annotations

from typing import Any

from minibroker.amqp.definitions import Accepted, Attach, Coordinator, Error, Released, Target
from minibroker.amqp.types import Symbol, UInt
from minibroker.testing import frames
from tests.broker.txn_driver import Observed, World, payload
from tests.personalities.harness import peer, world


def attach(w: World, name: str, address: str | None, *, consumer: bool, **fields: Any) -> Observed:
    """One consumer or producer attach to ``address`` (other attach fields as given); what the peer saw."""
    p = peer(w)
    if consumer:
        p.send(frames.attach_receiver(address, p.new_handle(name), name, **fields))
    else:
        p.send(frames.attach_sender(address, p.new_handle(name), name, **fields))
    return w.settle()[p]


def refusal(seen: Observed, name: str, *, consumer: bool) -> Error | None:
    """The error of a refused attach: the broker's reply has a null terminus and the link is detached."""
    reply = seen.attached[name]
    assert (reply.source if consumer else reply.target) is None, reply
    errors = [err for link, err in seen.detached if link == name]
    assert len(errors) == 1, seen.detached
    return errors[0]


def accepted_attach(seen: Observed, name: str) -> Attach:
    """The reply to an attach the broker accepted (a terminus, no detach)."""
    assert seen.detached == [], seen.detached
    return seen.attached[name]


def test_coordinator_attach_is_refused() -> None:
    """Quirk 1 (validate_attach): a coordinator target gets a null target and a detach with amqp:not-implemented
    'Transactions not supported'; minibroker answers with its coordinator."""

    def steps(w: World) -> Observed:
        p = peer(w)
        p.attach_controller("ctl")
        return w.settle()[p]

    ours = steps(world("minibroker"))
    assert isinstance(ours.attached["ctl"].target, Coordinator)
    assert ours.detached == []
    theirs = steps(world("rabbitmq"))
    assert theirs.attached["ctl"].target is None
    [(link, err)] = theirs.detached
    assert link == "ctl"
    assert err is not None
    assert (err.condition, err.description) == (Symbol("amqp:not-implemented"), "Transactions not supported")


def rcv_second(w: World, *, consumer: bool, snd_settle_mode: int | None) -> Observed:
    """An attach to queue ``orders`` asking rcv-settle-mode second with ``snd_settle_mode``."""
    mode = None if snd_settle_mode is None else UInt(snd_settle_mode)
    w.broker.declare_queue("orders")
    return attach(w, "l", "/queues/orders", consumer=consumer, rcv_settle_mode=UInt(1), snd_settle_mode=mode)


def test_rcv_settle_mode_second_is_refused_unless_sending_settled() -> None:
    """Quirk 2 (validate_attach): rcv-settle-mode second on a link not sending settled is refused with
    amqp:not-implemented; a producer sending settled is answered rcv-settle-mode first, a consumer's second is echoed
    (handle_attach). minibroker echoes second."""
    for consumer in (False, True):
        for snd in (None, 0, 2):  # absent (mixed), unsettled, mixed
            ours = accepted_attach(rcv_second(world("minibroker"), consumer=consumer, snd_settle_mode=snd), "l")
            assert ours.rcv_settle_mode == 1
            err = refusal(rcv_second(world("rabbitmq"), consumer=consumer, snd_settle_mode=snd), "l", consumer=consumer)
            assert err is not None
            assert err.condition == Symbol("amqp:not-implemented")
            assert err.description == "rcv-settle-mode second not supported"
        ours = accepted_attach(rcv_second(world("minibroker"), consumer=consumer, snd_settle_mode=1), "l")
        theirs = accepted_attach(rcv_second(world("rabbitmq"), consumer=consumer, snd_settle_mode=1), "l")
        assert (ours.rcv_settle_mode, theirs.rcv_settle_mode) == (1, 1 if consumer else 0)


def test_queue_addresses_are_percent_decoded() -> None:
    """Quirk 3 (parse_target_v2_string0): ``/queues/a%2Fb`` names queue "a/b", in every personality (issue 18:
    RabbitMQ 4 addresses are understood everywhere)."""

    def steps(w: World) -> list[str]:
        w.broker.declare_queue("a/b")
        p = peer(w)
        p.attach_producer("p", "/queues/a%2Fb")
        w.settle()
        p.transfer("p", payload("m"), settled=True)
        w.settle()
        return sorted(name for name, queue in w.broker.queues.items() if queue.ready)

    assert steps(world("minibroker")) == ["a/b"]
    assert steps(world("rabbitmq")) == ["a/b"]


def test_a_missing_queue_is_not_found_not_created() -> None:
    """Quirk 3 (ensure_target, link_error_not_found): ``/queues/missing`` is refused with amqp:not-found "no queue
    'missing' in vhost '/'", for consumers and producers, in every personality (issue 18); minibroker creates the
    node a plain address names."""
    for consumer in (False, True):
        w = world("minibroker")
        accepted_attach(attach(w, "l", "missing", consumer=consumer), "l")
        assert "missing" in w.broker.queues
        for name in ("rabbitmq", "minibroker"):
            w = world(name)
            err = refusal(attach(w, "l", "/queues/missing", consumer=consumer), "l", consumer=consumer)
            assert err is not None
            assert (err.condition, err.description) == (Symbol("amqp:not-found"), "no queue 'missing' in vhost '/'")
            assert w.broker.queues == {}


def test_other_address_formats_are_invalid() -> None:
    """Quirk 3 (parse_target_v2_string0; v1 formats denied by default in RabbitMQ 4.3): a plain name and a v1
    ``/queue/NAME`` are amqp:invalid-field; minibroker accepts each. (``/exchanges/amq.default/KEY`` names the
    default exchange here, as the 0-9-1 gateway addresses it: issue 18.)"""
    for address, consumer in [
        ("orders", False),
        ("orders", True),
        ("/queue/orders", False),
    ]:
        ours = world("minibroker")
        ours.broker.declare_queue("orders")
        accepted_attach(attach(ours, "l", address, consumer=consumer), "l")
        theirs = world("rabbitmq")
        theirs.broker.declare_queue("orders")
        err = refusal(attach(theirs, "l", address, consumer=consumer), "l", consumer=consumer)
        assert err is not None
        assert err.condition == Symbol("amqp:invalid-field"), address
        assert address in (err.description or ""), err


def publish(w: World, target: str | None, to: str | None = None) -> tuple[Any, dict[str, int]]:
    """One unsettled message on a producer to ``target`` (None: the anonymous relay, the message's ``to``): the
    broker's outcome, and how many messages each queue holds."""
    p = peer(w)
    p.send(frames.attach_sender(target, p.new_handle("p"), "p", target=Target(address=target)))
    w.settle()
    delivery = p.transfer("p", payload("m", to=to))
    state, settled = w.settle()[p].answers[delivery]
    assert settled
    return state, {name: len(queue.ready) for name, queue in w.broker.queues.items()}


def test_an_exchange_routes_by_key_and_releases_what_it_cannot_route() -> None:
    """``/exchanges/amq.direct/orders`` routes each message along amq.direct's bindings with key "orders"
    (accepted when bound) and releases what routes nowhere (issue 18: the real model, in every personality);
    ``/exchanges/amq.default/orders`` reaches queue "orders" by its implicit binding."""
    for name in ("rabbitmq", "minibroker"):
        w = world(name)
        w.broker.declare_queue("orders")
        state, held = publish(w, "/exchanges/amq.direct/orders")
        assert isinstance(state, Released)
        assert held == {"orders": 0}
        w.broker.rabbit.bind_queue(None, "orders", "amq.direct", "orders", {})
        state, held = publish(w, "/exchanges/amq.direct/orders")
        assert isinstance(state, Accepted)
        assert held == {"orders": 1}
        state, held = publish(w, "/exchanges/amq.default/orders")
        assert isinstance(state, Accepted)
        assert held == {"orders": 2}


def test_the_anonymous_relay_routes_to_queue_addresses() -> None:
    """Quirk 3: the anonymous relay (null target) routes ``to`` = ``/queues/orders`` to queue "orders", in every
    personality (issue 18)."""
    for name, expected in [("rabbitmq", {"orders": 1}), ("minibroker", {"orders": 1})]:
        w = world(name)
        w.broker.declare_queue("orders")
        state, held = publish(w, None, to="/queues/orders")
        assert isinstance(state, Accepted)
        assert held == expected, name


def test_an_exchange_that_does_not_exist_is_not_found() -> None:
    """Quirk 3: a target naming an exchange the virtual host does not have is refused with amqp:not-found
    (rabbit_amqp_session.erl, link_error_not_found), in every personality (issue 18)."""
    for name in ("rabbitmq", "minibroker"):
        w = world(name)
        p = peer(w)
        p.attach_producer("out", "/exchanges/orders-x/key")
        ((link, err),) = w.settle()[p].detached
        assert link == "out"
        assert err is not None
        assert (str(err.condition), err.description) == ("amqp:not-found", "no exchange 'orders-x' in vhost '/'")
        assert w.broker.queues == {}
