"""Fault injection (issue 16 §1), frame by frame: each point and action, and how rules match and count.

The broker is the real core and engine, driven by ``txn_driver``'s in-memory peers on a clock that moves only when
the test says (``World.advance``); rules are added through the public handle (``BrokerView(world).faults``), and
what happened is read from the frames each peer received and from the queue handles.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from minibroker.amqp.definitions import (
    Accepted,
    Declared,
    Error,
    Modified,
    Rejected,
    Released,
    TransactionalState,
)
from minibroker.broker.core import Broker, BrokerSettings
from minibroker.broker.faults import POINTS, Faults, FaultSpec
from minibroker.broker.transactions import counter_ids
from tests.broker.txn_driver import BrokerView, Observed, Peer, World, payload

ROLLBACK = "amqp:transaction:rollback"


class Setup:
    """A broker, its handle, and helpers that speak for one peer."""

    def __init__(self) -> None:
        self.world = World(Broker(BrokerSettings(), txn_ids=counter_ids(b"t")))
        self.view = BrokerView(self.world)
        self.faults = self.view.faults

    def peer(self, container: str = "client") -> Peer:
        peer = self.world.connect(container)
        self.world.settle()
        return peer

    def settle(self, peer: Peer) -> Observed:
        return self.world.settle()[peer]

    def depth(self, queue: str = "q") -> int:
        return self.view.queue(queue).depth

    def declare(self, peer: Peer) -> bytes:
        """Attach a controller (once) and declare; the txn-id."""
        if not peer.attached("ctl"):
            peer.attach_controller("ctl")
        delivery = peer.declare("ctl")
        state, _ = self.settle(peer).answers[delivery]
        assert isinstance(state, Declared), state
        return bytes(state.txn_id)

    def post(self, peer: Peer, txn: bytes, name: str = "m", address: str = "q") -> Any:
        """Post one message to ``address`` in ``txn``; the broker's provisional answer."""
        if not peer.attached("s"):
            peer.attach_producer("s", address)
        delivery = peer.transfer("s", payload(name), state=TransactionalState(txn_id=txn))
        return self.settle(peer).answers[delivery][0]

    def send(self, peer: Peer, name: str = "m", address: str = "q") -> int:
        if not peer.attached("s"):
            peer.attach_producer("s", address)
            self.world.settle()
        return peer.transfer("s", payload(name))


def condition_of(state: Any) -> str:
    """The condition of a rejected outcome (perhaps inside a transactional state)."""
    if isinstance(state, TransactionalState):
        state = state.outcome
    assert isinstance(state, Rejected), state
    assert isinstance(state.error, Error)
    return str(state.error.condition)


def dropped(peer: Peer, seen: Observed) -> bool:
    """The connection was cut: the engine is done and the peer got no close (nor anything else)."""
    return peer.conn.finished and not seen.closed and not seen.performatives


@pytest.fixture
def s() -> Setup:
    return Setup()


