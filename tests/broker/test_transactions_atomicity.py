"""Commits are all or nothing, as an observer reading the queues sees them (AMQP 1.0 part 4).

Part 4 §4.4.1: a posted message "does not become available at the destination node ... until after the
transaction has been (successfully) discharged", and "if the resource can no longer apply the outcome that it
originally indicated ... it MUST NOT allow the successful discharge"; "it is an error for the controller to
attempt to discharge a transaction against which a partial delivery has been posted". So a transaction's posts
are seen entirely or not at all, and a discharge the broker answers ``accepted`` must have made all of them
visible, at once.

A hypothesis state machine runs several transactions on two connections at the same time. Their posts go to
queues, through the anonymous relay (also to addresses with no node yet, D4), and to dynamic nodes that are
deleted with the link that made them, sometimes before the commit (R1); some posts are sent in two frames,
and a discharge may arrive between them (R6); the clock may pass the transaction time-out. After every step
an observer reads every queue through the public ``peek()`` handle, in one go, and checks each transaction:

- until its discharge is answered ``accepted``, none of its messages is visible;
- at the step where it is, every message it posted is visible;
- later, all of them still are, except those on nodes deleted since (no consumer takes anything here);
- a discharge that could apply everything (no node of it deleted, no partial post, not timed out) succeeds.

The observer knows what each client sent and what the broker answered, nothing of the broker's insides, and
none of the rules beyond "entirely, or not at all". ``test_checker_sees_a_partial_commit`` breaks atomicity
on purpose at the engine boundary and checks that the observer reports it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from minibroker.amqp.definitions import Accepted, Declared, TransactionalState
from minibroker.broker.core import Broker, BrokerSettings
from tests.broker.txn_driver import (
    BrokerView,
    Observed,
    Peer,
    World,
    census,
    lose_second_transactional_post,
    payload,
)


def txn_ids() -> Iterator[bytes]:
    """The broker's txn-ids: short, distinct, and the same in every run (so examples replay)."""
    return (b"txn-%d" % n for n in itertools.count(1))


def dynamic_ids() -> Iterator[str]:
    """The random part of the broker's dynamic addresses, the same in every run (so examples replay)."""
    return (str(n) for n in itertools.count(1))


QUEUES = ("q1", "q2", "q3")
TXN_TIMEOUT = 10.0
SETTINGS = BrokerSettings(transaction_timeout=TXN_TIMEOUT)


@dataclass(eq=False)
class Batch:
    """One transaction, as its client knows it."""

    label: str
    slot: int
    txn_id: bytes
    declared_at: float
    intended: dict[str, str] = field(default_factory=dict)  # message name -> the address it was posted to
    open: bool = True
    committed: bool = False  # its discharge(fail=false) was answered accepted
    partial: bool = False  # a post in it is in the middle of being sent


@dataclass(eq=False)
class Client:
    slot: int
    peer: Peer
    controller: str = ""
    producers: dict[str, str] = field(default_factory=dict)  # queue -> link
    relay: str = ""
    dynamic: dict[str, str] = field(default_factory=dict)  # link that made a dynamic node -> its address
    dynamic_producers: set[str] = field(default_factory=set)  # those of them that are producers
    sending: dict[str, tuple[str, Batch, bytes]] = field(default_factory=dict)  # link -> (message, batch, rest)


