"""The broker core: nodes, links, dispatch, settlement and transactions, driven by engine events.

Theory of operation
-------------------
The trio layer hands every batch of engine events to ``Broker.handle(conn, events, now)``. Each handler
is a plain synchronous call that changes broker state and issues engine commands (accept an attach,
deliver, settle); nothing here awaits, so one handler runs to completion before any other connection is
served and no lock is needed. Every engine given a command is recorded in ``dirty`` so the I/O layer
knows whose socket has bytes to write.

Settlement (Part 3 §3.4): a message delivered unsettled stays acquired (a ``Dispatched`` record) until
the consumer's outcome arrives. Accepted and rejected retire it; released and modified put it back in
its queue (modified with delivery-failed counts one more delivery attempt, §3.4.5). A delivery still
unsettled when its link or connection goes away gets the source's default outcome (released).

Transactions (Part 4, DESIGN §4): see ``transactions.py`` for what is staged. ``_commit`` applies every
staged post, retirement and acquisition of a transaction in one synchronous call, so no consumer, browser
or depth reading can observe part of it; ``_rollback`` undoes them. A transaction ends when it is
discharged, when its controller link detaches or its connection drops (rolled back), or when it is older
than ``transaction_timeout`` (rolled back, and its discharge then fails with amqp:transaction:timeout).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from minibroker.amqp.definitions import (
    Accepted,
    Coordinator,
    Declare,
    Declared,
    Discharge,
    Error,
    Modified,
    Rejected,
    Released,
    Source,
    Target,
    TransactionalState,
)
from minibroker.amqp.errors import Condition, error
from minibroker.amqp.types import DecodeError, Symbol
from minibroker.broker.links import RELEASED, Consumer, Controller, Dispatched, Producer
from minibroker.broker.message import Message
from minibroker.broker.namespace import DEFAULT_NAMESPACE, Namespace
from minibroker.broker.queue import Queue
from minibroker.broker.transactions import (
    MAX_TXN_ID,
    TXN_CAPABILITIES,
    Transaction,
    TransactionInfo,
    TransactionStats,
    control_body,
    counter_ids,
    info,
)
from minibroker.broker.views import ConnectionInfo
from minibroker.engine.connection import ServerConnection
from minibroker.engine.endpoints import IncomingDelivery, Link, LinkState, OutgoingDelivery
from minibroker.engine.events import (
    ConnectionClosed,
    ConnectionOpened,
    DeliveryUpdated,
    Event,
    IncomingSettled,
    LinkAttached,
    LinkDetached,
    LinkFlow,
    SessionFlow,
    TransferReceived,
)

_ACCEPTED = Accepted()
_OUTCOMES: list[str] = [
    Symbol(o) for o in ("amqp:accepted:list", "amqp:rejected:list", "amqp:released:list", "amqp:modified:list")
]
_REJECTED_LIST = "amqp:rejected:list"
_TXN_ID = Symbol("txn-id")
_CONTROLLER_CREDIT = 100


@dataclass(frozen=True)
class BrokerSettings:
    """Policies of the broker core."""

    auto_create: bool = True
    """Create a queue for an unknown address on attach (else refuse with amqp:not-found)."""
    link_credit: int = 1000
    """Credit granted to each producer link, topped up when half is used."""
    transaction_timeout: float = 300.0
    """Seconds after which an open transaction is rolled back; 0 means never."""


class Broker:
    """All broker state; one instance per running server."""

    def __init__(self, settings: BrokerSettings | None = None, txn_ids: Iterator[bytes] | None = None) -> None:
        self.settings = settings or BrokerSettings()
        self.default = Namespace(DEFAULT_NAMESPACE)
        self.namespaces: dict[str, Namespace] = {DEFAULT_NAMESPACE: self.default}
        self._namespace_of: dict[ServerConnection, Namespace] = {}
        self.connections: set[ServerConnection] = set()
        self.dirty: set[ServerConnection] = set()
        self.txn_stats = TransactionStats()
        self._txns: dict[bytes, Transaction] = {}
        self._expired: dict[ServerConnection, set[bytes]] = {}
        self._txn_ids = txn_ids if txn_ids is not None else counter_ids()
        self._seq = 0
        self._now = 0.0
        self.on_change: Callable[[], None] | None = None
        """Called after every batch of events (the I/O layer uses it to wake waiters)."""
        self.on_new_deadline: Callable[[], None] | None = None
        """Called when ``next_deadline`` may have moved earlier (the I/O layer re-arms its timer)."""

    # -- nodes ----------------------------------------------------------------------------------------
    @property
    def queues(self) -> dict[str, Queue]:
        """The queues of the default namespace."""
        return self.default.queues

    def declare_queue(self, name: str, namespace: Namespace | None = None) -> Queue:
        """Return the queue called ``name`` (in the default namespace unless told), creating it if needed."""
        queues = (namespace or self.default).queues
        queue = queues.get(name)
        if queue is None:
            queue = queues[name] = Queue(name)
        return queue

    def _lookup(self, conn: ServerConnection, address: Any) -> Queue | None:
        if not address or not isinstance(address, str):
            return None
        namespace = self._namespace_of.get(conn, self.default)
        queue = namespace.queues.get(address)
        if queue is None and self.settings.auto_create:
            queue = self.declare_queue(address, namespace)
        return queue

    # -- namespaces -----------------------------------------------------------------------------------
    def namespace(self, name: str) -> Namespace:
        """The namespace called ``name``, created if needed."""
        namespace = self.namespaces.get(name)
        if namespace is None:
            namespace = self.namespaces[name] = Namespace(name)
        return namespace

    def reset(self, namespace: Namespace | None = None) -> None:
        """Drop every node, message and transaction of ``namespace`` (default: the default namespace).

        Its connections are closed with ``amqp:connection:forced`` (rolling back their transactions);
        other namespaces are untouched. Costs O(nodes + connections) of that namespace.
        """
        namespace = namespace or self.default
        for conn in list(namespace.connections):
            conn.close(error(Condition.CONNECTION_FORCED, f"namespace {namespace.name!r} was reset"))
            self.handle(conn, conn.take_events(), self._now)
        namespace.queues = {}

    def drop_namespace(self, name: str) -> None:
        """Reset and forget a namespace (the default one cannot be dropped, only reset)."""
        namespace = self.namespaces.get(name)
        if namespace is None:
            return
        self.reset(namespace)
        if namespace is not self.default:
            del self.namespaces[name]

    def namespace_of(self, conn: ServerConnection) -> Namespace:
        """The namespace ``conn`` works in."""
        return self._namespace_of.get(conn, self.default)

    def _on_opened(self, conn: ServerConnection, event: ConnectionOpened) -> None:
        hostname = event.open.hostname
        chosen = self.namespaces.get(hostname) if hostname else None
        if chosen is not None:
            self._namespace_of[conn].connections.discard(conn)
            chosen.connections.add(conn)
            self._namespace_of[conn] = chosen

    # -- entry points -------------------------------------------------------------------------------
    def connection_made(self, conn: ServerConnection, namespace: Namespace | None = None) -> None:
        """A new connection's engine exists (before any byte was read); it came in for ``namespace``."""
        self.connections.add(conn)
        namespace = namespace or self.default
        namespace.connections.add(conn)
        self._namespace_of[conn] = namespace

    def handle(self, conn: ServerConnection, events: Iterable[Event], now: float = 0.0) -> None:
        """Apply a batch of events from ``conn``'s engine."""
        self._now = now
        pending = list(events)
        while pending:
            for event in pending:
                handler = self._HANDLERS.get(type(event))
                if handler is not None:
                    handler(self, conn, event)
            pending = conn.take_events()  # caused by our own commands (a detach after a refused attach)
        if conn.has_output:
            self.dirty.add(conn)
        if self.on_change is not None:
            self.on_change()

    def take_dirty(self) -> set[ServerConnection]:
        """Engines that have bytes to write since the last call."""
        dirty, self.dirty = self.dirty, set()
        return dirty

    def next_deadline(self) -> float | None:
        """When ``handle_timeout`` must next run (the oldest transaction's expiry), or None."""
        timeout = self.settings.transaction_timeout
        if not timeout or not self._txns:
            return None
        return min(txn.created for txn in self._txns.values()) + timeout

    def handle_timeout(self, now: float) -> None:
        """Roll back every transaction older than ``transaction_timeout``."""
        self._now = now
        timeout = self.settings.transaction_timeout
        if not timeout:
            return
        for txn in [t for t in self._txns.values() if now >= t.created + timeout]:
            self.txn_stats.timed_out += 1
            self._expired.setdefault(txn.conn, set()).add(txn.id)
            self._rollback(txn)
        if self.on_change is not None:
            self.on_change()

    # -- introspection ------------------------------------------------------------------------------
    @property
    def transactions(self) -> list[TransactionInfo]:
        """Open transactions with what each has staged, oldest first."""
        return [info(txn, self._now) for txn in sorted(self._txns.values(), key=lambda t: t.created)]

    def transactions_at(self, now: float, conns: set[ServerConnection] | None = None) -> list[TransactionInfo]:
        """``transactions`` with ages computed at ``now`` (only those of ``conns`` when given)."""
        txns = sorted(self._txns.values(), key=lambda t: t.created)
        return [info(txn, now) for txn in txns if conns is None or txn.conn in conns]

    def connection_infos(self, namespace: Namespace | None = None) -> list[ConnectionInfo]:
        """The open connections (of ``namespace`` when given), in the order they came."""
        conns = self.connections if namespace is None else namespace.connections
        infos = []
        for conn in conns:
            remote = conn.remote_open
            infos.append(
                ConnectionInfo(
                    id=conn.conn_id,
                    container_id=str(remote.container_id) if remote is not None else "",
                    hostname=remote.hostname if remote is not None else None,
                    namespace=self.namespace_of(conn).name,
                    user=conn.user,
                    sessions=len(conn.sessions),
                    links=sum(len(s.links) for s in conn.sessions.values()),
                )
            )
        return sorted(infos, key=lambda i: i.id)

    # -- links --------------------------------------------------------------------------------------
    def _on_attach(self, conn: ServerConnection, event: LinkAttached) -> None:
        link = event.link
        if link.is_sender:
            self._attach_consumer(conn, link)
        elif isinstance(link.target, Coordinator):
            self._attach_controller(conn, link)
        else:
            self._attach_producer(conn, link)

    def _attach_consumer(self, conn: ServerConnection, link: Link) -> None:
        source = link.source
        address = source.address if isinstance(source, Source) else None
        queue = self._lookup(conn, address)
        if queue is None or not isinstance(source, Source):
            conn.refuse_attach(link, error(Condition.NOT_FOUND, f"no node at address {address!r}"))
            return
        default_outcome = source.default_outcome
        if not isinstance(default_outcome, Released | Modified | Rejected | Accepted):
            default_outcome = RELEASED
        reply = Source(
            address=queue.name,
            durable=source.durable,
            expiry_policy=source.expiry_policy,
            timeout=source.timeout,
            distribution_mode=Symbol("move"),
            default_outcome=default_outcome,
            outcomes=_OUTCOMES,
            capabilities=source.capabilities,
        )
        conn.accept_attach(link, source=reply, target=link.target)
        consumer = Consumer(conn, link, queue, default_outcome)
        link.context = consumer
        queue.add_consumer(consumer)

    def _attach_producer(self, conn: ServerConnection, link: Link) -> None:
        target = link.target
        address = target.address if isinstance(target, Target) else None
        queue = None
        if address is not None:
            queue = self._lookup(conn, address)
            if queue is None:
                conn.refuse_attach(link, error(Condition.NOT_FOUND, f"no node at address {address!r}"))
                return
        # A null target address is the anonymous relay: each message is routed by its ``to``.
        conn.accept_attach(link, source=link.source, target=target)
        link.context = Producer(conn, link, queue)
        conn.grant_credit(link, self.settings.link_credit)

    def _attach_controller(self, conn: ServerConnection, link: Link) -> None:
        source = link.source
        outcomes = source.outcomes if isinstance(source, Source) else None
        # §4.3 / DESIGN §4: errors travel as rejected when the controller offers it, or lists no outcomes
        rejects = not outcomes or _REJECTED_LIST in outcomes
        reply = Coordinator(capabilities=[Symbol(c) for c in TXN_CAPABILITIES])
        conn.accept_attach(link, source=source, target=reply)
        link.context = Controller(conn, link, rejects)
        conn.grant_credit(link, _CONTROLLER_CREDIT)

    def _on_detach(self, conn: ServerConnection, event: LinkDetached) -> None:
        context = event.link.context
        event.link.context = None
        if isinstance(context, Consumer):
            queue = context.queue
            queue.remove_consumer(context)
            if context.txn is not None:
                context.txn = None
            # unsettled deliveries of a link that is gone get the default outcome, unless a transaction
            # holds them: then its commit or rollback decides
            for dispatched in list(context.unsettled.values()):
                if not dispatched.in_transaction:
                    self._finish_delivery(dispatched, context.default_outcome)
            self._dispatch(queue)
        elif isinstance(context, Controller):
            # §4.2 / DESIGN §4: a controller that goes away rolls back its open transactions
            for txn in [t for t in self._txns.values() if t.controller is event.link]:
                self._rollback(txn)

    def _on_closed(self, conn: ServerConnection, event: ConnectionClosed) -> None:
        for txn in [t for t in self._txns.values() if t.conn is conn]:
            self._rollback(txn)
        self._expired.pop(conn, None)
        self.connections.discard(conn)
        namespace = self._namespace_of.pop(conn, None)
        if namespace is not None:
            namespace.connections.discard(conn)
        self.dirty.discard(conn)

    # -- credit -------------------------------------------------------------------------------------
    def _on_link_flow(self, conn: ServerConnection, event: LinkFlow) -> None:
        consumer = event.link.context
        if not isinstance(consumer, Consumer):
            return
        properties = event.properties
        if properties is not None:
            # §4.4.3: a flow carrying txn-id makes the messages sent from now on acquired under that
            # transaction; a flow with properties but no txn-id ends that (one without properties does not)
            txn_id = properties.get(_TXN_ID)
            if txn_id is None:
                consumer.txn = None
            else:
                txn = self._txn(conn, txn_id)
                if txn is None:
                    conn.detach(consumer.link, self._unknown_txn_error(conn, txn_id))
                    self.dirty.add(conn)
                    return
                consumer.txn = txn
                txn.consumers.add(consumer)
        self._dispatch(consumer.queue)
        if consumer.link.drain:
            conn.complete_drain(consumer.link)
            self.dirty.add(conn)

    def _on_session_flow(self, conn: ServerConnection, event: SessionFlow) -> None:
        queues = {link.context.queue for link in event.session.links.values() if isinstance(link.context, Consumer)}
        for queue in queues:
            self._dispatch(queue)

    # -- messages in --------------------------------------------------------------------------------
    def _on_transfer(self, conn: ServerConnection, event: TransferReceived) -> None:
        context = event.link.context
        if isinstance(context, Controller):
            self._on_control(conn, context, event)
            return
        if not isinstance(context, Producer):
            return
        link = context.link
        delivery = event.delivery
        message = Message(event.payload, 0)
        queue = context.queue if context.queue is not None else self._route(conn, message)
        state = delivery.state
        if isinstance(state, TransactionalState):
            self._post_in_transaction(conn, delivery, state.txn_id, queue, message)
        elif queue is None:
            self._settle_incoming(conn, delivery, Rejected(error=self._unroutable(message)))
        else:
            self._enqueue(queue, message)
            self._settle_incoming(conn, delivery, _ACCEPTED)
            self._dispatch(queue)
        if link.credit <= self.settings.link_credit // 2:  # <=: with a credit of 1, refill at 0
            conn.grant_credit(link, self.settings.link_credit)

    def _route(self, conn: ServerConnection, message: Message) -> Queue | None:
        """Anonymous relay: the node named by the message's ``to`` (Part 3 §3.2.4)."""
        return self._lookup(conn, message.to)

    def _unroutable(self, message: Message) -> Error:
        return error(Condition.NOT_FOUND, f"no node at address {message.to!r}")

    def _enqueue(self, queue: Queue, message: Message) -> None:
        self._seq += 1
        message.seq = self._seq
        queue.put(message)

    def _settle_incoming(self, conn: ServerConnection, delivery: IncomingDelivery, state: Any) -> None:
        if delivery.settled:
            return
        # rcv-settle-mode second (§2.8.3): we give the outcome and settle only after the sender does
        settled = delivery.link.rcv_settle_mode != 1
        conn.dispose_incoming([delivery], state, settled=settled)

    def _on_incoming_settled(self, conn: ServerConnection, event: IncomingSettled) -> None:
        """The producer settled deliveries; nothing is held for them, so there is nothing to do."""

    # -- messages out -------------------------------------------------------------------------------
    def _dispatch(self, queue: Queue) -> None:
        """Send ready messages of ``queue`` to consumers with credit, round-robin."""
        while queue.ready:
            consumer = queue.next_consumer()
            if consumer is None:
                break
            message = queue.acquire()
            conn = consumer.conn
            presettled = consumer.presettled
            txn = consumer.txn
            state = TransactionalState(txn_id=txn.id) if txn is not None else None
            delivery = conn.deliver(consumer.link, message.encoded(), settled=presettled, state=state)
            self.dirty.add(conn)
            dispatched = Dispatched(consumer, delivery, message)
            delivery.context = dispatched
            if txn is not None:
                # §4.4.3: acquired under the transaction, settled or not, until it is discharged
                dispatched.acquired_by = txn
                dispatched.peer_settled = presettled
                txn.acquisitions.append(dispatched)
                consumer.unsettled[delivery] = dispatched
            elif presettled:
                queue.retire()
            else:
                consumer.unsettled[delivery] = dispatched

    def _on_delivery_updated(self, conn: ServerConnection, event: DeliveryUpdated) -> None:
        queues: set[Queue] = set()
        to_settle: list[OutgoingDelivery] = []
        state = event.state
        for delivery in event.deliveries:
            dispatched = delivery.context
            if not isinstance(dispatched, Dispatched) or delivery not in dispatched.consumer.unsettled:
                continue
            if isinstance(state, TransactionalState):
                self._retire_in_transaction(conn, dispatched, state, event.settled)
                continue
            if dispatched.in_transaction:
                # settling after the transaction staged its outcome: the transaction still decides
                if event.settled:
                    dispatched.peer_settled = True
                if state is None or dispatched.retired_by is not None:
                    continue
                # a plain outcome for a message acquired under a transaction: staged in that transaction
                assert dispatched.acquired_by is not None
                self._stage_retirement(dispatched, dispatched.acquired_by, state, event.settled)
                continue
            if state is None and not event.settled:
                continue
            outcome = state if state is not None else dispatched.consumer.default_outcome
            if not _is_outcome(outcome):
                continue  # a non-terminal state (received): the delivery stays acquired
            self._finish_delivery(dispatched, outcome)
            queues.add(dispatched.consumer.queue)
            if not event.settled:
                to_settle.append(delivery)
        if to_settle:
            conn.settle(to_settle, state)
            self.dirty.add(conn)
        for queue in queues:
            self._dispatch(queue)

    def _finish_delivery(self, dispatched: Dispatched, outcome: Any) -> None:
        """Apply a terminal outcome to a dispatched message and forget the delivery."""
        consumer = dispatched.consumer
        consumer.unsettled.pop(dispatched.delivery, None)
        dispatched.delivery.link.session.outgoing_unsettled.pop(dispatched.delivery.delivery_id, None)
        message = dispatched.message
        if isinstance(outcome, Released | Modified):
            if isinstance(outcome, Modified) and outcome.delivery_failed:
                message.delivery_count += 1
            consumer.queue.requeue(message)
        else:
            consumer.queue.retire()

    # -- transactions: the coordinator ----------------------------------------------------------------
    def _on_control(self, conn: ServerConnection, controller: Controller, event: TransferReceived) -> None:
        link = controller.link
        delivery = event.delivery
        if link.credit < _CONTROLLER_CREDIT // 2:
            conn.grant_credit(link, _CONTROLLER_CREDIT)
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
        elif txn.failed is not None:
            self._rollback(txn)
            self.txn_stats.failed_commits += 1
            description = f"transaction rolled back: {txn.failed.description}"
            self._control_error(conn, controller, delivery, error(Condition.TRANSACTION_ROLLBACK, description))
            return
        else:
            self._commit(txn)
        self._settle_incoming(conn, delivery, _ACCEPTED)

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

    # -- transactions: staging ----------------------------------------------------------------------
    def _post_in_transaction(
        self, conn: ServerConnection, delivery: IncomingDelivery, txn_id: Any, queue: Queue | None, message: Message
    ) -> None:
        """§4.4.1: stage a transactional post; answer with the provisional outcome."""
        txn = self._txn(conn, txn_id)
        if txn is None:
            self._settle_incoming(conn, delivery, Rejected(error=self._unknown_txn_error(conn, txn_id)))
            return
        if queue is None:
            err = self._unroutable(message)
            txn.failed = txn.failed or err
            self._settle_incoming(conn, delivery, TransactionalState(txn_id=txn.id, outcome=Rejected(error=err)))
            return
        txn.posts.append((queue, message))
        queue.staged += 1
        self._settle_incoming(conn, delivery, TransactionalState(txn_id=txn.id, outcome=_ACCEPTED))

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
            for victim in (other, txn):
                controller = victim.controller
                self._rollback(victim)
                victim.conn.detach(controller, err)
                self.dirty.add(victim.conn)
            return
        if not _is_outcome(state.outcome):
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

    # -- transactions: discharge --------------------------------------------------------------------
    def _commit(self, txn: Transaction) -> None:
        """Apply everything ``txn`` staged, in one step (no checkpoint: nobody sees half of it)."""
        self._end(txn)
        touched: set[Queue] = set()
        for queue, message in txn.posts:
            queue.staged -= 1
            self._enqueue(queue, message)
            touched.add(queue)
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
                dispatched.consumer.queue.retire()
            elif not dispatched.consumer.attached:
                self._finish_delivery(dispatched, dispatched.consumer.default_outcome)
                touched.add(dispatched.consumer.queue)
            # else: it stays acquired by its link, an ordinary unsettled delivery
        for conn, pairs in to_settle.items():
            for delivery, outcome in pairs:
                conn.settle([delivery], outcome)
            self.dirty.add(conn)
        self.txn_stats.committed += 1
        for queue in touched:
            self._dispatch(queue)

    def _rollback(self, txn: Transaction) -> None:
        """Undo everything ``txn`` staged."""
        self._end(txn)
        for queue, _message in txn.posts:
            queue.staged -= 1
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
        for queue in touched:
            self._dispatch(queue)

    def _end(self, txn: Transaction) -> None:
        del self._txns[txn.id]
        for consumer in txn.consumers:
            if consumer.txn is txn:
                consumer.txn = None
        txn.consumers.clear()

    _HANDLERS: dict[type, Any] = {
        LinkAttached: _on_attach,
        LinkDetached: _on_detach,
        ConnectionClosed: _on_closed,
        ConnectionOpened: _on_opened,
        LinkFlow: _on_link_flow,
        SessionFlow: _on_session_flow,
        TransferReceived: _on_transfer,
        IncomingSettled: _on_incoming_settled,
        DeliveryUpdated: _on_delivery_updated,
    }


def _is_outcome(state: Any) -> bool:
    return isinstance(state, Accepted | Rejected | Released | Modified)


__all__ = ["Broker", "BrokerSettings", "LinkState"]
