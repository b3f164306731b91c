"""Model-based test of transactions: AMQP 1.0 part 4, as the broker's clients can observe it.

A hypothesis state machine drives in-memory clients (``txn_driver``) against the real broker core and
engine, and checks what they observe against a model written from the specification (part 4, "Transactions")
and the broker's documented choices (README "Transactions"; R1-R10 are the deviations issue 11 lists, D1-D6
the cases it asks to decide, as in ``test_transactions_adversarial.py``). The model does not know how the
broker is built; it knows what may be visible, to whom, after which discharge.

The model
---------
*Messages.* Every message a client posts has exactly one fate at any moment (``Fate``): being sent (a
multi-frame transfer not finished yet), staged in an open transaction (posted with transactional-state:
"the message does not become available at the destination node ... until after the transaction has been
(successfully) discharged", §4.4.1), available on its node (in queue order: the order in which messages
became visible; a message that comes back keeps its place), out on exactly one delivery, consumed (accepted,
rejected: no dead-letter queue here), or gone (its transaction rolled back, its post was refused, or its node
was deleted).

*Deliveries.* What the client knows of each delivery it received: the transaction its transfer named
(transactional acquisition, §4.4.3), whether it was sent settled, whether all of its frames arrived, whether
the client settled it, and the outcome the client asked for and in which transaction (§4.4.2).

*Transactions.* A transaction is a set of intended effects: posts to make visible, outcomes to apply,
acquisitions. At a successful discharge all of them take effect, at a rollback none (``_decide`` is the
settlement table of part 4 §4.4.4 and README "Acquiring"/"Retiring"): an acquisition is released; an outcome
given to a delivery the client still holds is forgotten (the delivery is live again); one the client settled
meanwhile gets the source's default outcome. A commit that cannot apply everything applies nothing (R1). A
transaction ends at its discharge, when its controller goes (§4: "all such transactions are immediately rolled
back"), when its connection goes, or at its time-out (R5); a timed-out id is remembered (R4, R10).

What is checked
---------------
After every step, from the outside only:

- every frame the clients received was expected: answers to declare, discharge and posts with the conditions
  the rules name, the broker settling exactly the deliveries the model says it settles, with the outcome it
  says, aborting what it must abort (R3), detaching exactly the links it must detach;
- every delivery started is of a message that was available on that consumer's node, to a consumer with
  credit, carrying the transaction the consumer acquires under; granting credit takes the head of the queue;
- through ``peek()``/``stats()`` (public handles): every node holds, in order, exactly the messages the model
  says are available, with their delivery counts, and counts as acquired and staged what the model says;
  the nodes that exist are the ones the model says exist (dynamic nodes go with their link, D4);
- no message is lost (each posted-and-committed message is available, out on exactly one live delivery, or
  consumed by an outcome that consumes); no message is out on two live deliveries at once, nor both out and
  available; no effect of an open or rolled-back transaction is visible, every effect of a committed one is;
- no consumer sits on credit while its node has available messages (unless R5 holds it back);
- the open transactions (``transactions``) and the counters (``txn_stats``) are the model's.

``test_checker_*`` prove the checks can fail: a broker wrapped (at the engine boundary) so that it loses one
post of a commit, or so that it sends a released message twice, is reported.

Where the rules leave a choice, the model takes these (change them here if the broker decides otherwise):
a discharge(fail=false) with a partial post naming its transaction is R6 even when R1 would also fail the
commit; a rejected post may carry its ``rejected`` bare or inside transactional-state; a plain outcome for a
delivery acquired under a live transaction is staged in it, a later plain outcome is ignored (today's
behaviour); the misuse of a declare (R7, D3) is only tried below the R10 limit (which error wins is not said).
When one step rolls several transactions back in phases (a controller detached after a failed discharge or a
delivery naming two transactions), a message released by the first may reach a consumer acquiring under a
later one before that one rolls back: the model accepts such a delivery if it is released at once, in the
same step. A "slow" client (small frames, a session window it opens a few frames at a time) keeps at most one
delivery in flight and grants credit only when the window can take a first frame, so that every delivery the
broker starts reaches it at once and the model never has to guess at deliveries held back whole.
"""

from __future__ import annotations

import contextlib
import itertools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import event as hypothesis_event
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from minibroker.amqp.definitions import Accepted, Declared, Modified, Rejected, Released, TransactionalState
from minibroker.broker.core import Broker, BrokerSettings
from minibroker.broker.policy import NodePolicy
from minibroker.engine.connection import ServerConnection
from tests.broker.txn_driver import (
    TXN_ID,
    BrokerView,
    Observed,
    Peer,
    Started,
    World,
    census,
    deliver_redeliveries_twice,
    discharge_with_uint_fail,
    lose_second_transactional_post,
    payload,
)

# -- conditions, as the specification names them ------------------------------------------------------------
UNKNOWN_ID = "amqp:transaction:unknown-id"
ROLLBACK = "amqp:transaction:rollback"
TIMEOUT = "amqp:transaction:timeout"
NOT_FOUND = "amqp:not-found"
NOT_ALLOWED = "amqp:not-allowed"
DECODE_ERROR = "amqp:decode-error"
LIMIT = "amqp:resource-limit-exceeded"


def txn_ids() -> Iterator[bytes]:
    """The broker's txn-ids: short, distinct, and the same in every run (so examples replay)."""
    return (b"txn-%d" % n for n in itertools.count(1))


def dynamic_ids() -> Iterator[str]:
    """The random part of the broker's dynamic addresses, the same in every run (so examples replay)."""
    return (str(n) for n in itertools.count(1))


QUEUES = ("q1", "q2")
SLOTS = (0, 1)
TXN_TIMEOUT = 10.0  # transaction_timeout, in the seconds of the world's clock
MAX_TXNS = 3  # broker.max_transactions_per_connection: open and timed-out ids together (R10)
SMALL_FRAMES = 512  # max-frame-size of a "slow" client: a big message takes three frames
SETTINGS = BrokerSettings(
    transaction_timeout=TXN_TIMEOUT,
    max_transactions_per_connection=MAX_TXNS,
    # Out of scope here: rejected messages are dropped (no dead-letter queue) and no number of failed
    # deliveries dead-letters a message, so "rejected" consumes and "modified" only counts.
    node_defaults=NodePolicy(dead_letter_address="", max_delivery_attempts=0),
)
RELEASED = Released()
OUTCOMES: dict[str, Any] = {
    "accepted": Accepted(),
    "rejected": Rejected(),
    "released": Released(),
    "modified(delivery-failed)": Modified(delivery_failed=True),
    "modified": Modified(),
}
OUTCOME = st.sampled_from([*OUTCOMES, "no outcome"])
DEFAULT_OUTCOME = st.sampled_from(["unset", "unset", "modified(delivery-failed)", "accepted"])


def outcome_named(name: str) -> Any:
    """The outcome called ``name`` (None for "no outcome", or a source's "unset" default outcome)."""
    return OUTCOMES.get(name)


# -- the model ----------------------------------------------------------------------------------------------
class Fate(Enum):
    SENDING = "being sent (a multi-frame transfer in progress)"
    STAGED = "staged in an open transaction"
    AVAILABLE = "available on its node"
    OUT = "out on a delivery"
    CONSUMED = "consumed"
    GONE = "gone (never visible, or deleted with its node)"


@dataclass(eq=False)
class Node:
    """One incarnation of a node (a deleted dynamic node's address may name a new node later)."""

    name: str
    dynamic: bool = False
    deleted: bool = False

    def __repr__(self) -> str:
        return f"Node({self.name}{', deleted' if self.deleted else ''})"


@dataclass(eq=False)
class Msg:
    name: str
    address: str | None  # where the client sent it (a relay post's ``to``)
    fate: Fate = Fate.SENDING
    node: Node | None = None  # the node it is on, or staged for (None: to be created at commit, D4)
    seq: int = 0  # its place in its node's queue order
    count: int = 0  # its delivery-count
    txn: Txn | None = None  # STAGED: the transaction that posted it
    delivery: Delivery | None = None  # OUT: the one delivery carrying it
    was_visible: bool = False

    def __repr__(self) -> str:
        return f"Msg({self.name}, {self.fate.name}, node={self.node!r}, count={self.count})"


@dataclass(eq=False)
class Conn:
    """One client connection in a slot, and the links it keeps."""

    slot: int
    peer: Peer
    slow: bool  # small frames and a session window the test opens a few frames at a time
    rejects: bool  # its controller's source offers rejected (else errors detach the controller)
    controller: str = ""
    producers: dict[str, str] = field(default_factory=dict)  # node name -> link
    relay: str = ""
    dynamic_producers: dict[str, Node] = field(default_factory=dict)  # link -> the node made for it
    sending: dict[str, Partial] = field(default_factory=dict)  # link -> multi-frame post in progress
    timed_out: set[bytes] = field(default_factory=set)  # ids remembered after their time-out (R4, R10)

    def __repr__(self) -> str:
        return f"Conn({self.slot}, {self.peer.container_id})"


@dataclass(eq=False)
class Cons:
    """A consumer link."""

    conn: Conn
    name: str
    node: Node
    presettled: bool
    default_outcome: Any
    dynamic: bool
    credit: int = 0
    acquiring: Txn | None = None  # the live transaction its last flow named (§4.4.3)
    held_by_dead_id: bytes | None = None  # R5: bound to a timed-out id, it sends nothing
    attached: bool = True

    @property
    def default(self) -> Any:
        return RELEASED if self.default_outcome is None else self.default_outcome

    def __repr__(self) -> str:
        return f"Cons({self.name} on {self.node.name})"


@dataclass(eq=False)
class Delivery:
    consumer: Cons
    id: int
    msg: Msg
    count: int  # the delivery-count it must carry
    acquired_in: Txn | None  # the transaction its transfer named, until that one ends
    sent_settled: bool
    complete: bool = False
    client_settled: bool = False
    outcome: Any = None  # the outcome the client gave it in ``outcome_in``
    outcome_in: Txn | None = None
    over: bool = False  # its message's fate is decided; the broker settles or aborts it if the client holds it

    @property
    def holder(self) -> Txn | None:
        """The live transaction that decides this delivery's fate at its discharge, if any."""
        for txn in (self.acquired_in, self.outcome_in):
            if txn is not None and txn.live:
                return txn
        return None

    @property
    def on_the_wire(self) -> bool:
        """The client still holds it: neither side has settled it and its link is attached."""
        return not self.over and self.consumer.attached and not self.client_settled and not self.sent_settled

    def __repr__(self) -> str:
        return f"Delivery({self.consumer.name}#{self.id}: {self.msg.name})"


