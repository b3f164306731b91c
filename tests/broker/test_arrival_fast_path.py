"""The usual arrival's short path (``Dispatcher._enqueue_all``: one queue, no expiry, schedule, journal record, copy
of its own, rule action or head to drop; issue 19) against the general one, as clients and the inspection API see
them.

Two brokers get the same random steps: plain and transactional posts of every kind of message (python-qpid-proton's
empty header and properties, a priority, a ttl, an absolute-expiry-time, a delivery delay, a durable header, a
property a filter reads) to a plain queue, a full one (reject-publish), one that drops its head, one that is
deleted under an open transaction, topics with a filtered and an unfiltered subscription or one filtered
subscription only; commits and rollbacks; consumers taking and accepting; the clock moving (expiries, scheduled
deliveries). The second broker is told a queue may need copies of their own (``Dispatcher.own_copies``, which
no queue here does), and so takes the general path (``_enqueue_copies``) for every arrival. After every step both
must have answered every peer alike (outcomes, deliveries with their bytes, settlements, detaches), hold the same
messages in the same order with the same counts, and wait for the same next timer.
"""

from __future__ import annotations

from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from minibroker.amqp.definitions import (
    Accepted,
    ApplicationProperties,
    Declared,
    Header,
    MessageAnnotations,
    Properties,
    TransactionalState,
)
from minibroker.amqp.types import Described, Symbol, Timestamp, UByte, UInt
from minibroker.broker.core import Broker
from minibroker.broker.message import Message
from minibroker.broker.policy import DROP_HEAD, NodePolicy
from minibroker.broker.selector import SELECTOR_DESCRIPTORS
from minibroker.broker.settings import BrokerSettings
from minibroker.testing import frames
from tests.broker.txn_driver import BrokerView, Observed, World, census

SELECTOR = next(d for d in SELECTOR_DESCRIPTORS if isinstance(d, str))
RED = {Symbol("s"): Described(SELECTOR, "color = 'red'")}
QUEUES = ("plain", "full", "drop", "gone")
TOPICS = ("t", "t1")  # t: a filtered and an unfiltered subscription; t1: one filtered subscription only
CONSUMERS = {"c-plain": "plain", "c-full": "full", "c-drop": "drop", "c-t-red": "t", "c-t-all": "t", "c-t1-red": "t1"}
PROTON_EMPTY = b"\x00\x53\x70\x45\x00\x53\x73\x45"  # python-qpid-proton's empty header and properties (list0)
KINDS = ("proton", "bare", "priority", "ttl", "expiry", "delay", "durable", "red")


def _message(kind: str, name: str) -> bytes:
    body = f"<<{name}>>"
    if kind == "proton":
        return PROTON_EMPTY + frames.message(body)
    sections: dict[str, list[Any]] = {
        "bare": [],
        "priority": [Header(priority=UByte(9))],
        "ttl": [Header(ttl=UInt(1000))],
        "expiry": [Properties(message_id=name, absolute_expiry_time=Timestamp(1500))],
        "delay": [MessageAnnotations({Symbol("x-opt-delivery-delay"): 700})],
        "durable": [Header(durable=True)],
        "red": [ApplicationProperties({"color": "red"})],
    }
    return frames.message(body, *sections[kind])


