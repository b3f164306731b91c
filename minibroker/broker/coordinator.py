"""The transaction coordinator (Part 4, DESIGN §4): declare, discharge, staging, commit, rollback, time-outs.

Theory of operation
-------------------
The coordinator is the one owner of every relation between transactions and the rest of the broker: which
transactions are open (by id, by connection, by controller link), which transaction holds each delivery
(acquired under it, §4.4.3, or carrying an outcome staged in it, §4.4.2), which transaction each consumer
link acquires under, and which links stopped acquiring because their transaction timed out. Nothing else
keeps a pointer to a transaction, so nothing can drift out of step with it.

A delivery's fate is decided in exactly one place. If a transaction holds it, that transaction's discharge
decides; otherwise the consumer's own disposition does (``Dispatcher.apply_outcome``). Every disposition
from a consumer comes through ``disposition`` here first, which is how that rule is kept.

``_commit`` first checks that every staged post can still be applied (its node still exists and has room),
then applies all staged work in one synchronous call, so no consumer, browser or depth reading can observe
part of it; if anything cannot be applied, nothing is, and the commit fails with amqp:transaction:rollback
(§4.4.1: "If the resource can no longer apply the outcome that it originally indicated would be the result
of a successful discharge then it MUST NOT allow the successful discharge"). ``_rollback`` undoes the
staged work. A transaction ends when it is discharged, when its controller link detaches or its connection
drops (rolled back), or when it is older than ``transaction_timeout`` (rolled back; its id is remembered
until discharged, and the links that acquired under it stop until told otherwise). A check-back transaction
whose connection is lost is held in doubt instead, its work kept, until it is resolved (``checkback.py`` says
when and how; this module applies it: ``_hold``, ``_adopt``, ``resolve``).

What is deliberately not here: routing and consumer order (``dispatch.py``), and which link a frame came on
(``endpoints.py``).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Collection, Iterable, Iterator
from functools import partial
from typing import Any

from minibroker.amqp.definitions import (
    Accepted,
    Declare,
    Declared,
    Discharge,
    Error,
    Rejected,
    Released,
    TransactionalState,
)
from minibroker.amqp.errors import Condition, error
from minibroker.amqp.states import Outcome, as_delivery_state, is_outcome
from minibroker.amqp.types import DecodeError, Symbol
from minibroker.broker.checkback import (
    COMMITTED,
    IN_DOUBT,
    ROLLED_BACK,
    CheckBack,
    CheckLink,
    CheckRequest,
    Doubt,
    Key,
    request_of,
)
from minibroker.broker.clock import BrokerClock
from minibroker.broker.dispatch import ACCEPTED, Dispatcher, servicebus_entity
from minibroker.broker.exchanges import Route
from minibroker.broker.faults import COORDINATOR_ADDRESS
from minibroker.broker.injection import Injection
from minibroker.broker.links import RELEASED, Consumer, Controller, Dispatched
from minibroker.broker.message import Message
from minibroker.broker.namespace import TOPIC, Namespace, Node
from minibroker.broker.nodes import Nodes
from minibroker.broker.outbox import Outbox
from minibroker.broker.personality import MINIBROKER, Personality, wire_error
from minibroker.broker.policy import DROP_HEAD
from minibroker.broker.queue import Queue
from minibroker.broker.recorder import Recorder, journal_full_error
from minibroker.broker.settings import BrokerSettings
from minibroker.broker.transactions import (
    MAX_TXN_ID,
    Deferred,
    Post,
    Transaction,
    TransactionCounters,
    TransactionInfo,
    control_body,
    info,
)
from minibroker.engine.connection import ServerConnection
from minibroker.engine.endpoints import IncomingDelivery, LinkState, OutgoingDelivery
from minibroker.engine.events import DeliveryUpdated, TransferReceived
from minibroker.servicebus import messages as sb_messages
from minibroker.servicebus import via as sb_via
from minibroker.servicebus.entities import key as entity_key

_ATTACHED = LinkState.ATTACHED  # globals: ~10x cheaper than enum lookups (issue 19)

CONTROLLER_CREDIT = MINIBROKER.controller_credit
Contain = Callable[[str, Callable[[], None]], bool]
"""Runs a step on its own: an error in it is logged and goes no further (``core.contain``)."""
TXN_ID = Symbol("txn-id")


def named_transactions(delivery: IncomingDelivery) -> list[Any]:
    """The txn-ids the frames of an incoming delivery named (in order, each once)."""
    state = delivery.state
    if not delivery.earlier_states:  # the common case: one state for the whole delivery
        return [state.txn_id] if isinstance(state, TransactionalState) else []
    named: list[Any] = []
    for earlier in [*delivery.earlier_states, state]:
        if isinstance(earlier, TransactionalState) and earlier.txn_id not in named:
            named.append(earlier.txn_id)
    return named


def transactional_work(delivery: IncomingDelivery) -> bool:
    """Whether a transfer is transactional work: frames that carry different states, none naming a transaction,
    are not (§4.4.1)."""
    return isinstance(delivery.state, TransactionalState) or (
        bool(delivery.earlier_states) and bool(named_transactions(delivery))
    )


class _Waiting:
    """A discharge's answer, and the aborted transfers it waits for."""

    __slots__ = ("answer", "answered", "held_back")

    def __init__(self, held_back: list[OutgoingDelivery], answer: Callable[[], None]) -> None:
        self.held_back = held_back
        self.answer = answer
        self.answered = False


class _Held:
    """The transactions of one connection: open ones, and timed-out ones not yet discharged."""

    __slots__ = ("declared", "open", "timed_out")

    def __init__(self) -> None:
        self.declared = 0
        """Transactions the connection declared so far (a personality's txn-ids may number them)."""
        self.open: dict[bytes, Transaction] = {}
        self.timed_out: dict[bytes, list[OutgoingDelivery]] = {}
        """Timed-out id -> its acquired deliveries whose aborted transfers were still held back at the time-out
        (the discharge of the id is answered after them, §4.4.3)."""