@dataclass(eq=False)
class Txn:
    id: bytes
    conn: Conn
    declared_at: float
    posts: list[Msg] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)  # acquired in it, or given an outcome in it
    refused_post: bool = False  # a post in it was rejected: its commit must fail
    live: bool = True
    aborts: list[tuple[int, int]] = field(default_factory=list)  # made by its time-out's rollback (R3, R5)
    label: str = ""

    def __repr__(self) -> str:
        return f"Txn({self.id.decode(errors='replace')!r}, conn {self.conn.slot}, live={self.live})"


@dataclass(eq=False)
class Partial:
    """A post sent in two frames, the first one sent."""

    msg: Msg
    link: str
    delivery_id: int
    settled: bool
    named: Txn | None  # what its first frame named
    plan: str  # "plain", "first" (state on the first frame only), "all", "two" (D1: T1 first, T2 last)
    rest: bytes

    def __repr__(self) -> str:
        return f"Partial({self.msg.name} on {self.link}, {self.plan}, named={self.named!r})"


@dataclass(frozen=True)
class Answer:
    """The answer the broker must give to one of our transfers."""

    kind: str  # "accepted", "declared", "provisional", "rejected"
    txn_id: bytes | None = None
    condition: str | None = None

    def check(self, state: Any) -> str | None:
        if self.kind == "accepted":
            ok = isinstance(state, Accepted)
        elif self.kind == "declared":
            ok = isinstance(state, Declared)
        elif self.kind == "provisional":
            ok = state == TransactionalState(txn_id=self.txn_id, outcome=Accepted())
        else:
            outcome = state.outcome if isinstance(state, TransactionalState) else state
            ok = isinstance(outcome, Rejected) and condition_of(outcome) == self.condition
        return None if ok else f"expected {self}, got {state}"


@dataclass
class Expected:
    """What one step must show on the wire, besides deliveries (which the model learns)."""

    answers: dict[tuple[int, int], Answer] = field(default_factory=dict)
    silent: set[tuple[int, int]] = field(default_factory=set)  # transfers that get no answer
    settles: dict[tuple[int, int], Any] = field(default_factory=dict)
    detaches: list[tuple[int, str, str | None]] = field(default_factory=list)


def event(label: str) -> None:
    """Count what happened, for ``--hypothesis-show-statistics`` (a no-op when driven outside hypothesis)."""
    with contextlib.suppress(InvalidArgument):
        hypothesis_event(label)


def condition_of(state: Any) -> str | None:
    err = getattr(state, "error", None)
    return None if err is None else str(err.condition)


