"""The ``ENTITY/$management`` node of the ``servicebus`` personality (issue 17 item 6): what each operation does
to the broker's queues. Encoding is ``minibroker.servicebus.management``; requests reach here through the
service links (``services.py``).

Operations (as the Python SDK sends them, ``_servicebus_receiver.py`` / ``_servicebus_sender.py``):

- ``peek-message`` (``from-sequence-number``, ``message-count``): the entity's messages (ready, locked by a
  receiver, deferred and scheduled) from that sequence number on, in sequence order, locking nothing; 204 when
  there are none; with ``session-id`` (a session receiver's), that session's messages only;
- ``schedule-message`` (``messages``: each ``message`` encoded, with ``x-opt-scheduled-enqueue-time``): posted
  as a scheduled transfer is, answered with their ``sequence-numbers``;
- ``cancel-scheduled-message`` (``sequence-numbers``): those still waiting are dropped;
- ``receive-by-sequence-number`` (``sequence-numbers``, ``receiver-settle-mode``): deferred messages, each with a
  lock token (or removed, for receive-and-delete); 404 ``message-not-found`` when one is not deferred;
- ``update-disposition`` (``disposition-status``, ``lock-tokens``): settles messages received that way;
- on ``TOPIC/Subscriptions/NAME/$management``, the rule operations as the JS SDK sends them
  (``core/managementClient.ts`` ``addRule``, ``removeRule``, ``getRules``; encoding in
  ``minibroker.servicebus.rules``): ``add-rule`` (``rule-name``, ``rule-description``; 409
  ``entity-already-exists`` for a name taken, 400 for a bad description, filter or action, 403
  ``resource-limit-exceeded`` past 2000 rules), ``remove-rule``
  (``rule-name``; 404 ``amqp:not-found`` for an unknown one), ``enumerate-rules`` (``skip``, ``top``: ``rules``,
  each a map with its ``rule-description``; 204 when there are none).
- the session operations (``minibroker.servicebus.sessions``; the sessions themselves are ``sessions.py``):
  ``renew-session-lock``, ``get-session-state`` and ``set-session-state`` on a session one of the requesting
  connection's receivers holds (410 ``session-lock-lost`` otherwise), ``get-message-sessions`` (``skip``,
  ``top``, ``last-updated-time``; 204 when there are none).
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from minibroker.broker.clock import BrokerClock
from minibroker.broker.dispatch import Dispatcher, entity_properties, servicebus_entity
from minibroker.broker.message import Message
from minibroker.broker.namespace import QUEUE, TOPIC, Node
from minibroker.broker.nodes import Nodes
from minibroker.broker.queue import Queue
from minibroker.broker.session_gate import SessionGate
from minibroker.broker.sessions import missing_session
from minibroker.broker.topic import Subscription, Topic
from minibroker.engine.connection import ServerConnection
from minibroker.servicebus import addresses as sb_addresses
from minibroker.servicebus import management as sb_management
from minibroker.servicebus import messages as sb_messages
from minibroker.servicebus import rules as sb_rules
from minibroker.servicebus import sessions as sb_sessions
from minibroker.servicebus.cbs import Request, read_request


class Management:
    """The ``$management`` operations of one broker."""

    def __init__(
        self,
        nodes: Nodes,
        dispatcher: Dispatcher,
        clock: BrokerClock,
        arrival: Callable[[bytes], bytes],
        lock_tokens: Iterator[uuid.UUID] | None = None,
    ) -> None:
        """``lock_tokens``: the tokens given to deferred messages received by sequence number (a test may inject
        them; by default unguessable, as the broker draws no randomness inline)."""
        self.nodes = nodes
        self._lock_tokens = lock_tokens if lock_tokens is not None else _random_tokens()
        self.dispatcher = dispatcher
        self.clock = clock
        self.arrival = arrival
        """What a Service Bus entity does to a message it takes (``Endpoints._servicebus_arrival``)."""

    def answer(self, conn: ServerConnection, node: str, payload: bytes) -> bytes:
        """The answer to the request ``payload`` sent to the management node ``node`` (``ENTITY/$management``)."""
        request = read_request(payload)
        operation = request.operation
        body = sb_management.body(payload)
        entity = node[: -len(sb_addresses.MANAGEMENT)].rstrip("/")
        if operation == sb_management.SCHEDULE:
            return self._schedule(conn, request, entity, body)
        if operation == sb_management.RENEW_LOCK:
            return self._renew_lock(conn, request, body)
        if operation == sb_management.UPDATE_DISPOSITION:
            return self._update_disposition(request, body)
        if operation in _RULE_OPERATIONS:
            return self._rules(request, operation, self._subscription(conn, entity), body)
        queue = self._queue(conn, entity)
        if operation in _SESSION_OPERATIONS:
            return self._session_operation(conn, request, operation, queue, body)
        if operation == sb_management.PEEK:
            return self._peek(request, queue, body)
        if operation == sb_management.CANCEL_SCHEDULED:
            return self._cancel(request, body)
        if operation == sb_management.RECEIVE_BY_SEQUENCE_NUMBER:
            return self._receive_deferred(request, queue, body)
        return sb_management.response(
            request, sb_management.NOT_IMPLEMENTED, f"$management operation {operation!r} is not implemented"
        )

    def _node(self, conn: ServerConnection, entity: str) -> Node | None:
        """The node ``entity`` names, created as an attach would: ``TOPIC/Subscriptions/NAME`` makes a topic (a
        JS SDK receiver peeks before its first receive attaches the link), a subscription's sub-queue is a queue."""
        named = sb_addresses.subscription(entity)
        if named is None:
            return self.nodes.lookup(conn, entity, None)
        if named[2]:
            return self.nodes.lookup(conn, sb_addresses.sub_queue_node(*named), QUEUE)
        topic = self.nodes.lookup(conn, named[0], TOPIC)
        return topic if isinstance(topic, Topic) else None  # a queue has no subscriptions

    def _queue(self, conn: ServerConnection, entity: str) -> Queue | None:
        """The queue behind ``entity`` (a queue, or ``TOPIC/Subscriptions/NAME``), created as an attach would."""
        node = self._node(conn, entity)
        named = sb_addresses.subscription(entity)
        if isinstance(node, Topic):
            if named is None:
                return None
            return self.nodes.servicebus_subscription(node, named[1])
        return node

    def _subscription(self, conn: ServerConnection, entity: str) -> Subscription | None:
        """The subscription ``TOPIC/Subscriptions/NAME`` names, created (with its topic) when it is not there yet,
        as a receiver's attach would: the JS SDK's rule manager opens no receiver. None when ``entity`` names no
        subscription, or the name is a queue's."""
        named = sb_addresses.subscription(entity)
        if named is None:
            return None
        topic = self.nodes.lookup(conn, named[0], TOPIC)
        return self.nodes.servicebus_subscription(topic, named[1]) if isinstance(topic, Topic) else None

    # -- peek ---------------------------------------------------------------------------------------------
    def _peek(self, request: Request, queue: Queue | None, body: dict[str, Any]) -> bytes:
        start = body.get("from-sequence-number")
        count = body.get("message-count")
        start = start if isinstance(start, int) else 0
        count = count if isinstance(count, int) and count > 0 else 1
        found: list[tuple[int, Message, int]] = []
        if queue is not None:
            found += [(m.seq, m, sb_messages.ACTIVE) for m in queue.ready if m.seq >= start]
            found += [(m.seq, m, sb_messages.ACTIVE) for m in self.dispatcher.locked_on(queue) if m.seq >= start]
            scheduled = self.dispatcher.timers.scheduled_on(queue)
            found += [(m.seq, m, sb_messages.SCHEDULED) for m in scheduled if m.seq >= start]
            deferred = self.dispatcher.deferred.get(queue, {})
            found += [(seq, m, sb_messages.DEFERRED) for seq, m in deferred.items() if seq >= start]
        session_id = body.get("session-id")
        if isinstance(session_id, str):  # a session receiver peeks at its session's messages only
            wanted = SessionGate(session_id)
            found = [item for item in found if wanted.admits(item[1])]
        found.sort(key=lambda item: item[0])
        if not found:
            return sb_management.response(request, sb_management.NO_CONTENT, "No messages to peek")
        encoded = [
            message.rewritten(sb_messages.delivery_annotations(seq, None, state))
            for seq, message, state in found[:count]
        ]
        return sb_management.response(request, sb_management.OK, "OK", sb_management.messages_value(encoded))

    # -- scheduling ---------------------------------------------------------------------------------------
    def _schedule(self, conn: ServerConnection, request: Request, entity: str, body: dict[str, Any]) -> bytes:
        node = self._node(conn, entity)
        if node is None:
            return sb_management.response(request, sb_management.NOT_FOUND, f"no entity {entity!r}")
        numbers: list[int] = []
        for entry in sb_management.items(body.get("messages")):
            encoded = entry.get("message") if isinstance(entry, dict) else None
            if not isinstance(encoded, bytes | bytearray):
                return sb_management.response(request, sb_management.BAD_REQUEST, "a scheduled message is missing")
            message = Message(self.arrival(bytes(encoded)))
            if message.malformed is not None:
                return sb_management.response(request, sb_management.BAD_REQUEST, f"a message: {message.malformed}")
            self.dispatcher.servicebus_arrive(node, message)
            requires_session = isinstance(node, Queue) and entity_properties(node).requires_session
            missing = missing_session(requires_session, message)
            refusal = missing or self.dispatcher.inject(node, message)
            if refusal is not None:
                condition = str(missing.condition) if missing is not None else None  # (not retried by the SDK)
                return sb_management.response(
                    request, sb_management.BAD_REQUEST, str(refusal.description), condition=condition
                )
            numbers.append(message.seq)
        return sb_management.response(request, sb_management.OK, "OK", sb_management.sequence_numbers_value(numbers))

    def _cancel(self, request: Request, body: dict[str, Any]) -> bytes:
        now = self.clock.now
        timers = self.dispatcher.timers
        for seq in sb_management.items(body.get("sequence-numbers")):
            if not isinstance(seq, int):
                continue
            for queue, message in timers.scheduled(seq):
                if message.deliver_at is not None and message.deliver_at > now and not queue.deleted:
                    queue.drop_scheduled(message)
                    timers.discard_message(message)
        return sb_management.response(request, sb_management.OK, "OK")

    # -- locks ------------------------------------------------------------------------------------------
    def _renew_lock(self, conn: ServerConnection, request: Request, body: dict[str, Any]) -> bytes:
        """Each lock token's peek-lock renewed for another lock duration (410 ``message-lock-lost`` when one
        holds no lock: settled, or run out); ``expirations`` in wall-clock ms."""
        expirations: list[int] = []
        for token in sb_management.items(body.get("lock-tokens")):
            until = None
            if isinstance(token, uuid.UUID):
                until = self.dispatcher.renew_lock(conn, token.bytes_le)  # the delivery-tag (``lock_token``)
                if until is None:
                    until = self.dispatcher.renew_deferred(token)  # a deferred message received by number
            if until is None:
                return sb_management.response(
                    request,
                    sb_management.GONE,
                    f"the lock of {token} is lost",
                    condition=sb_management.MESSAGE_LOCK_LOST,
                )
            expirations.append(self.clock.wall_ms(until))
        return sb_management.response(request, sb_management.OK, "OK", sb_management.expirations_value(expirations))

    # -- deferred messages ----------------------------------------------------------------------------
    def _receive_deferred(self, request: Request, queue: Queue | None, body: dict[str, Any]) -> bytes:
        deferred = self.dispatcher.deferred.get(queue, {}) if queue is not None else {}
        wanted = [seq for seq in sb_management.items(body.get("sequence-numbers")) if isinstance(seq, int)]
        missing = [seq for seq in wanted if seq not in deferred]
        if queue is None or missing:
            return sb_management.response(
                request,
                sb_management.NOT_FOUND,
                f"no deferred message with sequence number {missing[0] if missing else wanted}",
                condition=sb_management.MESSAGE_NOT_FOUND,
            )
        delete = body.get("receiver-settle-mode") == 0  # ReceiverSettleMode.First: receive-and-delete
        encoded, tokens = [], []
        locked_until = self.clock.now + entity_properties(queue).lock_duration
        for seq in wanted:
            message = deferred[seq]
            if delete:
                del deferred[seq]
                token = None
            else:
                token = next(self._lock_tokens)
                locked_until = self.dispatcher.lock_deferred(token, queue, seq)
            annotations = sb_messages.delivery_annotations(seq, self.clock.wall_ms(locked_until), sb_messages.DEFERRED)
            encoded.append(message.rewritten(annotations))
            tokens.append(token)
        value = sb_management.messages_value(encoded, None if delete else tokens)
        return sb_management.response(request, sb_management.OK, "OK", value)

    # -- subscription rules -------------------------------------------------------------------------------
    def _rules(self, request: Request, operation: str, queue: Queue | None, body: dict[str, Any]) -> bytes:
        """add-rule, remove-rule and enumerate-rules on a subscription's rules (``Dispatcher.subscription_rules``)."""
        if not isinstance(queue, Subscription):
            rules_of = f"{servicebus_entity(queue)}/Rules" if queue is not None else "Rules"
            detail = "Rules live on a subscription (TOPIC/Subscriptions/NAME/$management)."
            return sb_management.entity_not_found(request, rules_of, detail)
        rules = self.dispatcher.subscription_rules(queue)
        name = body.get("rule-name")
        if operation == sb_management.ENUMERATE_RULES:
            return self._enumerate_rules(request, rules, body)
        if operation == sb_management.REMOVE_RULE:
            if not isinstance(name, str) or name not in rules:
                return sb_management.entity_not_found(request, f"{servicebus_entity(queue)}/Rules/{name}")
            del rules[name]
            return sb_management.response(request, sb_management.OK, "OK")
        try:
            spec = sb_rules.parse_description(name, body.get("rule-description"))
            rule = sb_rules.compile_rule(spec, self.nodes.settings.max_selector_length or None)
        except sb_rules.RuleError as exc:
            return sb_management.response(request, sb_management.BAD_REQUEST, f"invalid rule: {exc}")
        if len(rules) >= sb_rules.MAX_RULES:
            return sb_management.response(
                request,
                sb_management.FORBIDDEN,
                f"a subscription holds at most {sb_rules.MAX_RULES} rules",
                condition=sb_management.QUOTA_EXCEEDED,
            )
        if spec.name in rules:
            return sb_management.response(
                request,
                sb_management.CONFLICT,
                f"rule {spec.name!r} already exists",
                condition=sb_management.ENTITY_ALREADY_EXISTS,
            )
        self.dispatcher.add_rule(queue, rule, self.clock.wall_ms(self.clock.now))
        return sb_management.response(request, sb_management.OK, "OK")

    def _enumerate_rules(
        self, request: Request, rules: dict[str, tuple[sb_rules.Rule, int]], body: dict[str, Any]
    ) -> bytes:
        skip, top = body.get("skip", 0), body.get("top", 0)
        if not _count(skip) or not _count(top):  # as get-message-sessions: a bad count is no "all rules"
            return _argument_error(request, "skip and top are counts (ints >= 0)")
        chosen = list(rules.values())[skip : skip + (top or len(rules))]
        if not chosen:
            return sb_management.response(request, sb_management.NO_CONTENT, "No rules")
        value = [{"rule-description": sb_rules.description_value(rule.spec, created)} for rule, created in chosen]
        return sb_management.response(request, sb_management.OK, "OK", {"rules": value})

    def _update_disposition(self, request: Request, body: dict[str, Any]) -> bytes:
        status = body.get("disposition-status")
        for token in sb_management.items(body.get("lock-tokens")):
            held = self.dispatcher.unlock_deferred(token) if isinstance(token, uuid.UUID) else None
            if held is None and "session-id" in body:
                # a session receiver settles here once its link is gone: its session lock was lost
                return sb_management.response(
                    request,
                    sb_management.GONE,
                    f"the session of lock token {token} is not locked by this client",
                    condition=sb_sessions.SESSION_LOCK_LOST,
                )
            if held is None:  # settled already, or its lock ran out (then the message stays deferred)
                return sb_management.response(
                    request,
                    sb_management.GONE,
                    f"the lock of lock token {token} is lost: it is not held, or it expired",
                    condition=sb_management.MESSAGE_LOCK_LOST,
                )
            queue, seq = held.queue, held.seq
            deferred = self.dispatcher.deferred.get(queue, {})
            message = deferred.get(seq)
            if message is None:
                continue
            if status == sb_management.COMPLETED:
                del deferred[seq]
            elif status == sb_management.DEAD_LETTERED:
                del deferred[seq]
                reason, description = body.get("deadletter-reason"), body.get("deadletter-description")
                self.dispatcher.servicebus_dead_letter(
                    queue,
                    message,
                    reason if isinstance(reason, str) else None,
                    description if isinstance(description, str) else None,
                )
        return sb_management.response(request, sb_management.OK, "OK")

    # -- sessions ---------------------------------------------------------------------------------------
    def _session_operation(
        self, conn: ServerConnection, request: Request, operation: str, queue: Queue | None, body: dict[str, Any]
    ) -> bytes:
        """A session operation (``_servicebus_session.py``, ``_session_browser.py``) on ``queue``'s sessions."""
        sessions = self.dispatcher.sessions
        if operation == sb_sessions.GET_MESSAGE_SESSIONS:
            return self._list_sessions(request, queue, body)
        session_id = body.get("session-id")
        problem = sb_sessions.id_problem(session_id)
        if problem is not None:
            return _argument_error(request, f"session-id: {problem}")
        assert isinstance(session_id, str)
        holders = self.dispatcher.consumers_of(conn)
        if queue is None or sessions.holder(queue, session_id) not in holders:
            return sb_management.response(
                request,
                sb_management.GONE,
                f"session {session_id!r} is not locked by this client",
                condition=sb_sessions.SESSION_LOCK_LOST,
            )
        if operation == sb_sessions.RENEW_SESSION_LOCK:
            until = sessions.renew(queue, session_id, entity_properties(queue).lock_duration, holders)
            assert until is not None  # (held by one of ``holders``: checked above)
            value = sb_sessions.expiration_value(self.clock.wall_ms(until))
            return sb_management.response(request, sb_management.OK, "OK", value)
        if operation == sb_sessions.GET_SESSION_STATE:
            value = sb_sessions.state_value(sessions.state(queue, session_id))
            return sb_management.response(request, sb_management.OK, "OK", value)
        state = body.get("session-state")
        if state is not None and not isinstance(state, bytes | bytearray):
            return _argument_error(request, f"session-state is binary or null, not {type(state).__name__}")
        sessions.set_state(queue, session_id, bytes(state) if state is not None else None)
        return sb_management.response(request, sb_management.OK, "OK")

    def _list_sessions(self, request: Request, queue: Queue | None, body: dict[str, Any]) -> bytes:
        skip, top = body.get("skip", 0), body.get("top", _LIST_PAGE)
        if not _count(skip) or not _count(top):
            return _argument_error(request, "skip and top are counts (ints >= 0)")
        since = sb_sessions.listing_since(body.get("last-updated-time"))
        after = self.clock.from_wall_ms(since) if since is not None else None
        listed = self.dispatcher.sessions.listed(queue, after) if queue is not None else []
        page = listed[skip : skip + min(top, _LIST_PAGE)]
        if not page:
            return sb_management.response(request, sb_management.NO_CONTENT, "No sessions")
        value = sb_sessions.sessions_value(skip + len(page), page)
        return sb_management.response(request, sb_management.OK, "OK", value)


_SESSION_OPERATIONS = frozenset(
    {
        sb_sessions.RENEW_SESSION_LOCK,
        sb_sessions.GET_SESSION_STATE,
        sb_sessions.SET_SESSION_STATE,
        sb_sessions.GET_MESSAGE_SESSIONS,
    }
)
_LIST_PAGE = 100  # sessions answered at most per get-message-sessions (the SDKs ask for 100)


def _argument_error(request: Request, description: str) -> bytes:
    """A 400 answer with ``com.microsoft:argument-error``, which the SDK raises at once (not retried)."""
    return sb_management.response(request, sb_management.BAD_REQUEST, description, condition=sb_sessions.ARGUMENT_ERROR)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


_RULE_OPERATIONS = frozenset({sb_management.ADD_RULE, sb_management.REMOVE_RULE, sb_management.ENUMERATE_RULES})


def _random_tokens() -> Iterator[uuid.UUID]:
    """Lock tokens: 128 bits from ``secrets`` (as ``nodes._random_ids`` for dynamic addresses)."""
    while True:
        yield uuid.UUID(bytes=secrets.token_bytes(16))