# -- the registry -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"point": "nowhere", "action": "drop"}, "unknown fault point 'nowhere' (known points: attach, declare"),
        ({"point": "deliver", "action": "reject"}, "its actions: delay, drop-connection"),
        ({"point": "discharge", "action": "reject", "condition": "oops"}, "known: rollback, timeout, unknown-id, "),
        ({"point": "declare", "action": "delay"}, "needs a delay"),
        ({"point": "transfer", "action": "reject", "times": -1}, "times: expected an integer of 0 or more"),
        ({"point": "transfer", "action": "reject", "after": 1.5}, "after: expected an integer"),
        ({"point": "transfer", "action": "delay", "delay": "soon"}, "delay: expected a number"),
        ({"point": "transfer", "action": "delay", "delay": float("inf")}, "delay: expected a finite number"),
        ({"point": "transfer", "action": "reject", "address": 3}, "address: expected a string"),
    ],
)
def test_a_bad_rule_is_refused_naming_what_is_allowed(s: Setup, fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        s.faults.add(**fields)
    assert s.faults.list() == []


def test_from_mapping_names_an_unknown_or_missing_field() -> None:
    with pytest.raises(ValueError, match=r"colour: unknown field \(known fields: action, address"):
        FaultSpec.from_mapping({"point": "attach", "action": "refuse", "colour": "red"})
    with pytest.raises(ValueError, match="action: missing"):
        FaultSpec.from_mapping({"point": "attach"})
    with pytest.raises(ValueError, match="point: expected a string"):
        FaultSpec.from_mapping({"point": 1, "action": "refuse"})


def test_short_condition_names_are_the_transaction_conditions() -> None:
    assert FaultSpec("discharge", "reject", condition="rollback").condition == ROLLBACK
    assert FaultSpec("discharge", "reject", condition="timeout").condition == "amqp:transaction:timeout"
    assert FaultSpec("discharge", "reject", condition="unknown-id").condition == "amqp:transaction:unknown-id"
    assert FaultSpec("attach", "refuse", condition="amqp:not-found").condition == "amqp:not-found"


def test_after_skips_times_counts_and_zero_is_always() -> None:
    faults = Faults()
    faults.add(FaultSpec("transfer", "reject", after=2, times=2))
    fired = [faults.fire("transfer") is not None for _ in range(6)]
    assert fired == [False, False, True, True, False, False]
    always = Faults()
    always.add(FaultSpec("transfer", "reject", times=0, after=1))
    assert [always.fire("transfer") is not None for _ in range(5)] == [False, True, True, True, True]
    assert always.list()[0].hits == 4


def test_rules_are_tried_in_order_and_the_first_that_fires_wins() -> None:
    faults = Faults()
    first = faults.add(FaultSpec("transfer", "reject"))
    second = faults.add(FaultSpec("transfer", "release"))
    assert faults.fire("transfer") is first
    assert faults.fire("transfer") is second  # the first is spent
    assert faults.fire("transfer") is None
    assert faults.fire("deliver") is None


def test_list_remove_and_clear(s: Setup) -> None:
    one = s.faults.add("transfer", "reject", address="q", description="no")
    two = s.faults.add("deliver", "delay", delay=2.5, times=0)
    listed = s.faults.list()
    expected = [(one, "transfer", "reject", 0), (two, "deliver", "delay", 0)]
    assert [(r.id, r.point, r.action, r.hits) for r in listed] == expected
    assert listed[0].address == "q"
    assert listed[0].description == "no"
    assert listed[1].delay == 2.5
    assert s.faults.remove(one) is True
    assert s.faults.remove(one) is False
    assert [r.id for r in s.faults.list()] == [two]
    s.faults.clear()
    assert s.faults.list() == []


def test_every_point_has_actions() -> None:
    assert set(POINTS) == {"attach", "declare", "post", "discharge", "transfer", "deliver", "connection"}


# -- attach -------------------------------------------------------------------------------------------------
def test_attach_refuse_answers_a_null_terminus_then_detaches_with_the_condition(s: Setup) -> None:
    s.faults.add("attach", "refuse", address="q", condition="amqp:not-found", description="gone fishing")
    peer = s.peer()
    peer.attach_producer("s", "q")
    seen = s.settle(peer)
    assert seen.attached["s"].target is None
    [(name, err)] = seen.detached
    assert name == "s"
    assert err is not None
    assert (err.condition, err.description) == ("amqp:not-found", "gone fishing")
    peer.attach_producer("other", "elsewhere")  # another address is not matched
    seen = s.settle(peer)
    assert seen.attached["other"].target is not None
    assert not seen.detached
    assert s.faults.list()[0].hits == 1


def test_attach_refuse_of_a_coordinator_by_its_address(s: Setup) -> None:
    s.faults.add("attach", "refuse", address="$coordinator")
    peer = s.peer()
    peer.attach_producer("s", "q")
    peer.attach_controller("ctl")
    seen = s.settle(peer)
    assert seen.attached["s"].target is not None
    assert seen.attached["ctl"].target is None
    assert [name for name, _ in seen.detached] == ["ctl"]


def test_attach_detach_accepts_then_detaches(s: Setup) -> None:
    s.faults.add("attach", "detach", address="q", condition="amqp:resource-deleted")
    peer = s.peer()
    peer.attach_consumer("r", "q", presettled=False, default_outcome=None)
    seen = s.settle(peer)
    assert seen.attached["r"].source is not None
    [(name, err)] = seen.detached
    assert name == "r"
    assert err is not None
    assert err.condition == "amqp:resource-deleted"
    assert s.view.queue("q").stats().consumers == 0


# -- declare ------------------------------------------------------------------------------------------------
def test_declare_reject(s: Setup) -> None:
    s.faults.add("declare", "reject", condition="amqp:resource-limit-exceeded")
    peer = s.peer()
    peer.attach_controller("ctl")
    delivery = peer.declare("ctl")
    assert condition_of(s.settle(peer).answers[delivery][0]) == "amqp:resource-limit-exceeded"
    assert s.view.transactions == []
    s.declare(peer)  # spent: the next one is declared


def test_declare_detach(s: Setup) -> None:
    s.faults.add("declare", "detach", condition="amqp:not-allowed")
    peer = s.peer()
    peer.attach_controller("ctl")
    delivery = peer.declare("ctl")
    seen = s.settle(peer)
    assert delivery not in seen.answers
    assert [(n, e.condition if e else None) for n, e in seen.detached] == [("ctl", "amqp:not-allowed")]


def test_declare_delay_answers_after_the_delay(s: Setup) -> None:
    s.faults.add("declare", "delay", delay=30)
    peer = s.peer()
    peer.attach_controller("ctl")
    delivery = peer.declare("ctl")
    assert delivery not in s.settle(peer).answers
    assert s.world.broker.next_deadline() == 30
    s.world.advance(29.5)
    assert delivery not in s.settle(peer).answers
    s.world.advance(0.5)
    assert isinstance(s.settle(peer).answers[delivery][0], Declared)
    assert len(s.view.transactions) == 1


def test_a_delayed_declare_whose_controller_went_is_never_answered(s: Setup) -> None:
    s.faults.add("declare", "delay", delay=5)
    peer = s.peer()
    peer.attach_controller("ctl")
    peer.declare("ctl")
    s.world.settle()
    peer.detach("ctl")
    s.world.settle()
    s.world.advance(5)
    assert s.view.transactions == []
    assert s.world.broker.internal_errors == 0


def test_declare_drop_connection(s: Setup) -> None:
    s.faults.add("declare", "drop-connection")
    peer = s.peer()
    peer.attach_controller("ctl")
    s.world.settle()
    peer.declare("ctl")
    assert dropped(peer, s.settle(peer))
    assert s.view.connections == []


# -- post -------------------------------------------------------------------------------------------------
def test_post_reject_refuses_the_post_and_the_commit(s: Setup) -> None:
    s.faults.add("post", "reject", address="q", condition="amqp:resource-limit-exceeded")
    peer = s.peer()
    txn = s.declare(peer)
    assert condition_of(s.post(peer, txn, "a")) == "amqp:resource-limit-exceeded"
    assert isinstance(s.post(peer, txn, "b"), TransactionalState)  # spent
    delivery = peer.discharge("ctl", txn, fail=False)
    assert condition_of(s.settle(peer).answers[delivery][0]) == ROLLBACK
    assert s.depth() == 0


def test_post_rollback_only_takes_the_post_but_the_commit_fails(s: Setup) -> None:
    s.faults.add("post", "rollback-only")
    peer = s.peer()
    txn = s.declare(peer)
    provisional = s.post(peer, txn)
    assert isinstance(provisional, TransactionalState)
    assert isinstance(provisional.outcome, Accepted)
    delivery = peer.discharge("ctl", txn, fail=False)
    state = s.settle(peer).answers[delivery][0]
    assert condition_of(state) == ROLLBACK
    assert s.depth() == 0
    assert s.view.txn_stats.failed_commits == 1


# -- discharge ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("short", "full"), [("rollback", ROLLBACK), ("timeout", "amqp:transaction:timeout")])
def test_discharge_reject_rolls_back_with_the_condition(s: Setup, short: str, full: str) -> None:
    s.faults.add("discharge", "reject", condition=short)
    peer = s.peer()
    txn = s.declare(peer)
    s.post(peer, txn)
    delivery = peer.discharge("ctl", txn, fail=False)
    assert condition_of(s.settle(peer).answers[delivery][0]) == full
    assert s.depth() == 0
    assert s.view.transactions == []


def test_discharge_reject_unknown_id(s: Setup) -> None:
    s.faults.add("discharge", "reject", condition="unknown-id")
    peer = s.peer()
    txn = s.declare(peer)
    delivery = peer.discharge("ctl", txn, fail=False)
    assert condition_of(s.settle(peer).answers[delivery][0]) == "amqp:transaction:unknown-id"


def test_discharge_delay_commits_when_the_delay_is_over(s: Setup) -> None:
    s.faults.add("discharge", "delay", delay=10)
    peer = s.peer()
    txn = s.declare(peer)
    s.post(peer, txn)
    delivery = peer.discharge("ctl", txn, fail=False)
    assert delivery not in s.settle(peer).answers
    s.world.advance(9)
    assert s.depth() == 0
    assert delivery not in s.settle(peer).answers
    s.world.advance(1)
    assert isinstance(s.settle(peer).answers[delivery][0], Accepted)
    assert s.depth() == 1


def test_discharge_detach_rolls_back(s: Setup) -> None:
    s.faults.add("discharge", "detach", condition="amqp:transaction:rollback")
    peer = s.peer()
    txn = s.declare(peer)
    s.post(peer, txn)
    delivery = peer.discharge("ctl", txn, fail=False)
    seen = s.settle(peer)
    assert delivery not in seen.answers
    assert [(n, e.condition if e else None) for n, e in seen.detached] == [("ctl", ROLLBACK)]
    assert s.depth() == 0
    assert s.view.transactions == []


def test_discharge_drop_connection_rolls_back(s: Setup) -> None:
    s.faults.add("discharge", "drop-connection")
    peer = s.peer()
    txn = s.declare(peer)
    s.post(peer, txn)
    peer.discharge("ctl", txn, fail=False)
    assert dropped(peer, s.settle(peer))
    assert s.depth() == 0
    assert s.view.txn_stats.rolled_back == 1
    assert s.view.txn_stats.committed == 0


def test_discharge_lose_outcome_commits_and_never_answers(s: Setup) -> None:
    s.faults.add("discharge", "lose-outcome")
    peer = s.peer()
    txn = s.declare(peer)
    s.post(peer, txn)
    peer.discharge("ctl", txn, fail=False)
    assert dropped(peer, s.settle(peer))
    assert s.depth() == 1
    assert s.view.txn_stats.committed == 1


# -- transfer -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("action", "kind"), [("reject", Rejected), ("release", Released), ("modify", Modified)])
def test_transfer_answers_instead_of_taking_the_message(s: Setup, action: str, kind: type) -> None:
    s.faults.add("transfer", action, address="q", condition="amqp:not-allowed", description="nope")
    peer = s.peer()
    delivery = s.send(peer)
    state = s.settle(peer).answers[delivery][0]
    assert isinstance(state, kind)
    if action == "reject":
        assert state.error == Error(condition="amqp:not-allowed", description="nope")
    if action == "modify":
        assert state.delivery_failed
    assert s.depth() == 0
    second = s.send(peer, "n")
    assert isinstance(s.settle(peer).answers[second][0], Accepted)
    assert s.depth() == 1


def test_transfer_reject_of_a_transactional_post_fails_its_commit(s: Setup) -> None:
    s.faults.add("transfer", "reject")
    peer = s.peer()
    txn = s.declare(peer)
    assert condition_of(s.post(peer, txn)) == "amqp:not-allowed"
    delivery = peer.discharge("ctl", txn, fail=False)
    assert condition_of(s.settle(peer).answers[delivery][0]) == ROLLBACK


def test_transfer_to_the_relay_matches_the_messages_to(s: Setup) -> None:
    s.faults.add("transfer", "release", address="q")
    peer = s.peer()
    peer.attach_producer("relay", None)
    s.world.settle()
    elsewhere = peer.transfer("relay", payload("a", to="other"))
    here = peer.transfer("relay", payload("b", to="q"))
    answers = s.settle(peer).answers
    assert isinstance(answers[elsewhere][0], Accepted)
    assert isinstance(answers[here][0], Released)


def test_transfer_delay_takes_the_message_later(s: Setup) -> None:
    s.faults.add("transfer", "delay", delay=3)
    peer = s.peer()
    delivery = s.send(peer)
    assert delivery not in s.settle(peer).answers
    assert s.depth() == 0
    s.world.advance(3)
    assert isinstance(s.settle(peer).answers[delivery][0], Accepted)
    assert s.depth() == 1


def test_transfer_drop_connection(s: Setup) -> None:
    s.faults.add("transfer", "drop-connection")
    peer = s.peer()
    s.send(peer)
    assert dropped(peer, s.settle(peer))
    assert s.depth() == 0


# -- deliver ------------------------------------------------------------------------------------------------
def consumer(s: Setup, container: str = "consumer", credit: int = 10) -> Peer:
    peer = s.peer(container)
    peer.attach_consumer("r", "q", presettled=False, default_outcome=None)
    peer.flow("r", credit)
    s.world.settle()
    return peer


def test_deliver_delay_holds_the_message_back(s: Setup) -> None:
    s.faults.add("deliver", "delay", delay=4, address="q")
    reader = consumer(s)
    writer = s.peer()
    s.send(writer)
    seen = s.world.settle()
    assert seen[reader].completed == []
    assert s.view.queue("q").stats().scheduled == 1
    s.world.advance(4)
    [got] = s.world.settle()[reader].completed
    assert got.name == "m"


def test_deliver_drop_connection_puts_the_message_back(s: Setup) -> None:
    s.faults.add("deliver", "drop-connection", container_id="unlucky")
    unlucky = consumer(s, "unlucky")
    writer = s.peer()
    s.send(writer)
    seen = s.world.settle()
    assert dropped(unlucky, seen[unlucky])
    assert s.depth() == 1
    lucky = consumer(s, "lucky")  # another container: not matched
    assert s.depth() == 0
    assert lucky.conn.finished is False
    assert s.view.queue("q").stats().acquired == 1


# -- connection ---------------------------------------------------------------------------------------------
def test_connection_close_on_open_after_a_delay(s: Setup) -> None:
    s.faults.add("connection", "close", condition="amqp:connection:forced", description="bye", delay=2)
    peer = s.peer()
    assert not peer.conn.finished
    assert len(s.view.connections) == 1
    s.world.advance(2)
    seen = s.settle(peer)
    assert seen.closed
    assert seen.close_error == Error(condition="amqp:connection:forced", description="bye")
    assert s.view.connections == []


def test_connection_drop_on_open_by_container(s: Setup) -> None:
    s.faults.add("connection", "drop", container_id="victim")
    other = s.peer("bystander")
    victim = s.world.connect("victim")
    seen = s.world.settle()
    assert victim.conn.finished
    assert not seen[victim].closed
    assert not other.conn.finished


def test_a_connection_rule_fires_at_once_on_open_connections(s: Setup) -> None:
    first = s.peer("a")
    second = s.peer("b")
    s.faults.add("connection", "close", times=0, condition="amqp:connection:forced")
    seen = s.world.settle()
    assert seen[first].closed
    assert seen[second].closed
    assert s.faults.list()[0].hits == 2


# -- counting and logging -----------------------------------------------------------------------------------
def test_after_and_times_on_the_wire(s: Setup) -> None:
    s.faults.add("transfer", "reject", after=1, times=2)
    peer = s.peer()
    sent = [s.send(peer, f"m{i}") for i in range(4)]
    answers = s.settle(peer).answers
    assert [type(answers[d][0]).__name__ for d in sent] == ["Accepted", "Rejected", "Rejected", "Accepted"]
    assert s.faults.list()[0].hits == 2


def test_times_zero_fires_always(s: Setup) -> None:
    s.faults.add("transfer", "release", times=0)
    peer = s.peer()
    sent = [s.send(peer, f"m{i}") for i in range(5)]
    answers = s.settle(peer).answers
    assert all(isinstance(answers[d][0], Released) for d in sent)
    assert s.faults.list()[0].hits == 5


def test_each_firing_is_logged_with_its_rule_id(s: Setup, caplog: pytest.LogCaptureFixture) -> None:
    rule = s.faults.add("transfer", "release", times=2)
    peer = s.peer()
    with caplog.at_level(logging.INFO, logger="minibroker.faults"):
        s.send(peer)
        s.send(peer, "n")
        s.world.settle()
    fired = [r.getMessage() for r in caplog.records if r.name == "minibroker.faults" and "fired" in r.getMessage()]
    assert len(fired) == 2
    assert all(m.startswith(f"fault rule {rule} fired: transfer release") for m in fired)


def test_no_rules_no_change(s: Setup) -> None:
    assert s.world.broker.injection.rules == []
    peer = s.peer()
    txn = s.declare(peer)
    s.post(peer, txn)
    delivery = peer.discharge("ctl", txn, fail=False)
    assert isinstance(s.settle(peer).answers[delivery][0], Accepted)
    assert s.depth() == 1