def same_outcome(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    return not isinstance(a, Modified) or bool(a.delivery_failed) == bool(b.delivery_failed)


def consumes(outcome: Any) -> bool:
    """Part 3 §3.4: accepted and rejected end the message's life at its source (no dead-letter queue here)."""
    return isinstance(outcome, Accepted | Rejected)


class TransactionsModel(RuleBasedStateMachine):
    """Two client connections, each with a controller, producers, consumers; the model; the checks."""

    def __init__(self) -> None:
        super().__init__()
        self.world = World(Broker(SETTINGS, txn_ids=txn_ids(), dynamic_ids=dynamic_ids()))
        self.view = BrokerView(self.world)
        self.conns: dict[int, Conn] = {}
        self.names = itertools.count(1)
        self.seq = itertools.count(1)
        self.nodes: dict[str, Node] = {}  # current incarnation of each node name
        self.msgs: dict[str, Msg] = {}
        self.txns: dict[bytes, Txn] = {}  # every transaction ever declared
        self.consumers: list[Cons] = []  # attached
        self.deliveries: dict[tuple[int, int], Delivery] = {}  # (slot, delivery id) -> delivery, until over
        self.sent: dict[tuple[int, int], Delivery] = {}  # every delivery started, by (slot, delivery id)
        self.aborts_due: dict[tuple[int, int], Delivery] = {}  # partly sent deliveries the broker must abort
        self.aborting: list[tuple[int, int]] | None = None  # collects the aborts one rollback makes
        self.answers_due: list[tuple[tuple[int, int], Answer, list[tuple[int, int]]]] = []
        """Discharge answers that come once these aborts are out (§4.4.3: abort "before completing the
        discharge")."""
        self.detaches_due: list[tuple[Conn, str, str, list[tuple[int, int]]]] = []
        """The same for an answer that is an error detaching the controller (conn, controller, condition, aborts):
        until then the controller stays attached, and its transactions open."""
        self.stats = Counter[str]()  # declared, committed, timed_out
        self.expected = Expected()
        self.rolled_back_now: dict[bytes, set[Cons]] = {}  # this step's rollbacks, and who acquired under them
        self.credit_step: Cons | None = None  # the step is one credit grant: deliveries take the queue's head
        self.controller_lost = False  # the step detached a controller: attach a new one after it

    # -- model: messages and nodes ------------------------------------------------------------------------------
    def _name(self, prefix: str) -> str:
        return f"{prefix}{next(self.names)}"

    def _node(self, name: str, *, dynamic: bool = False) -> Node:
        """The node called ``name``, created if it does not exist (auto-create)."""
        node = self.nodes.get(name)
        if node is None or node.deleted:
            node = self.nodes[name] = Node(name, dynamic=dynamic)
        return node

    def _new_msg(self, to: str | None) -> Msg:
        msg = Msg(self._name("m"), to)
        self.msgs[msg.name] = msg
        return msg

    def _make_visible(self, msg: Msg, node: Node) -> None:
        """The message is posted: it takes the next place in its node's queue order."""
        msg.node = node
        msg.seq = next(self.seq)
        msg.was_visible = True
        msg.txn = None
        self._back(msg)

    def _back(self, msg: Msg) -> None:
        """The message is available again at its place, unless its node was deleted meanwhile."""
        msg.delivery = None
        assert msg.node is not None
        msg.fate = Fate.GONE if msg.node.deleted else Fate.AVAILABLE

    def _gone(self, msg: Msg) -> None:
        msg.fate = Fate.GONE
        msg.txn = None
        msg.delivery = None

    def _available(self, node: Node) -> list[Msg]:
        found = [m for m in self.msgs.values() if m.fate is Fate.AVAILABLE and m.node is node]
        return sorted(found, key=lambda m: m.seq)

    def _delete_node(self, node: Node) -> None:
        """A dynamic node goes with its link: so do the messages on it (§3.5.3)."""
        node.deleted = True
        for msg in self._available(node):
            self._gone(msg)

    # -- model: outcomes (part 3 §3.4) and the settlement table of part 4 ------------------------------------------
    def _finish(self, d: Delivery, outcome: Any, *, tell: Any) -> None:
        """``outcome`` takes effect at the source; the delivery is over. A delivery not completely sent is
        aborted when its message goes back to the node (R3: nobody may get it whole twice), and sent to the end
        when the outcome consumes it. If the client still holds it, the broker settles it with ``tell``."""
        assert not d.over, d
        key = (d.consumer.conn.slot, d.id)
        if not d.complete and not consumes(outcome) and key in self.sent and d.consumer.attached:
            # (a detached link's held-back frames are dropped with it: nothing to abort)
            event("a partly sent delivery must be aborted (R3)")
            self.aborts_due[key] = d
            if self.aborting is not None:
                self.aborting.append(key)
        elif d.on_the_wire:
            self.expected.settles[key] = tell
        d.over = True
        self.deliveries.pop((d.consumer.conn.slot, d.id), None)
        msg = d.msg
        if consumes(outcome):
            msg.fate = Fate.CONSUMED
            msg.delivery = None
        else:
            if isinstance(outcome, Modified) and outcome.delivery_failed:
                msg.count += 1
            self._back(msg)

    def _decide(self, d: Delivery, txn: Txn, committed: bool) -> None:
        """What the discharge of ``txn`` does to a delivery it holds (part 4 §4.4.4; README; R2)."""
        acquired = d.acquired_in is txn
        staged = d.outcome_in is txn
        outcome = d.outcome
        if acquired:
            d.acquired_in = None
        if staged:
            d.outcome_in, d.outcome = None, None
        if d.over or not (acquired or staged):
            return
        gone = not d.consumer.attached
        if committed:
            if staged:
                event("commit applies a staged outcome")
                self._finish(d, outcome, tell=outcome)
            elif d.client_settled:  # R2: settled without an outcome: the source's default outcome
                event("commit: acquisition the client settled without outcome (R2)")
                self._finish(d, d.consumer.default, tell=None)
            elif d.sent_settled:  # R2: a pre-settled acquisition is consumed by the commit
                self._finish(d, Accepted(), tell=None)
            elif gone:
                self._finish(d, d.consumer.default, tell=None)
            else:
                event("commit: acquisition stays out as an ordinary delivery")
        elif acquired:  # §4.4.3: the acquisition is undone, delivery-count unchanged
            event("rollback releases an acquisition")
            self._finish(d, RELEASED, tell=RELEASED)
        elif d.client_settled or gone:  # §4.4.4 "Controller Settles": the source's default outcome
            event("rollback: a retirement the client settled gets the default outcome")
            self._finish(d, d.consumer.default, tell=None)
        else:
            event("rollback: a retirement goes back to its link")  # §4.4.4: "the state reverts"

    def _end(self, txn: Txn, committed: bool) -> None:
        """``txn`` is discharged (committed or not) or rolled back by the broker."""
        assert txn.live
        txn.live = False
        acquiring = {c for c in self.consumers if c.acquiring is txn}
        for c in acquiring:  # §4.4.3: "the txn-id of any link endpoints will be cleared"
            c.acquiring = None
        if not committed:
            self.rolled_back_now[txn.id] = acquiring
        for msg in txn.posts:
            if msg.fate is not Fate.STAGED:
                continue
            if committed:
                self._make_visible(msg, msg.node if msg.node is not None else self._node(str(msg.address)))
            else:
                self._gone(msg)
        for d in list(dict.fromkeys(txn.deliveries)):
            self._decide(d, txn, committed)

    def _commit(self, txn: Txn) -> None:
        self.stats["committed"] += 1
        if txn.posts:
            event("commit with posts")
        self._end(txn, committed=True)

    def _rollback(self, txn: Txn) -> None:
        self._end(txn, committed=False)

    def _time_out(self, txn: Txn) -> None:
        """R5: the transaction rolls back; links acquiring under it stay bound to its id, which is remembered
        (with the aborts its rollback made: the discharge of the id is answered after them)."""
        bound = [c for c in self.consumers if c.acquiring is txn]
        txn.aborts = self._collect_aborts(lambda: self._rollback(txn))
        for c in bound:
            event("a link acquiring under a timed-out transaction is held (R5)")
            c.held_by_dead_id = txn.id
        txn.conn.timed_out.add(txn.id)
        self.stats["timed_out"] += 1

    def _controller_gone(self, conn: Conn) -> None:
        """§4: closing the control link rolls back every transaction it created and did not discharge ("attempts
        to perform further transactional work on them will lead to failure"): the links acquiring under them
        stop, as after a time-out (R5), until a flow says what comes next."""
        for txn in self._live(conn):
            bound = [c for c in self.consumers if c.acquiring is txn]
            self._rollback(txn)
            for c in bound:
                event("a link acquiring under a transaction whose controller went is held")
                c.held_by_dead_id = txn.id

    def _live(self, conn: Conn) -> list[Txn]:
        return [t for t in self.txns.values() if t.live and t.conn is conn]

    def _cannot_commit(self, txn: Txn) -> bool:
        """R1: a post to a node deleted since; or a post the broker refused."""
        return txn.refused_post or any(m.node is not None and m.node.deleted for m in txn.posts)

    def _forget_timed_out(self, conn: Conn, txn_id: bytes) -> None:
        """R4/R5: the discharge of a timed-out id forgets it and frees the links bound to it."""
        conn.timed_out.discard(txn_id)
        for c in self.consumers:
            if c.held_by_dead_id == txn_id and c.conn is conn:
                c.held_by_dead_id = None

    def _collect_aborts(self, rollback: Any) -> list[tuple[int, int]]:
        """Run ``rollback``; the aborts it made."""
        self.aborting = []
        try:
            rollback()
            return self.aborting
        finally:
            self.aborting = None

    def _answer_after(self, key: tuple[int, int], answer: Answer, aborts: list[tuple[int, int]]) -> None:
        """§4.4.3: the discharge is answered once the aborts of its rollback are out."""
        due = [k for k in aborts if k in self.aborts_due]
        if due:
            event("a discharge answer waits for an abort held back by the window")
            self.expected.silent.add(key)
            self.answers_due.append((key, answer, due))
        else:
            self.expected.answers[key] = answer

    def _error_after(self, key: tuple[int, int], condition: str, aborts: list[tuple[int, int]]) -> bool:
        """§4.3 and §4.4.3: a discharge's error, once the aborts of its rollback are out. It travels as
        ``rejected``, or (a controller without it) by detaching the controller: that detach is the answer, so
        it waits for the aborts as well, and the controller's other transactions stay open until it goes out.
        True when the controller is detached in this step."""
        conn = self.conns[key[0]]
        if conn.rejects:
            self._answer_after(key, Answer("rejected", condition=condition), aborts)
            return False
        due = [k for k in aborts if k in self.aborts_due]
        if not due:
            return self._control_error(conn, key[1], condition)
        event("a controller's error detach waits for an abort held back by the window")
        self.expected.silent.add(key)
        self.detaches_due.append((conn, conn.controller, condition, due))
        return False

    def _detach_when_aborted(self, aborted_now: set[tuple[int, int]]) -> list[Conn]:
        """The error detaches of controllers whose aborts are out by now (in this step, or their link went): they
        are expected in this step, with their effects (the controller's transactions roll back). Returns the
        connections whose controller went."""
        gone: list[Conn] = []
        waiting = []
        for conn, controller, condition, aborts in self.detaches_due:
            if any(k in self.aborts_due and k not in aborted_now for k in aborts):
                waiting.append((conn, controller, condition, aborts))
            elif self.conns.get(conn.slot) is conn and conn.controller == controller and conn not in gone:
                # (a controller detached meanwhile, or already by an earlier error, is not detached again)
                event("a controller's error detach sent once its abort is out")
                self.expected.detaches.append((conn.slot, controller, condition))
                self._controller_gone(conn)
                gone.append(conn)
        self.detaches_due = [w for w in waiting if w[0] not in gone]  # (the broker's later detach is a no-op)
        return gone

    def _unknown_condition(self, conn: Conn, txn_id: bytes) -> str:
        return TIMEOUT if txn_id in conn.timed_out else UNKNOWN_ID

    def _bad_ids(self, conn: Conn) -> list[bytes]:
        """txn-ids ``conn`` may not use: never declared, discharged, another connection's, timed out."""
        return [b"never-declared"] + [i for i, t in self.txns.items() if not (t.live and t.conn is conn)]

    def _consumer_gone(self, c: Cons) -> None:
        """Its deliveries get the default outcome, unless a transaction holds them (which then decides)."""
        c.attached = False
        c.acquiring = None
        self.consumers.remove(c)
        for key, d in list(self.aborts_due.items()):
            if d.consumer is c:  # a detached link's held-back frames are never sent (R3)
                del self.aborts_due[key]
        for d in [d for d in self.deliveries.values() if d.consumer is c]:
            if d.holder is None:
                self._finish(d, c.default, tell=None)
        if c.dynamic:
            self._delete_node(c.node)

    # -- driving -----------------------------------------------------------------------------------------------
    def _step(self) -> dict[int, Observed]:
        """Let the broker answer; check what each client saw against the model; learn the deliveries."""
        seen = self.world.settle()
        by_slot: dict[int, Observed] = {}
        for peer, observed in seen.items():
            assert not observed.violations, observed.violations
            conn = next((c for c in self.conns.values() if c.peer is peer), None)
            if conn is None:  # it closed in this step
                assert not observed.started, observed
                assert not observed.settled_by_broker, observed
                continue
            by_slot[conn.slot] = observed
        expected = self.expected
        aborted_now = {(slot, delivery_id) for slot, obs in by_slot.items() for _, delivery_id in obs.aborted}
        controllers_gone = self._detach_when_aborted(aborted_now)
        self._check_no_duplicates()
        bounced: list[tuple[Delivery, Txn]] = []
        for slot, obs in by_slot.items():
            if self.credit_step is not None:
                self._check_head_of_queue(slot, obs)
            for started in obs.started:
                bounce = self._on_started(slot, started)
                if bounce is not None:
                    bounced.append(bounce)
            for done in obs.completed:
                key = (slot, done.delivery_id)
                d = self.sent.get(key)
                assert d is not None, f"slot {slot}: delivery {done.delivery_id} completed, but it is not out"
                assert key not in self.aborts_due, f"{d.msg.name}: the rest of an aborted delivery arrived (R3)"
                assert done.name == d.msg.name, (done, d.msg.name)
                assert done.delivery_count == d.count, f"{d.msg.name}: delivery-count {done.delivery_count}"
                d.complete = True
            for started in obs.started:
                if not self.sent[(slot, started.delivery_id)].complete:
                    event("a delivery held back by the session window")
        for d, txn in bounced:  # delivered under a transaction that rolled back later in the same step
            event("delivery under a transaction that rolled back in the same step")
            self._decide(d, txn, committed=False)  # its release is expected in this step, in ``expected``
        self.expected = Expected()  # what the rest of this method adds is for the next step
        for slot, obs in by_slot.items():
            for link, delivery_id in obs.aborted:
                d = self.aborts_due.pop((slot, delivery_id), None)
                assert d is not None, f"slot {slot}: delivery {delivery_id} on {link} aborted, which was not due"
                event("partly sent delivery aborted (R3)")
            peer = self.conns[slot].peer
            due = [d.msg.name for (s, _), d in self.aborts_due.items() if s == slot]
            assert not (due and peer.window_room), f"slot {slot}: window open, yet no abort of {due} (R3)"
        waiting = []
        for key, answer, aborts in self.answers_due:  # §4.4.3: answered once its aborts are out
            if any(k in self.aborts_due for k in aborts):
                waiting.append((key, answer, aborts))
                expected.silent.add(key)
            else:
                expected.answers[key] = answer
        self.answers_due = waiting
        detached = sorted(
            (slot, name, None if err is None else str(err.condition))
            for slot, obs in by_slot.items()
            for name, err in obs.detached
        )
        assert detached == sorted(expected.detaches), f"detached {detached}, expected {sorted(expected.detaches)}"
        answers = {(slot, i): state for slot, obs in by_slot.items() for i, (state, _) in obs.answers.items()}
        for key, answer in expected.answers.items():
            assert key in answers, f"no answer to {key}: expected {answer}"
            problem = answer.check(answers[key])
            assert problem is None, f"answer to {key}: {problem}"
        for key in expected.silent:  # sent settled; or a discharge the broker answers by detaching (R6, R7)
            assert key not in answers, f"{key} must get no answer, got {answers[key]}"
        unexpected = {k: v for k, v in answers.items() if k not in expected.answers}
        assert not unexpected, f"unexpected answers {unexpected}"
        settles = {(slot, i): state for slot, obs in by_slot.items() for i, state in obs.settled_by_broker}
        assert set(settles) == set(expected.settles), f"broker settled {settles}, expected {expected.settles}"
        for key, state in settles.items():
            assert same_outcome(state, expected.settles[key]), (
                f"{key} settled with {state}, not {expected.settles[key]}"
            )
        self.rolled_back_now = {}
        self.credit_step = None
        for conn in controllers_gone:
            self._reattach_controller(conn)
        return by_slot

    def _check_no_duplicates(self) -> None:
        """No message is on two deliveries a client holds, nor on one and on a queue (independent of the model)."""
        names = Counter(name for c in self.conns.values() for _, name in c.peer.unsettled.values())
        twice = [n for n, k in names.items() if k > 1]
        assert not twice, f"a message is out on two live deliveries at once: {twice}"
        queued = {n for q in census(self.view).values() for n, _ in q.ready}
        both = queued & set(names)
        assert not both, f"a message is both on a queue and out on a live delivery: {both}"

    def _check_head_of_queue(self, slot: int, obs: Observed) -> None:
        """A credit grant (and nothing else in the step) takes the head of the consumer's queue, in order."""
        c = self.credit_step
        assert c is not None
        if c.conn.slot != slot:
            return
        got = [s.name for s in obs.started if s.link == c.name]
        head = [m.name for m in self._available(c.node)][: len(got)]
        assert got == head, f"{c.name} got {got}, the head of {c.node.name} is {head}"

    def _on_started(self, slot: int, s: Started) -> tuple[Delivery, Txn] | None:
        """A delivery began: the broker acquired a message for a consumer. Check it may; record it."""
        c = next((c for c in self.consumers if c.conn.slot == slot and c.name == s.link), None)
        assert c is not None, f"slot {slot}: delivery on {s.link}, which is no attached consumer"
        assert c.credit > 0, f"{c.name} got {s.name} without credit"
        msg = self.msgs.get(s.name or "")
        assert msg is not None, f"{c.name} got {s.name!r}, which nobody posted"
        assert msg.fate is Fate.AVAILABLE, f"{c.name} got {msg.name}, which is {msg.fate.value}"
        assert msg.node is c.node, f"{c.name} got {msg.name} from {msg.node}, not {c.node.name}"
        assert s.settled == c.presettled, f"{msg.name} sent settled={s.settled} on {c.name}"
        named = s.state.txn_id if isinstance(s.state, TransactionalState) else None
        assert s.state is None or s.state == TransactionalState(txn_id=named), f"{msg.name} sent with {s.state}"
        bounce = None
        if c.acquiring is not None:
            assert named == c.acquiring.id, f"{msg.name} on {c.name} named {named}, not {c.acquiring.id}"
        elif named is not None and c in self.rolled_back_now.get(named, ()):
            bounce = self.txns[named]
        else:
            assert named is None, f"{msg.name} on {c.name} named {named}; the link acquires outside transactions"
            assert c.held_by_dead_id is None, f"{c.name} is bound to a timed-out transaction, yet sent {msg.name} (R5)"
        c.credit -= 1
        txn = c.acquiring or bounce
        d = Delivery(c, s.delivery_id, msg, msg.count, acquired_in=txn, sent_settled=s.settled)
        msg.fate, msg.delivery = Fate.OUT, d
        if txn is not None:
            txn.deliveries.append(d)
            event(f"delivery acquired under a transaction (sent settled: {s.settled})")
        self.deliveries[(slot, d.id)] = self.sent[(slot, d.id)] = d
        if s.settled and txn is None:  # at most once: consumed as it leaves
            self._finish(d, Accepted(), tell=None)
        return (d, bounce) if bounce is not None else None

    # -- connections ------------------------------------------------------------------------------------------
    def _connect(self, slot: int, slow: bool, rejects: bool) -> Conn:
        peer = self.world.connect(
            self._name(f"client{slot}-"),
            max_frame_size=SMALL_FRAMES if slow else None,
            window=1 if slow else None,
        )
        conn = self.conns[slot] = Conn(slot, peer, slow, rejects)
        conn.controller = self._name(f"ctl{slot}-")
        peer.attach_controller(conn.controller, rejects=rejects)
        for q in QUEUES:
            conn.producers[q] = self._name(f"p{slot}-")
            peer.attach_producer(conn.producers[q], q)
            self._node(q)
        conn.relay = self._name(f"relay{slot}-")
        peer.attach_producer(conn.relay, None)
        self._step()
        return conn

    def _reattach_controller(self, conn: Conn) -> None:
        conn.controller = self._name(f"ctl{conn.slot}-")
        conn.peer.attach_controller(conn.controller, rejects=conn.rejects)
        self._step()

    def _control_error(self, conn: Conn, delivery_id: int, condition: str) -> bool:
        """§4.3: an error travels as rejected when the controller's source offers it, else by detaching the
        controller (which rolls back its transactions). True when the controller is detached."""
        if conn.rejects:
            self.expected.answers[(conn.slot, delivery_id)] = Answer("rejected", condition=condition)
            return False
        self.expected.detaches.append((conn.slot, conn.controller, condition))
        self._controller_gone(conn)
        return True

    def _close(self, slot: int, graceful: bool) -> None:
        conn = self.conns.pop(slot)
        for c in [c for c in self.consumers if c.conn is conn]:
            self._consumer_gone(c)
        for node in conn.dynamic_producers.values():
            self._delete_node(node)
        for partial in conn.sending.values():
            self._gone(partial.msg)
        for key in [k for k, d in self.aborts_due.items() if d.consumer.conn is conn]:
            del self.aborts_due[key]
        self.answers_due = [entry for entry in self.answers_due if entry[0][0] != slot]
        self.detaches_due = [entry for entry in self.detaches_due if entry[0] is not conn]
        for key in [k for k, d in self.sent.items() if d.consumer.conn is conn]:
            del self.sent[key]  # delivery ids are per session: the next connection starts again at 0
        self._controller_gone(conn)
        conn.timed_out.clear()
        if graceful:
            conn.peer.close()
        else:
            conn.peer.eof()
        self._step()

    # -- declare and discharge ---------------------------------------------------------------------------------
    def declare(self, slot: int) -> Txn | None:
        """Declare; the new transaction, or None when the broker refused (R10) and said so."""
        conn = self.conns[slot]
        delivery_id = conn.peer.declare(conn.controller)
        key = (slot, delivery_id)
        in_use = len(self._live(conn)) + len(conn.timed_out)
        if in_use >= MAX_TXNS:  # R10: open and timed-out ids count toward the limit together
            event("declare beyond the limit (R10)")
            detached = self._control_error(conn, delivery_id, LIMIT)
            self._step()
            if detached:
                self._reattach_controller(conn)
            return None
        self.expected.answers[key] = Answer("declared")
        answer, _ = self._step()[slot].answers[delivery_id]
        txn_id = answer.txn_id
        assert isinstance(txn_id, bytes), txn_id
        assert 0 < len(txn_id) <= 32, txn_id
        assert txn_id not in self.txns, f"txn-id {txn_id!r} given twice"
        txn = self.txns[txn_id] = Txn(txn_id, conn, self.world.now, label=f"T{len(self.txns) + 1}")
        self.stats["declared"] += 1
        return txn

    def _some_txn(self, slot: int, data: st.DataObject) -> Txn | None:
        """One of the connection's open transactions, or a new one (None when the broker refuses one)."""
        live = self._live(self.conns[slot])
        if not live or (len(live) < MAX_TXNS and data.draw(st.integers(0, 3), label="declare another") == 0):
            return self.declare(slot) or next(iter(self._live(self.conns[slot])), None)  # (R10 may refuse)
        return self._pick(data, live, "txn")

    def discharge(self, slot: int, txn_id: bytes, fail: bool) -> None:
        conn = self.conns[slot]
        txn = self.txns.get(txn_id)
        delivery_id = conn.peer.discharge(conn.controller, txn_id, fail=fail)
        key = (slot, delivery_id)
        detached = False
        if txn is None or not txn.live or txn.conn is not conn:
            timed_out = txn_id in conn.timed_out
            aborts = txn.aborts if txn is not None and timed_out else []
            if timed_out:
                self._forget_timed_out(conn, txn_id)
            if timed_out and fail:  # R4: a discharge with fail=true always completes
                event("discharge(fail=true) of a timed-out id (R4)")
                self._answer_after(key, Answer("accepted"), aborts)
            elif timed_out:
                event("discharge of a timed-out id")
                detached = self._error_after(key, TIMEOUT, aborts)
            else:
                event("discharge of an unknown id")
                detached = self._control_error(conn, delivery_id, UNKNOWN_ID)
        elif not fail and any(p.named is txn for p in conn.sending.values()):
            # R6, §4.4.1: discharging a transaction against which a partial delivery has been posted: the
            # control link is terminated with transaction-rollback; the discharge itself gets no answer
            event("discharge(fail=false) while a post is partial (R6)")
            self.expected.detaches.append((slot, conn.controller, ROLLBACK))
            self.expected.silent.add(key)
            self._controller_gone(conn)
            detached = True
        elif fail:
            self._answer_after(key, Answer("accepted"), self._collect_aborts(lambda: self._rollback(txn)))
        elif self._cannot_commit(txn):
            event("commit that cannot apply everything (R1)")
            aborts = self._collect_aborts(lambda: self._rollback(txn))
            detached = self._error_after(key, ROLLBACK, aborts)
        else:
            self._commit(txn)
            self.expected.answers[key] = Answer("accepted")
        self._step()
        if detached:
            self._reattach_controller(conn)

    # -- posting ---------------------------------------------------------------------------------------------
    def _target(self, conn: Conn, where: str, data: st.DataObject | None) -> tuple[str, str | None]:
        """(link, ``to``) for a post: a producer's node, or the anonymous relay with an address."""
        if where in QUEUES:
            return conn.producers[where], None
        if where == "dynamic-producer":
            idle = self._idle_dynamic_producers(conn)
            link = idle[0] if data is None else data.draw(st.sampled_from(idle), label="dynamic producer")
            return link, None
        if where == "relay-fresh":
            return conn.relay, self._name("fresh")  # a new address: auto-created (D4)
        if where == "relay-dynamic":
            names = sorted(n.name for n in self.nodes.values() if n.dynamic and not n.deleted)
            to = names[0] if data is None else data.draw(st.sampled_from(names), label="dynamic address")
            return conn.relay, to
        if where == "relay-nowhere":
            return conn.relay, None
        assert where.startswith("relay-")
        return conn.relay, where.removeprefix("relay-")

    def _destinations(self, conn: Conn) -> list[str]:
        """Where a post may go now (not through a link that is in the middle of sending a message)."""
        where = [q for q in QUEUES if conn.producers[q] not in conn.sending]
        if conn.relay not in conn.sending:
            where += ["relay-q1", "relay-q2", "relay-fresh", "relay-nowhere"]
            if any(n.dynamic and not n.deleted for n in self.nodes.values()):
                where += ["relay-dynamic", "relay-dynamic"]
        if self._idle_dynamic_producers(conn):
            where += ["dynamic-producer", "dynamic-producer"]
        return where

    def _idle_dynamic_producers(self, conn: Conn) -> list[str]:
        return sorted(link for link in conn.dynamic_producers if link not in conn.sending)

    def post_plain_to(self, node: Node, *, big: bool) -> None:
        """A plain post to ``node`` by whichever connection has a link free for it."""
        for conn in self.conns.values():
            where = [w for w in self._destinations(conn) if w in (node.name, f"relay-{node.name}")]
            if node.name not in QUEUES and conn.relay not in conn.sending:
                where.append(f"relay-{node.name}")
            if where:
                self.post(conn.slot, where[0], "plain", settled=False, big=big)
                return

    def _node_of_link(self, conn: Conn, link: str) -> Node | None:
        if link in conn.dynamic_producers:
            return conn.dynamic_producers[link]
        for q, name in conn.producers.items():
            if name == link:
                return self.nodes[q]
        return None

    def _reserved(self, address: str) -> bool:
        """A `dynamic.` address whose node is gone (or never was): no post or attach may make it."""
        existing = self.nodes.get(address)
        return address.startswith("dynamic.") and (existing is None or existing.deleted)

    def _arrived(self, conn: Conn, msg: Msg, link: str, named: list[bytes], delivery_id: int, settled: bool) -> None:
        """A post arrived whole; ``named``: the txn-ids its frames named, in order (after inheritance)."""
        key = (conn.slot, delivery_id)
        answer: Answer | None = None
        distinct = list(dict.fromkeys(named))
        relay_to = msg.address if link == conn.relay else None
        node = self._node_of_link(conn, link)
        # README: the relay reaches no node when ``to`` is missing, or names a `dynamic.` address with no node
        # (nobody but the broker makes a node there): rejected, amqp:not-found
        nowhere = link == conn.relay and (relay_to is None or self._reserved(str(relay_to)))
        if len(distinct) > 1:
            # D1, §4.4.1: "all frames MUST be explicitly associated with the same transaction"
            event("a post whose frames name two transactions (D1)")
            answer = Answer("rejected", condition=ROLLBACK)
            self._gone(msg)
            if any(i in self.txns and self.txns[i].live and self.txns[i].conn is conn for i in distinct):
                self.expected.detaches.append((conn.slot, conn.controller, ROLLBACK))
                self._controller_gone(conn)
                self.controller_lost = True
        elif not distinct:
            if nowhere:
                answer = Answer("rejected", condition=NOT_FOUND)
                self._gone(msg)
            else:
                self._make_visible(msg, node if node is not None else self._node(str(relay_to)))
                answer = Answer("accepted")
        else:
            txn = self.txns.get(distinct[0])
            if txn is None or not txn.live or txn.conn is not conn:
                event("post naming an unusable txn-id")
                answer = Answer("rejected", condition=self._unknown_condition(conn, distinct[0]))
                self._gone(msg)
            elif nowhere:
                answer = Answer("rejected", condition=NOT_FOUND)
                txn.refused_post = True
                self._gone(msg)
            else:
                msg.fate, msg.txn = Fate.STAGED, txn
                if link == conn.relay:
                    existing = self.nodes.get(str(relay_to))
                    msg.node = existing if existing is not None and not existing.deleted else None
                    if msg.node is None:
                        event("relay post in a transaction to an address with no node (D4)")
                else:
                    msg.node = node
                txn.posts.append(msg)
                answer = Answer("provisional", txn_id=txn.id)
        if settled:
            self.expected.silent.add(key)
        else:
            self.expected.answers[key] = answer

    def post(
        self,
        slot: int,
        where: str,
        mode: str,
        *,
        settled: bool,
        big: bool,
        txn: Txn | None = None,
        data: st.DataObject | None = None,
    ) -> None:
        """One single-frame post. ``mode``: plain, txn, unknown (an id the connection may not use)."""
        conn = self.conns[slot]
        named: list[bytes] = []
        if mode == "txn":
            if txn is None:
                txn = self._some_txn(slot, data) if data is not None else (self._live(conn) or [None])[0]
            if txn is None:
                return
            named = [txn.id]
        elif mode == "unknown":
            bad = self._bad_ids(conn)
            named = [bad[-1] if data is None else self._pick(data, bad, "txn-id")]
        link, to = self._target(conn, where, data)
        msg = self._new_msg(to)
        state = TransactionalState(txn_id=named[0]) if named else None
        delivery_id = conn.peer.transfer(link, payload(msg.name, big=big, to=to), settled=settled, state=state)
        self.controller_lost = False
        self._arrived(conn, msg, link, named, delivery_id, settled)
        self._step()
        if self.controller_lost:
            self._reattach_controller(conn)

    # -- credit ----------------------------------------------------------------------------------------------
    def _may_grant(self, c: Cons, credit: int) -> bool:
        """A slow connection keeps at most one delivery in flight, and only grants credit when the window can
        take its first frame: then a delivery the broker starts always reaches the client at once."""
        conn = c.conn
        if not conn.slow:
            return True
        others = sum(o.credit for o in self.consumers if o.conn is conn and o is not c)
        due = any(k[0] == conn.slot for k in self.aborts_due)
        return credit <= 1 and others == 0 and conn.peer.window_room >= 1 and not conn.peer.receiving and not due

    def flow(self, c: Cons, credit: int, mode: str, txn: Txn | None = None, bad: bytes | None = None) -> None:
        """A flow for ``c``. ``mode``: keep (no properties), txn (properties name ``txn``), end (properties
        without txn-id), unknown (properties name ``bad``)."""
        properties: dict[Any, Any] | None = None
        slot = c.conn.slot
        if mode == "txn":
            assert txn is not None
            properties = {TXN_ID: txn.id}
            c.acquiring, c.held_by_dead_id = txn, None
        elif mode == "end":  # §4.4.3 (README): properties without txn-id end transactional acquisition
            properties = {}
            c.acquiring, c.held_by_dead_id = None, None
        elif mode == "unknown":
            assert bad is not None
            properties = {TXN_ID: bad}
            condition = self._unknown_condition(c.conn, bad)
            event(f"flow naming an unusable txn-id ({condition})")
            self.expected.detaches.append((slot, c.name, condition))  # R5: detached, with the reason
            c.conn.peer.flow(c.name, credit, properties)
            self._consumer_gone(c)
            self._step()
            return
        c.credit = credit
        c.conn.peer.flow(c.name, credit, properties)
        self.credit_step = c
        self._step()

    # -- dispositions ----------------------------------------------------------------------------------------
    def dispose(self, d: Delivery, state: Any, *, settled: bool) -> None:
        """The client's disposition of delivery ``d`` (complete, held by the client)."""
        conn = d.consumer.conn
        holder = d.holder
        outcome = state.outcome if isinstance(state, TransactionalState) else state
        named = state.txn_id if isinstance(state, TransactionalState) else None
        txn = self.txns.get(named) if named is not None else None
        usable = txn is not None and txn.live and txn.conn is conn
        self.controller_lost = False
        if settled:
            d.client_settled = True
        if named is None:
            if holder is not None and (d.acquired_in is holder or outcome is None):
                # the transaction holding it decides; a plain outcome is staged in the acquiring transaction
                if outcome is not None and d.outcome_in is None:
                    d.outcome_in, d.outcome = holder, outcome
                    event("plain outcome staged in the acquiring transaction")
            elif outcome is not None:
                if holder is not None:  # acquired outside any: the latest outcome takes it out of the transaction
                    event("a plain outcome takes a staged one out of its transaction")
                    d.outcome_in, d.outcome = None, None
                self._finish(d, outcome, tell=outcome)
            elif settled:
                self._finish(d, d.consumer.default, tell=None)
        elif not usable:
            # R8: an unknown, discharged, timed-out or other connection's id: the outcome is not applied
            event(f"disposition naming an unusable txn-id (held: {holder is not None})")
            if holder is None:
                self._finish(d, RELEASED, tell=RELEASED)  # D6: released, and said so
        elif holder is not None and holder is not txn and d.acquired_in is holder:
            # §4.4.2: "the delivery MUST NOT be associated with a different non discharged transaction than
            # the outcome": both roll back, and the control link is terminated with transaction-rollback
            event("a delivery names a second live transaction")
            self.expected.detaches.append((conn.slot, conn.controller, ROLLBACK))
            self._controller_gone(conn)
            self.controller_lost = True
        elif outcome is not None:
            # staged in ``txn``; a delivery acquired outside any transaction is associated with none (§4.4.2:
            # it "need not be associated with the same transaction as the outcome"), so an outcome staged in
            # another one before moves here
            assert txn is not None
            if d.outcome_in is not None and d.outcome_in is not txn:
                event("an outcome moves to another transaction")
            d.outcome_in, d.outcome = txn, outcome
            txn.deliveries.append(d)
            event("outcome staged in a transaction")
        elif settled:
            if holder is None:  # R8: settled without outcome, held by no transaction: default outcome now
                self._finish(d, d.consumer.default, tell=None)
            else:
                event("settled without outcome in the holding transaction (R2 at discharge)")
        conn.peer.dispose(d.id, state, settled=settled)
        self._step()
        if self.controller_lost:
            self._reattach_controller(conn)

    # -- hypothesis: initial state and rules -------------------------------------------------------------------
    # Hypothesis picks rules uniformly; the compound rules at the end make the interesting sequences (a
    # consumer's transactional round trip, a commit racing the deletion of a node) common enough.
    def _pick(self, data: st.DataObject, items: list[Any], label: str) -> Any:
        """Draw one of ``items`` by its short name, so that falsifying examples read well."""
        by_name = {self._label(i): i for i in items}
        return by_name[data.draw(st.sampled_from(sorted(by_name)), label=label)]

    def _label(self, item: Any) -> str:
        if isinstance(item, Txn):
            return item.label
        if isinstance(item, bytes):
            txn = self.txns.get(item)
            return txn.label if txn is not None else item.decode()
        if isinstance(item, Cons):
            return item.name
        if isinstance(item, Delivery):
            return f"{item.consumer.name}#{item.id}:{item.msg.name}"
        if isinstance(item, Conn):
            return f"slot{item.slot}"
        if isinstance(item, Node):
            return item.name
        return str(item)

    @initialize(slow=st.booleans(), rejects=st.sampled_from([True, True, False]))
    def connect_all(self, slow: bool, rejects: bool) -> None:
        self._connect(0, slow=False, rejects=True)
        self._connect(1, slow=slow, rejects=rejects)

    @rule(slot=st.sampled_from(SLOTS))
    def declare_rule(self, slot: int) -> None:
        self.declare(slot)

    @rule(
        slot=st.sampled_from(SLOTS),
        mode=st.sampled_from(["plain", "plain", "txn", "txn", "txn", "unknown"]),
        settled=st.booleans(),
        big=st.booleans(),
        data=st.data(),
    )
    def post_rule(self, slot: int, mode: str, settled: bool, big: bool, data: st.DataObject) -> None:
        where_to = self._destinations(self.conns[slot])
        if where_to:
            self.post(slot, data.draw(st.sampled_from(where_to), label="to"), mode, settled=settled, big=big, data=data)

    # multi-frame posts (R6, D1)
    @rule(
        slot=st.sampled_from(SLOTS),
        plan=st.sampled_from(["plain", "first", "first", "all", "two"]),
        settled=st.booleans(),
        data=st.data(),
    )
    def start_partial_post(self, slot: int, plan: str, settled: bool, data: st.DataObject) -> None:
        conn = self.conns[slot]
        txn = None if plan == "plain" else self._some_txn(slot, data)
        where_to = self._destinations(conn)
        if (plan != "plain" and txn is None) or not where_to:
            return
        self.start_post(slot, data.draw(st.sampled_from(where_to), label="to"), plan, txn, settled=settled, data=data)

    def start_post(
        self, slot: int, where: str, plan: str, txn: Txn | None, *, settled: bool, data: st.DataObject | None = None
    ) -> None:
        """Send the first frame of a two-frame post (``finish_partial_post`` sends the rest)."""
        conn = self.conns[slot]
        link, to = self._target(conn, where, data)
        msg = self._new_msg(to)
        whole = payload(msg.name, big=True, to=to)
        cut = len(whole) // 2
        state = TransactionalState(txn_id=txn.id) if txn is not None else None
        delivery_id = conn.peer.begin_transfer(link, whole[:cut], settled=settled, state=state)
        conn.sending[link] = Partial(msg, link, delivery_id, settled, txn, plan, whole[cut:])
        self._step()  # nothing to see yet

    @precondition(lambda self: any(c.sending for c in self.conns.values()))
    @rule(data=st.data())
    def finish_partial_post(self, data: st.DataObject) -> None:
        conn = self._pick(data, [c for c in self.conns.values() if c.sending], "connection")
        link = data.draw(st.sampled_from(sorted(conn.sending)), label="link")
        partial = conn.sending.pop(link)
        first = partial.named.id if partial.named is not None else None
        last: bytes | None = first if partial.plan == "all" else None
        if partial.plan == "two":  # D1: the last frame names another transaction
            others = [t for t in self._live(conn) if t is not partial.named]
            second = self._pick(data, others, "second txn") if others else self.declare(conn.slot)
            last = second.id if second is not None and second.id != first else b"never-declared"
        named = [i for i in (first, last) if i is not None]
        self.controller_lost = False
        conn.peer.end_transfer(link, partial.rest, state=None if last is None else TransactionalState(txn_id=last))
        self._arrived(conn, partial.msg, link, named, partial.delivery_id, partial.settled)
        self._step()
        if self.controller_lost:
            self._reattach_controller(conn)

    # consumers and nodes
    def attach_consumer(
        self, slot: int, source: str, presettled: bool, default_outcome: Any, credit: int
    ) -> Cons | None:
        conn = self.conns[slot]
        if sum(c.conn is conn for c in self.consumers) >= 3:
            return None
        name = self._name(f"c{slot}-")
        dynamic = source == "dynamic"
        conn.peer.attach_consumer(
            name, None if dynamic else source, presettled=presettled, default_outcome=default_outcome, dynamic=dynamic
        )
        self._step()
        node = self._node(conn.peer.addresses[name], dynamic=True) if dynamic else self.nodes[source]
        c = Cons(conn, name, node, presettled, default_outcome, dynamic)
        self.consumers.append(c)
        credit = min(credit, 1) if conn.slow else credit
        if credit and self._may_grant(c, credit):
            self.flow(c, credit, "keep")
        return c

    @rule(
        slot=st.sampled_from(SLOTS),
        source=st.sampled_from([*QUEUES, "dynamic"]),
        presettled=st.sampled_from([False, False, False, True]),
        default_outcome=DEFAULT_OUTCOME,
        credit=st.sampled_from([0, 1, 3]),
    )
    def attach_consumer_rule(self, slot: int, source: str, presettled: bool, default_outcome: str, credit: int) -> None:
        self.attach_consumer(slot, source, presettled, outcome_named(default_outcome), credit)

    def detach_consumer(self, c: Cons) -> None:
        if c.dynamic:
            event("dynamic source detached: its node is deleted (R1)")
        c.conn.peer.detach(c.name)
        self._consumer_gone(c)
        self._step()

    @precondition(lambda self: self.consumers)
    @rule(data=st.data())
    def detach_consumer_rule(self, data: st.DataObject) -> None:
        self.detach_consumer(self._pick(data, self.consumers, "consumer"))

    def attach_dynamic_producer(self, slot: int) -> Node | None:
        conn = self.conns[slot]
        if len(conn.dynamic_producers) >= 2:
            return None
        link = self._name(f"dp{slot}-")
        conn.peer.attach_producer(link, None, dynamic=True)
        self._step()
        node = conn.dynamic_producers[link] = self._node(conn.peer.addresses[link], dynamic=True)
        return node

    @rule(slot=st.sampled_from(SLOTS))
    def attach_dynamic_producer_rule(self, slot: int) -> None:
        self.attach_dynamic_producer(slot)

    def delete_dynamic(self, node: Node) -> None:
        """Detach the link that made a dynamic node: the node goes with it (R1)."""
        for conn in self.conns.values():
            for link, made in list(conn.dynamic_producers.items()):
                if made is node:
                    event("dynamic target detached: its node is deleted (R1)")
                    del conn.dynamic_producers[link]
                    partial = conn.sending.pop(link, None)
                    if partial is not None:
                        self._gone(partial.msg)
                        if partial.named is not None and partial.named.live:
                            event("a post discarded before it was whole fails its transaction (§4.4.4)")
                            partial.named.refused_post = True
                    conn.peer.detach(link)
                    self._delete_node(node)
                    self._step()
                    return
        owner = next(c for c in self.consumers if c.dynamic and c.node is node)
        self.detach_consumer(owner)

    def _dynamic_nodes(self) -> list[Node]:
        return sorted((n for n in self.nodes.values() if n.dynamic and not n.deleted), key=lambda n: n.name)

    @precondition(lambda self: self._dynamic_nodes())
    @rule(data=st.data())
    def delete_dynamic_rule(self, data: st.DataObject) -> None:
        self.delete_dynamic(self._pick(data, self._dynamic_nodes(), "node"))

    # credit
    @precondition(lambda self: self.consumers)
    @rule(
        credit=st.integers(0, 3),
        mode=st.sampled_from(["keep", "keep", "txn", "txn", "end", "unknown"]),
        data=st.data(),
    )
    def grant_credit(self, credit: int, mode: str, data: st.DataObject) -> None:
        busy = [c for c in self.consumers if self._available(c.node)]
        c = self._pick(data, busy or self.consumers, "consumer")
        if mode == "unknown":
            bad = sorted(c.conn.timed_out) if c.conn.timed_out else []
            if not bad or data.draw(st.booleans(), label="any unusable id"):
                bad = self._bad_ids(c.conn)
            self.flow(c, credit, mode, bad=self._pick(data, bad, "txn-id"))
            return
        credit = max(credit, 1) if mode == "txn" else credit
        if c.conn.slow:
            credit = min(credit, 1)
        txn = self._some_txn(c.conn.slot, data) if mode == "txn" else None
        if mode == "txn" and txn is None:
            return
        self.flow(c, credit if self._may_grant(c, credit) else 0, mode, txn=txn)

    @precondition(lambda self: any(c.slow for c in self.conns.values()))
    @rule(frames_more=st.sampled_from([1, 1, 2, 6]), data=st.data())
    def open_window(self, frames_more: int, data: st.DataObject) -> None:
        conn = self._pick(data, [c for c in self.conns.values() if c.slow], "connection")
        conn.peer.open_window(frames_more)
        self._step()

    # dispositions
    def _open_deliveries(self) -> list[Delivery]:
        return sorted(
            (d for d in self.deliveries.values() if d.on_the_wire and d.complete),
            key=lambda d: (d.consumer.conn.slot, d.id),
        )

    def _disposition(self, d: Delivery, outcome: Any, mode: str, data: st.DataObject, txn: Txn | None = None) -> Any:
        """The state a disposition of ``d`` carries in ``mode``; None when the mode is impossible now."""
        conn = d.consumer.conn
        if mode in ("txn", "txn-no-outcome"):
            txn = d.holder or (txn if txn is not None and txn.live else None) or self._some_txn(conn.slot, data)
            if txn is None or not d.on_the_wire:
                return None
            return TransactionalState(txn_id=txn.id, outcome=None if mode == "txn-no-outcome" else outcome)
        if mode == "unknown":
            return TransactionalState(txn_id=self._pick(data, self._bad_ids(conn), "txn-id"), outcome=outcome)
        if mode == "second":
            holder = d.holder
            if holder is None:
                return None
            others = [t for t in self._live(conn) if t is not holder]
            if not others:
                self.declare(conn.slot)
                others = [t for t in self._live(conn) if t is not holder]
            if not others or not holder.live or not d.on_the_wire:
                return None
            return TransactionalState(txn_id=self._pick(data, others, "second txn").id, outcome=outcome or Accepted())
        return outcome if outcome is not None else "settle-only"

    @precondition(lambda self: self._open_deliveries())
    @rule(
        outcome=OUTCOME,
        mode=st.sampled_from(["plain", "plain", "txn", "txn", "txn", "txn-no-outcome", "unknown", "second"]),
        settled=st.booleans(),
        data=st.data(),
    )
    def dispose_rule(self, outcome: str, mode: str, settled: bool, data: st.DataObject) -> None:
        d = self._pick(data, self._open_deliveries(), "delivery")
        state = self._disposition(d, outcome_named(outcome), mode, data)
        if state is not None and d.on_the_wire:
            self.dispose(d, None if state == "settle-only" else state, settled=settled)

    # discharge, time, endings
    @rule(
        slot=st.sampled_from(SLOTS),
        fail=st.booleans(),
        which=st.sampled_from(["live", "live", "live", "live", "unusable"]),
        data=st.data(),
    )
    def discharge_rule(self, slot: int, fail: bool, which: str, data: st.DataObject) -> None:
        conn = self.conns[slot]
        live = self._live(conn)
        if which == "unusable" or not live:
            bad = sorted(conn.timed_out) if conn.timed_out else []
            if not bad or data.draw(st.booleans(), label="any unusable id"):
                bad = self._bad_ids(conn)
            self.discharge(slot, self._pick(data, bad, "txn-id"), fail)
            return
        self.discharge(slot, self._pick(data, live, "txn").id, fail)

    @rule(seconds=st.sampled_from([1.0, 4.0, 4.0, TXN_TIMEOUT + 1]))
    def time_passes(self, seconds: float) -> None:
        now = self.world.now + seconds
        for txn in [t for t in self.txns.values() if t.live and now >= t.declared_at + TXN_TIMEOUT]:
            event("transaction timed out (R5)")
            self._time_out(txn)
        self.world.advance(seconds)
        self._step()

    @rule(slot=st.sampled_from(SLOTS))
    def detach_controller(self, slot: int) -> None:
        conn = self.conns[slot]
        conn.peer.detach(conn.controller)
        self._controller_gone(conn)
        self._step()
        self._reattach_controller(conn)

    @rule(
        slot=st.sampled_from(SLOTS),
        graceful=st.booleans(),
        slow=st.booleans(),
        rejects=st.sampled_from([True, True, False]),
    )
    def reconnect(self, slot: int, graceful: bool, slow: bool, rejects: bool) -> None:
        """The connection closes (close frame or dropped socket); a new one takes its place."""
        self._close(slot, graceful)
        self._connect(slot, slow=slow and slot == 1, rejects=rejects)

    # misuse of the coordinator (R7, D2, D3)
    @rule(
        slot=st.sampled_from(SLOTS),
        kind=st.sampled_from(
            [
                "settled declare",
                "settled discharge",
                "declare carrying transactional-state",
                "discharge with fail=1 (uint)",
                "controller attached with snd-settle-mode settled",
            ]
        ),
        data=st.data(),
    )
    def misuse_coordinator(self, slot: int, kind: str, data: st.DataObject) -> None:
        conn = self.conns[slot]
        peer = conn.peer
        live = self._live(conn)
        if "declare" in kind and len(live) + len(conn.timed_out) >= MAX_TXNS:
            return  # which error comes first is not said; R10 has rules of its own
        event(f"coordinator misuse: {kind}")
        if kind == "controller attached with snd-settle-mode settled":
            # R7: refused: answered with a null target, then detached with amqp:not-allowed
            name = self._name(f"ctl{slot}-settled-")
            self.expected.detaches.append((slot, name, NOT_ALLOWED))
            peer.attach_controller(name, rejects=conn.rejects, snd_settle_mode=1)
            assert self._step()[slot].attached[name].target is None, "a settled-mode controller was not refused"
            return
        if kind in ("settled declare", "settled discharge"):
            # R7, §4.2-4.3 "This message MUST NOT be sent settled": the controller is detached with not-allowed
            if kind == "settled declare":
                delivery_id = peer.declare(conn.controller, settled=True)
            else:
                txn_id = self._pick(data, live, "txn").id if live else b"never-declared"
                fail = data.draw(st.booleans(), label="fail")
                delivery_id = peer.discharge(conn.controller, txn_id, fail=fail, settled=True)
            self.expected.silent.add((slot, delivery_id))
            self.expected.detaches.append((slot, conn.controller, NOT_ALLOWED))
            self._controller_gone(conn)
            self._step()
            self._reattach_controller(conn)
            return
        if kind == "declare carrying transactional-state":
            # D3, §4: "No transactional work is allowed on the control link"
            txn_id = self._pick(data, live, "txn").id if live else b"never-declared"
            delivery_id = peer.declare(conn.controller, state=TransactionalState(txn_id=txn_id))
            condition = NOT_ALLOWED
        else:
            # D2: a discharge that does not decode is refused; the transaction stays open
            if not live:
                return
            txn = self._pick(data, live, "txn")
            delivery_id = peer.control(conn.controller, discharge_with_uint_fail(txn.id))
            condition = DECODE_ERROR
        detached = self._control_error(conn, delivery_id, condition)
        self._step()
        if detached:
            self._reattach_controller(conn)

    # compound rules
    @rule(
        slot=st.sampled_from(SLOTS),
        credit=st.integers(1, 3),
        big=st.booleans(),
        acquire=st.sampled_from(["in the transaction", "in the transaction", "outside"]),
        plans=st.lists(
            st.tuples(
                OUTCOME,
                st.sampled_from(["txn", "txn", "txn", "plain", "txn-no-outcome", "unknown", "second", "none"]),
                st.booleans(),
            ),
            min_size=3,
            max_size=3,
        ),
        then=st.sampled_from(["commit", "commit", "rollback", "leave open", "time out", "controller detach"]),
        data=st.data(),
    )
    def consume_in_txn(
        self,
        slot: int,
        credit: int,
        big: bool,
        acquire: str,
        plans: list[tuple[str, str, bool]],
        then: str,
        data: st.DataObject,
    ) -> None:
        """A transactional consumer's round trip: acquire under a transaction (§4.4.3) or outside one, give the
        messages outcomes (mostly in the transaction; some plain, none, settle-only, naming an unusable or a
        second transaction), then commit, roll back, time out, lose the controller, or leave it open."""
        conn = self.conns[slot]
        mine = [c for c in self.consumers if c.conn is conn and c.held_by_dead_id is None]
        if not mine or data.draw(st.integers(0, 4), label="new consumer") == 0:
            source = data.draw(st.sampled_from([*QUEUES, "dynamic"]), label="source")
            presettled = data.draw(st.sampled_from([False, False, False, True]), label="presettled")
            default = outcome_named(data.draw(DEFAULT_OUTCOME, label="default outcome"))
            made = self.attach_consumer(slot, source, presettled, default, 0)
            mine = [made] if made is not None else mine
        if not mine:
            return
        c = self._pick(data, mine, "consumer")
        if conn.slow:
            credit = 1
            if not conn.peer.window_room and not conn.peer.receiving:
                conn.peer.open_window(1)
                self._step()
        for _ in range(credit - len(self._available(c.node))):
            self.post_plain_to(c.node, big=big)
        txn = self._some_txn(slot, data)
        if txn is None or not c.attached:
            return
        before = set(self.sent)
        grant = credit if self._may_grant(c, credit) else 0
        if acquire == "outside":
            self.flow(c, grant, "end")
        else:
            self.flow(c, grant, "txn", txn=txn)
        new = [d for k, d in self.sent.items() if k not in before and d.consumer is c]
        for d, (outcome, mode, settled) in zip(new, plans, strict=False):
            if mode == "none" or not d.complete or not d.on_the_wire:
                continue
            if acquire == "outside" and mode in ("txn", "txn-no-outcome") and d.holder is None:
                mode = "txn-retire"
            state = self._disposition(d, outcome_named(outcome), "txn" if mode == "txn-retire" else mode, data, txn=txn)
            if state is not None and d.on_the_wire:
                self.dispose(d, None if state == "settle-only" else state, settled=settled)
        if not txn.live or then == "leave open":
            return
        if then == "time out":
            self.time_passes(TXN_TIMEOUT + 1)
        elif then == "controller detach":
            self.detach_controller(slot)
        else:
            self.discharge(slot, txn.id, then == "rollback")

    @rule(
        slot=st.sampled_from(SLOTS),
        n=st.integers(1, 3),
        delete=st.sampled_from(["none", "before discharge", "before discharge"]),
        fail=st.sampled_from([False, False, True]),
        data=st.data(),
    )
    def post_in_txn_and_discharge(self, slot: int, n: int, delete: str, fail: bool, data: st.DataObject) -> None:
        """Stage a few posts (to queues, through the relay, to dynamic nodes), perhaps delete a node one of them
        went to, then discharge: the commit applies everything, or nothing (R1)."""
        conn = self.conns[slot]
        if not self._dynamic_nodes() and data.draw(st.booleans(), label="make a dynamic node"):
            if data.draw(st.booleans(), label="as a dynamic target"):
                self.attach_dynamic_producer(slot)
            else:
                self.attach_consumer(slot, "dynamic", False, None, 0)
        txn = self._some_txn(slot, data)
        if txn is None:
            return
        for _ in range(n):
            where_to = self._destinations(conn)
            if not where_to or not txn.live:
                return
            where = data.draw(st.sampled_from(where_to), label="to")
            self.post(
                slot, where, "txn", settled=data.draw(st.booleans(), label="settled"), big=False, txn=txn, data=data
            )
        staged_to = [m.node for m in txn.posts if m.node is not None and m.node.dynamic and not m.node.deleted]
        if delete != "none" and staged_to:
            self.delete_dynamic(self._pick(data, list(dict.fromkeys(staged_to)), "node"))
        if txn.live:
            self.discharge(slot, txn.id, fail)

    # -- invariants -------------------------------------------------------------------------------------------
    @invariant()
    def queues_hold_what_the_model_says(self) -> None:
        if self.conns:
            self._check_queues()

    def _check_queues(self) -> None:
        seen = census(self.view)
        existing = {name for name, node in self.nodes.items() if not node.deleted}
        assert set(seen) == existing, f"nodes {sorted(seen)}, model {sorted(existing)}"
        for name, queue in seen.items():
            node = self.nodes[name]
            model = [(m.name, m.count) for m in self._available(node)]
            lost = [n for n, _ in model if n not in {r for r, _ in queue.ready}]
            assert not lost, f"{name}: {lost} should be available there, and are not (lost?); it holds {queue.ready}"
            extra = [n for n, _ in queue.ready if n not in {m for m, _ in model}]
            assert not extra, f"{name}: {extra} should not be available there (yet); the model says {model}"
            assert list(queue.ready) == model, f"{name}: broker has {list(queue.ready)}, model {model}"
            out = sum(m.fate is Fate.OUT and m.node is node for m in self.msgs.values())
            assert queue.acquired == out, f"{name}: acquired {queue.acquired}, model {out}"
            staged = sum(m.fate is Fate.STAGED and m.node is node for m in self.msgs.values())
            assert queue.staged == staged, f"{name}: staged {queue.staged}, model {staged}"

    @invariant()
    def every_message_has_one_fate(self) -> None:
        """The model's own consistency: one fate each; an out message is on exactly one delivery."""
        carriers = Counter(id(d.msg) for d in self.deliveries.values())
        for msg in self.msgs.values():
            if msg.fate is Fate.OUT:
                assert msg.delivery is not None, msg
                assert not msg.delivery.over, msg
                assert carriers[id(msg)] == 1, msg
            else:
                assert carriers[id(msg)] == 0, msg
            assert (msg.fate is Fate.STAGED) == (msg.txn is not None and msg.txn.live), msg
            if msg.was_visible:
                assert msg.fate in (Fate.AVAILABLE, Fate.OUT, Fate.CONSUMED, Fate.GONE), msg

    @invariant()
    def clients_hold_what_the_model_says(self) -> None:
        for slot, conn in self.conns.items():
            held = {i: name for i, (_, name) in conn.peer.unsettled.items()}
            model = {
                d.id: d.msg.name
                for d in self.deliveries.values()
                if d.consumer.conn is conn and d.on_the_wire and d.complete
            }
            assert held == model, f"slot {slot}: client holds {held}, model {model}"

    @invariant()
    def transactions_are_the_model_s(self) -> None:
        if not self.conns:
            return
        open_ids = sorted(t.txn_id for t in self.view.transactions)
        assert open_ids == sorted(i for i, t in self.txns.items() if t.live), open_ids
        stats = self.view.txn_stats
        got = {"declared": stats.declared, "committed": stats.committed, "timed_out": stats.timed_out}
        assert got == {k: self.stats[k] for k in got}, (got, self.stats)

    @invariant()
    def no_idle_credit(self) -> None:
        """The broker sends while it may: a consumer with credit leaves nothing available on its node (unless
        R5 binds it to a timed-out id, or its session window is shut)."""
        for c in self.consumers:
            if c.credit and c.held_by_dead_id is None and c.conn.peer.window_room:
                left = [m.name for m in self._available(c.node)]
                assert not left, f"{c.name} has credit {c.credit}, yet {c.node.name} holds {left}"

    def teardown(self) -> None:
        if not self.conns:
            return
        for slot in list(self.conns):
            self._close(slot, graceful=True)
        assert self.view.transactions == []
        for name, queue in census(self.view).items():
            assert (queue.acquired, queue.staged) == (0, 0), f"{name}: {queue}"
        self._check_queues()
        lost = [m.name for m in self.msgs.values() if m.fate in (Fate.OUT, Fate.STAGED, Fate.SENDING)]
        assert not lost, lost


TransactionsModel.TestCase.settings = settings(
    max_examples=350,
    stateful_step_count=50,
    deadline=None,
    report_multiple_bugs=False,  # one bug at a time, shrunk quickly
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestTransactionsModel = TransactionsModel.TestCase
TestTransactionsModel.pytestmark = [pytest.mark.timeout(300)]  # passing takes seconds; shrinking a failure, longer


# -- the checks can fail --------------------------------------------------------------------------------------
def _check_all(machine: TransactionsModel) -> None:
    machine.queues_hold_what_the_model_says()
    machine.every_message_has_one_fate()
    machine.clients_hold_what_the_model_says()
    machine.transactions_are_the_model_s()
    machine.no_idle_credit()


def _commit_two_posts(machine: TransactionsModel) -> None:
    """Scripted: a transaction posts to q1 and q2, then commits."""
    machine.connect_all(slow=False, rejects=True)
    txn = machine.declare(0)
    assert txn is not None
    machine.post(0, "q1", "txn", settled=False, big=False, txn=txn)
    machine.post(0, "q2", "txn", settled=False, big=False, txn=txn)
    machine.discharge(0, txn.id, fail=False)
    _check_all(machine)
    machine.teardown()


def _release_and_redeliver(machine: TransactionsModel) -> None:
    """Scripted: a consumer with credit 3 gets a message, releases it, and gets it again."""
    machine.connect_all(slow=False, rejects=True)
    consumer = machine.attach_consumer(0, "q1", False, None, 3)
    assert consumer is not None
    machine.post(1, "q1", "plain", settled=False, big=False)
    (delivery,) = machine._open_deliveries()
    machine.dispose(delivery, Released(), settled=False)
    _check_all(machine)
    (again,) = machine._open_deliveries()
    assert again.msg is delivery.msg
    machine.teardown()


def test_r6_a_release_bounced_through_a_second_transaction_of_the_controller() -> None:
    """Scripted (the falsifying example hypothesis found, shrunk by hand): the controller of T1 and T2 discharges
    T1 while a post naming T1 is partial (R6). T1 rolls back first: m, which the client settled under T1, gets
    the default outcome (released) and goes back to q2, where a consumer acquiring under T2 takes it; then the
    controller's detach rolls T2 back, which releases that delivery. Both happen in one step: the model must
    expect the broker's ``released`` for the bounced delivery in that step, not in the next one."""
    machine = TransactionsModel()
    machine.connect_all(slow=False, rejects=True)
    t1 = machine.declare(0)
    assert t1 is not None
    machine.start_post(0, "q1", "first", t1, settled=False)
    consumer = machine.attach_consumer(0, "q2", False, None, 1)
    assert consumer is not None
    machine.post(1, "q2", "plain", settled=False, big=False)
    (delivery,) = machine._open_deliveries()
    machine.dispose(delivery, TransactionalState(txn_id=t1.id, outcome=Accepted()), settled=True)
    t2 = machine.declare(0)
    assert t2 is not None
    machine.flow(consumer, 1, "txn", txn=t2)
    machine.discharge(0, t1.id, fail=False)  # R6: T1 rolls back, the controller is detached, T2 rolls back
    _check_all(machine)
    assert [m.name for m in machine._available(consumer.node)] == [delivery.msg.name]
    machine.teardown()


@pytest.mark.parametrize("then", ["window opens", "consumer detaches", "connection closes"])
def test_r4_timed_out_discharge_detach_waits_for_the_abort(then: str) -> None:
    """Scripted (the falsifying example of model-failure2, by hand): a controller without ``rejected`` on a slow
    connection; a big delivery acquired under T is partly sent when T times out, its abort held back by the
    closed window. discharge(T, fail=false) is answered by detaching the controller with
    amqp:transaction:timeout, and that answer waits for the abort (§4.4.3, README "Acquiring"): the controller
    stays attached meanwhile (a second transaction declared on it stays open), and its detach, rolling the second
    one back, goes out when the window lets the abort out, or when the consumer's link goes (no abort then);
    never when the connection closes first."""
    machine = TransactionsModel()
    machine.connect_all(slow=True, rejects=False)
    conn = machine.conns[1]
    consumer = machine.attach_consumer(1, "q1", False, None, 0)
    assert consumer is not None
    machine.post_plain_to(consumer.node, big=True)
    t1 = machine.declare(1)
    assert t1 is not None
    machine.flow(consumer, 1, "txn", txn=t1)
    (delivery,) = machine.sent.values()
    assert not delivery.complete, "the window must hold the rest of the delivery back"
    machine.time_passes(TXN_TIMEOUT + 1)
    t2 = machine.declare(1)
    assert t2 is not None
    machine.post(1, "q2", "txn", settled=False, big=False, txn=t2)
    controller = conn.controller
    machine.discharge(1, t1.id, fail=False)  # no detach yet: the abort is held back
    assert conn.controller == controller
    assert t2.live
    _check_all(machine)
    if then == "window opens":
        conn.peer.open_window(6)
        machine._step()  # the abort, then the detach; T2 rolls back
    elif then == "consumer detaches":
        machine.detach_consumer(consumer)
    else:
        machine._close(1, graceful=True)
        machine._connect(1, slow=True, rejects=False)
    assert not t2.live
    assert conn.controller != controller or then == "connection closes"
    _check_all(machine)
    machine.teardown()


def test_the_scripted_runs_pass_on_the_broker_as_it_is() -> None:
    _commit_two_posts(TransactionsModel())
    _release_and_redeliver(TransactionsModel())


def test_checker_sees_a_partial_commit() -> None:
    """Between the engine and the core, a transactional post is lost (its client still gets the provisional
    accepted): the commit applies half of the transaction. The model must say a committed message is lost."""
    machine = TransactionsModel()
    machine.world.event_filter = lose_second_transactional_post()
    with pytest.raises(AssertionError, match=r"q2: \['m\d+'\] should be available there, and are not"):
        _commit_two_posts(machine)


def test_checker_sees_a_message_delivered_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine sends a released message twice when it is redelivered: the model must report it."""
    monkeypatch.setattr(ServerConnection, "deliver", deliver_redeliveries_twice(ServerConnection.deliver))
    with pytest.raises(AssertionError, match="out on two live deliveries at once"):
        _release_and_redeliver(TransactionsModel())
