"""Messages into nodes and out to consumers: routing, limits, dispatch, outcomes, dead-letters, timers.

Theory of operation
-------------------
*In.* ``post`` puts a message on a node. A queue takes it if its limits allow (or drops its head, by
policy); a topic gives a copy to every subscription whose selector and no-local filter let it through; an
exchange (a ``Route``, ``exchanges.py``) gives one to each queue its bindings reach, and a message it routes
nowhere is released (RabbitMQ 4). A
message may not be visible at once: a delivery time (``x-opt-delivery-time``, ``x-opt-delivery-delay``,
``x-opt-scheduled-enqueue-time``) or a redelivery delay holds it on a timer first. A message whose ttl
or absolute-expiry-time has passed is never delivered: it goes to the node's expiry address or is dropped.

*Out.* Each queue's consumers form a ``ConsumerGroup``. ``dispatch`` hands ready messages to consumers with
credit, round-robin. The fast path takes the head message for the next consumer; when a consumer has a
selector, or a message refused a consumer (``modified`` with undeliverable-here), each consumer takes the
first message it may have, looking at each ready message once (its ``Scan`` of the queue, ``queue.py``),
not at every dispatch. Browsers (distribution-mode copy) walk the queue with a cursor and take nothing
away. Whether a delivery is acquired under a transaction (§4.4.3) is the coordinator's to say: it answers
through the ``Acquirer`` seam, so this module knows nothing of transactions.

*Outcomes* (Part 3 §3.4): accepted retires the message; rejected dead-letters it; released puts it back
(after the redelivery delay, if any); modified puts it back too, counting a failed delivery when
delivery-failed is set, merging its annotations, and keeping it from that consumer when
undeliverable-here is set. A message past ``max_delivery_attempts`` failed deliveries is dead-lettered.
Dead-letters get annotations saying why: ``x-opt-dead-letter-reason``, ``x-opt-dead-letter-description``,
``x-opt-original-address``. ``finish`` applies an outcome whoever decided it: the consumer (``apply_outcome``),
a departing link (its source's default outcome), or a transaction's commit or rollback.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Collection, Iterator
from functools import partial
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard
from weakref import WeakSet

from minibroker.amqp.definitions import Accepted, Error, Modified, Rejected, TransactionalState
from minibroker.amqp.errors import Condition, error
from minibroker.amqp.states import Outcome, is_outcome
from minibroker.amqp.types import DecodeError, Symbol, Timestamp, ULong
from minibroker.broker.clock import BrokerClock
from minibroker.broker.exchanges import Route
from minibroker.broker.exchanges import route as route_queues
from minibroker.broker.injection import Injection
from minibroker.broker.lazy import lazy_module
from minibroker.broker.links import RELEASED, Consumer, ConsumerGroup, Dispatched
from minibroker.broker.message import DEFAULT_PRIORITY, MAX_DELIVERY_COUNT, Message
from minibroker.broker.namespace import QUEUE, Node
from minibroker.broker.nodes import Nodes
from minibroker.broker.outbox import Outbox
from minibroker.broker.policy import DROP_HEAD, REJECT_PUBLISH_DLX
from minibroker.broker.queue import Queue, delivery_order
from minibroker.broker.recorder import Recorder, journal_full_error
from minibroker.broker.session_gate import SessionGate, group_id
from minibroker.broker.sessions import SessionLock, Sessions, Waiter
from minibroker.broker.timers import Due, Expiry, Lock, TimerKind, Timers
from minibroker.broker.topic import Subscription, Topic
from minibroker.engine.connection import ServerConnection
from minibroker.engine.endpoints import IncomingDelivery, LinkState
from minibroker.servicebus import addresses as sb_addresses
from minibroker.servicebus import messages as sb_messages
from minibroker.servicebus import sessions as sb_sessions
from minibroker.servicebus.entities import DEFAULT, EntityProperties

if TYPE_CHECKING:
    from minibroker.broker.selector import MessageFields, Selector
    from minibroker.servicebus import rules as sb_rules
else:  # Service Bus topics only (read per message there): loaded on its first read, not at start-up (issue 19)
    sb_rules = lazy_module("minibroker.servicebus.rules")

_ATTACHING = LinkState.ATTACHING  # globals: ~10x cheaper than enum lookups (issue 19)
_LOCK_LOST_OUTCOME = Modified(delivery_failed=True)  # a Service Bus lock ran out: back, a delivery counted
_MAX_TIME_MS = 10**15  # about 31,700 years: a delay, delivery time or expiry beyond it is ignored

_made = attrgetter("made")  # a queue's place among the queues made


def _sane_ms(value: object) -> TypeGuard[int | float]:
    """True for a time in milliseconds the broker honours: a finite number (not a bool) of sane magnitude."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and -_MAX_TIME_MS <= value <= _MAX_TIME_MS
    )


_DELIVERY_TIME = "x-opt-delivery-time"  # Artemis, ActiveMQ: wall-clock ms
_DELIVERY_DELAY = "x-opt-delivery-delay"  # Artemis, ActiveMQ: ms from arrival
_SCHEDULED_ENQUEUE_TIME = "x-opt-scheduled-enqueue-time"  # Service Bus: wall-clock ms
ACCEPTED = Accepted()


def selector_fields(message: Message, limit: int | None = None) -> MessageFields:
    """What selectors read of ``message`` (sections of at most ``limit`` bytes), decoded once and kept on it."""
    from minibroker.broker.selector import MessageFields  # only brokers with selectors pay for the import

    fields: MessageFields | None = message.fields
    if fields is None or fields.limit != limit:
        fields = message.fields = MessageFields.from_message(message.payload, limit)
    return fields


def selects(selector: Selector | SessionGate | None, message: Message) -> bool:
    if selector is None:
        return True
    if isinstance(selector, SessionGate):  # a Service Bus receiver: by the message's session (``sessions.py``)
        return selector.admits(message)
    return selector.matches(selector_fields(message, selector.max_properties_size))


def _subscription_selects(subscription: Any, message: Message) -> bool:
    selector = subscription.selector
    return selector is None or selector.matches(selector_fields(message, selector.max_properties_size))


def _never(view: sb_rules.MessageView) -> bool:
    return False


def _priority_on(queue: Queue, message: Message) -> int | None:
    """The priority ``message`` takes on ``queue`` when it is not its own (RabbitMQ's, ``NodePolicy.max_priority``:
    a classic queue without priorities is FIFO, one with N levels caps them and counts none as 0), else None."""
    levels = queue.policy.max_priority
    if levels is None:
        return None
    if levels == 0:
        wanted = DEFAULT_PRIORITY  # one level for all: FIFO, as the common message already has
    else:
        header = message.header
        wanted = min(int(header.priority) if header is not None and header.priority is not None else 0, levels)
    return None if wanted == message.priority else wanted


def _needs_own(queue: Queue, message: Message) -> bool:
    """Whether ``queue`` takes a copy of ``message`` with content of its own (``Dispatcher._enqueue_own``)."""
    return queue.policy.message_ttl is not None or _priority_on(queue, message) is not None


def _refusal(targets: list[Queue], message: Message) -> Error | None:
    """Why one of ``targets`` cannot take ``message`` now (reject-publish at a limit), or None."""
    for queue in targets:
        policy = queue.policy  # (no limits, no ``has_room`` call: every post passes here, issue 19)
        if (policy.max_messages or policy.max_bytes) and policy.overflow != DROP_HEAD and not queue.has_room(message):
            if queue.policy.limit_ready:  # a RabbitMQ queue: its words (rabbit_amqp_session.erl ``rejected``)
                refusal = error(Condition.RESOURCE_LIMIT_EXCEEDED, f"queue '{queue.name}' exceeded maximum length")
                refusal.info = {Symbol("queue"): queue.name, Symbol("reason"): Symbol("maxlen")}
                return refusal
            return error(
                Condition.RESOURCE_LIMIT_EXCEEDED,
                f"node {queue.node_name!r} is full ({queue.held} messages, {queue.held_bytes} bytes)",
            )
    return None


