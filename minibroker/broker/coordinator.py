"""The transaction coordinator (Part 4, DESIGN §4): declare, discharge, staging, commit and rollback.

Theory of operation: see ``transactions.py`` for what a transaction stages. ``_commit`` applies every
staged post, retirement and acquisition of a transaction in one synchronous call, so no consumer,
browser or depth reading can observe part of it; if a staged post can no longer be applied (its node is
full and refuses new messages), nothing is applied and the commit fails with amqp:transaction:rollback.
``_rollback`` undoes the staged work. A transaction ends when it is discharged, when its controller link
detaches or its connection drops (rolled back), or when it is older than ``transaction_timeout`` (rolled
back, and its discharge then fails with amqp:transaction:timeout).
"""

from __future__ import annotations

from typing import Any

from minibroker.amqp.definitions import (
    Accepted,
    Declare,
    Declared,
    Discharge,
    Error,
    Rejected,
    TransactionalState,
)
from minibroker.amqp.errors import Condition, error
from minibroker.amqp.types import DecodeError
from minibroker.broker.delivery import DeliveryMixin, is_outcome
from minibroker.broker.links import RELEASED, Controller, Dispatched
from minibroker.broker.message import Message
from minibroker.broker.namespace import Node
from minibroker.broker.queue import Queue
from minibroker.broker.transactions import MAX_TXN_ID, Transaction, control_body
from minibroker.engine.connection import ServerConnection
from minibroker.engine.endpoints import IncomingDelivery, Link, OutgoingDelivery
from minibroker.engine.events import TransferReceived

ACCEPTED = Accepted()
CONTROLLER_CREDIT = 100