class Twin:
    """One broker, its client (a producer per node, a controller, the consumers) and the open transaction."""

    def __init__(self, *, general: bool) -> None:
        policies = {
            "plain": NodePolicy(),
            "full": NodePolicy(max_messages=2),
            "drop": NodePolicy(max_messages=2, overflow=DROP_HEAD),
            "gone": NodePolicy(),
        }
        broker = Broker(BrokerSettings(queues=policies, topics={name: NodePolicy() for name in TOPICS}))
        if general:
            broker.dispatcher.own_copies = True  # (no queue needs one: every arrival takes ``_enqueue_copies``)
        self.world = World(broker)
        self.peer = peer = self.world.connect("app")
        for address in (*QUEUES, *TOPICS):
            peer.attach_producer(f"p-{address}", address)
        peer.attach_controller("ctl")
        for name, address in CONSUMERS.items():
            chosen = RED if name.endswith("-red") else None
            peer.attach_consumer(name, address, presettled=False, default_outcome=None, source_filter=chosen)
        self.settle()
        self.txn: bytes | None = None
        self.declare()

    def settle(self) -> Observed:
        observed = self.world.settle()[self.peer]
        for completed in observed.completed:  # a consumer accepts whatever it gets
            self.peer.dispose(completed.delivery_id, Accepted(), settled=True)
        if observed.completed:
            observed.settled_by_broker += self.world.settle()[self.peer].settled_by_broker
        return observed

    def declare(self) -> Observed:
        delivery_id = self.peer.declare("ctl")
        observed = self.settle()
        declared = observed.answers[delivery_id][0]
        assert isinstance(declared, Declared)
        self.txn = declared.txn_id
        return observed

    def step(self, step: tuple[Any, ...]) -> Any:
        """Apply one step; what the client saw, and the broker's state, as plain values to compare."""
        peer = self.peer
        op = step[0]
        if op == "post":  # ``count`` messages in a row
            _, address, kind, transactional, count, name = step
            for n in range(count if peer.attached(f"p-{address}") else 0):
                state = TransactionalState(txn_id=self.txn) if transactional else None
                peer.transfer(f"p-{address}", _message(kind, f"{name}.{n}"), state=state)
            observed = self.settle()
        elif op == "discharge":
            assert self.txn is not None
            peer.discharge("ctl", self.txn, fail=not step[1])
            observed = self.settle()
            observed.answers.update(self.declare().answers)
        elif op == "take":
            _, consumer, credit = step
            if peer.attached(consumer):
                peer.flow(consumer, credit)
            observed = self.settle()
        elif op == "advance":
            self.world.advance(step[1])
            observed = self.settle()
        else:  # delete the queue "gone" (a transaction may have posted to it: its commit then fails)
            BrokerView(self.world).queue("gone").delete()
            observed = self.settle()
        return self.snapshot(observed)

    def snapshot(self, observed: Observed) -> Any:
        broker = self.world.broker
        view = BrokerView(self.world)
        topics = {name: view.topic(name).subscriptions() for name in TOPICS}
        queues = {name: broker.node_counts(queue) for name, queue in broker.queues.items()}
        return (
            sorted(observed.answers.items(), key=lambda item: item[0]),
            [(c.link, c.name, c.delivery_count, c.payload) for c in observed.completed],
            sorted(observed.settled_by_broker, key=lambda item: item[0]),
            observed.detached,
            observed.violations,
            census(view),
            queues,
            topics,
            broker.next_deadline(),
        )


posts = st.tuples(
    st.just("post"), st.sampled_from((*QUEUES, *TOPICS)), st.sampled_from(KINDS), st.booleans(), st.integers(1, 4)
)
steps = st.lists(
    st.one_of(
        posts,
        posts,  # (twice: most steps are arrivals)
        st.tuples(st.just("discharge"), st.booleans()),  # commit (True) or roll back
        st.tuples(st.just("take"), st.sampled_from(sorted(CONSUMERS)), st.integers(1, 3)),
        st.tuples(st.just("advance"), st.sampled_from([0.4, 0.8, 1.6])),
        st.tuples(st.just("delete")),
    ),
    min_size=4,
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(steps)
@example([("post", "drop", "proton", False, 3), ("take", "c-drop", 3)])  # the head dropped at the limit
@example([("post", "full", "proton", True, 3), ("discharge", True), ("take", "c-full", 3)])  # a commit past it
@example([("post", "gone", "proton", True, 1), ("delete",), ("discharge", True)])  # the node deleted meanwhile
@example([("post", "t", "red", True, 2), ("post", "t1", "bare", False, 1), ("discharge", False)])  # filters
def test_the_short_arrival_gives_what_the_general_path_gives(program: list[tuple[Any, ...]]) -> None:
    fast, general = Twin(general=False), Twin(general=True)
    assert fast.snapshot(Observed()) == general.snapshot(Observed())
    for i, step in enumerate(program):
        if step[0] == "post":
            step = (*step, f"m{i}")  # (each message named by its step)
        assert fast.step(step) == general.step(step), step


def test_the_twins_can_tell_a_difference() -> None:
    """The comparison sees an arrival that went wrong: a message put on its queue out of its place in delivery order
    (ahead of one that came before it) differs from the general path's."""
    fast, general = Twin(general=False), Twin(general=True)
    first = ("post", "plain", "proton", False, 1, "first")
    assert fast.step(first) == general.step(first)
    queue = fast.world.broker.queues["plain"]
    put = queue.put

    def misplaced(message: Message) -> None:
        message.content.place(0)  # as if it had come before everything
        put(message)

    queue.put = misplaced  # type: ignore[method-assign]
    second = ("post", "plain", "proton", False, 1, "second")
    assert fast.step(second) != general.step(second)