_RABBIT_REASONS = {"max-delivery-attempts": "delivery_limit"}
"""Dead-letter reasons as RabbitMQ names them (rabbit_dead_letter.erl), where ours differ."""
TTL_EXPIRED = "TTLExpiredException"
TTL_EXPIRED_DESCRIPTION = "The message expired and was dead lettered."
"""Service Bus's dead-letter reason and description for an expired message."""
SESSION_ID_NULL = "Session id is null."
SESSION_ID_NULL_DESCRIPTION = "Session enabled entity doesn't allow a message whose session identifier is null."
"""Service Bus's dead-letter reason and description for a message without a session id that a subscription
requiring sessions gets (as Azure/azure-service-bus#196 reports them)."""


class DeferredLock:
    """The lock ``token`` holds on the deferred message ``seq`` of ``queue`` (received by sequence number) and its
    timer on the broker clock (``Dispatcher.lock_deferred``)."""

    __slots__ = ("queue", "seq", "timer", "token")

    def __init__(self, token: uuid.UUID, queue: Queue, seq: int) -> None:
        self.token = token
        self.queue = queue
        self.seq = seq
        self.timer: Lock | None = None


def servicebus_entity(queue: Queue) -> str:
    """The Service Bus entity path of a queue: its node, or ``TOPIC/Subscriptions/NAME`` for a subscription."""
    if isinstance(queue, Subscription):
        return f"{queue.topic.name}/Subscriptions/{queue.key[1]}"
    return queue.node_name


def entity_properties(queue: Queue) -> EntityProperties:
    """The Service Bus properties of the entity behind ``queue`` (``minibroker.servicebus.entities``)."""
    namespace = queue.namespace
    return namespace.entity_properties(servicebus_entity(queue)) if namespace is not None else DEFAULT


def _attaching(consumer: Consumer) -> bool:
    """Whether ``consumer``'s attach still waits for the broker's answer (a receiver waiting for a session)."""
    return consumer.link.state is _ATTACHING


class Acquirer(Protocol):
    """Who says whether a consumer's deliveries are acquired under a transaction (§4.4.3): the coordinator."""

    def transfer_state(self, consumer: Consumer) -> TransactionalState | None:
        """The delivery state the consumer's next transfer carries (a transactional-state), or None."""

    def acquired(self, dispatched: Dispatched) -> None:
        """``dispatched`` was sent carrying ``transfer_state``: it is acquired under that transaction."""

    def holds(self, dispatched: Dispatched) -> bool:
        """Whether a transaction holds ``dispatched`` (then it decides the message's fate, not a lock's end)."""


class _NoTransactions:
    def transfer_state(self, consumer: Consumer) -> TransactionalState | None:
        return None

    def acquired(self, dispatched: Dispatched) -> None:  # pragma: no cover - never called without a state
        raise AssertionError("acquired without a transaction")

    def holds(self, dispatched: Dispatched) -> bool:
        return False