class CoordinatorMixin(DeliveryMixin):
    """Transactions: the coordinator link and the staging, commit and rollback of transactional work."""

    # -- the coordinator ------------------------------------------------------------------------------
    def _on_control(self, conn: ServerConnection, controller: Controller, event: TransferReceived) -> None:
        # §4.4.1: the provisional outcomes of posts go out before any declare or discharge is answered
        self._flush_accepts(conn)
        link = controller.link
        delivery = event.delivery
        if link.credit < CONTROLLER_CREDIT // 2:
            conn.grant_credit(link, CONTROLLER_CREDIT)
        try:
            body = control_body(event.payload)
        except DecodeError as exc:
            self._control_error(conn, controller, delivery, error(Condition.DECODE_ERROR, str(exc)))
            return
        if isinstance(body, Declare):
            if body.global_id is not None:
                err = error(Condition.NOT_IMPLEMENTED, "distributed transactions (global-id) are not supported")
                self._control_error(conn, controller, delivery, err)
                return
            limit = self.settings.max_transactions_per_connection
            if sum(1 for t in self._txns.values() if t.conn is conn) >= limit:
                err = error(Condition.RESOURCE_LIMIT_EXCEEDED, f"at most {limit} open transactions per connection")
                self._control_error(conn, controller, delivery, err)
                return
            txn = self._declare(conn, link)
            self._settle_incoming(conn, delivery, Declared(txn_id=txn.id))  # honours rcv-settle-mode second
        elif isinstance(body, Discharge):
            self._discharge(conn, controller, delivery, body)
        else:
            err = error(Condition.DECODE_ERROR, "a coordinator message must carry declare or discharge")
            self._control_error(conn, controller, delivery, err)

    def _declare(self, conn: ServerConnection, controller: Link) -> Transaction:
        txn_id = next(self._txn_ids)
        assert len(txn_id) <= MAX_TXN_ID, "txn-id generator gave an id longer than 32 bytes"
        assert txn_id not in self._txns, "txn-id generator repeated an id"
        txn = Transaction(txn_id, conn, controller, self._now)
        self._txns[txn_id] = txn
        self.txn_stats.declared += 1
        if self.on_new_deadline is not None and len(self._txns) == 1:
            self.on_new_deadline()
        return txn

    def _discharge(
        self, conn: ServerConnection, controller: Controller, delivery: IncomingDelivery, body: Discharge
    ) -> None:
        txn_id = body.txn_id
        txn = self._txn(conn, txn_id)
        if txn is None:
            self._control_error(conn, controller, delivery, self._unknown_txn_error(conn, txn_id, discharged=True))
            return
        if body.fail:
            self._rollback(txn)
            self._settle_incoming(conn, delivery, ACCEPTED)
            return
        self._collecting = [] if self.durable else None
        try:
            failure = txn.failed or self._commit(txn)
        finally:
            work, self._collecting = self._collecting or [], None
        if failure is not None:
            if txn.id in self._txns:
                self._rollback(txn)
            self.txn_stats.failed_commits += 1
            description = f"transaction rolled back: {failure.description}"
            self._control_error(conn, controller, delivery, error(Condition.TRANSACTION_ROLLBACK, description))
            return
        # one journal record for all the durable work; ``accepted`` once it is on disk
        self._journal_ops(work, lambda: self._settle_incoming(conn, delivery, ACCEPTED))

    def _control_error(
        self, conn: ServerConnection, controller: Controller, delivery: IncomingDelivery, err: Error
    ) -> None:
        """§4.3: report a declare/discharge error as rejected, or by detaching the coordinator link."""
        if controller.rejects_errors and not delivery.settled:
            self._settle_incoming(conn, delivery, Rejected(error=err))
        else:
            conn.detach(controller.link, err)

    def _txn(self, conn: ServerConnection, txn_id: Any) -> Transaction | None:
        """The live transaction ``txn_id`` of ``conn`` (another connection's id is unknown here)."""
        if not isinstance(txn_id, bytes):
            return None
        txn = self._txns.get(txn_id)
        return txn if txn is not None and txn.conn is conn else None

    def _unknown_txn_error(self, conn: ServerConnection, txn_id: Any, *, discharged: bool = False) -> Error:
        expired = self._expired.get(conn)
        if expired is not None and isinstance(txn_id, bytes) and txn_id in expired:
            if discharged:  # only the discharge ends the memory of it: other uses report it but keep it
                expired.discard(txn_id)
            return error(Condition.TRANSACTION_TIMEOUT, "the transaction timed out and was rolled back")
        shown = txn_id.hex() if isinstance(txn_id, bytes) else repr(txn_id)
        return error(Condition.UNKNOWN_TXN_ID, f"unknown transaction id {shown}")

    def _expire_transactions(self, now: float) -> None:
        """Roll back every transaction older than ``transaction_timeout``."""
        timeout = self.settings.transaction_timeout
        if not timeout:
            return
        expired = [t for t in self._txns.values() if now >= t.created + timeout]
        for txn in expired:
            self.txn_stats.timed_out += 1
            self._expired.setdefault(txn.conn, set()).add(txn.id)
        self._rollback_all(expired)

    def _transactions_deadline(self) -> float | None:
        timeout = self.settings.transaction_timeout
        if not timeout or not self._txns:
            return None
        return min(txn.created for txn in self._txns.values()) + timeout

    # -- staging --------------------------------------------------------------------------------------
    def _post_in_transaction(
        self, conn: ServerConnection, delivery: IncomingDelivery, txn_id: Any, node: Node | None, message: Message
    ) -> None:
        """§4.4.1: stage a transactional post; answer with the provisional outcome."""
        txn = self._txn(conn, txn_id)
        if txn is None:
            self._settle_incoming(conn, delivery, Rejected(error=self._unknown_txn_error(conn, txn_id)))
            return
        err = self._unroutable(message) if node is None else self._admit(node, message, conn)
        if err is None and txn.staged_bytes + message.size > self.settings.max_staged_bytes:
            limit = self.settings.max_staged_bytes
            err = error(Condition.RESOURCE_LIMIT_EXCEEDED, f"a transaction may post at most {limit} bytes")
        if err is not None or node is None:
            txn.failed = txn.failed or err
            self._settle_incoming(conn, delivery, TransactionalState(txn_id=txn.id, outcome=Rejected(error=err)))
            return
        txn.posts.append((node, message))
        txn.staged_bytes += message.size
        node.staged += 1
        self._answer_later(conn, delivery, txn.accepted_state)

    def _unroutable(self, message: Message) -> Error:
        return error(Condition.NOT_FOUND, f"no node at address {message.to!r}")

    def _retire_in_transaction(
        self, conn: ServerConnection, dispatched: Dispatched, state: TransactionalState, settled: bool
    ) -> None:
        """§4.4.2: stage the outcome of a delivered message."""
        txn = self._txn(conn, state.txn_id)
        if txn is None:
            # DESIGN §4: an unknown txn-id rejects that delivery; its message goes back to the queue
            err = self._unknown_txn_error(conn, state.txn_id)
            if not dispatched.in_transaction:
                delivery = dispatched.delivery
                self._finish_delivery(dispatched, RELEASED)
                if not settled:
                    conn.settle([delivery], Rejected(error=err))
                self._dispatch(dispatched.consumer.queue)
            return
        other = dispatched.acquired_by or dispatched.retired_by
        if other is not None and other is not txn:
            # DESIGN §4: one delivery may not name two live transactions: both roll back
            err = error(Condition.TRANSACTION_ROLLBACK, "a delivery named two different transactions")
            self._rollback_all([other, txn])
            for victim in (other, txn):
                victim.conn.detach(victim.controller, err)
                self.dirty.add(victim.conn)
            return
        if not is_outcome(state.outcome):
            return
        self._stage_retirement(dispatched, txn, state.outcome, settled)

    def _stage_retirement(self, dispatched: Dispatched, txn: Transaction, outcome: Any, settled: bool) -> None:
        if dispatched.retired_by is None:
            txn.retirements.append(dispatched)
        dispatched.retired_by = txn
        dispatched.retire_outcome = outcome
        dispatched.peer_settled = dispatched.peer_settled or settled
        if settled:
            delivery = dispatched.delivery
            delivery.link.session.outgoing_unsettled.pop(delivery.delivery_id, None)

    # -- discharge ------------------------------------------------------------------------------------
    def _commit(self, txn: Transaction) -> Error | None:
        """Apply everything ``txn`` staged, in one step (no checkpoint: nobody sees half of it).

        Returns the reason when a staged post can no longer be applied; then nothing was applied.
        """
        err = self._check_posts(txn)
        if err is not None:
            return err
        self._end(txn)
        touched: set[Queue] = set()
        for node, message in txn.posts:
            node.staged -= 1
            touched.update(self._post(node, message, txn.conn))
        to_settle: dict[ServerConnection, list[tuple[OutgoingDelivery, Any]]] = {}
        for dispatched in txn.retirements:
            dispatched.retired_by = None
            if dispatched.acquired_by is txn:
                dispatched.acquired_by = None
            self._finish_delivery(dispatched, dispatched.retire_outcome)
            touched.add(dispatched.consumer.queue)
            if not dispatched.peer_settled and dispatched.consumer.attached:
                # after commit, the broker settles what it still holds unsettled
                to_settle.setdefault(dispatched.consumer.conn, []).append(
                    (dispatched.delivery, dispatched.retire_outcome)
                )
        for dispatched in txn.acquisitions:
            if dispatched.acquired_by is not txn:
                continue  # retired above
            dispatched.acquired_by = None
            if dispatched.peer_settled:
                # pre-settled acquisition with no outcome staged: consumed by the commit
                dispatched.consumer.unsettled.pop(dispatched.delivery, None)
                dispatched.consumer.queue.retire(dispatched.message)
            elif not dispatched.consumer.attached:
                self._finish_delivery(dispatched, dispatched.consumer.default_outcome)
                touched.add(dispatched.consumer.queue)
            # else: it stays acquired by its link, an ordinary unsettled delivery
        for conn, pairs in to_settle.items():
            by_outcome: dict[int, tuple[Any, list[OutgoingDelivery]]] = {}
            for delivery, outcome in pairs:
                by_outcome.setdefault(id(outcome), (outcome, []))[1].append(delivery)
            for outcome, deliveries in by_outcome.values():
                conn.settle(deliveries, outcome)  # ranges of consecutive ids
            self.dirty.add(conn)
        self.txn_stats.committed += 1
        for queue in touched:
            self._dispatch(queue)
        return None

    def _check_posts(self, txn: Transaction) -> Error | None:
        """Whether every staged post still fits its node, counting the posts before it."""
        extra: dict[int, tuple[int, int]] = {}
        for node, message in txn.posts:
            for queue in self._targets(node, message, txn.conn):
                if queue.policy.overflow == "drop-head":
                    continue
                count, size = extra.get(id(queue), (0, 0))
                if not queue.has_room(message, count, size):
                    return error(Condition.RESOURCE_LIMIT_EXCEEDED, f"node {queue.node_name!r} is full")
                extra[id(queue)] = (count + 1, size + message.size)
        return None

    def _rollback_all(self, txns: list[Transaction]) -> None:
        """Roll back several transactions, then dispatch: a message released by one is not handed to a
        consumer still acquiring under another that is about to roll back too."""
        touched: set[Queue] = set()
        for txn in txns:
            touched |= self._rollback(txn, dispatch=False)
        for queue in touched:
            self._dispatch(queue)

    def _rollback(self, txn: Transaction, *, dispatch: bool = True) -> set[Queue]:
        """Undo everything ``txn`` staged; return the queues it touched."""
        self._end(txn)
        for node, _message in txn.posts:
            node.staged -= 1
        touched: set[Queue] = set()
        for dispatched in txn.acquisitions:
            if dispatched.acquired_by is not txn:
                continue
            # §4.4.3 / DESIGN §4: messages acquired under a rolled-back transaction go back, count unchanged
            dispatched.acquired_by = None
            dispatched.retired_by = None
            delivery = dispatched.delivery
            if dispatched.consumer.unsettled.get(delivery) is not dispatched:
                continue
            self._finish_delivery(dispatched, RELEASED)
            touched.add(dispatched.consumer.queue)
            if not dispatched.peer_settled and dispatched.consumer.attached:
                dispatched.consumer.conn.settle([delivery], RELEASED)
                self.dirty.add(dispatched.consumer.conn)
        for dispatched in txn.retirements:
            if dispatched.retired_by is not txn:
                continue
            dispatched.retired_by = None
            dispatched.retire_outcome = None
            consumer = dispatched.consumer
            if dispatched.peer_settled or not consumer.attached:
                # the consumer already forgot it (or is gone): the source's default outcome applies
                self._finish_delivery(dispatched, consumer.default_outcome)
                touched.add(consumer.queue)
            else:
                # back to the state it had: acquired by its link, and the client may settle it again
                delivery = dispatched.delivery
                delivery.link.session.outgoing_unsettled[delivery.delivery_id] = delivery
        self.txn_stats.rolled_back += 1
        if dispatch:
            for queue in touched:
                self._dispatch(queue)
        return touched

    def _end(self, txn: Transaction) -> None:
        del self._txns[txn.id]
        for consumer in txn.consumers:
            if consumer.txn is txn:
                consumer.txn = None
        txn.consumers.clear()