class Coordinator:
    """The transactions of one broker."""

    def __init__(
        self,
        settings: BrokerSettings,
        clock: BrokerClock,
        nodes: Nodes,
        dispatcher: Dispatcher,
        outbox: Outbox,
        recorder: Recorder,
        txn_ids: Iterator[bytes],
        new_deadline: Callable[[], None],
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.nodes = nodes
        self.dispatcher = dispatcher
        self.outbox = outbox
        self.recorder = recorder
        self.counters = TransactionCounters()
        self._txn_ids = txn_ids
        self._new_deadline = new_deadline
        self._open: dict[Transaction, None] = {}  # every open transaction, in the order declared
        self._deadlines: list[tuple[float, int, Transaction]] = []
        """A heap of (when, tie-break, transaction) time-outs; entries of ended or re-timed transactions are stale
        and skipped (``_due``)."""
        self._ties = itertools.count()
        self._shared: dict[Namespace, dict[bytes, Transaction]] = {}
        """The ids of transactions valid on every connection of their namespace (``txn_scope`` "namespace")."""
        self.close_connection: Callable[[ServerConnection, Error], None] = self._close
        """Closes a connection with an error (the core replaces it so that the close is handled at once)."""
        self.staged_bytes = 0
        """Bytes posted in every open transaction together (bounded by ``max_total_staged_bytes``)."""
        self._by_conn: dict[ServerConnection, _Held] = {}
        self._holder: dict[Dispatched, Transaction] = {}
        self._acquiring: dict[Consumer, Transaction] = {}
        self._stopped: dict[Consumer, bytes] = {}
        """Links bound to a transaction that ended without being discharged (timed out, or its controller went):
        they send nothing until told what comes next (§4.4.3; §4: further work on it "will lead to failure")."""
        self.check_back = CheckBack(settings.check_back, outbox)
        """In-doubt transactions, their checks, remembered outcomes and ``$txn-check`` links (``checkback.py``)."""
        self.waiting: dict[ServerConnection, list[_Waiting]] = {}
        """Answers to discharges that rolled back, sent once the aborted transfers are out, by the connection of
        those transfers (only a read of that connection can let them out: ``answer_waiting``; the core reads
        this map, never writes it, to call that only when something waits)."""
        dispatcher.acquirer = self
        self.injection = Injection()
        """Fault injection (set by the core): points ``declare``, ``discharge`` and ``post``."""

    # -- the Acquirer seam of the dispatcher (§4.4.3) ---------------------------------------------------
    def transfer_state(self, consumer: Consumer) -> TransactionalState | None:
        txn = self._acquiring.get(consumer)
        return txn.state if txn is not None else None

    def holds(self, dispatched: Dispatched) -> bool:
        """Whether a transaction holds ``dispatched`` (acquired under it, or its outcome staged in it)."""
        return dispatched in self._holder

    def acquired(self, dispatched: Dispatched) -> None:
        txn = self._acquiring[dispatched.consumer]
        txn.acquired[dispatched] = None
        self._holder[dispatched] = txn

    # -- the control link (§4.2, §4.3) ------------------------------------------------------------------
    def control(self, conn: ServerConnection, controller: Controller, event: TransferReceived) -> None:
        """A declare or discharge arrived on a coordinator link."""
        personality = controller.personality
        unsettled = _unsettled_of_session(controller) if personality.strict else 0
        # §4.4.1: the provisional outcomes of posts go out before any declare or discharge is answered
        if self.outbox.pending:  # (a declare usually finds none: no call, issue 19)
            self.outbox.flush(conn)
        self.replenish(conn, controller)
        delivery = event.delivery
        if delivery.settled:
            # §4.3: declare and discharge "MUST NOT be sent settled", the controller needs their outcome;
            # a coordinator receiving one settled detaches
            text = f"{_strict(personality, '§4.3')}declare and discharge must not be sent settled"
            self._detach(controller, error(Condition.NOT_ALLOWED, text))
            return
        if transactional_work(delivery):
            # §4 intro: "No transactional work is allowed on the control link"
            err = error(Condition.NOT_ALLOWED, "a declare or discharge cannot itself be transactional work")
            self._control_error(conn, controller, delivery, err)
            return
        try:
            body = control_body(event.payload)
        except DecodeError as exc:
            self._control_error(conn, controller, delivery, error(Condition.DECODE_ERROR, str(exc)))
            return
        if self.injection.rules and self._control_fault(conn, controller, delivery, body):
            return
        self._control_body(conn, controller, delivery, body, unsettled)

    def _control_body(
        self, conn: ServerConnection, controller: Controller, delivery: IncomingDelivery, body: Any, unsettled: int
    ) -> None:
        """Answer a decoded declare or discharge."""
        if isinstance(body, Declare) and unsettled:
            # Qpid Proton's rule (cpp/src/session.cpp, session::transaction_declare), which its tx_tester expects
            err = error(
                Condition.ILLEGAL_STATE,
                f"strict (Qpid Proton's transaction rules): declared while this session had {unsettled} unsettled "
                "transfer(s) of its own; settle them first",
            )
            self._control_error(conn, controller, delivery, err)
        elif isinstance(body, Declare):
            self._declare(conn, controller, delivery, body)
        elif isinstance(body, Discharge):
            self._discharge(conn, controller, delivery, body)
        else:
            err = error(Condition.DECODE_ERROR, "a coordinator message must carry declare or discharge")
            self._control_error(conn, controller, delivery, err)

    def _control_fault(
        self, conn: ServerConnection, controller: Controller, delivery: IncomingDelivery, body: Any
    ) -> bool:
        """Fault points ``declare`` and ``discharge``; whether a rule fired and took the control message."""
        point = "declare" if isinstance(body, Declare) else "discharge" if isinstance(body, Discharge) else None
        rule = self.injection.fire(point, conn, COORDINATOR_ADDRESS) if point is not None else None
        if rule is None:
            return False
        action = rule.action
        if action == "delay":
            # handled (declared, committed) only once the delay is over, as by a slow broker
            self.injection.later(rule.delay, partial(self._late_control, conn, controller, delivery, body))
        elif action == "drop-connection":
            self.injection.drop(conn)  # before anything is applied: the transaction rolls back with the connection
        elif action == "lose-outcome":
            self._discharge(conn, controller, delivery, body)  # applied (committed) ...
            self.injection.drop(conn)  # ... and its answer never sent: the controller cannot know
        elif action == "detach":
            self._detach(controller, rule.error())  # its transactions roll back when the detach is handled
        else:  # reject; a discharge's transaction is rolled back, as the rejection says
            txn = self._live(conn, body.txn_id) if isinstance(body, Discharge) else None
            if txn is not None:
                self._rollback_all([txn])
            err = rule.error()
            self._after(
                _held_back(txn) if txn is not None else [], lambda: self._control_error(conn, controller, delivery, err)
            )
        return True

    def _late_control(
        self, conn: ServerConnection, controller: Controller, delivery: IncomingDelivery, body: Any
    ) -> None:
        """A declare or discharge a ``delay`` fault held back, answered now (unless its link went meanwhile)."""
        if controller.link.state is _ATTACHED and not conn.finished:
            self._control_body(conn, controller, delivery, body, 0)

    def _post_fault(self, conn: ServerConnection, txn: Transaction, target: Any, message: Message) -> Error | None:
        """Fault point ``post`` (a transactional transfer, matched on its node or ``to``): ``reject`` gives the error
        the post is refused with (a rejected provisional outcome, and the commit fails); ``rollback-only`` takes the
        post, but the commit will fail with amqp:transaction:rollback."""
        address = target.name if target is not None else message.to
        rule = self.injection.fire("post", conn, address if isinstance(address, str) else None)
        if rule is None:
            return None
        if rule.action == "reject":
            return rule.error()
        if txn.failed is None:
            txn.failed = error(
                Condition.TRANSACTION_ROLLBACK, rule.spec.description or f"marked rollback-only by fault rule {rule.id}"
            )
        return None

    def replenish(self, conn: ServerConnection, controller: Controller, *, answered: bool = False) -> None:
        """Keep the controller's credit topped up, so declares and discharges can be pipelined; or, for a
        personality that keeps a window, give one back per answer (``answered``) up to its credit."""
        link = controller.link
        personality = controller.personality
        credit = personality.controller_credit
        if personality.controller_window:
            if answered and link.credit < credit:
                conn.grant_credit(link, link.credit + 1)
                self.outbox.touch(conn)
        elif link.credit < credit // 2:
            conn.grant_credit(link, credit)
            self.outbox.touch(conn)

    def _reply(self, conn: ServerConnection, controller: Controller, delivery: IncomingDelivery, state: Any) -> None:
        """Answer a declare or discharge."""
        self.outbox.answer_now(conn, delivery, state)
        if controller.personality.controller_window and controller.link.state is _ATTACHED:
            self.replenish(conn, controller, answered=True)

    def controller_gone(self, controller: Controller) -> None:
        """§4 intro: a control link that closes rolls back the transactions it created (unless the personality
        leaves that to the end of the connection, or the connection is ending and ``connection_closed`` holds them
        in doubt: ``checkback.py``)."""
        if not controller.personality.controller_detach_rolls_back:
            return
        held = self._by_conn.get(controller.conn)
        if held is not None:  # O(transactions of its connection)
            # a connection that is ending takes its links with it: ``connection_closed`` holds check-back ones
            closing = controller.check_back and controller.conn.closing
            gone = [t for t in held.open.values() if t.controller is controller and not (closing and self._holds(t))]
            self._rollback_all(gone, stop=True)

    def _declare(
        self, conn: ServerConnection, controller: Controller, delivery: IncomingDelivery, body: Declare
    ) -> None:
        personality = controller.personality
        if body.global_id is not None and personality.global_id == "refuse":
            err = error(Condition.NOT_IMPLEMENTED, "distributed transactions (global-id) are not supported")
            self._control_error(conn, controller, delivery, err)
            return
        held = self._by_conn.get(conn)
        if held is None:
            held = self._by_conn[conn] = _Held()
        limit = self.settings.max_transactions_per_connection
        if len(held.open) + len(held.timed_out) >= limit:
            counts = f"{len(held.open)} open, {len(held.timed_out)} timed out and not yet discharged"
            err = error(Condition.RESOURCE_LIMIT_EXCEEDED, f"at most {limit} transactions per connection ({counts})")
            self._control_error(conn, controller, delivery, err)
            return
        held.declared += 1
        make = personality.txn_id
        if make is None:
            txn_id = next(self._txn_ids)
            assert len(txn_id) <= MAX_TXN_ID, "txn-id generator gave an id longer than 32 bytes"
        else:
            txn_id = make(held.declared, conn.conn_id, {*held.open, *held.timed_out})
        assert txn_id not in held.open, "txn-id generator repeated an id"
        txn = Transaction(txn_id, conn, controller, self.clock.now)
        self._open[txn] = None
        held.open[txn_id] = txn
        if personality.txn_scope == "namespace":
            self._shared.setdefault(self.nodes.namespace_of(conn), {})[txn_id] = txn
        self.counters.declared += 1
        if personality.timeout_from == "declare":
            self._time(txn)
        self._reply(conn, controller, delivery, Declared(txn_id=txn_id))

    def _discharge(
        self, conn: ServerConnection, controller: Controller, delivery: IncomingDelivery, body: Discharge
    ) -> None:
        personality = controller.personality
        txn = self._live(conn, body.txn_id)
        if txn is None and self.check_back:
            txn = self._adopt(conn, controller, body.txn_id)
        if txn is None:
            held_back = self._forget_timed_out(conn, body.txn_id)
            if held_back is not None and body.fail:
                # §4.3: "the coordinator MUST always be able to complete a discharge where the fail flag is set
                # to true": the rollback the controller asks for happened at the time-out
                self._after(held_back, lambda: self._reply(conn, controller, delivery, ACCEPTED))
                return
            err = (
                self._timeout_error(personality)
                if held_back is not None
                else self._unknown_id_error(body.txn_id, personality, discharge=True)
            )
            self._after(held_back or [], lambda: self._control_error(conn, controller, delivery, err))
            return
        if body.fail:
            self._rollback_all([txn])
            self._after(_held_back(txn), lambda: self._reply(conn, controller, delivery, ACCEPTED))
            return
        if personality.timeout_mode == "lazy" and txn.deadline is not None and self.clock.now >= txn.deadline:
            # a lazy time-out: the commit is the first to notice it
            self.counters.timed_out += 1
            self._rollback_all([txn])
            err = self._timeout_error(personality)
            self._after(_held_back(txn), lambda: self._control_error(conn, controller, delivery, err))
            return
        if txn.delayed or (
            conn.has_incomplete_transfers
            and any(txn.id in named_transactions(partial) for partial in conn.incomplete_transfers())
        ):
            # §4.4.1: "It is an error for the controller to attempt to discharge a transaction against which a
            # partial delivery has been posted. Should this happen, the control link MUST be terminated with
            # the transaction-rollback error." A post a ``delay`` fault holds back is not complete either.
            self._rollback_all([txn], stop=True)
            err = error(Condition.TRANSACTION_ROLLBACK, "discharged while a transfer posted in it was incomplete")
            self._detach(controller, err)
            return
        failure, work = self._try_commit(txn)
        if failure is not None:
            err = _commit_failure(personality, failure, refused_post=failure is txn.failed)
            self._after(_held_back(txn), lambda: self._control_error(conn, controller, delivery, err))
            return
        if self.recorder.durable:
            # one journal record for all the durable work; ``accepted`` once it is on disk
            self.recorder.record_then(work, lambda: self._reply(conn, controller, delivery, ACCEPTED))
        else:
            self._reply(conn, controller, delivery, ACCEPTED)  # nothing waits for a disk: no closure (issue 19)

    def _try_commit(self, txn: Transaction) -> tuple[Error | None, list[Any]]:
        """Commit ``txn``: None and its journal work (to record before answering), or why it could not be applied
        (then it is rolled back, §4.4.4)."""
        if self.recorder.durable:
            with self.recorder.collecting() as work:
                failure = txn.failed or self._journal_refusal(txn) or self._commit(txn)
        else:
            work = []
            failure = txn.failed or self._commit(txn)
        if failure is not None:
            if txn in self._open:
                self._rollback_all([txn])
            self.counters.failed_commits += 1
        return failure, work

    def _journal_refusal(self, txn: Transaction) -> Error | None:
        """While the journal cannot write (disk full), a commit with durable work fails; so does one whose record
        would be larger than the journal takes (its messages, and the copies its outcomes may forward to a
        dead-letter or expiry address). Checked before anything is applied."""
        size = sum(post.message.size for post in txn.posts if post.message.durable)
        durable = size > 0 or any(post.message.durable for post in txn.posts)
        for dispatched in txn.held() if txn.acquired or txn.outcomes else ():
            if not dispatched.message.durable_id:
                continue
            durable = True
            outcome = txn.outcomes.get(dispatched)
            if outcome is None and not dispatched.consumer.presettled:
                outcome = dispatched.consumer.default_outcome
            if outcome is not None and not isinstance(outcome, Accepted):
                size += dispatched.message.size  # may be forwarded: a copy in the record
        if not durable:
            return None
        if not self.recorder.accepting:
            return journal_full_error()
        return self.recorder.too_large(size)

    def _after(self, held_back: list[OutgoingDelivery], answer: Callable[[], None]) -> None:
        """Answer a discharge that rolled back now, or once the aborted transfers of its acquired deliveries have
        left (§4.4.3: abort the remainder of a partly sent message "before completing the discharge"): the
        consumer's session window may hold them back."""
        pending = [d for d in held_back if not d.complete]
        if not pending:
            answer()
            return
        entry = _Waiting(pending, answer)
        for conn in {d.link.context.conn for d in pending}:
            self.waiting.setdefault(conn, []).append(entry)

    def answer_waiting(self, conn: ServerConnection) -> None:
        """Send the answers that waited for aborted transfers of ``conn`` once they have gone out (or never will:
        their link is gone)."""
        entries = self.waiting.pop(conn, None)
        if entries is None:
            return
        still = []
        for entry in entries:
            if entry.answered:
                continue
            if all(d.complete for d in entry.held_back):
                entry.answered = True
                entry.answer()
            else:
                still.append(entry)
        if still:
            self.waiting[conn] = still

    def _control_error(
        self, conn: ServerConnection, controller: Controller, delivery: IncomingDelivery, err: Error
    ) -> None:
        """§4.3: report a declare/discharge error as rejected, or by detaching the coordinator link."""
        if controller.rejects_errors:
            self._reply(conn, controller, delivery, Rejected(error=err))
        else:
            self._detach(controller, err)

    def _detach(self, controller: Controller, err: Error) -> None:
        """Detach a coordinator link (its open transactions roll back when the engine reports the detach)."""
        controller.conn.detach(controller.link, err)
        self.outbox.touch(controller.conn)

    def _close(self, conn: ServerConnection, err: Error) -> None:
        conn.close(err)
        self.outbox.touch(conn)

    # -- ids ------------------------------------------------------------------------------------------
    def _live(self, conn: ServerConnection, txn_id: Any) -> Transaction | None:
        """The open transaction ``txn_id`` of ``conn`` (another connection's id is unknown here, unless the
        personality shares ids across the namespace)."""
        if not isinstance(txn_id, bytes):
            return None
        held = self._by_conn.get(conn)
        txn = held.open.get(txn_id) if held is not None else None
        if txn is None and self._shared:
            shared = self._shared.get(self.nodes.namespace_of(conn))
            txn = shared.get(txn_id) if shared is not None else None
        return txn

    def _timed_out(self, conn: ServerConnection, txn_id: Any) -> bool:
        held = self._by_conn.get(conn)
        return held is not None and isinstance(txn_id, bytes) and txn_id in held.timed_out

    def unknown_error(self, conn: ServerConnection, txn_id: Any) -> Error:
        """What a use of a txn-id that names no open transaction of ``conn`` is answered with."""
        personality = self.nodes.personality_of(conn)
        if self._timed_out(conn, txn_id):
            return self._timeout_error(personality)
        return self._unknown_id_error(txn_id, personality)

    @staticmethod
    def _timeout_error(personality: Personality) -> Error:
        return error(Condition.TRANSACTION_TIMEOUT, personality.timeout_text)

    @staticmethod
    def _unknown_id_error(txn_id: Any, personality: Personality, *, discharge: bool = False) -> Error:
        if personality.strict and isinstance(txn_id, bytes) and len(txn_id) > MAX_TXN_ID:
            text = f"strict (AMQP 1.0 part 4 §4.5.4): a txn-id is at most 32 octets; this one has {len(txn_id)}"
            return error(Condition.INVALID_FIELD, text)
        if discharge and personality.unknown_discharge is not None:
            return wire_error(*personality.unknown_discharge, txn_id=txn_id)
        shown = txn_id.hex() if isinstance(txn_id, bytes) else repr(txn_id)
        return error(Condition.UNKNOWN_TXN_ID, f"unknown transaction id {shown}")

    def _unknown_closes(self, conn: ServerConnection, txn_id: Any, prefix: str = "") -> bool:
        """Close ``conn`` when its personality answers a use of an unknown txn-id so; whether it did."""
        closes = self.nodes.personality_of(conn).unknown_txn_closes
        if closes is None or self._timed_out(conn, txn_id):
            return False
        condition, description = closes
        self.close_connection(conn, wire_error(condition, prefix + description, txn_id=txn_id))
        return True

    def _forget_timed_out(self, conn: ServerConnection, txn_id: Any) -> list[OutgoingDelivery] | None:
        """The controller discharged a timed-out id: forget it, and let the links stopped on it go on (§4.4.3:
        "When a transaction is discharged, the txn-id of any link endpoints will be cleared"). Returns the
        deliveries whose aborts the answer waits for, or None when the id did not time out."""
        if not self._timed_out(conn, txn_id):
            return None
        held_back = self._by_conn[conn].timed_out.pop(txn_id)
        for consumer in [c for c, dead in self._stopped.items() if dead == txn_id and c.conn is conn]:
            del self._stopped[consumer]
            self.dispatcher.restart(consumer)
        return held_back

    # -- posting (§4.4.1) -------------------------------------------------------------------------------
    def post(
        self,
        conn: ServerConnection,
        delivery: IncomingDelivery,
        target: Node | Route | Deferred | None,
        message: Message,
        refusal: Error | None = None,
        entity: str | None = None,
    ) -> None:
        """Stage a transactional post and answer with its provisional outcome (``target`` None: unroutable;
        ``refusal``: the post is refused, e.g. not permitted, and so is the commit; ``entity``: the Service Bus
        entity the post is work on, for ``Personality.one_entity``)."""
        state = delivery.state
        if not delivery.earlier_states and isinstance(state, TransactionalState):
            txn_id = state.txn_id  # one frame, one state: the usual post reads it directly (issue 19)
        else:
            named = named_transactions(delivery)
            if len(named) > 1:
                # §4.4.1: "all frames MUST be explicitly associated with the same transaction"
                mixed = error(Condition.TRANSACTION_ROLLBACK, "the frames of one transfer named different transactions")
                self.outbox.answer_now(conn, delivery, Rejected(error=mixed))
                self._conflict([t for i in named if (t := self._live(conn, i)) is not None], mixed)
                return
            txn_id = named[0]
        txn = self._live(conn, txn_id)
        if txn is None:
            detaches = self.nodes.personality_of(conn).unknown_txn_detaches
            if self._unknown_closes(conn, txn_id):
                pass
            elif detaches is not None and not self._timed_out(conn, txn_id):
                conn.detach(delivery.link, wire_error(*detaches, txn_id=txn_id))
                self.outbox.touch(conn)
            else:
                self.outbox.answer_now(conn, delivery, Rejected(error=self.unknown_error(conn, txn_id)))
            return
        personality = txn.controller.personality
        if txn.deadline is None and personality.timeout_from == "first-operation":
            self._time(txn)
        if refusal is None and entity is not None and personality.one_entity:
            refusal = _one_entity(txn, entity)
        if refusal is None and self.injection.rules:
            refusal = self._post_fault(conn, txn, target, message)
        err: Error | None
        if refusal is not None:
            err = refusal
        elif target is None:
            err = error(Condition.NOT_FOUND, f"no node at address {message.to!r}")
        elif isinstance(target, Deferred):
            # created by the commit, which checks its limits; a new queue journals durable messages
            err = journal_full_error() if message.durable and not self.recorder.accepting else None
        else:
            err = self.dispatcher.admit(target, message, conn)
            if err is None and self.recorder.durable:  # (only a journal refuses: no call without one, issue 19)
                err = self.dispatcher.journal_refusal(target, message, conn)
        size = message.size  # (read once: a post is per message, issue 19)
        limit = self.settings.max_staged_bytes
        if err is None and txn.staged_bytes + size > limit:
            err = error(Condition.RESOURCE_LIMIT_EXCEEDED, f"a transaction may post at most {limit} bytes")
        total = self.settings.max_total_staged_bytes
        if err is None and total and self.staged_bytes + size > total:
            err = error(
                Condition.RESOURCE_LIMIT_EXCEEDED,
                f"open transactions may post at most {total} bytes together on this broker",
            )
        if err is not None or target is None:
            # it cannot take the message: a rejected provisional outcome, and the commit will fail
            txn.failed = txn.failed or err
            rejected = Rejected(error=err)
            wrapped = personality.post_refusal_wrapped
            self.outbox.answer_now(
                conn, delivery, TransactionalState(txn_id=txn.id, outcome=rejected) if wrapped else rejected
            )
            return
        txn.posts.append(Post(target, message))
        txn.staged_bytes += size
        self.staged_bytes += size
        if not isinstance(target, Deferred):
            target.staged += 1
        provisional = personality.provisional
        if provisional == "transactional":
            self.outbox.answer(conn, delivery, txn.accepted_state)
        else:
            state = txn.accepted_state if provisional == "settled" else ACCEPTED
            self.outbox.answer(conn, delivery, state, settle=True)

    # -- acquiring (§4.4.3) and retiring (§4.4.2) --------------------------------------------------------
    def flow(self, conn: ServerConnection, consumer: Consumer, properties: dict[Any, Any]) -> Error | None:
        """A flow with properties on a consumer link: ``txn-id`` makes what the link sends from now on acquired
        under that transaction; properties without it end transactional acquisition. Returns the error to
        detach the link with when the id names no open transaction."""
        was_stopped = self._unbind(consumer)
        txn_id = properties.get(TXN_ID)
        err = None
        if txn_id is not None and consumer.browser:
            # §4.4.3: "If the link endpoint does not support transactional acquisition, the link MUST be
            # terminated with a not-implemented error": a browser acquires nothing
            err = error(Condition.NOT_IMPLEMENTED, "a browsing link (distribution-mode copy) acquires nothing")
        elif txn_id is not None and (acquisition := self.nodes.personality_of(conn).transactional_acquisition) != "yes":
            # §4.4.3: "If the link endpoint does not support transactional acquisition, the link MUST be
            # terminated with a not-implemented error" (or, as some brokers do, the txn-id is ignored)
            if acquisition == "refuse":
                err = error(Condition.NOT_IMPLEMENTED, "transactional acquisition is not supported")
        elif txn_id is not None:
            txn = self._live(conn, txn_id)
            if txn is None:
                err = self.unknown_error(conn, txn_id)
            else:
                if txn.deadline is None and txn.controller.personality.timeout_from == "first-operation":
                    self._time(txn)
                self._acquiring[consumer] = txn
                txn.consumers[consumer] = None
                if txn.state is None:
                    txn.state = TransactionalState(txn_id=txn.id)
        if was_stopped and err is None:
            self.dispatcher.restart(consumer)
        return err

    def _unbind(self, consumer: Consumer) -> bool:
        """End the link's transactional acquisition; True if it was stopped on a transaction that ended."""
        txn = self._acquiring.pop(consumer, None)
        if txn is not None:
            txn.consumers.pop(consumer, None)
        return self._stopped.pop(consumer, None) is not None

    def _stop(self, consumers: list[Consumer], txn_id: bytes) -> None:
        """Links acquiring under a transaction that ended without a discharge send nothing more (not even
        outside a transaction) until a flow, or the discharge of a timed-out id, says what comes next."""
        for consumer in consumers:
            if consumer.attached:
                self._stopped[consumer] = txn_id
                self.dispatcher.stop(consumer)

    def hold_post(self, conn: ServerConnection, delivery: IncomingDelivery, change: int) -> None:
        """A transactional transfer a ``delay`` fault holds back (``change`` 1), or takes now (-1): until it is taken,
        the transactions it names count it as an incomplete post (a commit of one fails, as §4.4.1 says)."""
        for txn_id in named_transactions(delivery):
            txn = self._live(conn, txn_id)
            if txn is not None:
                txn.delayed = max(0, txn.delayed + change)

    def discarded(self, conn: ServerConnection, states: list[object]) -> None:
        """A transfer was discarded before it was whole (not aborted by its sender): a transaction it was
        posted in cannot commit (§4.4.4: "Should the resource be unable to process the delivery it MUST NOT
        allow the successful discharge of the associated transaction")."""
        for state in states:
            txn = self._live(conn, state.txn_id) if isinstance(state, TransactionalState) else None
            if txn is not None and txn.failed is None:
                txn.failed = error(Condition.TRANSACTION_ROLLBACK, "a transfer posted in it was discarded")

    def consumer_gone(self, consumer: Consumer) -> None:
        """A consumer link detached: what a transaction holds waits for its discharge; the rest of its
        unsettled deliveries get the source's default outcome (§3.5.3)."""
        self._unbind(consumer)
        for dispatched in list(consumer.unsettled.values()):
            if dispatched not in self._holder:
                self.dispatcher.finish(dispatched, consumer.default_outcome)

    def disposition(self, conn: ServerConnection, event: DeliveryUpdated) -> None:
        """The peer's disposition of deliveries we sent (role=receiver)."""
        state, settled = event.state, event.settled
        plain: list[Dispatched] = []
        browsed: list[OutgoingDelivery] = []
        lost: list[OutgoingDelivery] = []
        touched: set[Queue] = set()
        for delivery in event.deliveries:
            consumer = delivery.link.context
            if not isinstance(consumer, Consumer):
                continue
            if consumer.browser:  # a copy: its outcome changes nothing
                if delivery.open:
                    browsed.append(delivery)
                continue
            dispatched = consumer.unsettled.get(delivery)
            if dispatched is None:
                if consumer.servicebus and delivery.open and is_outcome(state):
                    lost.append(delivery)  # its peek-lock ran out (``Dispatcher._lock_expired``)
                continue
            holder = self._holder.get(dispatched)
            if isinstance(state, TransactionalState):
                self._retire(conn, dispatched, holder, state, settled, touched)
            elif holder is not None and dispatched in holder.acquired:
                if is_outcome(state) and dispatched not in holder.outcomes:
                    # a plain outcome for a delivery acquired under a transaction: staged in that transaction
                    holder.outcomes[dispatched] = state
                # else its transaction decides, and the engine keeps whether the client settled it
            elif holder is not None and not is_outcome(state):
                pass  # settled, or a non-terminal state, while an outcome waits in a transaction: it decides
            else:
                if holder is not None:
                    # acquired outside any transaction, with an outcome staged in one: the client's latest word, a
                    # plain outcome, takes it out of the transaction (as a later one moves it to another)
                    del holder.outcomes[dispatched]
                    del self._holder[dispatched]
                plain.append(dispatched)
        if browsed:  # (tested first: a transactional accept's disposition has none, issue 19)
            # a browsed copy is settled with the outcome it was given, never as work of a transaction
            given = state.outcome if isinstance(state, TransactionalState) else state
            self.outbox.settle(conn, browsed, as_delivery_state(given))
        if lost:
            # Service Bus answers the settlement of a message whose lock was lost with a rejected outcome naming
            # com.microsoft:message-lock-lost; azure-servicebus raises MessageLockLostError for it
            # (``_pyamqp/receiver.py`` ``check_disposition_outcome``, ``_transport/_pyamqp_transport.py``)
            self.outbox.settle(conn, lost, Rejected(error=sb_messages.lock_lost_error()))
        if plain:
            self.dispatcher.apply_outcome(conn, plain, state, settled)
        if touched:
            self.dispatcher.dispatch_all(touched)

    def _retire(
        self,
        conn: ServerConnection,
        dispatched: Dispatched,
        holder: Transaction | None,
        state: TransactionalState,
        settled: bool,
        touched: set[Queue],
    ) -> None:
        """§4.4.2: a disposition carrying transactional-state."""
        txn = self._live(conn, state.txn_id)
        consumer = dispatched.consumer
        if txn is None and self._unknown_closes(conn, state.txn_id, "Unrecoverable error: "):
            return
        if txn is None:
            if holder is None:
                # the outcome names no open transaction, so it cannot be applied: the message goes back to its
                # queue, and if the client left the delivery unsettled we settle it saying just that
                self.dispatcher.finish(dispatched, RELEASED)
                if dispatched.delivery.open:
                    self.outbox.settle(conn, [dispatched.delivery], RELEASED)
                touched.add(consumer.queue)
            return  # held: its own transaction decides
        personality = txn.controller.personality
        if personality.retire_accepted_only and not isinstance(state.outcome, Accepted):
            return  # ignored: no disposition, the delivery stays as it was
        if txn.deadline is None and personality.timeout_from == "first-operation":
            self._time(txn)
        if personality.one_entity and consumer.servicebus:
            refused = _one_entity(txn, sb_via.top_level_entity(servicebus_entity(consumer.queue)))
            if refused is not None:
                txn.failed = txn.failed or refused
                if holder is None:  # (else the transaction that holds its outcome decides)
                    # refused, so it cannot stay locked to a client that settled it: back to its queue at once
                    self.dispatcher.finish(dispatched, RELEASED)
                    touched.add(consumer.queue)
                    if dispatched.delivery.open:
                        self.outbox.settle(conn, [dispatched.delivery], Rejected(error=refused))
                return
        if holder is not None and holder is not txn:
            if dispatched in holder.acquired or (personality.strict and dispatched in holder.outcomes):
                # §4.4.2: "the delivery MUST NOT be associated with a different non discharged transaction than the
                # outcome. If this happens then the control link MUST be terminated with transaction-rollback"
                text = f"{_strict(personality, '§4.4.2')}a delivery and its outcome named two transactions"
                self._conflict([holder, txn], error(Condition.TRANSACTION_ROLLBACK, text))
                return
            if not is_outcome(state.outcome):
                return  # its outcome is staged in another transaction, which decides
            # a delivery acquired outside any transaction is associated with none (§4.4.2: "The delivery itself
            # need not be associated with the same transaction as the outcome, or indeed with any transaction at
            # all"): its outcome moves to the transaction the latest disposition names
            del holder.outcomes[dispatched]
        if is_outcome(state.outcome):
            txn.outcomes[dispatched] = state.outcome
            self._holder[dispatched] = txn
            delivery = dispatched.delivery
            if personality.retire_answered and not settled and delivery.open and delivery.complete:
                # (a delivery whose last frames the peer's window still holds back gets no disposition before them)
                conn.update([delivery], TransactionalState(txn_id=txn.id, outcome=ACCEPTED))
                self.outbox.touch(conn)
        elif settled and holder is None:
            # settled without an outcome, and no transaction holds it: the source's default outcome (§3.5.3)
            self.dispatcher.finish(dispatched, consumer.default_outcome)
            touched.add(consumer.queue)
        # otherwise a non-terminal state: nothing changes

    def _conflict(self, txns: list[Transaction], err: Error) -> None:
        """Roll back transactions that one piece of work named together, and detach their controllers."""
        live = list(dict.fromkeys(t for t in txns if t in self._open))
        self._rollback_all(live, stop=True)
        for txn in live:
            self._detach(txn.controller, err)

    # -- discharge --------------------------------------------------------------------------------------
    def _commit(self, txn: Transaction) -> Error | None:
        """Apply everything ``txn`` staged, in one step (no checkpoint: nobody sees half of it).

        Returns the reason when a staged post can no longer be applied; then nothing was applied.
        """
        err = self._check(txn)
        if err is not None:
            return err
        self._end(txn)
        touched: set[Queue] = set()
        for post in txn.posts:
            target = post.target
            node: Node | Route
            if isinstance(target, Deferred):
                namespace = target.namespace
                node = namespace.node(target.name) or self.nodes.create(namespace, target.name, target.kind, auto=True)
            else:
                node = target
                node.staged -= 1
            touched.update(self.dispatcher.post(node, post.message, txn.conn))
        if txn.acquired or txn.outcomes:  # (a commit of posts only builds no settlements, issue 19)
            self._retire_held(txn, touched)
        self.counters.committed += 1
        if txn.check_back:
            self.check_back.ended(txn, COMMITTED, self.clock.now, self._key(txn.conn))
        self.dispatcher.dispatch_all(touched)
        return None

    def _retire_held(self, txn: Transaction, touched: set[Queue]) -> None:
        """Apply the outcomes a committing ``txn`` holds, and finish what was acquired under it (§4.4.2, §4.4.3)."""
        settle: list[tuple[OutgoingDelivery, Outcome]] = []
        outcomes = txn.outcomes
        for dispatched in txn.held():
            consumer = dispatched.consumer
            delivery = dispatched.delivery
            outcome = outcomes.get(dispatched)
            if outcome is None:  # acquired under it, no outcome staged
                if consumer.presettled:
                    outcome = ACCEPTED  # sent settled: consumed by the commit
                elif not delivery.open:
                    outcome = consumer.default_outcome  # the client settled it without an outcome (§3.5.3)
                else:
                    continue  # stays acquired by its link, an ordinary unsettled delivery
            self.dispatcher.finish(dispatched, outcome)
            if delivery.open:
                settle.append((delivery, outcome))  # §4.4.2: the broker settles what it still holds unsettled
            touched.add(consumer.queue)
        _settle(self.outbox, settle)

    def _check(self, txn: Transaction) -> Error | None:
        """Why a staged post can no longer be applied (its node was deleted, or is full), or None."""
        if txn.entity is not None and txn.controller.personality.one_entity:
            # Service Bus: the transaction's work is in its entity (sends via it are transferred from it)
            entity = self.nodes.namespace_of(txn.conn).node(txn.entity)
            if entity is None or entity.deleted:
                return error(Condition.RESOURCE_DELETED, f"entity {txn.entity!r} was deleted")
        extra: dict[Any, tuple[int, int]] = {}  # what the posts before this one add, per queue
        created: set[tuple[int, str]] = set()  # the nodes this commit creates
        for post in txn.posts:
            target, message = post
            node: Node | Route | None
            if isinstance(target, Deferred):
                node = target.namespace.node(target.name)
                if node is None:
                    # created by the commit: check the limits an empty node of that name will have
                    key = (id(target.namespace), target.name)  # ``x`` and ``queue://x`` are one node
                    if key not in created:
                        refusal = self.nodes.refuse_new_node(len(created))
                        if refusal is not None:
                            return refusal
                        created.add(key)
                    configured, policy = self.settings.policy_for(target.name)
                    if (configured or target.kind) == TOPIC or policy.overflow == DROP_HEAD:
                        continue  # a new topic has no subscription yet
                    count, size = extra.get(key, (0, 0))
                    if not policy.admits(count, size, message.size):
                        return error(Condition.RESOURCE_LIMIT_EXCEEDED, f"node {target.name!r} is full")
                    extra[key] = (count + 1, size + message.size)
                    continue
            else:
                node = target
            if node.deleted:
                return error(Condition.RESOURCE_DELETED, f"node {node.name!r} was deleted")
            # (a plain queue's targets without the call, and no counting for a queue with no limit to reach: every
            # post of a commit passes here, issue 19)
            for queue in [node] if type(node) is Queue else self.dispatcher.targets(node, message, txn.conn):
                policy = queue.policy
                if policy.overflow == DROP_HEAD or not (policy.max_messages or policy.max_bytes):
                    continue
                count, size = extra.get(queue, (0, 0))
                if not queue.has_room(message, count, size):
                    return error(Condition.RESOURCE_LIMIT_EXCEEDED, f"node {queue.node_name!r} is full")
                extra[queue] = (count + 1, size + message.size)
        return None

    def _rollback_all(self, txns: Iterable[Transaction], *, stop: bool = False, contain: Contain | None = None) -> None:
        """Roll back several transactions, then dispatch: a message released by one is not handed to a
        consumer still acquiring under another that is about to roll back too. ``stop``: they end without a
        discharge, so the links acquiring under them stop. ``contain``: each rollback on its own (a timer's)."""
        touched: set[Queue] = set()
        for txn in txns:

            def roll_back(txn: Transaction = txn) -> None:
                acquiring = list(txn.consumers)
                touched.update(self._rollback(txn))
                if stop:
                    self._stop(acquiring, txn.id)

            if contain is None:
                roll_back()
            elif not contain(f"rolling back transaction {txn.id.hex()}", roll_back):
                self._forget(txn)
        if contain is None:
            self.dispatcher.dispatch_all(touched)
        else:
            contain("dispatching after rollbacks", lambda: self.dispatcher.dispatch_all(touched))

    def _forget(self, txn: Transaction) -> None:
        """Take a transaction whose rollback failed out of the registries all the same."""
        self._open.pop(txn, None)
        self._unregister(txn)
        self.staged_bytes -= txn.staged_bytes
        txn.staged_bytes = 0
        for dispatched in [d for d, t in self._holder.items() if t is txn]:
            del self._holder[dispatched]
        for consumer in [c for c, t in self._acquiring.items() if t is txn]:
            del self._acquiring[consumer]
        if txn.check_back:
            self.check_back.ended(txn, ROLLED_BACK, self.clock.now, self._key(txn.conn))

    def _rollback(self, txn: Transaction) -> set[Queue]:
        """Undo everything ``txn`` staged; return the queues it touched (the caller dispatches)."""
        self._end(txn)
        for post in txn.posts:
            if not isinstance(post.target, Deferred):
                post.target.staged -= 1
        touched: set[Queue] = set()
        settle: list[tuple[OutgoingDelivery, Outcome]] = []
        for dispatched in txn.held() if txn.acquired or txn.outcomes else ():
            consumer = dispatched.consumer
            delivery = dispatched.delivery
            if dispatched in txn.acquired:
                # §4.4.3 / DESIGN §4: acquired under a rolled-back transaction: back on its queue, delivery-count
                # unchanged. One not completely sent is aborted by ``finish``, never finished (§4.4.3: "the
                # resource MUST abort or complete the sending of the remainder of the message")
                self.dispatcher.finish(dispatched, RELEASED)
                if delivery.open:
                    settle.append((delivery, RELEASED))
            elif delivery.open:
                continue  # back to the state it had: acquired by its link, and the client may settle it again
            else:
                # the client settled it, or its link is gone: the source's default outcome (§3.5.3)
                self.dispatcher.finish(dispatched, consumer.default_outcome)
            touched.add(consumer.queue)
        _settle(self.outbox, settle)
        self.counters.rolled_back += 1
        if txn.check_back:
            self.check_back.ended(txn, ROLLED_BACK, self.clock.now, self._key(txn.conn))
        return touched

    def _end(self, txn: Transaction) -> list[Consumer]:
        """Take ``txn`` out of every registry; return the links that were acquiring under it (their txn-id is
        cleared, §4.4.3)."""
        del self._open[txn]
        self._unregister(txn)
        self.staged_bytes -= txn.staged_bytes
        txn.staged_bytes = 0
        if txn.acquired or txn.outcomes:
            holder = self._holder
            for work in (txn.acquired, txn.outcomes):
                for dispatched in work:
                    if holder.get(dispatched) is txn:
                        del holder[dispatched]
        if not txn.consumers:
            return []
        consumers = list(txn.consumers)
        for consumer in consumers:
            if self._acquiring.get(consumer) is txn:
                del self._acquiring[consumer]
        txn.consumers.clear()
        return consumers

    def _unregister(self, txn: Transaction) -> None:
        """Forget ``txn``'s id on its connection (and in its namespace)."""
        held = self._by_conn.get(txn.conn)
        if held is not None:
            held.open.pop(txn.id, None)
        if self._shared:
            namespace = self.nodes.namespace_of(txn.conn)
            shared = self._shared.get(namespace)
            if shared is not None and shared.get(txn.id) is txn:
                del shared[txn.id]
                if not shared:
                    del self._shared[namespace]

    # -- endings ------------------------------------------------------------------------------------------
    def connection_closed(self, conn: ServerConnection) -> None:
        """§4 intro / DESIGN §4: a connection that drops rolls back its open transactions."""
        held = self._by_conn.pop(conn, None)
        if held is not None:
            txns = list(held.open.values())
            kept = [t for t in txns if self._holds(t) and self._hold(t, conn)]
            self._rollback_all([t for t in txns if t not in kept])
        for consumer in [c for c in self._stopped if c.conn is conn]:
            del self._stopped[consumer]

    # -- in doubt (checkback.py) -----------------------------------------------------------------------------
    def _holds(self, txn: Transaction) -> bool:
        """Whether ``txn`` is held in doubt when its connection is lost: a check-back one that neither failed nor
        timed out (such a one rolls back as the specification says)."""
        return txn.check_back and txn.failed is None and (txn.deadline is None or txn.deadline > self.clock.now)

    def _key(self, conn: ServerConnection) -> Key:
        """The producer group of ``conn``: its namespace and container-id."""
        remote = conn.remote_open
        return self.nodes.namespace_of(conn).name, str(remote.container_id) if remote is not None else ""

    def _hold(self, txn: Transaction, conn: ServerConnection) -> bool:
        """Hold ``txn`` in doubt (its connection ``conn`` is being lost); False when it cannot be (its id is in
        doubt already, from another connection's transaction): then it rolls back."""
        namespace = self.nodes.namespace_of(conn)
        if not self.check_back.hold(txn, namespace, self._key(conn)[1], self.clock.now):
            return False
        self._unregister(txn)  # its id is no connection's any more
        txn.deadline = None  # its lifetime is the check schedule's now
        if txn.consumers:
            consumers = list(txn.consumers)
            for consumer in consumers:
                del self._acquiring[consumer]
            txn.consumers.clear()
            self._stop(consumers, txn.id)  # as after any transaction that ended without a discharge
        self.counters.in_doubt += 1
        self._new_deadline()
        return True

    def _adopt(self, conn: ServerConnection, controller: Controller, txn_id: Any) -> Transaction | None:
        """Resolution (a): ``conn``, of the same producer group, discharges an in-doubt id: the transaction becomes
        its own again, and the discharge goes on as for any open one."""
        if not isinstance(txn_id, bytes):
            return None
        namespace = self.nodes.namespace_of(conn)
        doubt = self.check_back.find(txn_id, namespace, self._key(conn)[1])
        if doubt is None:
            return None
        txn = doubt.txn
        self.check_back.release(doubt)
        txn.conn = conn
        txn.controller = controller
        held = self._by_conn.get(conn)
        if held is None:
            held = self._by_conn[conn] = _Held()
        held.open[txn.id] = txn
        return txn

    def resolve(self, txn_id: bytes, *, commit: bool, namespace: Namespace | None = None) -> tuple[str, Error | None]:
        """Resolution (b) and (c): commit or roll back the in-doubt transaction ``txn_id`` (of ``namespace`` when
        given). Its state afterwards (``committed`` or ``rolled-back``) and, for a commit that could not be
        applied (rolled back instead, §4.4.4), why. ``LookupError`` when no such transaction is in doubt."""
        doubt = self.check_back.find(txn_id, namespace)
        if doubt is None:
            raise LookupError(f"no transaction {txn_id.hex()} is in doubt")
        txn = doubt.txn
        if not commit:
            self._rollback_all([txn])
            return ROLLED_BACK, None
        failure, work = self._try_commit(txn)
        if failure is not None:
            return ROLLED_BACK, failure
        self.recorder.record_then(work, lambda: None)
        return COMMITTED, None

    def _open_in_group(self, key: Key, txn_id: bytes) -> Transaction | None:
        """The transaction ``txn_id`` open on any live connection of the producer group ``key`` (a query from a new
        connection while the old one is not yet known lost: it has not ended). Costs a pass over the connections
        holding transactions, once per query."""
        for conn, held in self._by_conn.items():
            txn = held.open.get(txn_id)
            if txn is not None and self._key(conn) == key:
                return txn
        return None

    def check_message(self, conn: ServerConnection, check: CheckLink, event: TransferReceived) -> None:
        """A message to ``$txn-check``: an in-doubt transaction's outcome (resolution c), or an outcome query."""
        delivery = event.delivery
        request = request_of(event.payload)
        refusal = self._checked(conn, check, request) if isinstance(request, CheckRequest) else request
        self.outbox.answer_now(conn, delivery, ACCEPTED if refusal is None else Rejected(error=refusal))

    def _checked(self, conn: ServerConnection, check: CheckLink, request: CheckRequest) -> Error | None:
        """Act on a readable ``$txn-check`` message; the error to reject it with, or None."""
        txn_id = request.txn_id
        if request.outcome is None:
            live = self._live(conn, txn_id) or self._open_in_group(check.key, txn_id)
            state = self.check_back.state(check.key, txn_id, self.clock.now, open_=live is not None)
            posts = None
            if state == IN_DOUBT:
                held = live if live is not None else self.check_back.find(txn_id, container=check.key[1])
                txn = held.txn if isinstance(held, Doubt) else held
                posts = len(txn.posts) if txn is not None else None
            if self.check_back.answer(conn, check.key, txn_id, state, posts):
                return None
            return error(Condition.PRECONDITION_FAILED, "attach a receiver from $txn-check first: answers go there")
        namespace = self.nodes.namespace_of(conn)
        doubt = self.check_back.find(txn_id, namespace, check.key[1])
        if doubt is None:
            return error(Condition.UNKNOWN_TXN_ID, f"transaction {txn_id.hex()} is not in doubt for this container")
        if request.outcome != "unknown":
            _, failure = self.resolve(txn_id, commit=request.outcome == "commit", namespace=namespace)
            return failure
        return None  # checked again at the next interval

    def _time(self, txn: Transaction) -> None:
        """Start ``txn``'s time-out clock (at its declare or its first operation, as the personality says)."""
        personality = txn.controller.personality
        timeout = self.settings.transaction_timeout if personality.timeout is None else personality.timeout
        if not timeout:
            return
        txn.deadline = self.clock.now + timeout
        if personality.timeout_mode == "lazy":
            return  # only a commit looks at it
        heap = self._deadlines
        if len(heap) > 2 * len(self._open) + 64:
            # entries of transactions that ended stay until popped: drop them all now and then (amortised O(1))
            heap[:] = [entry for entry in heap if entry[2] in self._open and entry[2].deadline == entry[0]]
            heapq.heapify(heap)
        first = not heap or txn.deadline < heap[0][0]
        heapq.heappush(heap, (txn.deadline, next(self._ties), txn))
        if first:
            self._new_deadline()

    def _due(self) -> tuple[float, int, Transaction] | None:
        """The earliest time-out still standing (stale entries dropped)."""
        heap = self._deadlines
        while heap:
            when, _, txn = heap[0]
            if txn in self._open and txn.deadline == when:
                return heap[0]
            heapq.heappop(heap)
        return None

    def next_deadline(self) -> float | None:
        """When the next open transaction times out, or the next in-doubt one is checked."""
        due = self._due()
        when = due[0] if due is not None else None
        if self.check_back:
            check = self.check_back.next_deadline()
            if check is not None and (when is None or check < when):
                return check
        return when

    def handle_timeout(self, now: float, contain: Contain | None = None) -> None:
        """Roll back every transaction whose time is up; the links acquiring under one stop (they send nothing, in a
        transaction or out of one, until the controller says what comes next). A personality that closes the
        connection instead closes it (which rolls back its transactions).

        ``contain`` runs each rollback on its own (an error in one is logged, the others still run); a
        transaction whose rollback failed is forgotten all the same, so its time-out never comes round again."""
        expired: list[Transaction] = []
        closing: dict[ServerConnection, Personality] = {}
        while (due := self._due()) is not None and due[0] <= now:
            heapq.heappop(self._deadlines)
            txn = due[2]
            personality = txn.controller.personality
            if personality.timeout_mode == "close":
                closing[txn.conn] = personality
                self.counters.timed_out += 1  # (the close rolls back the connection's others, which did not time out)
            else:
                expired.append(txn)
        self.counters.timed_out += len(expired)
        self._rollback_all(expired, stop=True, contain=contain)
        for txn in expired:
            held = self._by_conn.get(txn.conn)
            if held is not None:
                held.timed_out[txn.id] = _held_back(txn)
        if self.check_back:
            abandoned = [doubt.txn for doubt in self.check_back.due(now)]
            self.counters.abandoned += len(abandoned)
            self._rollback_all(abandoned, contain=contain)
        for conn, personality in closing.items():
            err = error(Condition.TRANSACTION_TIMEOUT, personality.timeout_text)
            if contain is None:
                self.close_connection(conn, err)
            else:
                contain(
                    f"closing connection {conn.conn_id} on a transaction time-out",
                    partial(self.close_connection, conn, err),
                )

    # -- introspection ----------------------------------------------------------------------------------
    def infos(
        self, now: float, conns: Collection[ServerConnection] | None = None, namespace: Namespace | None = None
    ) -> list[TransactionInfo]:
        """The open and in-doubt transactions (of ``conns``, and those held in doubt for ``namespace``, when
        given), oldest first, as of ``now``."""
        if not self.check_back:
            return [info(txn, now) for txn in self._open if conns is None or txn.conn in conns]
        doubts = self.check_back
        found = []
        for txn in self._open:
            doubt = doubts.find(txn.id)
            if doubt is not None and doubt.txn is txn:
                if conns is None or doubt.namespace is namespace:
                    found.append(info(txn, now, "in-doubt"))
            elif conns is None or txn.conn in conns:
                found.append(info(txn, now))
        return found


def _strict(personality: Personality, section: str) -> str:
    """The prefix of an error description naming the specification's section, under ``strict``."""
    return f"strict (AMQP 1.0 part 4 {section}): " if personality.strict else ""


def _unsettled_of_session(controller: Controller) -> int:
    """Transfers the controller's session sent on its other links that the broker has not settled yet."""
    link = controller.link
    return sum(1 for d in link.session.incoming_unsettled.values() if d.link is not link)


def _commit_failure(personality: Personality, cause: Error, *, refused_post: bool) -> Error:
    """The error a commit that could not be applied is answered with (rolled back instead, §4.4.4)."""
    if refused_post and personality.commit_failed_keeps_cause:
        return Error(condition=cause.condition, description=cause.description)
    condition, description = personality.commit_failed
    if description is None:
        prefix = "transaction rolled back: " if condition == Condition.TRANSACTION_ROLLBACK else ""
        description = f"{prefix}{cause.description}"
    return wire_error(condition, description)


def _one_entity(txn: Transaction, entity: str) -> Error | None:
    """``Personality.one_entity``: the refusal of work on ``entity`` in ``txn``, which is on the first entity its
    work touched (``minibroker.servicebus.via``), named without regard to case (``entities.key``)."""
    if txn.entity is None:
        txn.entity = entity
    return None if entity_key(txn.entity) == entity_key(entity) else sb_via.span_error(txn.entity, entity)


def _held_back(txn: Transaction) -> list[OutgoingDelivery]:
    """Deliveries acquired under ``txn`` whose aborted transfer is still held back by the consumer's window."""
    return [d.delivery for d in txn.acquired if not d.delivery.complete]


def _settle(outbox: Outbox, settle: list[tuple[OutgoingDelivery, Outcome]]) -> None:
    """Settle deliveries, grouped by connection and outcome, as ranged dispositions (collected as pairs and grouped
    here once: no call per delivery, issue 19)."""
    by_conn: dict[ServerConnection, dict[object, tuple[Outcome, list[OutgoingDelivery]]]] = {}
    for delivery, outcome in settle:
        by_outcome = by_conn.get(conn := delivery.link.context.conn)
        if by_outcome is None:
            by_outcome = by_conn[conn] = {}
        # outcomes without fields are equal whatever object each client disposition decoded to: one run for them
        key = type(outcome) if isinstance(outcome, Accepted | Released) else id(outcome)
        group = by_outcome.get(key)
        if group is None:
            group = by_outcome[key] = (outcome, [])
        group[1].append(delivery)
    for conn, groups in by_conn.items():
        for outcome, deliveries in groups.values():
            outbox.settle(conn, deliveries, outcome)