class AtomicityChecker(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.world = World(Broker(SETTINGS, txn_ids=txn_ids(), dynamic_ids=dynamic_ids()))
        self.view = BrokerView(self.world)
        self.clients: dict[int, Client] = {}
        self.batches: dict[str, Batch] = {}
        self.names = itertools.count(1)
        self.deleted: set[str] = set()  # addresses of dynamic nodes deleted so far
        self.just_committed: set[str] = set()  # batches whose commit was answered in this step

    # -- driving -----------------------------------------------------------------------------------------------
    def _step(self) -> dict[int, Observed]:
        seen = self.world.settle()
        by_slot = {c.slot: seen[c.peer] for c in self.clients.values() if c.peer in seen}
        for slot, obs in by_slot.items():
            assert not obs.violations, obs.violations
            client = self.clients[slot]
            if any(name == client.controller for name, _ in obs.detached):  # its transactions rolled back (§4)
                for batch in self._open(slot):
                    batch.open = False
                client.controller = f"ctl{slot}-{next(self.names)}"
                client.peer.attach_controller(client.controller)
                self._step()
        return by_slot

    def _connect(self, slot: int) -> None:
        peer = self.world.connect(f"client{slot}")
        client = self.clients[slot] = Client(slot, peer, controller=f"ctl{slot}")
        peer.attach_controller(client.controller)
        for q in QUEUES:
            client.producers[q] = f"p{slot}-{q}"
            peer.attach_producer(client.producers[q], q)
        client.relay = f"relay{slot}"
        peer.attach_producer(client.relay, None)
        self._step()

    def _open(self, slot: int | None = None) -> list[Batch]:
        return [b for b in self.batches.values() if b.open and (slot is None or b.slot == slot)]

    def _pick(self, data: st.DataObject, items: list[Any], label: str, name: Any) -> Any:
        by_name = {name(i): i for i in items}
        return by_name[data.draw(st.sampled_from(sorted(by_name)), label=label)]

    def _destinations(self, client: Client, in_two_frames: bool) -> list[tuple[str, str | None, str]]:
        """(how, link, address) of every place a post may go now from ``client``."""
        where: list[tuple[str, str | None, str]] = [
            (f"producer->{q}", link, q) for q, link in client.producers.items() if link not in client.sending
        ]
        if client.relay not in client.sending:
            where += [(f"relay->{q}", client.relay, q) for q in QUEUES]
            where.append(("relay->fresh", client.relay, ""))
            if not in_two_frames:  # (one finished after its node went would make a new node of that name)
                where += [(f"relay->{a}", client.relay, a) for c in self.clients.values() for a in c.dynamic.values()]
        where += [
            (f"dynamic producer->{a}", link, a)
            for link, a in client.dynamic.items()
            if link in client.dynamic_producers and link not in client.sending
        ]
        return where

    # -- rules -------------------------------------------------------------------------------------------------
    @initialize()
    def connect(self) -> None:
        self._connect(0)
        self._connect(1)

    @precondition(lambda self: len(self._open()) < 6)
    @rule(slot=st.sampled_from([0, 1]))
    def declare(self, slot: int) -> None:
        client = self.clients[slot]
        delivery_id = client.peer.declare(client.controller)
        answer, _ = self._step()[slot].answers[delivery_id]
        assert isinstance(answer, Declared), answer
        label = f"T{len(self.batches) + 1}"
        self.batches[label] = Batch(label, slot, answer.txn_id, self.world.now)

    @precondition(lambda self: self._open())
    @rule(settled=st.booleans(), in_two_frames=st.sampled_from([False, False, True]), data=st.data())
    def post(self, settled: bool, in_two_frames: bool, data: st.DataObject) -> None:
        batch = self._pick(data, self._open(), "txn", lambda b: b.label)
        client = self.clients[batch.slot]
        where = self._destinations(client, in_two_frames)
        if not where:
            return
        _, link, address = self._pick(data, where, "to", lambda w: w[0])
        self._post_one(batch, client, link, address, settled=settled, in_two_frames=in_two_frames)

    def _post_one(
        self,
        batch: Batch,
        client: Client,
        link: str | None,
        address: str,
        *,
        settled: bool,
        in_two_frames: bool = False,
    ) -> None:
        assert link is not None
        address = address or f"fresh{next(self.names)}"
        name = f"{batch.label}.{len(batch.intended) + 1}"
        to = address if link == client.relay else None
        whole = payload(name, big=in_two_frames, to=to)
        state = TransactionalState(txn_id=batch.txn_id)
        batch.intended[name] = address
        if in_two_frames:
            client.peer.begin_transfer(link, whole[:100], settled=settled, state=state)
            client.sending[link] = (name, batch, whole[100:])
            batch.partial = True
        else:
            client.peer.transfer(link, whole, settled=settled, state=state)
        self._step()

    @precondition(lambda self: any(c.sending for c in self.clients.values()))
    @rule(data=st.data())
    def finish_post(self, data: st.DataObject) -> None:
        client = self._pick(data, [c for c in self.clients.values() if c.sending], "client", lambda c: c.slot)
        link = data.draw(st.sampled_from(sorted(client.sending)), label="link")
        _, batch, rest = client.sending.pop(link)
        batch.partial = any(b is batch for _, b, _ in client.sending.values())
        client.peer.end_transfer(link, rest)
        self._step()

    @rule(slot=st.sampled_from([0, 1]), as_target=st.booleans())
    def make_dynamic_node(self, slot: int, as_target: bool) -> None:
        """A link with a dynamic target (a producer) or source (a consumer that never takes anything)."""
        client = self.clients[slot]
        if len(client.dynamic) >= 3:
            return
        link = f"dyn{slot}-{next(self.names)}"
        if as_target:
            client.peer.attach_producer(link, None, dynamic=True)
            client.dynamic_producers.add(link)
        else:
            client.peer.attach_consumer(link, None, presettled=False, default_outcome=None, dynamic=True)
        self._step()
        client.dynamic[link] = client.peer.addresses[link]

    @precondition(lambda self: any(c.dynamic for c in self.clients.values()))
    @rule(data=st.data())
    def delete_dynamic_node(self, data: st.DataObject) -> None:
        """The link that made a dynamic node detaches: the node, and what is on it, goes (R1)."""
        client = self._pick(data, [c for c in self.clients.values() if c.dynamic], "client", lambda c: c.slot)
        self._delete(client, data.draw(st.sampled_from(sorted(client.dynamic)), label="link"))

    def _delete(self, client: Client, link: str) -> None:
        self.deleted.add(client.dynamic.pop(link))
        client.dynamic_producers.discard(link)
        dropped = client.sending.pop(link, None)
        if dropped is not None:  # a post in the middle of being sent on it is dropped with the link
            _, batch, _ = dropped
            batch.partial = any(b is batch for _, b, _ in client.sending.values())
        client.peer.detach(link)
        self._step()

    @precondition(lambda self: self._open())
    @rule(fail=st.sampled_from([False, False, True]), data=st.data())
    def discharge(self, fail: bool, data: st.DataObject) -> None:
        self._discharge(self._pick(data, self._open(), "txn", lambda b: b.label), fail)

    def _discharge(self, batch: Batch, fail: bool) -> None:
        client = self.clients[batch.slot]
        could_commit = (
            not fail
            and not batch.partial
            and self.world.now < batch.declared_at + TXN_TIMEOUT
            and not any(a in self.deleted for a in batch.intended.values())
            and not any(b is batch for c in self.clients.values() for _, b, _ in c.sending.values())
        )
        delivery_id = client.peer.discharge(client.controller, batch.txn_id, fail=fail)
        batch.open = False
        answers = self._step().get(batch.slot, Observed()).answers
        answer = answers.get(delivery_id, (None, True))[0]
        if not fail and isinstance(answer, Accepted):
            batch.committed = True
            self.just_committed.add(batch.label)
        if could_commit:
            assert batch.committed, f"{batch.label}: a commit that could apply everything got {answer}"

    @rule(
        slot=st.sampled_from([0, 1]),
        n=st.integers(1, 4),
        delete=st.sampled_from(["a node it posted to", "a node it posted to", "nothing"]),
        then=st.sampled_from(["commit", "commit", "roll back", "leave open"]),
        data=st.data(),
    )
    def batch_across_nodes(self, slot: int, n: int, delete: str, then: str, data: st.DataObject) -> None:
        """A transaction posts to several nodes, dynamic ones among them; one of those may go before the
        commit (R1)."""
        client = self.clients[slot]
        if not client.dynamic_producers and not any(c.dynamic for c in self.clients.values()):
            self.make_dynamic_node(slot, data.draw(st.booleans(), label="as target"))
        if len(self._open()) >= 6:
            return
        self.declare(slot)
        batch = list(self.batches.values())[-1]
        for _ in range(n):
            where = self._destinations(client, in_two_frames=False)
            if not where:
                break
            dynamic = [w for w in where if "dynamic" in w[0]]
            _, link, address = self._pick(data, where + dynamic * 3, "to", lambda w: w[0])
            self._post_one(batch, client, link, address, settled=data.draw(st.booleans(), label="settled"))
        posted_to = {a for a in batch.intended.values()}
        owners = [(c, link) for c in self.clients.values() for link, a in c.dynamic.items() if a in posted_to]
        if delete != "nothing" and owners:
            client_and_link = self._pick(data, owners, "delete", lambda o: o[1])
            self._delete(*client_and_link)
        if then != "leave open" and batch.open:
            self._discharge(batch, then == "roll back")

    @rule()
    def time_passes(self) -> None:
        self.world.advance(TXN_TIMEOUT / 2 + 0.5)
        self._step()

    @rule(slot=st.sampled_from([0, 1]))
    def detach_controller(self, slot: int) -> None:
        """§4: the controller goes: its transactions roll back."""
        client = self.clients[slot]
        client.peer.detach(client.controller)
        for batch in self._open(slot):
            batch.open = False
        self._step()
        client.controller = f"ctl{slot}-{next(self.names)}"
        client.peer.attach_controller(client.controller)
        self._step()

    # -- the observer ------------------------------------------------------------------------------------------
    @invariant()
    def each_transaction_is_seen_entirely_or_not_at_all(self) -> None:
        if not self.clients:
            return
        visible: dict[str, set[str]] = {}
        for address, queue in census(self.view).items():
            for name, _ in queue.ready:
                assert name is not None, f"{address} holds a message nobody posted"
                label, _, _ = name.partition(".")
                visible.setdefault(label, set()).add(name)
                assert self.batches[label].intended[name] == address, f"{name} is on {address}"
        for label, batch in self.batches.items():
            seen = visible.get(label, set())
            if not batch.committed:
                assert not seen, f"{label} ({'open' if batch.open else 'not committed'}) is visible in part: {seen}"
                continue
            everything = set(batch.intended)
            if label in self.just_committed:
                missing = everything - seen
                assert not missing, f"{label} was committed, but only {sorted(seen)} of it is visible"
            left = {n for n, a in batch.intended.items() if a not in self.deleted}
            assert seen == left, f"{label}: {sorted(seen)} visible, {sorted(left)} expected"
        self.just_committed.clear()


AtomicityChecker.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=40,
    deadline=None,
    report_multiple_bugs=False,  # one bug at a time, shrunk quickly
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestAtomicity = AtomicityChecker.TestCase
TestAtomicity.pytestmark = [pytest.mark.timeout(300)]  # passing takes seconds; shrinking a failure, longer


# -- the checker can fail -----------------------------------------------------------------------------------
class FirstChoice:
    """Stands in for ``st.data()`` in a scripted run: every ``sampled_from`` draw takes its first element."""

    def draw(self, strategy: Any, label: str | None = None) -> Any:
        return strategy.elements[0]


def _commit_two_posts(checker: AtomicityChecker) -> None:
    checker.connect()
    checker.declare(0)
    batch = checker.batches["T1"]
    client = checker.clients[0]
    for q in ("q1", "q2"):
        name = f"T1.{len(batch.intended) + 1}"
        batch.intended[name] = q
        client.peer.transfer(client.producers[q], payload(name), state=TransactionalState(txn_id=batch.txn_id))
        checker._step()
        checker.each_transaction_is_seen_entirely_or_not_at_all()
    checker.discharge(False, FirstChoice())  # type: ignore[arg-type]
    checker.each_transaction_is_seen_entirely_or_not_at_all()


def test_the_scripted_commit_passes_on_the_broker_as_it_is() -> None:
    _commit_two_posts(AtomicityChecker())


def test_checker_sees_a_partial_commit() -> None:
    checker = AtomicityChecker()
    checker.world.event_filter = lose_second_transactional_post()
    with pytest.raises(AssertionError, match="T1 was committed, but only"):
        _commit_two_posts(checker)
