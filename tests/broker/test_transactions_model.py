"""Model-based test of transactions (Part 4, DESIGN §4) against the real broker core and engine.

A hypothesis state machine drives two in-memory clients (``txn_driver``) through random sequences of
declare, post (plain, in a transaction, or with a txn-id the connection does not own), consumer attach and
detach, credit (plain, acquiring under a transaction, ending acquisition, or naming an unknown txn-id),
retire (accepted, rejected, released, modified, settle-only; plain, transactional, with an unknown txn-id,
or naming a second live transaction; settled or not), commit, rollback, discharge of an unknown or timed-out
id, the clock passing the transaction time-out, controller detach, and connection close (close frame or
dropped socket) followed by a reconnect.

Beside the broker runs a deliberately simple reference model:

- per queue, the visible messages ordered by the sequence number each got when it became visible;
- per transaction, its staged posts, the deliveries it acquired and those it holds an outcome for;
- per consumer, its credit, whether it acquires under a transaction, and its live deliveries.

The model predicts everything except *which* consumer a dispatch picks; that it learns from the transfers
the clients receive, checking each against the model (the message must be visible, on that queue, with
the delivery-count the model expects, carrying the consumer's txn-id). It also predicts every disposition
by which the broker settles a delivery (after a commit, a rollback, an outcome given unsettled), every
link the broker detaches, and every answer to a post, declare and discharge, error conditions included.

After every step every queue's ready messages (bodies in order, delivery counts), depth, staged and
acquired counts, the open transactions and what each staged, the deliveries each client still has to
settle, and a census of every message the broker holds are compared with the model. Granting credit must
deliver exactly the head of the queue, in order, and no consumer may sit on credit while its queue has
visible messages. Closing every connection at the end must leave no transaction, staged message, acquired
message or unsettled delivery behind.

One subtlety the model allows: when one step rolls back several transactions (a time-out pass, a
controller that goes away), a message released by the first may be sent, under a later one that is still
live at that moment, to a consumer acquiring under it, and released again when that one rolls back.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from minibroker.amqp.definitions import Accepted, Declared, Modified, Rejected, Released, TransactionalState
from minibroker.amqp.errors import Condition
from minibroker.broker.core import Broker, BrokerSettings
from minibroker.broker.links import Consumer
from minibroker.broker.policy import NodePolicy
from minibroker.broker.transactions import counter_ids
from minibroker.testing import frames
from tests.broker.txn_driver import TXN_ID, Observed, Peer, World, broker_census, decode_message

QUEUES = ("q1", "q2")  # few queues, so that producers and consumers meet often
SLOTS = (0, 1)
MAX_CONSUMERS = 3  # per connection
MAX_TXNS = 4  # open at once, over both connections
RELEASED = Released()
OUTCOMES: list[Any] = [Accepted(), Rejected(), Released(), Modified(delivery_failed=True), Modified()]
DEFAULT_OUTCOMES: list[Any] = [None, Modified(delivery_failed=True), Accepted()]

TIMEOUT = 10.0  # transaction_timeout, in the seconds of the world's clock
SETTINGS = BrokerSettings(
    transaction_timeout=TIMEOUT,
    # Out of scope here, so switched off: rejected messages are dropped rather than dead-lettered, and no
    # number of failed deliveries dead-letters a message. Transactions are what the model is about.
    node_defaults=NodePolicy(dead_letter_address="", max_delivery_attempts=0),
)

ConsumerSpec = tuple[str, bool, Any, int]
"""(queue, presettled, default outcome, initial credit) of a consumer link."""
SLOT = st.sampled_from(SLOTS)
QUEUE = st.sampled_from(QUEUES)
OUTCOME = st.sampled_from([*OUTCOMES, None])  # None: settle without an outcome
CONSUMERS = st.tuples(
    QUEUE, st.sampled_from([False, False, True]), st.sampled_from(DEFAULT_OUTCOMES), st.sampled_from([0, 2, 5])
)


# -- the reference model --------------------------------------------------------------------------------
@dataclass(eq=False)
class MMsg:
    body: str
    queue: str
    seq: int = 0
    count: int = 0  # delivery-count


@dataclass(eq=False)
class MTxn:
    id: bytes
    slot: int
    created: float = 0.0
    posts: list[MMsg] = field(default_factory=list)
    retirements: list[MDel] = field(default_factory=list)
    acquisitions: list[MDel] = field(default_factory=list)


@dataclass(eq=False)
class MConsumer:
    slot: int
    name: str
    queue: str
    presettled: bool
    default_outcome: Any
    attached: bool = True
    credit: int = 0
    txn: MTxn | None = None
    deliveries: dict[int, MDel] = field(default_factory=dict)  # live ones, by delivery id

    @property
    def outcome_when_gone(self) -> Any:
        return RELEASED if self.default_outcome is None else self.default_outcome


@dataclass(eq=False)
class MDel:
    msg: MMsg
    consumer: MConsumer
    delivery_id: int
    acquired_by: MTxn | None = None
    retired_by: MTxn | None = None
    outcome: Any = None
    peer_settled: bool = False  # the consumer settled it (or it was sent settled), as the broker knows
    wire_open: bool = True  # neither side has settled it on the wire

    @property
    def in_txn(self) -> bool:
        return self.acquired_by is not None or self.retired_by is not None


def same_outcome(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    return not isinstance(a, Modified) or bool(a.delivery_failed) == bool(b.delivery_failed)


def condition_of(state: Any) -> str | None:
    """The error condition a state (rejected) carries, if any."""
    return condition_of_error(getattr(state, "error", None))


def condition_of_error(err: Any) -> str | None:
    return None if err is None else str(err.condition)


class TransactionsModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.broker = Broker(SETTINGS, txn_ids=counter_ids(b"txn-"))
        self.world = World(self.broker)
        self.peers: dict[int, Peer] = {}
        self.controllers: dict[int, str] = {}
        self.producers: dict[int, dict[str, str]] = {}
        self.names = 0
        self.visible: dict[str, list[MMsg]] = {q: [] for q in QUEUES}
        self.txns: list[MTxn] = []  # live, in declaration order
        self.dead_ids: list[bytes] = [b"never-declared"]
        self.expired: dict[int, set[bytes]] = {slot: set() for slot in SLOTS}
        """txn-ids of each connection that timed out and whose discharge has not yet been refused."""
        self.consumers: list[MConsumer] = []  # attached
        self.seq = 0
        self.bodies = 0
        self.entered = 0
        self.consumed = 0
        self.expected_settles: list[tuple[int, int, Any]] = []
        self.doomed: dict[bytes, list[MConsumer]] = {}
        self.messages: dict[str, MMsg] = {}  # every message posted, by body
        self.expected_detaches: list[tuple[int, str, str]] = []

    # -- model helpers --------------------------------------------------------------------------------
    def _name(self, prefix: str) -> str:
        self.names += 1
        return f"{prefix}{self.names}"

    def _make_visible(self, msg: MMsg) -> None:
        """A message becomes visible for the first time: it takes the next sequence number."""
        self.seq += 1
        msg.seq = self.seq
        self.entered += 1
        self._requeue(msg)

    def _requeue(self, msg: MMsg) -> None:
        queue = self.visible[msg.queue]
        queue.insert(bisect.bisect([m.seq for m in queue], msg.seq), msg)

    def _finish(self, d: MDel, outcome: Any) -> None:
        """A terminal outcome applies: the delivery is over, the message goes back or is gone."""
        del d.consumer.deliveries[d.delivery_id]
        if isinstance(outcome, Released | Modified):
            if isinstance(outcome, Modified) and outcome.delivery_failed:
                d.msg.count += 1
            self._requeue(d.msg)
        else:
            self.consumed += 1

    def _settle_expected(self, d: MDel, outcome: Any) -> None:
        self.expected_settles.append((d.consumer.slot, d.delivery_id, outcome))
        d.wire_open = False

    def _stage(self, d: MDel, txn: MTxn, outcome: Any, settled: bool) -> None:
        if d.retired_by is None:
            txn.retirements.append(d)
        d.retired_by = txn
        d.outcome = outcome
        d.peer_settled = d.peer_settled or settled

    def _end(self, txn: MTxn) -> None:
        self.txns.remove(txn)
        self.dead_ids.append(txn.id)
        for consumer in self.consumers:
            if consumer.txn is txn:
                consumer.txn = None

    def _commit(self, txn: MTxn) -> None:
        self._end(txn)
        _events("commit", txn)
        for msg in txn.posts:
            self._make_visible(msg)
        for d in txn.retirements:
            d.retired_by = None
            if d.acquired_by is txn:
                d.acquired_by = None
            self._finish(d, d.outcome)
            if not d.peer_settled and d.consumer.attached:
                self._settle_expected(d, d.outcome)
        for d in txn.acquisitions:
            if d.acquired_by is not txn:
                continue
            d.acquired_by = None
            if d.peer_settled:
                del d.consumer.deliveries[d.delivery_id]
                self.consumed += 1
            elif not d.consumer.attached:
                self._finish(d, d.consumer.outcome_when_gone)
                event("commit: acquisition of a detached consumer")
            else:
                event("commit: acquisition stays acquired by its link")

    def _rollback(self, txn: MTxn) -> None:
        # Several transactions may roll back in one step (a time-out pass, a controller that goes away):
        # what the first releases may be dispatched, under a later one, to a consumer acquiring under it
        # (still live then), and released again by its rollback. Remember who acquired under it.
        self.doomed[txn.id] = [c for c in self.consumers if c.txn is txn]
        self._end(txn)
        _events("rollback", txn)
        for d in txn.acquisitions:
            if d.acquired_by is not txn:
                continue
            d.acquired_by = None
            d.retired_by = None
            self._finish(d, RELEASED)  # delivery-count unchanged
            if not d.peer_settled and d.consumer.attached:
                self._settle_expected(d, RELEASED)
        for d in txn.retirements:
            if d.retired_by is not txn:
                continue
            d.retired_by = None
            d.outcome = None
            if d.peer_settled or not d.consumer.attached:
                self._finish(d, d.consumer.outcome_when_gone)
                event("rollback: settled or orphaned retirement gets the default outcome")
            else:
                event("rollback: unsettled retirement goes back to its link")

    def _consumer_gone(self, consumer: MConsumer) -> None:
        consumer.attached = False
        consumer.txn = None
        self.consumers.remove(consumer)
        for d in list(consumer.deliveries.values()):
            d.wire_open = False
            if d.in_txn:
                event("consumer gone with deliveries held by a transaction")  # its commit or rollback decides
            else:
                self._finish(d, consumer.outcome_when_gone)

    def _live_txns(self, slot: int) -> list[MTxn]:
        return [t for t in self.txns if t.slot == slot]

    def _unknown_condition(self, slot: int, txn_id: bytes, *, discharged: bool = False) -> str:
        """The error for a txn-id ``slot``'s connection does not know (DESIGN §4: a timed-out one says so,
        until its discharge is refused)."""
        expired = self.expired[slot]
        if txn_id in expired:
            if discharged:
                expired.discard(txn_id)
            return Condition.TRANSACTION_TIMEOUT.value
        return Condition.UNKNOWN_TXN_ID.value

    def _bad_ids(self, slot: int) -> list[bytes]:
        """txn-ids unknown to ``slot``'s connection: discharged ones and other connections' live ones."""
        return self.dead_ids + [t.id for t in self.txns if t.slot != slot]

    def _alive(self) -> list[MMsg]:
        held = [d.msg for c in self._all_consumers() for d in c.deliveries.values()]
        return [m for q in QUEUES for m in self.visible[q]] + held

    def _all_consumers(self) -> list[MConsumer]:
        """Attached consumers and detached ones whose deliveries a transaction still holds."""
        found = {id(c): c for c in self.consumers}
        for txn in self.txns:
            for d in [*txn.acquisitions, *txn.retirements]:
                found.setdefault(id(d.consumer), d.consumer)
        return list(found.values())

    # -- driving the broker ---------------------------------------------------------------------------
    def _step(self) -> dict[int, Observed]:
        """Deliver what the broker wrote, check it against the model's expectations, apply deliveries."""
        seen = self.world.settle()
        by_slot = {slot: seen.get(peer, Observed()) for slot, peer in self.peers.items()}
        for peer, observed in seen.items():
            if peer not in self.peers.values():  # a connection closed in this step
                assert not observed.transfers, observed
                assert not observed.settled_by_broker, observed
        detached = sorted(
            (slot, name, condition_of_error(err)) for slot, obs in by_slot.items() for name, err in obs.detached
        )
        assert detached == sorted(self.expected_detaches), (detached, self.expected_detaches)
        self.expected_detaches = []
        for slot, obs in by_slot.items():
            for t in obs.transfers:
                self._on_transfer(slot, t.link, t.delivery_id, t.settled, t.state, t.body, t.delivery_count)
        self._check_settles(by_slot)
        self.doomed = {}
        return by_slot

    def _check_settles(self, by_slot: dict[int, Observed]) -> None:
        """The broker settled exactly the deliveries the model expected, with the expected outcomes."""
        settles = sorted(
            (
                (slot, delivery_id, state)
                for slot, obs in by_slot.items()
                for delivery_id, state in obs.settled_by_broker
            ),
            key=lambda s: (s[0], s[1]),
        )
        expected = sorted(self.expected_settles, key=lambda s: (s[0], s[1]))
        assert [(s, d) for s, d, _ in settles] == [(s, d) for s, d, _ in expected], (settles, expected)
        for (_, delivery_id, got), (_, _, want) in zip(settles, expected, strict=True):
            assert same_outcome(got, want), f"delivery {delivery_id} settled with {got}, expected {want}"
        self.expected_settles = []

    def _on_transfer(
        self, slot: int, link: str, delivery_id: int, settled: bool, state: Any, body: Any, count: int
    ) -> None:
        consumer = next(c for c in self.consumers if c.slot == slot and c.name == link)
        assert consumer.credit > 0, f"{link} got {body!r} without credit"
        consumer.credit -= 1
        txn_id = state.txn_id if isinstance(state, TransactionalState) else None
        if consumer.txn is None and isinstance(txn_id, bytes) and consumer in self.doomed.get(txn_id, []):
            # acquired under a transaction that rolled back later in this same step: released at once
            # (the same step may have delivered it again since, even to a consumer that settled it: the
            # order of transfers across connections is lost, so look it up among every message)
            assert count == self.messages[body].count
            if not settled:
                self.expected_settles.append((slot, delivery_id, RELEASED))
            event("delivery under a transaction that rolled back in the same step")
            return
        queue = self.visible[consumer.queue]
        msg = next((m for m in queue if m.body == body), None)
        assert msg is not None, f"{link} got {body!r}, which is not visible on {consumer.queue}"
        queue.remove(msg)
        assert count == msg.count, f"{body!r} delivered with delivery-count {count}, expected {msg.count}"
        if count:
            event("redelivery with delivery-count > 0")
        assert settled == consumer.presettled
        txn = consumer.txn
        if txn is not None:
            assert state == TransactionalState(txn_id=txn.id), f"{body!r} sent with state {state}"
            d = MDel(msg, consumer, delivery_id, acquired_by=txn, peer_settled=settled, wire_open=not settled)
            txn.acquisitions.append(d)
            consumer.deliveries[delivery_id] = d
            event(f"delivery acquired under a transaction (presettled={settled})")
        else:
            assert state is None, f"{body!r} sent with state {state}"
            if settled:
                self.consumed += 1
            else:
                consumer.deliveries[delivery_id] = MDel(msg, consumer, delivery_id)

    def _connect(self, slot: int, consumer: ConsumerSpec) -> None:
        """Open connection ``slot`` with a controller, a producer per queue and one consumer."""
        peer = self.world.connect(self._name(f"client{slot}-"))
        self.peers[slot] = peer
        self.controllers[slot] = self._name(f"ctl{slot}-")
        peer.attach_controller(self.controllers[slot])
        self.producers[slot] = {q: self._name(f"p{slot}-") for q in QUEUES}
        for q, name in self.producers[slot].items():
            peer.attach_producer(name, q)
        self._step()
        self._attach_consumer(slot, consumer)

    def _attach_consumer(self, slot: int, spec: ConsumerSpec) -> None:
        queue, presettled, default_outcome, credit = spec
        if sum(c.slot == slot for c in self.consumers) >= MAX_CONSUMERS:
            return
        consumer = MConsumer(slot, self._name(f"c{slot}-"), queue, presettled, default_outcome)
        self.peers[slot].attach_consumer(consumer.name, queue, presettled=presettled, default_outcome=default_outcome)
        self.consumers.append(consumer)
        observed = self._step()
        assert not observed[slot].transfers  # no credit yet
        if credit:
            self._flow(consumer, credit, None)

    # -- rules ------------------------------------------------------------------------------------------
    # Hypothesis picks rules uniformly, so the transactional variants get rules of their own: that is
    # how they are weighted.
    @initialize(first=CONSUMERS, second=CONSUMERS)
    def connect_all(self, first: ConsumerSpec, second: ConsumerSpec) -> None:
        self._connect(0, first)
        self._connect(1, second)

    @precondition(lambda self: len(self.txns) < MAX_TXNS)
    @rule(slot=SLOT)
    def declare(self, slot: int) -> None:
        self._declare(slot)

    def _declare(self, slot: int) -> MTxn:
        delivery_id = self.peers[slot].declare(self.controllers[slot])
        answer, _ = self._step()[slot].answers[delivery_id]
        assert isinstance(answer, Declared), answer
        assert answer.txn_id not in self.dead_ids
        assert all(t.id != answer.txn_id for t in self.txns)
        txn = MTxn(answer.txn_id, slot, self.world.now)
        self.txns.append(txn)
        return txn

    def _some_txn(self, slot: int, data: st.DataObject) -> MTxn:
        """One of ``slot``'s open transactions, or a new one (always when it has none, so that work gets
        staged even in runs where the ``declare`` rule is switched off)."""
        live = self._live_txns(slot)
        if not live or (len(self.txns) < MAX_TXNS and data.draw(st.integers(0, 3), label="declare another") == 0):
            return self._declare(slot)
        return data.draw(st.sampled_from(live), label="txn")

    @rule(
        slot=SLOT,
        queue=QUEUE,
        n=st.integers(1, 3),
        mode=st.sampled_from(["plain", "plain", "unknown"]),
        settled=st.booleans(),
        data=st.data(),
    )
    def post(self, slot: int, queue: str, n: int, mode: str, settled: bool, data: st.DataObject) -> None:
        for _ in range(n):
            self._post(slot, queue, mode, settled, data)

    @rule(slot=SLOT, queue=QUEUE, n=st.integers(1, 3), settled=st.booleans(), data=st.data())
    def post_in_txn(self, slot: int, queue: str, n: int, settled: bool, data: st.DataObject) -> None:
        for _ in range(n):
            self._post(slot, queue, "txn", settled, data)

    @rule(slot=SLOT, queue=QUEUE, n=st.integers(1, 3), settled=st.booleans(), data=st.data())
    def post_in_txn_again(self, slot: int, queue: str, n: int, settled: bool, data: st.DataObject) -> None:
        for _ in range(n):
            self._post(slot, queue, "txn", settled, data)

    def _post(self, slot: int, queue: str, mode: str, settled: bool, data: st.DataObject) -> None:
        peer = self.peers[slot]
        self.bodies += 1
        msg = MMsg(f"m{self.bodies}", queue)
        self.messages[msg.body] = msg
        txn: MTxn | None = None
        state: Any = None
        if mode == "txn":
            txn = self._some_txn(slot, data)
            state = TransactionalState(txn_id=txn.id)
            txn.posts.append(msg)
        elif mode == "unknown":
            bad_id = data.draw(st.sampled_from(self._bad_ids(slot)), label="txn-id")
            state = TransactionalState(txn_id=bad_id)
            condition = self._unknown_condition(slot, bad_id)
        else:
            self._make_visible(msg)
        delivery_id = peer.transfer(self.producers[slot][queue], frames.message(msg.body), settled=settled, state=state)
        answers = self._step()[slot].answers
        if settled:
            assert delivery_id not in answers
            return
        answer, _ = answers[delivery_id]
        if mode == "plain":
            assert isinstance(answer, Accepted), answer
        elif txn is not None:
            # the provisional outcome (DESIGN §4)
            assert answer == TransactionalState(txn_id=txn.id, outcome=Accepted()), answer
        else:
            assert isinstance(answer, Rejected), answer
            assert condition_of(answer) == condition

    @rule(slot=SLOT, spec=CONSUMERS)
    def attach_consumer(self, slot: int, spec: ConsumerSpec) -> None:
        self._attach_consumer(slot, spec)

    @precondition(lambda self: self.consumers)
    @rule(data=st.data())
    def detach_consumer(self, data: st.DataObject) -> None:
        consumer = data.draw(st.sampled_from(self.consumers), label="consumer")
        self.peers[consumer.slot].detach(consumer.name)
        self._consumer_gone(consumer)
        self._step()

    @precondition(lambda self: self.consumers)
    @rule(credit=st.integers(0, 3), mode=st.sampled_from(["keep", "keep", "end", "unknown"]), data=st.data())
    def grant_credit(self, credit: int, mode: str, data: st.DataObject) -> None:
        self._grant_credit(credit, mode, data)

    @precondition(lambda self: self.consumers)
    @rule(credit=st.integers(1, 3), data=st.data())
    def grant_credit_in_txn(self, credit: int, data: st.DataObject) -> None:
        self._grant_credit(credit, "txn", data)

    def _grant_credit(self, credit: int, mode: str, data: st.DataObject) -> None:
        # mostly a consumer whose queue has something to deliver: an idle grant teaches little
        busy = [c for c in self.consumers if self.visible[c.queue]]
        consumer = data.draw(st.sampled_from(busy or self.consumers), label="consumer")
        slot = consumer.slot
        properties: dict[Any, Any] | None = None
        if mode == "txn":
            txn = self._some_txn(slot, data)
            properties = {TXN_ID: txn.id}
            consumer.txn = txn
        elif mode == "end":
            properties = {}  # §4.4.3: properties without txn-id end transactional acquisition
            consumer.txn = None
        elif mode == "unknown":
            bad_id = data.draw(st.sampled_from(self._bad_ids(slot)), label="txn-id")
            properties = {TXN_ID: bad_id}
            # the broker detaches a link whose flow names a transaction it does not know
            self.expected_detaches.append((slot, consumer.name, self._unknown_condition(slot, bad_id)))
        self._flow(consumer, credit, properties, unknown=mode == "unknown")

    def _flow(
        self, consumer: MConsumer, credit: int, properties: dict[Any, Any] | None, *, unknown: bool = False
    ) -> None:
        """Send a flow for ``consumer`` (the model's txn already set as ``properties`` say); check FIFO."""
        slot = consumer.slot
        head = [m.body for m in self.visible[consumer.queue]]
        self.peers[slot].flow(consumer.name, credit, properties)
        if unknown:
            self._consumer_gone(consumer)
            self._step()
            return
        consumer.credit = credit
        observed = self._step()[slot]
        got = [t.body for t in observed.transfers if t.link == consumer.name]
        # FIFO: credit takes exactly the head of the queue, in order
        assert got == head[:credit], (got, head)

    def _open_deliveries(self) -> list[MDel]:
        return [d for c in self.consumers for d in c.deliveries.values() if d.wire_open]

    def _has_open_deliveries(self) -> bool:
        return any(d.wire_open for c in self.consumers for d in c.deliveries.values())

    @precondition(_has_open_deliveries)
    @rule(outcome=OUTCOME, mode=st.sampled_from(["plain", "unknown"]), settled=st.booleans(), data=st.data())
    def retire(self, outcome: Any, mode: str, settled: bool, data: st.DataObject) -> None:
        self._retire(outcome, mode, settled, data)

    @precondition(_has_open_deliveries)
    @rule(outcome=OUTCOME, mode=st.sampled_from(["plain", "unknown"]), settled=st.booleans(), data=st.data())
    def retire_again(self, outcome: Any, mode: str, settled: bool, data: st.DataObject) -> None:
        self._retire(outcome, mode, settled, data)

    @precondition(_has_open_deliveries)
    @rule(outcome=OUTCOME, settled=st.booleans(), data=st.data())
    def retire_in_txn(self, outcome: Any, settled: bool, data: st.DataObject) -> None:
        self._retire(outcome, "txn", settled, data)

    @precondition(_has_open_deliveries)
    @rule(outcome=OUTCOME, settled=st.booleans(), data=st.data())
    def retire_in_txn_again(self, outcome: Any, settled: bool, data: st.DataObject) -> None:
        self._retire(outcome, "txn", settled, data)

    def _retire(self, outcome: Any, mode: str, settled: bool, data: st.DataObject) -> None:
        self._retire_one(
            data.draw(st.sampled_from(self._open_deliveries()), label="delivery"), outcome, mode, settled, data
        )

    def _retire_one(self, d: MDel, outcome: Any, mode: str, settled: bool, data: st.DataObject) -> None:
        """The consumer's disposition of delivery ``d``: ``outcome`` in ``mode`` (plain, txn, unknown)."""
        slot = d.consumer.slot
        if outcome is None:
            # settle without an outcome: only for a plain delivery or one whose outcome is staged already
            # (what it should mean for a message merely acquired under a transaction is left open)
            if d.acquired_by is not None and d.retired_by is None:
                outcome = Accepted()
            else:
                mode, settled = "plain", True
        state: Any = outcome
        if mode == "txn":
            # naming a second live transaction for a delivery is a different test: use the one it has
            txn = d.acquired_by or d.retired_by or self._some_txn(slot, data)
            state = TransactionalState(txn_id=txn.id, outcome=outcome)
            self._stage(d, txn, outcome, settled)
        if mode == "unknown":
            txn_id = data.draw(st.sampled_from(self._bad_ids(slot)), label="txn-id")
            state = TransactionalState(txn_id=txn_id, outcome=outcome)
            event(f"retire with unknown txn-id (in transaction: {d.in_txn})")
            if not d.in_txn:
                # DESIGN §4: an unknown txn-id rejects that delivery; its message goes back to the queue
                self._finish(d, RELEASED)
                if not settled:
                    self._settle_expected(d, Rejected())
        elif mode == "plain":
            if d.in_txn:
                if settled:
                    d.peer_settled = True
                if outcome is not None and d.retired_by is None:
                    assert d.acquired_by is not None
                    self._stage(d, d.acquired_by, outcome, settled)  # staged in the acquiring transaction
                    event("plain outcome staged in the acquiring transaction")
            else:
                self._finish(d, outcome if outcome is not None else d.consumer.outcome_when_gone)
                if not settled:
                    self._settle_expected(d, outcome)
        if settled:
            d.wire_open = False
        self.peers[slot].dispose(d.delivery_id, state, settled=settled)
        self._step()

    @precondition(lambda self: any(c.attached and not c.presettled for c in self.consumers))
    @rule(
        credit=st.integers(1, 3),
        outcomes=st.lists(
            st.tuples(
                OUTCOME.filter(lambda o: o is not None),
                st.booleans(),
                st.sampled_from(["txn", "txn", "txn", "plain", "none"]),
            ),
            min_size=3,
            max_size=3,
        ),
        then=st.sampled_from(["commit", "rollback", "leave open"]),
        data=st.data(),
    )
    def consume_in_txn(
        self, credit: int, outcomes: list[tuple[Any, bool, str]], then: str, data: st.DataObject
    ) -> None:
        """A transactional consumer's round trip: acquire under a transaction, give the messages outcomes
        (mostly in it; some plain, which stages them in it too; some none), then commit, roll back, or
        leave it open for later steps to decide."""
        candidates = [c for c in self.consumers if not c.presettled]
        busy = [c for c in candidates if self.visible[c.queue]]
        consumer = data.draw(st.sampled_from(busy or candidates), label="consumer")
        if not self.visible[consumer.queue]:
            for _ in range(credit):  # something to consume (other consumers with credit may take some)
                self._post(consumer.slot, consumer.queue, "plain", False, data)
        txn = self._some_txn(consumer.slot, data)
        consumer.txn = txn
        before = set(consumer.deliveries)
        self._flow(consumer, credit, {TXN_ID: txn.id})
        new = [d for i, d in consumer.deliveries.items() if i not in before]
        for d, (outcome, settled, how) in zip(new, outcomes, strict=False):
            if how != "none":
                self._retire_one(d, outcome, how, settled, data)
        if then != "leave open":
            if then == "rollback":
                self._rollback(txn)
            else:
                self._commit(txn)
            self._discharge(txn.slot, txn.id, then == "rollback", txn)

    @rule(slot=SLOT, fail=st.booleans(), unknown=st.sampled_from([False, False, False, True]), data=st.data())
    def discharge(self, slot: int, fail: bool, unknown: bool, data: st.DataObject) -> None:
        if unknown or not self.txns:
            # expired ids first, when there are some: their refusal is the interesting one
            bad = sorted(self.expired[slot]) + self._bad_ids(slot)
            self._discharge(slot, data.draw(st.sampled_from(bad), label="txn-id"), fail, None)
            return
        txn = data.draw(st.sampled_from(self.txns), label="txn")
        if fail:
            self._rollback(txn)
        else:
            self._commit(txn)
        self._discharge(txn.slot, txn.id, fail, txn)

    def _discharge(self, slot: int, txn_id: bytes, fail: bool, txn: MTxn | None) -> None:
        delivery_id = self.peers[slot].discharge(self.controllers[slot], txn_id, fail=fail)
        condition = None if txn is not None else self._unknown_condition(slot, txn_id, discharged=True)
        answer, _ = self._step()[slot].answers[delivery_id]
        if txn is not None:
            assert isinstance(answer, Accepted), answer
        else:
            assert isinstance(answer, Rejected), answer
            assert condition_of(answer) == condition

    @rule(seconds=st.sampled_from([1.0, 4.0, TIMEOUT + 1]))
    def time_passes(self, seconds: float) -> None:
        """The clock moves and the broker runs its timers: transactions older than the time-out roll back."""
        world = self.world
        world.now += seconds
        for txn in [t for t in self.txns if world.now >= t.created + TIMEOUT]:
            self._rollback(txn)
            self.expired[txn.slot].add(txn.id)
            event("transaction timed out")
        self.broker.handle_timeout(world.now)
        self._step()

    def _has_two_txns_to_confuse(self) -> bool:
        return any(
            (d.acquired_by or d.retired_by) is not None and len(self._live_txns(d.consumer.slot)) > 1
            for d in self._open_deliveries()
        )

    @precondition(_has_two_txns_to_confuse)
    @rule(outcome=OUTCOME.filter(lambda o: o is not None), settled=st.booleans(), data=st.data())
    def retire_naming_a_second_txn(self, outcome: Any, settled: bool, data: st.DataObject) -> None:
        """DESIGN §4: a delivery and its outcome may not name two live transactions. The broker rolls both
        back and detaches the controller with a transaction error (here every transaction of the
        connection goes, since they share that controller)."""
        candidates = [
            d
            for d in self._open_deliveries()
            if (d.acquired_by or d.retired_by) is not None and len(self._live_txns(d.consumer.slot)) > 1
        ]
        d = data.draw(st.sampled_from(candidates), label="delivery")
        slot = d.consumer.slot
        bound = d.acquired_by or d.retired_by
        event("a delivery names a second transaction")
        second = data.draw(st.sampled_from([t for t in self._live_txns(slot) if t is not bound]), label="txn")
        if settled:
            d.wire_open = False
        for txn in self._live_txns(slot):
            self._rollback(txn)
        controller = self.controllers[slot]
        self.expected_detaches.append((slot, controller, Condition.TRANSACTION_ROLLBACK.value))
        self.peers[slot].dispose(d.delivery_id, TransactionalState(txn_id=second.id, outcome=outcome), settled=settled)
        self._step()
        self.controllers[slot] = self._name(f"ctl{slot}-")
        self.peers[slot].attach_controller(self.controllers[slot])
        self._step()

    @rule(slot=SLOT, kind=st.sampled_from(["detach-controller", "close", "drop-socket"]), spec=CONSUMERS)
    def disrupt(self, slot: int, kind: str, spec: ConsumerSpec) -> None:
        """The controller goes away, or the whole connection (then a new one takes its slot)."""
        if kind == "detach-controller":
            peer = self.peers[slot]
            peer.detach(self.controllers[slot])
            for txn in self._live_txns(slot):
                self._rollback(txn)  # DESIGN §4: a controller that goes away rolls back its transactions
            self._step()
            self.controllers[slot] = self._name(f"ctl{slot}-")
            peer.attach_controller(self.controllers[slot])
            self._step()
        else:
            self._close(slot, graceful=kind == "close")
            self._connect(slot, spec)

    def _close(self, slot: int, graceful: bool) -> None:
        peer = self.peers.pop(slot)
        if graceful:
            peer.close()
        else:
            peer.eof()
        for consumer in [c for c in self.consumers if c.slot == slot]:
            self._consumer_gone(consumer)
        for txn in self._live_txns(slot):
            self._rollback(txn)  # DESIGN §4: a dropped connection rolls back its transactions
        self.expired[slot].clear()
        seen = self.world.settle()
        assert seen[peer].closed == graceful
        assert not seen[peer].transfers
        # what the close released may go to the other connection's consumers
        for other_slot, other in self.peers.items():
            for t in seen.get(other, Observed()).transfers:
                self._on_transfer(other_slot, t.link, t.delivery_id, t.settled, t.state, t.body, t.delivery_count)
        assert not self.expected_settles

    # -- invariants -----------------------------------------------------------------------------------
    @invariant()
    def queues_match(self) -> None:
        for name in QUEUES:
            queue = self.broker.queues[name]
            model = self.visible[name]
            ready = [decode_message(m.payload)[0] for m in queue.ready]
            assert ready == [m.body for m in model], f"{name}: broker has {ready}, model {[m.body for m in model]}"
            assert [m.delivery_count for m in queue.ready] == [m.count for m in model], name
            assert queue.depth == len(model)
            staged = sum(m.queue == name for t in self.txns for m in t.posts)
            assert queue.staged == staged, f"{name}: staged {queue.staged}, model {staged}"
            acquired = sum(d.msg.queue == name for c in self._all_consumers() for d in c.deliveries.values())
            assert queue.acquired == acquired, f"{name}: acquired {queue.acquired}, model {acquired}"

    @invariant()
    def transactions_match(self) -> None:
        broker = {i.txn_id: (i.posts, i.retirements, i.acquisitions) for i in self.broker.transactions}
        model = {t.id: (len(t.posts), len(t.retirements), len(t.acquisitions)) for t in self.txns}
        assert broker == model

    @invariant()
    def nothing_lost_or_duplicated(self) -> None:
        alive = self._alive()
        assert self.entered == len(alive) + self.consumed  # the model's own bookkeeping
        census = Counter(broker_census(self.broker))
        assert all(n == 1 for n in census.values()), f"held twice: {[b for b, n in census.items() if n > 1]}"
        assert census == Counter(m.body for m in alive), (census, [m.body for m in alive])
        staged = {m.body for t in self.txns for m in t.posts}
        assert not staged & set(census), "a staged post is visible before its commit"

    @invariant()
    def consumers_match(self) -> None:
        for consumer in self.consumers:
            peer = self.peers[consumer.slot]
            link = peer.broker_link(consumer.name)
            assert link is not None, consumer.name
            assert link.credit == consumer.credit, f"{consumer.name}: credit {link.credit}, model {consumer.credit}"
            context = link.context
            assert isinstance(context, Consumer)
            model_txn = None if consumer.txn is None else consumer.txn.id
            assert (None if context.txn is None else context.txn.id) == model_txn, consumer.name
            if consumer.credit:
                # the broker dispatches eagerly: credit is never left idle while the queue has messages
                assert not self.visible[consumer.queue], f"{consumer.name} has credit and {consumer.queue} is not empty"
        for slot, peer in self.peers.items():
            model = {d.delivery_id for d in self._open_deliveries() if d.consumer.slot == slot}
            assert set(peer.unsettled) == model, (slot, peer.unsettled, model)

    def teardown(self) -> None:
        if not self.peers:  # initialize did not run
            return
        for slot in list(self.peers):
            self._close(slot, graceful=True)
        assert self.broker.transactions == []
        assert not self.broker.connections
        for name, queue in self.broker.queues.items():
            assert (queue.staged, queue.acquired) == (0, 0), f"{name}: {queue!r} staged={queue.staged}"
            assert not queue.consumers, name
        self.queues_match()
        self.nothing_lost_or_duplicated()
        assert self.txns == []
        assert not self._all_consumers()


def _events(kind: str, txn: MTxn) -> None:
    """Label what a discharge applied, for ``--hypothesis-show-statistics``."""
    for what, items in (("posts", txn.posts), ("retirements", txn.retirements), ("acquisitions", txn.acquisitions)):
        if items:
            event(f"{kind} with {what}")


TransactionsModel.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestTransactionsModel = TransactionsModel.TestCase