class Dispatcher:
    """Routing, consumer groups, dispatch, outcomes and message timers of one broker."""

    def __init__(
        self,
        clock: BrokerClock,
        nodes: Nodes,
        recorder: Recorder,
        outbox: Outbox,
        new_deadline: Callable[[], None],
    ) -> None:
        self.clock = clock
        self.nodes = nodes
        self.recorder = recorder
        self.outbox = outbox
        self.timers = Timers()
        self.acquirer: Acquirer = _NoTransactions()
        self._new_deadline = new_deadline
        self._groups: dict[Queue, ConsumerGroup] = {}
        # (dicts, not sets: in the order they attached or stopped, the order a deleted queue detaches them in)
        self._stopped: dict[Queue, dict[Consumer, None]] = {}  # attached, but out of their group until restarted
        self._by_conn: dict[ServerConnection, dict[Consumer, None]] = {}
        self._seq = 0
        self._rule_actions = False  # a Service Bus rule with an action was ever made: copies may need rewriting
        self._session_subscriptions = False  # a Service Bus subscription requiring sessions ever took a message
        self.own_copies = False
        """A queue whose messages may need copies of their own exists: a per-queue message ttl or RabbitMQ's
        priorities (``NodePolicy.message_ttl``, ``max_priority``: a queue declared through ``rabbit.py``)."""
        # the last forwarded copy: (the original's bytes, its delivery-count, the annotations added, the copy's
        # bytes), so that copies of one fanned-out message (N subscriptions rejecting it) share their bytes
        self._forwarded: tuple[bytes, int, dict[str, Any], bytes] | None = None
        nodes.queue_gone = self.timers.queue_gone
        self.injection = Injection()
        """Fault injection (set by the core): point ``deliver``."""
        self._late: dict[int, Message] = {}  # messages a ``delay`` fault held back (by id), sent once it is over
        self.sessions = Sessions(clock, self.timers, new_deadline)
        """Service Bus sessions: who holds which, their locks and states (``sessions.py``)."""
        self.deferred: dict[Queue, dict[int, Message]] = {}
        """Messages a Service Bus receiver deferred, per queue by sequence number: set aside, never redelivered
        (``receive-by-sequence-number`` on ``$management`` fetches them); they go with their queue."""
        self.deferred_locks: dict[uuid.UUID, DeferredLock] = {}
        """The locks of deferred messages received by sequence number, by lock token (``lock_deferred``)."""

    # -- into nodes ---------------------------------------------------------------------------------
    def arrive(self, message: Message) -> None:
        """Fix the message's expiry and visibility times on the broker clock (Part 3 §3.2.1, §3.2.4)."""
        now = self.clock.now
        content = message.content  # (its fields read directly: every arrival passes here, issue 19)
        header = content.header
        ttl = header.ttl if header is not None else None
        expires = now + ttl / 1000 if ttl else None
        # (no call for a message without properties: every arrival passes here, issue 19)
        absolute = message.absolute_expiry_time() if content.expiry_properties_at >= 0 else None
        if absolute and _sane_ms(absolute):
            at = self.clock.from_wall_ms(absolute)
            expires = at if expires is None else min(expires, at)
        content.expires_at = expires
        if content.annotations:
            deliver_at = None
            for key, relative in ((_DELIVERY_TIME, False), (_SCHEDULED_ENQUEUE_TIME, False), (_DELIVERY_DELAY, True)):
                value = message.annotation(key)
                if _sane_ms(value):  # a non-finite or absurd time is ignored: the message is not scheduled
                    deliver_at = now + value / 1000 if relative else self.clock.from_wall_ms(value)
                    break
            message.deliver_at = deliver_at if deliver_at is not None and deliver_at > now else None

    def servicebus_arrive(self, node: Node | None, message: Message) -> None:
        """``arrive`` at a Service Bus entity: a message lives at most the entity's ``DefaultMessageTimeToLive``
        (``EntityProperties.default_message_ttl``; a topic's for its subscriptions): one without a ttl of its own
        that long, one with a longer ttl is cut down to it, as Service Bus does."""
        self.arrive(message)
        namespace = node.namespace if node is not None else None
        if namespace is not None and namespace.servicebus_entities:
            assert node is not None
            ttl = namespace.entity_properties(node.name).default_message_ttl
            if ttl is not None:
                limit = self.clock.now + ttl
                expires = message.expires_at
                message.expires_at = limit if expires is None else min(expires, limit)

    def targets(self, node: Node | Route, message: Message, origin: ServerConnection | None) -> list[Queue]:
        """The queues a message posted to ``node`` goes to (a topic's matching subscriptions, the queues an
        exchange routes to)."""
        if isinstance(node, Queue):
            return [node]
        if isinstance(node, Route):
            return self._exchange_targets(node, message)
        if isinstance(node, Topic):
            if node.namespace is not None and node.namespace.personality.servicebus:
                return self._servicebus_targets(node, message, origin)
            subscriptions: list[Queue] = list(node.publish(message, origin, _subscription_selects))
            return subscriptions
        return [node]

    def _published(self, node: Node | Route, message: Message, origin: ServerConnection | None) -> list[Queue]:
        """``targets`` for ``message`` as it is published to ``node``, counted on a topic then, once: its admission
        is asked more often (a transactional post's when posted and again at the commit)."""
        if isinstance(node, Topic):
            node.published_total += 1
        return self.targets(node, message, origin)

    @staticmethod
    def _exchange_targets(way: Route, message: Message) -> list[Queue]:
        """The queues of its namespace that an exchange routes ``message`` to (``exchanges.route``); a headers
        exchange reads the message's application-properties as its headers."""
        namespace = way.namespace

        def headers() -> dict[str, Any]:
            return dict(selector_fields(message).application_properties)

        queues = namespace.queues
        names = route_queues(namespace.exchanges, way.exchange, way.key, headers)
        return [queue for name in names if (queue := queues.get(name)) is not None]

    # -- Service Bus subscription rules (``minibroker.servicebus.rules``) ------------------------------------
    def _servicebus_targets(self, topic: Topic, message: Message, origin: ServerConnection | None) -> list[Queue]:
        """A Service Bus topic's targets: each subscription once per copy it takes (``_copies``), so a
        subscription whose rules with actions match appears once more for each (the message's properties
        decoded once per publish, for all subscriptions)."""
        view: sb_rules.MessageView | None = None
        limit = self.nodes.settings.max_selector_properties_size or None
        counts: dict[Subscription, int] = {}

        def matches(subscription: Subscription, message: Message) -> bool:
            if not _subscription_selects(subscription, message):
                return False
            nonlocal view
            if view is None:
                # ``sys.SequenceNumber``: the number ``_enqueue_all`` gives the message next, as its copies read it
                view = sb_rules.MessageView.of(message.payload, limit, message.seq or self._seq + 1)
            counts[subscription] = count = len(self._copies(subscription, view))
            if count and not self._session_subscriptions:
                self._session_subscriptions = entity_properties(subscription).requires_session
            return count > 0

        targets: list[Queue] = []
        for subscription in topic.publish(message, origin, matches):
            targets += [subscription] * counts[subscription]
        return targets

    def _copies(self, subscription: Subscription, view: sb_rules.MessageView) -> list[sb_rules.Rule | None]:
        """The copies ``subscription`` takes of a message, as Service Bus makes them (learn.microsoft.com,
        "Topic filters and actions"): one (None) when any matching rule has no action, then one for each
        matching rule with an action (that rule), in rule order."""
        plain = False
        acting: list[sb_rules.Rule | None] = []
        for rule, _ in self.subscription_rules(subscription).values():
            if rule.action is None:
                plain = plain or rule.matches(view)
            elif rule.matches(view):
                acting.append(rule)
        return [None, *acting] if plain else acting

    def subscription_rules(self, subscription: Subscription) -> dict[str, tuple[sb_rules.Rule, int]]:
        """A Service Bus subscription's rules by name, each with its creation time (wall-clock ms); first made
        from its entity properties (no rules configured: ``$Default``, the true filter). A configured rule
        whose filter does not compile matches nothing."""
        if subscription.rules is None:
            specs = entity_properties(subscription).rules
            created = self.clock.wall_ms(self.clock.now)
            rules: dict[str, tuple[sb_rules.Rule, int]] = {}
            subscription.rules = rules
            for spec in specs if specs is not None else (sb_rules.default_rule(),):
                try:
                    rule = sb_rules.compile_rule(spec, self.nodes.settings.max_selector_length or None)
                except sb_rules.RuleError:
                    rule = sb_rules.Rule(spec, _never)
                self.add_rule(subscription, rule, created)
        found: dict[str, tuple[sb_rules.Rule, int]] = subscription.rules
        return found

    def add_rule(self, subscription: Subscription, rule: sb_rules.Rule, created: int) -> None:
        """Give ``subscription`` (its rules made already) ``rule``, created at ``created`` (wall-clock ms)."""
        assert subscription.rules is not None
        subscription.rules[rule.name] = (rule, created)
        self._rule_actions = self._rule_actions or rule.action is not None

    def _apply_rule_actions(self, targets: list[Queue], copies: list[Message]) -> None:
        """SQL rule actions: the copies a subscription takes (``_servicebus_targets``: the same subscription
        one after another) are, in order, the ``_copies`` of the message; a rule's copy has that rule's action
        applied to the application-properties and the rule's name as application-property ``RuleName`` (as
        learn.microsoft.com "Topic filters and actions" says), and, after a subscription's first copy, a place
        (sequence number) of its own; the plain copy keeps the bytes."""
        view: sb_rules.MessageView | None = None
        made: Iterator[sb_rules.Rule | None] = iter(())
        previous: Queue | None = None
        for queue, copy in zip(targets, copies, strict=True):
            if not isinstance(queue, Subscription) or not queue.rules:
                previous = None
                continue
            if view is None:
                limit = self.nodes.settings.max_selector_properties_size or None
                view = sb_rules.MessageView.of(copy.payload, limit, copy.seq or None)
            made_before = queue is previous
            if not made_before:
                made = iter(self._copies(queue, view))
                previous = queue
            rule = next(made, None)
            if rule is None or rule.action is None:
                continue
            user = {**rule.action(view), sb_rules.RULE_NAME: rule.name}
            payload, start = copy.payload, copy.properties_start
            try:
                rest = sb_rules.with_user_properties(payload, start, user)
            except DecodeError:
                rest = payload[start:]  # (a malformed message is refused on arrival: not reached)
            copy.annotate({}, payload[:start] + rest)
            if made_before:
                # a further copy in this subscription is a message of its own there: its own place and sequence
                # number (deferral, receive-by-sequence-number and locks go by it)
                self._seq += 1
                copy.content.place(self._seq)

    def _dead_letter_sessionless(
        self, targets: list[Queue], copies: list[Message]
    ) -> tuple[list[Queue], list[Message]]:
        """A message without a session id published to a topic: each Service Bus subscription that requires
        sessions dead-letters its copy (Service Bus's reason and description, as Azure/azure-service-bus#196
        reports them), instead of keeping a message no session receiver can take; the other targets and copies."""
        kept: tuple[list[Queue], list[Message]] = ([], [])
        for queue, copy in zip(targets, copies, strict=True):
            if isinstance(queue, Subscription) and entity_properties(queue).requires_session:
                self.servicebus_dead_letter(queue, copy, SESSION_ID_NULL, SESSION_ID_NULL_DESCRIPTION)
            else:
                kept[0].append(queue)
                kept[1].append(copy)
        return kept

    def _expire_by_place(self, expires_at: float, targets: list[Queue], copies: list[Message]) -> None:
        """One expiry timer for each place the copies have (a rule action's further copy in a subscription has a
        place of its own: ``_apply_rule_actions``), as an expiry finds its copies by place."""
        places: dict[tuple[int, int], tuple[list[Queue], list[Message]]] = {}
        for queue, copy in zip(targets, copies, strict=True):
            queues, group = places.setdefault(copy.content.key, ([], []))
            queues.append(queue)
            group.append(copy)
        for queues, group in places.values():
            self.timers.expire(expires_at, tuple(queues), group)

    def admit(self, node: Node | Route, message: Message, origin: ServerConnection | None) -> Error | None:
        """None if ``node`` can take ``message`` now; else why not (reject-publish at a limit)."""
        # a plain queue's targets without the call: every transactional post asks (issue 19)
        return _refusal([node] if type(node) is Queue else self.targets(node, message, origin), message)

    def journal_refusal(self, node: Node | Route, message: Message, origin: ServerConnection | None) -> Error | None:
        """``amqp:resource-limit-exceeded`` when ``message`` would be journaled on ``node`` while the journal
        cannot write (disk full) or the message is too large for a journal record; None otherwise (at once while
        the journal writes)."""
        if not self.recorder.may_refuse(message):
            return None
        return self.recorder.refusal(self.targets(node, message, origin), message)

    def post(self, node: Node | Route, message: Message, origin: ServerConnection | None) -> list[Queue]:
        """Put ``message`` on ``node`` (admission already checked); return the queues that took it."""
        # a plain queue's targets without the call: every commit posts here, per message (issue 19)
        targets = [node] if type(node) is Queue else self._published(node, message, origin)
        self._enqueue_all(targets, message)
        return targets

    def _enqueue_all(self, targets: list[Queue], message: Message) -> None:
        """Put ``message`` on every queue of ``targets``: the first takes it, each other one a record of its own
        over the same content (one place in delivery order, one expiry timer, one schedule for them all); a queue
        with a message ttl or a priority of its own for the message gets a copy with its own content
        (``_enqueue_own``)."""
        content = message.content
        if (
            len(targets) == 1
            and content.expires_at is None
            and content.deliver_at is None
            and not (self.own_copies or self._rule_actions or self._session_subscriptions)
            and not (self.recorder.durable and message.durable)
            and targets[0].policy.overflow != DROP_HEAD
        ):
            # the usual arrival (one queue, no expiry, schedule, journal record, copy of its own, rule action or
            # head to drop): what ``_enqueue_copies`` comes to then, without its steps; every post passes here,
            # and any other one takes the general path below (issue 19)
            self._seq += 1
            content.place(self._seq)
            targets[0].put(message)
            return
        if self.own_copies and any(_needs_own(queue, message) for queue in targets):
            self._enqueue_own(targets, message)
            return
        self._enqueue_copies(targets, message)

    def _enqueue_own(self, targets: list[Queue], message: Message) -> None:
        """``_enqueue_all`` when some targets need a copy of their own: a per-queue message ttl (RabbitMQ
        ``x-message-ttl``: the message lives the least of it and its own ttl, rabbit_amqqueue.erl
        ``check_message_ttl_arg``) or another priority (``_priority_on``); the other targets share ``message``."""
        shared = [queue for queue in targets if not _needs_own(queue, message)]
        for queue in targets:
            if not _needs_own(queue, message):
                continue
            copy = Message(message.payload, limit=message.content.limit)
            copy.delivery_count = message.delivery_count
            copy.expires_at = message.expires_at
            ttl = queue.policy.message_ttl
            if ttl is not None:
                limit = self.clock.now + ttl
                copy.expires_at = limit if message.expires_at is None else min(message.expires_at, limit)
            copy.deliver_at = message.deliver_at
            priority = _priority_on(queue, message)
            if priority is not None:
                copy.content.priority = priority  # (its place in delivery order comes from it: ``Content.place``)
            self._enqueue_copies([queue], copy)
        self._enqueue_copies(shared, message)

    def _enqueue_copies(self, targets: list[Queue], message: Message) -> None:
        if not targets:
            return
        self._seq += 1
        message.content.place(self._seq)
        copies = [message]
        if len(targets) > 1:
            sharing = Message.sharing
            copies += [sharing(message) for _ in range(len(targets) - 1)]
        if self._rule_actions:
            self._apply_rule_actions(targets, copies)
        if self._session_subscriptions and group_id(message) is None:
            targets, copies = self._dead_letter_sessionless(targets, copies)
        now = self.clock.now
        content = message.content  # (the copies share it; its times read directly, issue 19)
        expires_at = content.expires_at
        if expires_at is not None and expires_at <= now:
            for queue, copy in zip(targets, copies, strict=True):
                self._expire(queue, copy)  # expired on arrival: never visible
            return
        deliver_at = content.deliver_at
        scheduled = deliver_at is not None and deliver_at > now
        enqueued = self.recorder.enqueued if self.recorder.durable and message.durable else None
        for queue, copy in zip(targets, copies, strict=True):
            if queue.policy.overflow == DROP_HEAD:
                while not queue.has_room(copy) and queue.ready:
                    head = queue.ready[0]
                    queue.remove_ready(head)
                    if queue.policy.dead_letter_exchange is not None:
                        self.dead_letter_exchange(queue, head, "maxlen")
            if enqueued is not None:
                enqueued(queue, copy)
            if scheduled:
                queue.hold_scheduled(copy)
            else:
                queue.put(copy)
        if expires_at is not None:
            if self._rule_actions:
                self._expire_by_place(expires_at, targets, copies)
            else:
                self.timers.expire(expires_at, tuple(targets), copies)
        if scheduled:
            assert deliver_at is not None
            self.timers.due(deliver_at, list(zip(targets, copies, strict=True)))
        if expires_at is not None or scheduled:
            self._new_deadline()

    def publish(self, conn: ServerConnection, delivery: IncomingDelivery, node: Node | Route, message: Message) -> None:
        """A plain (non-transactional) transfer to ``node``: admit it, post it, answer, dispatch. A message an
        exchange routes to no queue is released (RabbitMQ 4: rabbit_amqp_session.erl, ``released`` when
        unroutable); one it routes to some full queues goes to the others, and is answered with the refusal
        (rabbitmq.com/docs/maxlength: "The message will still be published to all other queues")."""
        # a plain queue's targets without the call: every post to a queue passes here (issue 19)
        targets = [node] if type(node) is Queue else self._published(node, message, conn)
        outcome: Accepted | Rejected = ACCEPTED
        if isinstance(node, Route):
            if not targets:
                self.outbox.answer_now(conn, delivery, RELEASED)
                return
            full = [queue for queue in targets if _refusal([queue], message) is not None]
            if full and len(full) < len(targets):
                self._dead_letter_refused(full, message)
                outcome = Rejected(error=_refusal(full, message))
                targets = [queue for queue in targets if queue not in full]
        refused = _refusal(targets, message) or self.recorder.refusal(targets, message)
        if refused is not None:
            self._dead_letter_refused(targets, message)
            self.outbox.answer_now(conn, delivery, Rejected(error=refused))
            return
        if self.recorder.durable:
            with self.recorder.refusable() as written:  # its journal record is written before anyone sees it
                self._enqueue_all(targets, message)
            if not written.ok:  # the journal did not take it (disk full): take it back, refuse it
                self._take_back(written.enqueued)
                self.outbox.answer_now(conn, delivery, Rejected(error=journal_full_error()))
                return
            journaled = bool(written.enqueued)
        else:
            self._enqueue_all(targets, message)
            journaled = not delivery.settled and message.durable  # (pre-settled: not asked, issue 19)
        if delivery.settled:
            pass  # nothing to answer (no ``answer`` call either: per message, issue 19)
        elif journaled:
            # journaled: ``accepted`` only once its journal record is on disk (group commit)
            self.recorder.after_durable(lambda: self.outbox.answer_now(conn, delivery, outcome))
        else:
            self.outbox.answer(conn, delivery, outcome)
        for queue in targets:
            self.dispatch(queue)

    def inject(self, node: Node | Route, message: Message) -> Error | None:
        """A message posted with no link (the management API): admitted, journaled, posted and dispatched as a
        settled plain transfer is (``publish``); the refusal when it is not taken."""
        targets = self._published(node, message, None)  # (published here: counted on a topic, as ``publish`` does)
        refused = _refusal(targets, message) or self.recorder.refusal(targets, message)
        if refused is not None:
            return refused
        if self.recorder.durable:
            with self.recorder.refusable() as written:
                self._enqueue_all(targets, message)
            if not written.ok:
                self._take_back(written.enqueued)
                return journal_full_error()
        else:
            self._enqueue_all(targets, message)
        for queue in targets:
            self.dispatch(queue)
        return None

    def _take_back(self, enqueued: list[tuple[Queue, Message]]) -> None:
        """Remove messages just enqueued (not yet dispatched) whose journal record was refused."""
        now = self.clock.now
        for queue, message in enqueued:
            if queue.remove_ready(message):
                pass
            elif message.deliver_at is not None and message.deliver_at > now:
                queue.release_scheduled(message)
            else:
                continue  # already delivered (a forward within the publish): it stays, not journaled
            self.timers.discard_message(message)

    def restore(self, queue: Queue, message: Message) -> None:
        """A message recovered from the journal takes its place in ``queue``, with its times (``expires_at``,
        ``deliver_at``, already on the broker clock): a scheduled one waits for its delivery time; one that
        has expired is put back only to be expired by the next ``handle_timeout`` (which recovery runs)."""
        self._seq += 1
        message.content.place(self._seq)
        now = self.clock.now
        expired = message.expires_at is not None and message.expires_at <= now
        if message.expires_at is not None:
            self.timers.add(message.expires_at, TimerKind.EXPIRE, queue, message)
        if not expired and message.deliver_at is not None and message.deliver_at > now:
            queue.hold_scheduled(message)
            self.timers.add(message.deliver_at, TimerKind.DUE, queue, message)
            return
        message.deliver_at = None
        queue.put(message)

    # -- consumers ------------------------------------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        """``consumer`` takes from its queue from now on."""
        self._groups.setdefault(consumer.queue, ConsumerGroup()).add(consumer)
        self._by_conn.setdefault(consumer.conn, {})[consumer] = None

    def remove_consumer(self, consumer: Consumer) -> None:
        """``consumer`` is gone (its unsettled deliveries are someone else's to finish); a Service Bus session
        receiver gives its session up at once."""
        self._leave_group(consumer)
        if consumer.servicebus:
            self.sessions.release(consumer)
        self._unstop(consumer)
        consumers = self._by_conn.get(consumer.conn)
        if consumers is not None:
            consumers.pop(consumer, None)
            if not consumers:
                del self._by_conn[consumer.conn]

    def stop(self, consumer: Consumer) -> None:
        """``consumer`` gets nothing more until ``restart`` (it stays attached, with its credit)."""
        self._leave_group(consumer)
        self._stopped.setdefault(consumer.queue, {})[consumer] = None

    def restart(self, consumer: Consumer) -> None:
        """A stopped consumer takes messages again."""
        if self._unstop(consumer) and consumer.attached:
            self._groups.setdefault(consumer.queue, ConsumerGroup()).add(consumer)
            self.dispatch(consumer.queue)

    def _leave_group(self, consumer: Consumer) -> None:
        group = self._groups.get(consumer.queue)
        if group is not None:
            group.remove(consumer)
            if not group:
                del self._groups[consumer.queue]

    def _unstop(self, consumer: Consumer) -> bool:
        """Take ``consumer`` off the stopped ones; whether it was stopped."""
        stopped = self._stopped.get(consumer.queue)
        if stopped is None or consumer not in stopped:
            return False
        del stopped[consumer]
        if not stopped:
            del self._stopped[consumer.queue]
        return True

    def consumers(self, queue: Queue) -> list[Consumer]:
        """The consumers taking from ``queue`` now: acquiring ones, then browsers."""
        group = self._groups.get(queue)
        return [*group.consumers, *group.browsers] if group is not None else []

    def consumer_count(self, queue: Queue) -> int:
        """Acquiring consumers of ``queue`` (browsers and stopped links not counted)."""
        group = self._groups.get(queue)
        return len(group.consumers) if group is not None else 0

    def has_links(self, queue: Queue) -> bool:
        """Whether any link (consumer, browser, or one stopped by a transaction) is attached to ``queue``."""
        return queue in self._groups or queue in self._stopped

    def consumers_of(self, conn: ServerConnection) -> Collection[Consumer]:
        """``conn``'s consumer links, in the order they attached."""
        return self._by_conn.get(conn, {}).keys()

    def resume(self, conn: ServerConnection) -> None:
        """``conn``'s peer read what was queued for it: deliveries held back for it may go on."""
        self.dispatch_all({consumer.queue for consumer in self.consumers_of(conn)})

    def queue_deleted(self, queue: Queue) -> None:
        """``queue`` is gone: its consumers, stopped ones included, are detached with ``amqp:resource-deleted``."""
        self.deferred.pop(queue, None)
        self.sessions.queue_gone(queue)
        group = self._groups.pop(queue, None)
        consumers = [*group.consumers, *group.browsers] if group is not None else []
        consumers += self._stopped.pop(queue, ())
        err = error(Condition.RESOURCE_DELETED, f"{queue.node_name!r} was deleted")
        for consumer in consumers:
            consumer.conn.detach(consumer.link, err)
            self.outbox.touch(consumer.conn)

    # -- out to consumers ---------------------------------------------------------------------------
    def dispatch_all(self, queues: Collection[Queue]) -> None:
        """Dispatch each of ``queues`` (a commit's, a rollback's, a batch of outcomes'), in the order they were made:
        the callers gather them in sets, whose order is their addresses in memory, and the same client steps must
        give the same deliveries in the same order on every run."""
        for queue in sorted(queues, key=_made) if len(queues) > 1 else queues:
            self.dispatch(queue)

    def dispatch(self, queue: Queue) -> None:
        """Send ready messages of ``queue`` to consumers with credit (and sessions to Service Bus receivers
        waiting for one)."""
        if self.sessions.waiting and queue in self.sessions.waiting:
            self.sessions.offer(queue, entity_properties(queue).lock_duration, _attaching)
        group = self._groups.get(queue)
        if group is None:
            return
        if group.browsers:
            self._dispatch_browsers(queue, group)
        if not queue.ready or not group.consumers:
            return
        if group.selective:
            self._dispatch_matching(queue, group)
            return
        ready = queue.ready
        while (message := ready.first()) is not None:  # (one call per delivery, issue 19)
            expires_at = message.content.expires_at  # (the field, read once: per delivery, issue 19)
            if expires_at is not None and expires_at <= self.clock.now:
                with self.recorder.together():
                    queue.remove_ready(message)
                    self._expire(queue, message)
                continue
            if message.excluded:
                self._dispatch_matching(queue, group)
                return
            consumer = group.next_consumer()
            if consumer is None:
                return
            queue.acquire_first()
            self._send(consumer, message)

    def _dispatch_matching(self, queue: Queue, group: ConsumerGroup) -> None:
        """Consumers with credit, in turn, take the first ready message their selector and exclusions allow.

        Incremental: each consumer keeps a ``Scan`` of the queue (``queue.py``) and looks at each ready message
        once, not once per dispatch: a new arrival is looked at only by the consumers with credit, and the
        messages a consumer does not select cost it nothing after its first look, however deep the queue.
        """
        while queue.ready:
            for consumer in group.in_turn():
                if not consumer.can_take():
                    continue
                chosen, expired = self._first_for(queue, consumer)
                if chosen is not None:
                    queue.acquire(chosen)
                    group.rotate_past(consumer)
                    self._send(consumer, chosen)
                if expired:
                    # only now: forwarding a copy may dispatch this queue again (its expiry address is itself)
                    self._expire_ready(queue, expired)
                if chosen is not None or expired:
                    break  # the ready list changed: start a new round
            else:
                return

    def _expire_ready(self, queue: Queue, messages: list[Message]) -> None:
        for message in messages:
            with self.recorder.together():
                if queue.remove_ready(message):
                    self._expire(queue, message)

    def _first_for(self, queue: Queue, consumer: Consumer) -> tuple[Message | None, list[Message]]:
        """The first ready message (delivery order) ``consumer`` may take, looking only where it has not looked,
        and the expired messages met on the way (the caller expires them once it has sent its choice: expiring
        may forward a copy, and so dispatch, re-entrantly).

        First the messages that came in behind its scan's cursor since it last looked, then onwards from the
        cursor. Nothing changes here but the scan.
        """
        scan = consumer.scan
        if scan is None:
            scan = consumer.scan = queue.open_scan()
        ready = queue.ready
        now = self.clock.now
        expired: list[Message] = []
        chosen = None
        while chosen is None and (message := queue.next_behind(scan)) is not None:
            scan.examined += 1
            if message.expires_at is not None and message.expires_at <= now:
                expired.append(message)
            elif not (message.excluded and consumer in message.excluded) and selects(consumer.selector, message):
                chosen = message
        if chosen is None:
            if scan.cursor is None:
                following = iter(ready)
            else:
                following = ready.irange_key(min_key=scan.cursor, inclusive=(False, True))
            for message in following:
                scan.cursor = delivery_order(message)
                scan.examined += 1
                if message.expires_at is not None and message.expires_at <= now:
                    expired.append(message)
                elif not (message.excluded and consumer in message.excluded) and selects(consumer.selector, message):
                    chosen = message
                    break
        return chosen, expired

    @staticmethod
    def available(consumer: Consumer) -> int:
        """The ``available`` of our flows on ``consumer``'s link (§2.7.4: messages the sender has ready): the
        queue's ready messages, for a browser those past its cursor. A selector's are not sifted (that would cost
        a scan of the queue): ``available`` is advisory."""
        ready = consumer.queue.ready
        if consumer.browser and consumer.cursor is not None:
            past: int = ready.bisect_key_right(consumer.cursor)  # ready messages at or before the cursor
            return len(ready) - past
        return len(ready)

    def _dispatch_browsers(self, queue: Queue, group: ConsumerGroup) -> None:
        for browser in group.browsers:
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
                browser.conn.deliver(browser.link, message.encoded(), settled=browser.presettled)
                self.outbox.touch(browser.conn)

    def _send(self, consumer: Consumer, message: Message) -> None:
        """Deliver an acquired message on ``consumer``'s link."""
        if self.injection.rules and self._deliver_fault(consumer, message):
            return
        conn = consumer.conn
        presettled = consumer.presettled
        state = self.acquirer.transfer_state(consumer)
        locked_until = None
        if not consumer.servicebus:
            payload = message.encoded()
        else:
            session = self.sessions.lock_of(consumer)
            if session is not None:  # a session's messages are locked with their session, not each on its own
                payload = self._servicebus_payload(message, session.until)
            else:
                locked_until = self.clock.now + entity_properties(consumer.queue).lock_duration
                payload = self._servicebus_payload(message, locked_until)
        delivery = conn.deliver(consumer.link, payload, settled=presettled, state=state)
        self.outbox.dirty.add(conn)  # (``touch``'s one line, without its call: per delivery, issue 19)
        if state is not None:
            # §4.4.3: acquired under the transaction, settled or not, until it is discharged
            dispatched = consumer.unsettled[delivery] = Dispatched(consumer, delivery, message)
            self.acquirer.acquired(dispatched)
        elif presettled:
            consumer.queue.retire(message)
        else:
            dispatched = consumer.unsettled[delivery] = Dispatched(consumer, delivery, message)
            if locked_until is not None:
                # a Service Bus peek-lock: it runs out on the broker clock (``_lock_expired``), a core timer
                dispatched.lock = self.timers.lock(locked_until, dispatched)
                self._new_deadline()

    def _servicebus_payload(self, message: Message, locked_until: float) -> bytes:
        """A message as it goes to a Service Bus receiver: sequence number, lock time and state annotated, the
        header's delivery-count written (``minibroker.servicebus.messages``)."""
        wall = self.clock.wall_ms(locked_until)
        return message.rewritten(sb_messages.delivery_annotations(message.seq, wall))

    def locked_on(self, queue: Queue) -> list[Message]:
        """The messages of ``queue`` out on consumer links, unsettled. O(consumers and their unsettled
        deliveries): for a Service Bus peek-message only."""
        return [
            dispatched.message
            for consumers in self._by_conn.values()
            for consumer in consumers
            if consumer.queue is queue and not consumer.browser
            for dispatched in consumer.unsettled.values()
        ]

    def renew_lock(self, conn: ServerConnection, tag: bytes) -> float | None:
        """Renew the peek-lock of ``conn``'s unsettled Service Bus delivery tagged ``tag`` (the lock token) for
        another lock duration from now: its new end on the broker clock, or None when it holds no lock (settled,
        or the lock ran out). O(unsettled deliveries of the connection): renew-lock is a rare request."""
        for consumer in self._by_conn.get(conn, ()):
            if not consumer.servicebus:
                continue
            for dispatched in consumer.unsettled.values():
                lock = dispatched.lock
                if lock is not None and lock.alive and dispatched.delivery.tag == tag:
                    lock.cancel()
                    until = self.clock.now + entity_properties(consumer.queue).lock_duration
                    dispatched.lock = self.timers.lock(until, dispatched)
                    self._new_deadline()
                    return until
        return None

    # -- locks of deferred messages (``$management`` receive-by-sequence-number) ----------------------------
    def lock_deferred(self, token: uuid.UUID, queue: Queue, seq: int) -> float:
        """Lock the deferred message ``seq`` of ``queue`` under ``token`` for the entity's lock duration; the
        lock's end on the broker clock. When it runs out the token holds nothing and the message stays deferred
        (as Service Bus keeps it: learn.microsoft.com "Message deferral")."""
        until = self.clock.now + entity_properties(queue).lock_duration
        held = DeferredLock(token, queue, seq)
        held.timer = self.timers.lock(until, held)
        self.deferred_locks[token] = held
        self._new_deadline()
        return until

    def renew_deferred(self, token: uuid.UUID) -> float | None:
        """Renew the lock ``token`` holds on a deferred message for another lock duration from now: its new end,
        or None when it holds none (settled, or run out)."""
        held = self.unlock_deferred(token)
        return None if held is None else self.lock_deferred(token, held.queue, held.seq)

    def unlock_deferred(self, token: uuid.UUID) -> DeferredLock | None:
        """Give up the lock ``token`` holds on a deferred message (it was settled); that lock, or None."""
        held = self.deferred_locks.pop(token, None)
        if held is not None and held.timer is not None:
            held.timer.cancel()
        return held

    def _lock_expired(self, lock: Lock) -> None:
        """A Service Bus peek-lock ran out: the message goes back, a delivery counted (as an abandon does); the
        receiver's late settlement of it is answered ``com.microsoft:message-lock-lost`` (``Coordinator``)."""
        dispatched = lock.holder
        lock.holder = None  # (out of the heap already)
        if isinstance(dispatched, SessionLock):
            self._session_lost(dispatched)
            return
        if isinstance(dispatched, Waiter):
            self.sessions.timed_out(dispatched)
            return
        if isinstance(dispatched, DeferredLock):
            if self.deferred_locks.get(dispatched.token) is dispatched:
                del self.deferred_locks[dispatched.token]  # the message stays deferred
            return
        if not isinstance(dispatched, Dispatched) or dispatched.lock is not lock:
            return
        dispatched.lock = None
        consumer = dispatched.consumer
        if consumer.unsettled.get(dispatched.delivery) is not dispatched or self.acquirer.holds(dispatched):
            return  # settled meanwhile, or a transaction decides its fate
        self.finish(dispatched, _LOCK_LOST_OUTCOME)
        self.dispatch(consumer.queue)

    def _session_lost(self, lock: SessionLock) -> None:
        """A Service Bus session lock ran out: the session is let go, the messages out on its receiver go back (a
        delivery counted, as for a peek-lock) unless a transaction holds them, and the receiver's link is detached
        with ``com.microsoft:session-lock-lost`` (``SessionLockLostError`` in the SDK, also for a late settlement).
        """
        if not self.sessions.expired(lock):
            return  # released or renewed meanwhile
        consumer = lock.consumer
        self._leave_group(consumer)
        for dispatched in list(consumer.unsettled.values()):
            if not self.acquirer.holds(dispatched):
                self.finish(dispatched, _LOCK_LOST_OUTCOME)
        consumer.conn.detach(consumer.link, sb_sessions.lock_lost(lock.session_id))
        self.outbox.touch(consumer.conn)
        self.dispatch(consumer.queue)

    def _deliver_fault(self, consumer: Consumer, message: Message) -> bool:
        """Fault point ``deliver`` (a message going to a consumer, matched on its queue's node): ``delay`` makes the
        acquired message wait as a redelivery delay does, then go out; ``drop-connection`` puts it back and cuts the
        consumer's connection. Whether a rule fired (then nothing was sent)."""
        if self._late.pop(id(message), None) is not None:
            return False  # its delay is over
        queue = consumer.queue
        rule = self.injection.fire("deliver", consumer.conn, queue.node_name)
        if rule is None:
            return False
        if rule.action == "delay":
            self._late[id(message)] = message
            queue.unacquire_for_later(message)
            self.timers.due(self.clock.now + rule.delay, [(queue, message)])
            self._new_deadline()
        else:
            queue.requeue(message)
            self.injection.drop(consumer.conn)
        return True

    # -- outcomes -----------------------------------------------------------------------------------
    def apply_outcome(self, conn: ServerConnection, deliveries: list[Dispatched], state: object, settled: bool) -> None:
        """The consumer's disposition (§3.4) of deliveries no transaction holds.

        A terminal outcome applies; a delivery settled without one gets the source's default outcome
        (§3.5.3); a non-terminal state leaves it acquired. What the consumer left unsettled we settle, with
        the outcome it gave.
        """
        queues: set[Queue] = set()
        to_settle = []
        given = state if is_outcome(state) else None
        for dispatched in deliveries:
            if given is not None:
                outcome = given
            elif settled:
                outcome = dispatched.consumer.default_outcome
            else:
                continue
            self.finish(dispatched, outcome)
            queues.add(dispatched.consumer.queue)
            if dispatched.delivery.open:
                to_settle.append(dispatched.delivery)
        if isinstance(given, Rejected) and given.error is not None and self.nodes.personality_of(conn).servicebus:
            # Service Bus echoes a dead-letter as a rejected without its error (issue 17); echoed with it,
            # azure-servicebus 7.15's ``dead_letter_message`` never returned (tests/servicebus/test_sdk.py)
            given = Rejected()
        self.outbox.settle(conn, to_settle, given)  # (only a delivery given an outcome can be left to settle)
        self.dispatch_all(queues)

    def finish(self, dispatched: Dispatched, outcome: Outcome) -> None:
        """Apply a terminal outcome to a dispatched message and forget the delivery (the caller dispatches)."""
        consumer = dispatched.consumer
        consumer.unsettled.pop(dispatched.delivery, None)
        if dispatched.lock is not None:
            dispatched.lock.cancel()
            dispatched.lock = None
        message = dispatched.message
        queue = consumer.queue
        if isinstance(outcome, Accepted):
            queue.retire(message)
            return
        servicebus = queue.namespace is not None and queue.namespace.personality.servicebus
        if isinstance(outcome, Rejected):
            description = outcome.error.description if outcome.error is not None else None
            if servicebus:
                reason, description = sb_messages.dead_letter_info(outcome.error.info if outcome.error else None)
                with self.recorder.together():
                    queue.retire(message)
                    self.servicebus_dead_letter(queue, message, reason, description)
                return
            with self.recorder.together():  # leaving the queue and reaching the DLQ: one record
                queue.retire(message)
                self._dead_letter(queue, message, "rejected", description)
            return
        # released or modified: the message goes back
        delivery = dispatched.delivery
        if not delivery.complete:
            # frames of it are still held back by the consumer's session window: abort it (§2.6.14), so that
            # consumer never gets the whole message while it goes to another
            consumer.conn.abort(delivery)
            self.outbox.touch(consumer.conn)
        if queue.deleted:
            queue.retire(message)  # its node is gone: there is nothing to go back to
            return
        if isinstance(outcome, Modified):
            if outcome.message_annotations:
                message.annotate(outcome.message_annotations)
            if outcome.undeliverable_here and servicebus:
                # Service Bus defer: set aside, never delivered again (``receive-by-sequence-number`` fetches it)
                queue.retire(message)
                self.deferred.setdefault(queue, {})[message.seq] = message
                return
            if outcome.undeliverable_here:
                if message.excluded is None:
                    message.excluded = WeakSet()
                message.excluded.add(consumer)
            if outcome.delivery_failed or servicebus:
                # Service Bus counts every abandon, with delivery-failed (azure-servicebus) or without it
                # (@azure/service-bus ``settleMessage``: ``modified({undeliverable_here: false})``).
                # The count is a uint (§3.2.1): saturates rather than wrapping or overflowing the header
                if message.delivery_count < MAX_DELIVERY_COUNT:
                    message.delivery_count += 1
                limit = queue.policy.max_delivery_attempts
                most = entity_properties(queue).max_delivery_count if servicebus else 0
                if most and message.delivery_count >= most:
                    with self.recorder.together():
                        queue.retire(message)
                        self.servicebus_dead_letter(
                            queue,
                            message,
                            sb_messages.MAX_DELIVERY_REASON,
                            f"Message could not be consumed after {most} delivery attempts.",
                        )
                    return
                if limit and message.delivery_count >= limit:
                    with self.recorder.together():
                        queue.retire(message)
                        self._dead_letter(
                            queue, message, "max-delivery-attempts", f"delivery failed {message.delivery_count} times"
                        )
                    return
                dropped_after = queue.namespace.personality.redelivery_limit if queue.namespace is not None else 0
                if dropped_after and message.delivery_count > dropped_after:
                    # a personality's redelivery limit: Qpid Proton's example broker drops a failed message whose
                    # delivery-count had already reached it (_modify_delivery checks before counting)
                    queue.retire(message)
                    return
                self.recorder.counted(queue, message)
        if message.expires_at is not None and message.expires_at <= self.clock.now:
            with self.recorder.together():
                queue.retire(message)
                self._expire(queue, message)
            return
        delay = queue.policy.redelivery_delay
        if delay > 0:
            queue.unacquire_for_later(message)
            self.timers.due(self.clock.now + delay, [(queue, message)])
            self._new_deadline()
            return
        queue.requeue(message)

    def _dead_letter(self, queue: Queue, message: Message, reason: str, description: str | None) -> None:
        """Move a message (already out of ``queue``'s counts) to the node's dead-letter address (or through its
        dead-letter exchange)."""
        if queue.policy.dead_letter_exchange is not None:
            self.dead_letter_exchange(queue, message, _RABBIT_REASONS.get(reason, reason))
            return
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

    def servicebus_dead_letter(
        self, queue: Queue, message: Message, reason: str | None, description: str | None
    ) -> None:
        """Service Bus dead-lettering: to ``<entity>/$DeadLetterQueue``, the reason and description as
        application-properties, the entity in ``x-opt-deadletter-source`` (``minibroker.servicebus.messages``)."""
        entity = servicebus_entity(queue)
        namespace = queue.namespace if queue.namespace is not None else self.nodes.default
        address = sb_addresses.dead_letter_queue(entity)
        node = namespace.node(address) or self.nodes.create(namespace, address, QUEUE, auto=True)
        rest = sb_messages.with_application_properties(
            message.payload,
            message.properties_start,
            {sb_messages.DEAD_LETTER_REASON: reason, sb_messages.DEAD_LETTER_DESCRIPTION: description},
        )
        copy = message.copy()
        copy.annotate({}, copy.rewritten({sb_messages.DEAD_LETTER_SOURCE: entity}, rest))
        copy.expires_at = None
        copy.deliver_at = None
        copy.excluded = None
        if self.admit(node, copy, None) is None:
            self.dispatch_all(self.post(node, copy, None))

    def _expire(self, queue: Queue, message: Message) -> None:
        """An expired message (already out of ``queue``'s counts) goes to the expiry address, or away; from a
        Service Bus entity with ``DeadLetteringOnMessageExpiration``, to its dead-letter queue with reason
        ``TTLExpiredException``, as Service Bus does."""
        namespace = queue.namespace
        configured = namespace is not None and bool(namespace.servicebus_entities)
        if configured and entity_properties(queue).dead_lettering_on_message_expiration:
            self.servicebus_dead_letter(queue, message, TTL_EXPIRED, TTL_EXPIRED_DESCRIPTION)
            return
        if queue.policy.dead_letter_exchange is not None:
            self.dead_letter_exchange(queue, message, "expired")
            return
        target = queue.policy.expiry_address
        if target:
            self._forward(queue, message, target, {"x-opt-original-address": queue.node_name})

    def _dead_letter_refused(self, targets: list[Queue], message: Message) -> None:
        """A post refused at a limit: each full ``reject-publish-dlx`` queue among ``targets`` dead-letters it."""
        for queue in targets:
            if queue.policy.overflow == REJECT_PUBLISH_DLX and not queue.has_room(message):
                self.dead_letter_exchange(queue, message, "maxlen")

    def dead_letter_exchange(self, queue: Queue, message: Message, reason: str) -> None:
        """Republish a message that left ``queue`` (rejected, expired, dropped at its length limit: ``reason`` as
        RabbitMQ names it) through the queue's dead-letter exchange, with the dead-letter routing key or else its
        own (its ``x-routing-key``, else the queue's name, as the default exchange reached it), as
        rabbit_dead_letter.erl does: its ``x-exchange`` and ``x-routing-key`` become the dead-letter exchange and
        that key, while its death records the exchange and key it had; annotated ``x-first-death-reason``/
        ``-queue``/``-exchange`` (the first time), ``x-last-death-*``, and ``x-opt-deaths`` (RabbitMQ 4's AMQP 1.0
        form of ``x-death``: mc_amqp.erl ``encode_deaths``). A missing exchange drops it; a message that would come
        back to ``queue`` itself without having been rejected is dropped (RabbitMQ's cycle rule, for the one-queue
        cycle)."""
        namespace = queue.namespace if queue.namespace is not None else self.nodes.default
        policy = queue.policy
        name = policy.dead_letter_exchange
        exchange = namespace.exchanges.get(name) if name is not None else None
        if exchange is None:
            return
        own = message.annotation("x-routing-key") if message.annotations else None
        own_key = own if isinstance(own, str) else queue.node_name
        key = policy.dead_letter_routing_key
        if key is None:
            key = own_key
        original = message.annotation("x-exchange") if message.annotations else None
        death = {"reason": reason, "queue": queue.node_name, "exchange": original if isinstance(original, str) else ""}
        annotations: dict[str, Any] = {f"x-last-death-{k}": v for k, v in death.items()}
        if not message.annotations or "x-first-death-reason" not in message.annotations:
            annotations.update({f"x-first-death-{k}": v for k, v in death.items()})
        annotations["x-opt-deaths"] = self._deaths(message, death, own_key)
        annotations["x-exchange"], annotations["x-routing-key"] = exchange.name, key  # what it is published with
        copy = message.copy()
        copy.annotate(annotations)
        copy.expires_at = None
        copy.deliver_at = None
        copy.excluded = None
        targets = self.targets(Route(namespace, exchange, key), copy, None)
        if reason != "rejected":
            targets = [target for target in targets if target is not queue]
        if targets and _refusal(targets, copy) is None:
            self._enqueue_all(targets, copy)
            self.dispatch_all(targets)

    def _deaths(self, message: Message, death: dict[str, str], key: str) -> list[dict[Symbol, Any]]:
        """The message's ``x-opt-deaths`` with this death counted: one map per (queue, reason), the latest first,
        its count, first and last time (wall-clock ms), exchange and routing keys (mc_amqp.erl ``encode_deaths``)."""
        now = Timestamp(self.clock.wall_ms())
        queue_key, reason_key = Symbol("queue"), Symbol("reason")
        found = message.annotation("x-opt-deaths") if message.annotations else None
        earlier = [d for d in found if isinstance(d, dict)] if isinstance(found, list) else []
        same = next(
            (d for d in earlier if d.get(queue_key) == death["queue"] and d.get(reason_key) == death["reason"]), None
        )
        count = int(same.get(Symbol("count"), 0)) + 1 if same is not None else 1
        entry = {
            queue_key: death["queue"],
            reason_key: Symbol(death["reason"]),
            Symbol("count"): ULong(min(count, 2**64 - 1)),
            Symbol("first-time"): same.get(Symbol("first-time"), now) if same is not None else now,
            Symbol("last-time"): now,
            Symbol("exchange"): death["exchange"],
            Symbol("routing-keys"): [key],
        }
        return [entry, *(d for d in earlier if d is not same)]

    def _forward(self, queue: Queue, message: Message, address: str, annotations: dict[str, Any]) -> None:
        namespace = queue.namespace if queue.namespace is not None else self.nodes.default
        node = namespace.node(address) or self.nodes.create(namespace, address, QUEUE, auto=True)
        copy = message.copy()
        last = self._forwarded
        same = last is not None and last[0] is message.payload and last[1:3] == (copy.delivery_count, annotations)
        if last is not None and same:
            copy.annotate(annotations, last[3])  # the same bytes: one copy in memory, one in the journal
        else:
            copy.annotate(annotations)
            self._forwarded = (message.payload, copy.delivery_count, annotations, copy.payload)
        copy.expires_at = None
        copy.deliver_at = None
        copy.excluded = None
        if self.admit(node, copy, None) is None:
            self.dispatch_all(self.post(node, copy, None))

    # -- timers ---------------------------------------------------------------------------------------
    def next_deadline(self) -> float | None:
        return self.timers.next_deadline()

    def handle_timeout(self, now: float, contain: Callable[[str, Callable[[], None]], object] | None = None) -> None:
        """Run every message timer due at ``now``: expiries and scheduled deliveries (with ``contain``, each on its
        own: an error in one is logged and the others still run)."""
        for entry in self.timers.pop_due(now):
            if contain is None:
                self._fire(entry)
            else:
                contain("a message timer", partial(self._fire, entry))

    def _fire(self, entry: Expiry | Due | Lock) -> None:
        if isinstance(entry, Expiry):
            self._expired(entry)
        elif isinstance(entry, Lock):
            self._lock_expired(entry)
        else:
            self._due(entry)

    def _expired(self, entry: Expiry) -> None:
        """The copies of one post reach their expiry time: each still ready is expired (an acquired or scheduled
        one is checked when it comes back)."""
        queues, key = entry.queues, entry.key
        entry.queues = None  # out of the heap: copies that leave from now on need not tell it
        now = self.clock.now
        for queue in queues or ():
            if queue.deleted:
                continue
            message = next(iter(queue.ready.irange_key(key, key)), None)
            if message is None or message.expires_at is None or message.expires_at > now:
                continue
            with self.recorder.together():
                queue.remove_ready(message)
                self._expire(queue, message)

    def _due(self, entry: Due) -> None:
        """Scheduled messages (or ones waiting out a redelivery delay) become visible."""
        items, entry.items = entry.items, []
        now = self.clock.now
        touched: dict[Queue, None] = {}
        for queue, message in items:
            if queue.deleted:
                continue
            if message.expires_at is not None and message.expires_at <= now:
                with self.recorder.together():
                    queue.drop_scheduled(message)
                    self._expire(queue, message)
                continue
            queue.release_scheduled(message)
            message.deliver_at = None
            queue.put(message)
            touched[queue] = None
        self.dispatch_all(touched)
