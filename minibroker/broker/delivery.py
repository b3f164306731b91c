"""Messages into nodes and out to consumers: routing, limits, dispatch, outcomes, dead-letters, timers.

Theory of operation
-------------------
*In.* ``_post`` puts a message on a node. A queue takes it if its limits allow (or drops its head, by
policy); a topic gives a copy to every subscription whose selector and no-local filter let it through. A
message may not be visible at once: a delivery time (``x-opt-delivery-time``, ``x-opt-delivery-delay``,
``x-opt-scheduled-enqueue-time``) or a redelivery delay holds it on a timer first. A message whose ttl
or absolute-expiry-time has passed is never delivered: it goes to the node's expiry address or is dropped.

*Out.* ``_dispatch`` hands ready messages to consumers with credit, round-robin. The fast path takes the
head message for the next consumer; when a consumer has a selector, or a message refused a consumer
(``modified`` with undeliverable-here), each consumer takes the first message it may have. Browsers
(distribution-mode copy) walk the queue with a cursor and take nothing away.

*Outcomes* (Part 3 §3.4): accepted retires the message; rejected dead-letters it; released puts it back
(after the redelivery delay, if any); modified puts it back too, counting a failed delivery when
delivery-failed is set, merging its annotations, and keeping it from that consumer when
undeliverable-here is set. A message past ``max_delivery_attempts`` failed deliveries is dead-lettered.
Dead-letters get annotations saying why: ``x-opt-dead-letter-reason``, ``x-opt-dead-letter-description``,
``x-opt-original-address``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from minibroker.amqp.definitions import Accepted, Error, Modified, Rejected, Released, TransactionalState
from minibroker.amqp.errors import Condition, error
from minibroker.broker.durability import DurabilityMixin
from minibroker.broker.links import Consumer, Dispatched
from minibroker.broker.message import Message
from minibroker.broker.namespace import Namespace, Node
from minibroker.broker.policy import DROP_HEAD
from minibroker.broker.queue import Queue, delivery_order
from minibroker.broker.timers import Timer, TimerKind
from minibroker.broker.topic import Topic
from minibroker.engine.connection import ServerConnection
from minibroker.engine.endpoints import OutgoingDelivery

if TYPE_CHECKING:
    from minibroker.broker.selector import MessageFields, Selector

BROWSED = object()
"""Context of a delivery to a browser: a copy whose outcome changes nothing."""

_DELIVERY_TIME = "x-opt-delivery-time"  # Artemis, ActiveMQ: wall-clock ms
_DELIVERY_DELAY = "x-opt-delivery-delay"  # Artemis, ActiveMQ: ms from arrival
_SCHEDULED_ENQUEUE_TIME = "x-opt-scheduled-enqueue-time"  # Service Bus: wall-clock ms


def is_outcome(state: Any) -> bool:
    """True for the terminal delivery states (§3.4)."""
    return isinstance(state, Accepted | Rejected | Released | Modified)


def selector_fields(message: Message) -> MessageFields:
    """What selectors read of ``message``, decoded once and kept on it."""
    from minibroker.broker.selector import MessageFields  # only brokers with selectors pay for the import

    if message.fields is None:
        message.fields = MessageFields.from_message(message.payload)
    fields: MessageFields = message.fields
    return fields


def selects(selector: Selector | None, message: Message) -> bool:
    return selector is None or selector.matches(selector_fields(message))


class DeliveryMixin(DurabilityMixin):
    """Routing into nodes, dispatch to consumers, outcomes and message timers."""

    # -- into nodes ---------------------------------------------------------------------------------
    def _arrive(self, message: Message) -> None:
        """Fix the message's expiry and visibility times on the broker clock (Part 3 §3.2.1, §3.2.4)."""
        now = self._now
        ttl = message.ttl
        expires = now + ttl / 1000 if ttl else None
        absolute = message.absolute_expiry_time()
        if absolute:
            at = self.clock.from_wall_ms(absolute)
            expires = at if expires is None else min(expires, at)
        message.expires_at = expires
        if message.annotations:
            deliver_at = None
            for key, relative in ((_DELIVERY_TIME, False), (_SCHEDULED_ENQUEUE_TIME, False), (_DELIVERY_DELAY, True)):
                value = message.annotation(key)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    deliver_at = now + value / 1000 if relative else self.clock.from_wall_ms(value)
                    break
            message.deliver_at = deliver_at if deliver_at is not None and deliver_at > now else None

    def _targets(self, node: Node, message: Message, origin: ServerConnection | None) -> list[Queue]:
        """The queues a message posted to ``node`` goes to (a topic's matching subscriptions)."""
        if isinstance(node, Topic):
            subscriptions: list[Queue] = list(
                node.publish(message, origin, lambda s, m: selects(s.selector, m))
            )
            return subscriptions
        return [node]

    def _admit(self, node: Node, message: Message, origin: ServerConnection | None) -> Error | None:
        """None if ``node`` can take ``message`` now; else why not (reject-publish at a limit)."""
        for queue in self._targets(node, message, origin):
            if queue.policy.overflow != DROP_HEAD and not queue.has_room(message):
                return error(
                    Condition.RESOURCE_LIMIT_EXCEEDED,
                    f"node {queue.node_name!r} is full ({queue.held} messages, {queue.held_bytes} bytes)",
                )
        return None

    def _post(self, node: Node, message: Message, origin: ServerConnection | None) -> list[Queue]:
        """Put ``message`` on ``node`` (admission already checked); return the queues that took it."""
        targets = self._targets(node, message, origin)
        for i, queue in enumerate(targets):
            self._enqueue(queue, message if i == 0 else message.copy())
        return targets

    def _enqueue(self, queue: Queue, message: Message) -> None:
        self._seq += 1
        message.seq = self._seq
        if queue.policy.overflow == DROP_HEAD:
            while not queue.has_room(message) and queue.ready:
                queue.remove_ready(queue.ready[0])
        now = self._now
        if message.expires_at is not None:
            if message.expires_at <= now:
                self._expire(queue, message)  # expired on arrival: never visible
                return
            self.timers.add(message.expires_at, TimerKind.EXPIRE, queue, message)
        self._journal_enqueue(queue, message)
        if message.deliver_at is not None and message.deliver_at > now:
            queue.hold_scheduled(message)
            self.timers.add(message.deliver_at, TimerKind.DUE, queue, message)
            self._new_deadline()
            return
        queue.put(message)
        if message.expires_at is not None:
            self._new_deadline()

    def _new_deadline(self) -> None:
        if self.on_new_deadline is not None:
            self.on_new_deadline()

    # -- out to consumers ---------------------------------------------------------------------------
    def _dispatch(self, queue: Queue) -> None:
        """Send ready messages of ``queue`` to consumers with credit."""
        if queue.browsers:
            self._dispatch_browsers(queue)
        if not queue.ready or not queue.consumers:
            return
        if queue.selective:
            self._dispatch_matching(queue)
            return
        ready = queue.ready
        while ready:
            message: Message = ready[0]
            if message.expires_at is not None and message.expires_at <= self._now:
                with self._journal_together():
                    queue.remove_ready(message)
                    self._expire(queue, message)
                continue
            if message.excluded:
                self._dispatch_matching(queue)
                return
            consumer = queue.next_consumer()
            if consumer is None:
                return
            queue.acquire_first()
            self._send(consumer, message)

    def _dispatch_matching(self, queue: Queue) -> None:
        """Each consumer with credit takes the first ready message its selector and exclusions allow."""
        progress = True
        while progress and queue.ready:
            progress = False
            expired: list[Message] = []
            for consumer in list(queue.consumers):
                if not consumer.can_take():
                    continue
                chosen = None
                for message in queue.ready:
                    if message.expires_at is not None and message.expires_at <= self._now:
                        expired.append(message)
                        continue
                    if message.excluded and consumer in message.excluded:
                        continue
                    if selects(consumer.selector, message):
                        chosen = message
                        break
                if chosen is not None and chosen not in expired:
                    queue.acquire(chosen)
                    queue.rotate_past(consumer)
                    self._send(consumer, chosen)
                    progress = True
                    break  # the ready list changed: start a new round
            for message in dict.fromkeys(expired):
                with self._journal_together():
                    if queue.remove_ready(message):
                        self._expire(queue, message)
                        progress = True

    def _dispatch_browsers(self, queue: Queue) -> None:
        for browser in queue.browsers:
            while browser.can_take():
                if browser.cursor is None:
                    following = iter(queue.ready)
                else:
                    following = queue.ready.irange_key(min_key=browser.cursor, inclusive=(False, True))
                message = next(following, None)
                if message is None:
                    break
                browser.cursor = delivery_order(message)
                if not selects(browser.selector, message):
                    continue
                delivery = browser.conn.deliver(browser.link, message.encoded(), settled=browser.presettled)
                delivery.context = BROWSED
                self.dirty.add(browser.conn)

    def _send(self, consumer: Consumer, message: Message) -> None:
        """Deliver an acquired message on ``consumer``'s link."""
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
            consumer.queue.retire(message)
        else:
            consumer.unsettled[delivery] = dispatched

    # -- outcomes -----------------------------------------------------------------------------------
    def _retire_in_transaction(
        self, conn: ServerConnection, dispatched: Dispatched, state: TransactionalState, settled: bool
    ) -> None:
        raise NotImplementedError  # provided by coordinator.py

    def _stage_retirement(self, dispatched: Dispatched, txn: Any, outcome: Any, settled: bool) -> None:
        raise NotImplementedError  # provided by coordinator.py

    def _apply_update(
        self, conn: ServerConnection, deliveries: list[OutgoingDelivery], state: Any, settled: bool
    ) -> None:
        """The consumer's disposition for deliveries we sent (role=receiver)."""
        queues: set[Queue] = set()
        to_settle: list[OutgoingDelivery] = []
        for delivery in deliveries:
            dispatched = delivery.context
            if dispatched is BROWSED:
                if not settled:
                    to_settle.append(delivery)
                continue
            if not isinstance(dispatched, Dispatched) or delivery not in dispatched.consumer.unsettled:
                continue
            if isinstance(state, TransactionalState):
                self._retire_in_transaction(conn, dispatched, state, settled)
                continue
            if dispatched.in_transaction:
                # settling after the transaction staged its outcome: the transaction still decides
                if settled:
                    dispatched.peer_settled = True
                if state is None or dispatched.retired_by is not None:
                    continue
                # a plain outcome for a message acquired under a transaction: staged in that transaction
                assert dispatched.acquired_by is not None
                self._stage_retirement(dispatched, dispatched.acquired_by, state, settled)
                continue
            if state is None and not settled:
                continue
            outcome = state if state is not None else dispatched.consumer.default_outcome
            if not is_outcome(outcome):
                continue  # a non-terminal state (received): the delivery stays acquired
            self._finish_delivery(dispatched, outcome)
            queues.add(dispatched.consumer.queue)
            if not settled:
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
        queue = consumer.queue
        if isinstance(outcome, Accepted):
            queue.retire(message)
            return
        if isinstance(outcome, Rejected):
            description = outcome.error.description if outcome.error is not None else None
            with self._journal_together():  # leaving the queue and reaching the DLQ: one record
                queue.retire(message)
                self._dead_letter(queue, message, "rejected", description)
            return
        # released or modified: the message goes back
        if isinstance(outcome, Modified):
            if outcome.message_annotations:
                message.annotate(outcome.message_annotations)
            if outcome.undeliverable_here:
                message.excluded = (message.excluded or set()) | {consumer}
            if outcome.delivery_failed:
                message.delivery_count += 1
                limit = queue.policy.max_delivery_attempts
                if limit and message.delivery_count >= limit:
                    with self._journal_together():
                        queue.retire(message)
                        self._dead_letter(
                            queue, message, "max-delivery-attempts", f"delivery failed {message.delivery_count} times"
                        )
                    return
                self._journal_count(queue, message)
        if message.expires_at is not None and message.expires_at <= self._now:
            with self._journal_together():
                queue.retire(message)
                self._expire(queue, message)
            return
        delay = queue.policy.redelivery_delay
        if delay > 0:
            queue.unacquire_for_later(message)
            self.timers.add(self._now + delay, TimerKind.DUE, queue, message)
            self._new_deadline()
            return
        queue.requeue(message)

    def _dead_letter(self, queue: Queue, message: Message, reason: str, description: str | None) -> None:
        """Move a message (already out of ``queue``'s counts) to the node's dead-letter address."""
        target = queue.policy.dead_letter_target(queue.node_name)
        if not target:
            return
        annotations: dict[str, Any] = {
            "x-opt-dead-letter-reason": reason,
            "x-opt-original-address": queue.node_name,
        }
        if description:
            annotations["x-opt-dead-letter-description"] = description
        self._forward(queue, message, target, annotations)

    def _expire(self, queue: Queue, message: Message) -> None:
        """An expired message (already out of ``queue``'s counts) goes to the expiry address, or away."""
        target = queue.policy.expiry_address
        if target:
            self._forward(queue, message, target, {"x-opt-original-address": queue.node_name})

    def _forward(self, queue: Queue, message: Message, address: str, annotations: dict[str, Any]) -> None:
        namespace: Namespace = queue.namespace if queue.namespace is not None else self.default
        node = namespace.node(address) or self._create_node(namespace, address, "queue")
        copy = message.copy()
        copy.annotate(annotations)
        copy.expires_at = None
        copy.deliver_at = None
        copy.excluded = None
        if self._admit(node, copy, None) is None:
            for target in self._post(node, copy, None):
                self._dispatch(target)

    # -- timers ---------------------------------------------------------------------------------------
    def _on_timer(self, timer: Timer) -> None:
        queue, message = timer.queue, timer.message
        if timer.kind is TimerKind.DUE:
            queue.release_scheduled(message)
            if message.expires_at is not None and message.expires_at <= self._now:
                self._expire(queue, message)
                return
            message.deliver_at = None
            queue.put(message)
            self._dispatch(queue)
        elif message.expires_at is not None and message.expires_at <= self._now:
            with self._journal_together():
                if queue.remove_ready(message):
                    self._expire(queue, message)

