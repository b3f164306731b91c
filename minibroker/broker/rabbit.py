"""The RabbitMQ model's operations (issue 18): declare, bind, purge and delete queues and exchanges, as the 0-9-1
gateway asks for them, with RabbitMQ's answers.

Theory of operation
-------------------
Queues are the broker's ordinary queues (``Namespace.queues``): one declared here is reached by a 1.0 attach to
its name, and a queue a 1.0 client made can be bound to an exchange. What RabbitMQ adds is kept beside them: for
each queue declared here its declaration (durable, exclusive owner, auto-delete, arguments; ``Declaration``), so
that a re-declaration is checked for equivalence, exclusive queues go with their connection, auto-delete queues
with their last consumer; and per namespace its exchanges with their bindings (``exchanges.py``). The queue
arguments become the queue's ``NodePolicy`` (length limits and overflow, message ttl, dead-letter exchange,
delivery limit): RabbitMQ's policy, without minibroker's ``<name>.DLQ`` or delivery limit unless asked.

Every operation takes the connection it is done for (its namespace is the virtual host, its identity the owner
of exclusive queues; None: the default namespace, no owner, as the embedder) and raises
``RabbitError`` with RabbitMQ's reply code and text (rabbitmq/rabbitmq-server:
deps/rabbit/src/rabbit_channel.erl ``handle_method`` for queue.* and exchange.*, ``check_name``,
``check_not_default_exchange``, ``check_exchange_deletion``, ``binding_action``; rabbit_amqqueue.erl
``assert_equivalence``, ``check_exclusive_access``, ``declare_args``, ``delete_with``; rabbit_misc.erl
``assert_field_equivalence``, ``rs``). The 1.0 side meets the same rules at attach: another connection's exclusive
queue and a queue held by an exclusive consumer (link property ``rabbitmq:exclusive``) refuse it with
``amqp:resource-locked``; on a queue with ``x-single-active-consumer`` the first consumer gets every message while
the others wait (stopped: ``Dispatcher.stop``), the oldest taking over when it goes.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from minibroker.amqp.definitions import Error
from minibroker.amqp.errors import Condition, error
from minibroker.amqp.types import Symbol
from minibroker.broker import exchanges as ex
from minibroker.broker.dispatch import Dispatcher
from minibroker.broker.links import Consumer
from minibroker.broker.namespace import QUEUE, Namespace, Node
from minibroker.broker.nodes import Nodes
from minibroker.broker.policy import DROP_HEAD, REJECT_PUBLISH, REJECT_PUBLISH_DLX, NodePolicy
from minibroker.broker.queue import Queue
from minibroker.engine.connection import ServerConnection
from minibroker.engine.endpoints import Link

REPLY_CODE = Symbol("rabbitmq:reply-code")
"""Where a 1.0 refusal carries the 0-9-1 reply code the gateway closes the channel with, when the condition's
usual one is not RabbitMQ's (the error's info)."""
EXCLUSIVE_CONSUMER = Symbol("rabbitmq:exclusive")
GETTER = Symbol("rabbitmq:get")
"""The attach property of the link the gateway drains for ``basic.get``: no consumer (rabbit_channel.erl basic.get is
``rabbit_amqqueue:basic_get``), so not counted, never exclusive or active, and no use that arms an auto-delete queue;
each get is a use of an ``x-expires`` queue (``got_from``)."""
"""The attach property that asks for an exclusive consumer (what the gateway sends for basic.consume exclusive)."""
SERVER_NAMED = "amq.gen-"
OVERFLOWS = (DROP_HEAD, REJECT_PUBLISH, REJECT_PUBLISH_DLX)
QUEUE_TYPES = ("classic", "quorum")
_TYPE_ARGUMENTS = {
    # rabbit_classic_queue.erl / rabbit_quorum_queue.erl ``capabilities``: the arguments each type takes (those
    # of another type are refused; any other argument is kept and ignored, as RabbitMQ does)
    "classic": {"x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
                "x-max-length", "x-max-length-bytes", "x-max-priority", "x-overflow", "x-queue-mode",
                "x-queue-version", "x-single-active-consumer", "x-queue-type", "x-queue-master-locator",
                "x-queue-leader-locator"},
    "quorum": {"x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
               "x-dead-letter-strategy", "x-max-length", "x-max-length-bytes", "x-delivery-limit",
               "x-max-in-memory-length", "x-max-in-memory-bytes", "x-overflow", "x-single-active-consumer",
               "x-queue-type", "x-quorum-initial-group-size", "x-quorum-target-group-size",
               "x-queue-leader-locator"},
}  # fmt: skip
_KNOWN_ARGUMENTS = set().union(*_TYPE_ARGUMENTS.values())
_EQUIVALENT_ARGUMENTS = ("x-queue-type", "x-message-ttl", "x-expires", "x-dead-letter-exchange",
                         "x-dead-letter-routing-key", "x-max-length", "x-max-length-bytes", "x-max-priority",
                         "x-overflow", "x-single-active-consumer", "x-delivery-limit")  # fmt: skip
"""The arguments a re-declaration must repeat (rabbit_amqqueue.erl ``assert_args_equivalence``: the queue type's)."""
_MAX_TTL_MS = 315_360_000_000  # rabbit_misc.erl ``check_expiry``: at most ten years in ms


class RabbitError(Exception):
    """A refusal of the RabbitMQ model: the AMQP 0-9-1 reply code of the channel error RabbitMQ gives (one of the
    codes below; the gateway closes the channel with it) and RabbitMQ's text. Plain numbers, so the core loads
    nothing of the 0-9-1 wire definitions."""

    def __init__(self, reply_code: int, text: str) -> None:
        super().__init__(text)
        self.reply_code = reply_code
        self.text = text


ACCESS_REFUSED, NOT_FOUND, RESOURCE_LOCKED, PRECONDITION_FAILED = 403, 404, 405, 406
"""The 0-9-1 reply codes of the model's refusals (0-9-1 §1.3 constants, all soft errors)."""
_CODE_NAMES = {
    ACCESS_REFUSED: "ACCESS_REFUSED",
    NOT_FOUND: "NOT_FOUND",
    RESOURCE_LOCKED: "RESOURCE_LOCKED",
    PRECONDITION_FAILED: "PRECONDITION_FAILED",
}


def failure(code: int, text: str) -> RabbitError:
    """A 0-9-1 error as RabbitMQ words it: the reply code's name, then the text (``NOT_FOUND - no queue ...``)."""
    return RabbitError(code, f"{_CODE_NAMES[code]} - {text}")


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _field_type(value: Any) -> str:
    """The 0-9-1 field type RabbitMQ would name for an argument's value (in equivalence errors)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "longstr"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    return type(value).__name__


def _shown(value: Any) -> str:
    """An argument's value as rabbit_misc.erl ``val`` shows it (``none`` when absent)."""
    return "none" if value is None else f"the value '{value}' of type '{_field_type(value)}'"


@dataclass
class Declaration:
    """How a queue was declared through the model."""

    durable: bool
    exclusive: ServerConnection | None
    """The connection that owns it (an exclusive queue), or None."""
    auto_delete: bool
    arguments: dict[str, Any]
    had_consumer: bool = False
    """An auto-delete queue goes when its last consumer goes, once it had one."""
    exclusive_consumer: Consumer | None = None
    """A consumer that holds the queue alone (``rabbitmq:exclusive``)."""
    consumers: set[Consumer] = field(default_factory=set)
    active: Consumer | None = None
    """With ``x-single-active-consumer``: the one consumer that gets messages (the others wait, in ``waiting``)."""
    waiting: list[Consumer] = field(default_factory=list)
    expires: float | None = None
    """Seconds unused after which it is deleted (``x-expires``), or None."""
    used_at: float = 0.0
    """When it was last used: declared, or left by its last consumer (broker time)."""


class RabbitModel:
    """RabbitMQ's queues, exchanges and bindings over the broker's namespaces (``broker.rabbit``)."""

    def __init__(
        self,
        nodes: Nodes,
        dispatcher: Dispatcher,
        delete_node: Callable[[Node], None],
        ids: Iterator[str] | None = None,
    ) -> None:
        """``delete_node`` deletes a node and detaches its links (``Endpoints.delete_node``); ``ids`` make the names
        of server-named queues (``amq.gen-<id>``; by default 128 random bits)."""
        self.nodes = nodes
        self.dispatcher = dispatcher
        self.delete_node = delete_node
        self._ids = ids if ids is not None else _random_ids()
        self.declared: dict[Queue, Declaration] = {}
        """Queues declared through the model, with their declarations."""
        # exclusive queues per owner, in the order declared (an ordered set: they go with it in that order)
        self._owned: dict[ServerConnection, dict[Queue, None]] = {}
        self.later: Callable[[float, Callable[[], None]], None] | None = None
        """Runs a step that many seconds of broker time from now (set by the core: ``Injection.later``); without
        it ``x-expires`` deletes nothing."""

    # -- virtual hosts -------------------------------------------------------------------------------
    def vhost_exists(self, name: str) -> bool:
        """Whether ``name`` is a virtual host: a namespace ("/" is the default one)."""
        return name == "/" or name in self.nodes.namespaces

    def routable(self, conn: ServerConnection, exchange: str, routing_key: str, headers: Mapping[str, Any]) -> bool:
        """Whether a message published now to ``exchange`` ("" the default) with ``routing_key`` (and ``headers``,
        for a headers exchange) would reach a queue: what a channel transaction's mandatory publishes are checked
        with at tx.commit, where rabbit_channel.erl routes them and returns the unroutable ones."""
        namespace = self._namespace(conn)
        start = namespace.exchanges.get(exchange)
        if start is None:
            return False
        names = ex.route(namespace.exchanges, start, routing_key, lambda: headers)
        return any(name in namespace.queues for name in names)

    def _namespace(self, conn: ServerConnection | None) -> Namespace:
        return self.nodes.namespace_of(conn) if conn is not None else self.nodes.default

    # -- exchanges -----------------------------------------------------------------------------------
    def declare_exchange(
        self,
        conn: ServerConnection | None,
        name: str,
        kind: str,
        *,
        passive: bool = False,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: Mapping[str, Any] | None = None,
    ) -> None:
        """exchange.declare (rabbit_channel.erl): the type must be known (406), the default exchange is not
        declared (403), a new name must not start with ``amq.`` (403), an existing exchange must be declared alike
        (406 ``inequivalent arg``); passive: it must exist (404)."""
        namespace = self._namespace(conn)
        rs = _rs("exchange", name, namespace)
        if passive:
            _not_default(name)
            if name not in namespace.exchanges:
                raise failure(NOT_FOUND, f"no {rs}")
            return
        if kind not in ex.KINDS:
            raise failure(PRECONDITION_FAILED, f"unknown exchange type '{kind}'")
        _not_default(name)
        existing = namespace.exchanges.get(name)
        if existing is None:
            _check_name("exchange", name)
            namespace.exchanges[name] = ex.Exchange(
                name, kind, durable=durable, auto_delete=auto_delete, internal=internal, arguments=arguments
            )
            return
        for key, current, received in (
            ("type", existing.kind, kind),
            ("durable", _bool(existing.durable), _bool(durable)),
            ("auto_delete", _bool(existing.auto_delete), _bool(auto_delete)),
            ("internal", _bool(existing.internal), _bool(internal)),
        ):
            if current != received:
                raise _inequivalent(key, rs, f"'{received}'", f"'{current}'")
        alternate = "alternate-exchange"
        if existing.arguments.get(alternate) != (arguments or {}).get(alternate):
            received_value = (arguments or {}).get(alternate)
            raise _inequivalent(alternate, rs, _shown(received_value), _shown(existing.arguments.get(alternate)))

    def delete_exchange(self, conn: ServerConnection | None, name: str, *, if_unused: bool = False) -> None:
        """exchange.delete: not the default exchange (403) nor an ``amq.`` one (403); with ``if_unused`` it must
        have no binding (406 ``in use``); a missing exchange is no error. Its bindings go, and those to it."""
        namespace = self._namespace(conn)
        _not_default(name)
        rs = _rs("exchange", name, namespace)
        if name.startswith("amq."):
            raise failure(ACCESS_REFUSED, f"deletion of system {rs} not allowed")
        exchange = namespace.exchanges.get(name)
        if exchange is None:
            return
        if if_unused and exchange.bindings:
            raise failure(PRECONDITION_FAILED, f"{rs} in use")
        self._drop_exchange(namespace, exchange)

    def _drop_exchange(self, namespace: Namespace, exchange: ex.Exchange) -> None:
        del namespace.exchanges[exchange.name]
        exchange.deleted = True
        exchange.bindings.clear()
        self._unbind_destination(namespace, ex.EXCHANGE_DESTINATION, exchange.name)

    def bind_exchange(
        self,
        conn: ServerConnection | None,
        destination: str,
        source: str,
        routing_key: str,
        arguments: Mapping[str, Any] | None = None,
    ) -> None:
        """exchange.bind (a RabbitMQ extension): messages ``source`` routes with the binding go on to
        ``destination``."""
        self._bind(conn, ex.EXCHANGE_DESTINATION, destination, source, routing_key, arguments, add=True)

    def unbind_exchange(
        self,
        conn: ServerConnection | None,
        destination: str,
        source: str,
        routing_key: str,
        arguments: Mapping[str, Any] | None = None,
    ) -> None:
        """exchange.unbind: the binding goes (none such: no error); an auto-delete source left without bindings
        goes too."""
        self._bind(conn, ex.EXCHANGE_DESTINATION, destination, source, routing_key, arguments, add=False)

    def bind_queue(
        self,
        conn: ServerConnection | None,
        queue: str,
        exchange: str,
        routing_key: str,
        arguments: Mapping[str, Any] | None = None,
    ) -> None:
        """queue.bind: ``exchange`` routes messages matching the binding to ``queue`` (both must exist: 404; not
        the default exchange: 403; not another connection's exclusive queue: 405; a headers binding's ``x-match``
        must be valid: 406)."""
        self._bind(conn, ex.QUEUE_DESTINATION, queue, exchange, routing_key, arguments, add=True)

    def unbind_queue(
        self,
        conn: ServerConnection | None,
        queue: str,
        exchange: str,
        routing_key: str,
        arguments: Mapping[str, Any] | None = None,
    ) -> None:
        """queue.unbind: the binding goes (none such: no error)."""
        self._bind(conn, ex.QUEUE_DESTINATION, queue, exchange, routing_key, arguments, add=False)

    def _bind(
        self,
        conn: ServerConnection | None,
        kind: str,
        destination: str,
        source: str,
        key: str,
        arguments: Mapping[str, Any] | None,
        *,
        add: bool,
    ) -> None:
        """rabbit_channel.erl ``binding_action_with_checks`` and ``binding_action``."""
        namespace = self._namespace(conn)
        _not_default(destination if kind == ex.EXCHANGE_DESTINATION else None)
        _not_default(source)
        exchange = namespace.exchanges.get(source)
        if kind == ex.QUEUE_DESTINATION:
            queue = namespace.queues.get(destination)
            if queue is None:
                raise failure(NOT_FOUND, f"no {_rs('queue', destination, namespace)}")
        elif destination not in namespace.exchanges:
            raise failure(NOT_FOUND, f"no {_rs('exchange', destination, namespace)}")
        if exchange is None:
            raise failure(NOT_FOUND, f"no {_rs('exchange', source, namespace)}")
        if kind == ex.QUEUE_DESTINATION:
            bound = namespace.queues[destination]
            self._exclusive_access(conn, bound)
            if add and bound.auto:  # a bound queue is no idle node to sweep (its bindings would go with it)
                self.nodes.keep(bound)
        table = dict(arguments or {})
        found = ex.binding(kind, destination, key, table)
        if add:
            if exchange.kind == ex.HEADERS:
                invalid = ex.x_match_error(table)
                if invalid is not None:
                    raise failure(PRECONDITION_FAILED, invalid)
            exchange.bindings[found] = table
            return
        if exchange.bindings.pop(found, ...) is not ... and exchange.auto_delete and not exchange.bindings:
            self._drop_exchange(namespace, exchange)

    def _unbind_destination(self, namespace: Namespace, kind: str, name: str) -> None:
        """Remove every binding to the queue or exchange ``name`` (it is gone); auto-delete exchanges left
        without bindings go too (rabbit_binding.erl ``remove_for_destination``)."""
        emptied = []
        for exchange in namespace.exchanges.values():
            gone = [b for b in exchange.bindings if b.kind == kind and b.destination == name]
            for found in gone:
                del exchange.bindings[found]
            if gone and exchange.auto_delete and not exchange.bindings:
                emptied.append(exchange)
        for exchange in emptied:
            if namespace.exchanges.get(exchange.name) is exchange:
                self._drop_exchange(namespace, exchange)

    # -- queues --------------------------------------------------------------------------------------
    def declare_queue(
        self,
        conn: ServerConnection | None,
        name: str,
        *,
        passive: bool = False,
        durable: bool = False,
        exclusive: bool = False,
        auto_delete: bool = False,
        arguments: Mapping[str, Any] | None = None,
    ) -> tuple[str, int, int]:
        """queue.declare: (the queue's name, its ready messages, its consumers).

        "" gets a server name ``amq.gen-<id>``; a name given must not start with ``amq.`` (403); its arguments must
        be valid (406 ``invalid arg``); an existing queue declared here must be declared alike (405 when another
        connection owns it or exclusivity differs, 406 ``inequivalent arg``); passive: it must exist (404) and not
        be another connection's (405)."""
        namespace = self._namespace(conn)
        arguments = dict(arguments or {})
        if passive:
            queue = self._queue(namespace, name)
            self._exclusive_access(conn, queue)
            return name, queue.depth, self.consumer_count(queue)
        server_named = not name
        if server_named:
            name = self._server_name(namespace)
        else:  # rabbit_channel.erl queue.declare: check_name for every name given, existing or not
            _check_name("queue", name)
        owner = conn if exclusive else None
        node = namespace.node(name)
        if node is not None:
            rs = _rs("queue", name, namespace)
            if not isinstance(node, Queue):
                raise failure(PRECONDITION_FAILED, f"{rs} is a topic (an AMQP 1.0 multicast node)")
            declared = self.declared.get(node)
            if declared is not None:
                self._equivalent(conn, node, declared, durable and not exclusive, auto_delete, arguments, owner)
                self._used(node, declared)
            elif node.auto:  # created on demand by a 1.0 link: declared now, so RabbitMQ's to keep
                self.nodes.keep(node)
            return name, node.depth, self.consumer_count(node)
        rs = _rs("queue", name, namespace)
        policy = queue_policy(arguments, rs)
        refused = self.nodes.refuse_new_node()
        if refused is not None:
            raise failure(PRECONDITION_FAILED, f"cannot declare {rs}: {refused.description}")
        created = self.nodes.create(namespace, name, QUEUE)
        if not isinstance(created, Queue):  # configured as a topic
            self.nodes.delete(created)
            raise failure(PRECONDITION_FAILED, f"{rs} is configured as a topic")
        created.policy = policy
        if not durable or exclusive:  # a transient queue: gone when the node restarts, so nothing of it journaled
            created.on_departure = None  # (RabbitMQ's queues guide: "Transient queues will be deleted on node boot")
        self.dispatcher.own_copies = True  # its priorities are RabbitMQ's (and maybe its message ttl)
        declared = self.declared[created] = Declaration(durable and not exclusive, owner, auto_delete, arguments)
        expires = arguments.get("x-expires")
        if expires is not None:
            declared.expires = expires / 1000
            self._used(created, declared)
        if owner is not None:
            self._owned.setdefault(owner, {})[created] = None
        return name, 0, 0

    def _used(self, queue: Queue, declared: Declaration) -> None:
        """``queue`` was used now: an ``x-expires`` queue is looked at again that long from now."""
        if declared.expires is None or self.later is None:
            return
        declared.used_at = self.dispatcher.clock.now
        self.later(declared.expires, partial(self._expire, queue, declared))

    def _expire(self, queue: Queue, declared: Declaration) -> None:
        """An ``x-expires`` queue's time is up: deleted when it has no consumer and nothing used it since."""
        expires = declared.expires
        if queue.deleted or self.declared.get(queue) is not declared or declared.consumers or expires is None:
            return
        unused = self.dispatcher.clock.now - declared.used_at
        if unused >= expires:
            self.delete_node(queue)
        elif self.later is not None:  # used since (a basic.get): looked at again that long after that use
            self.later(expires - unused, partial(self._expire, queue, declared))

    def _server_name(self, namespace: Namespace) -> str:
        while True:
            name = f"{SERVER_NAMED}{next(self._ids)}"
            if namespace.node(name) is None:
                return name

    def _equivalent(
        self,
        conn: ServerConnection | None,
        queue: Queue,
        declared: Declaration,
        durable: bool,
        auto_delete: bool,
        arguments: dict[str, Any],
        owner: ServerConnection | None,
    ) -> None:
        """rabbit_amqqueue.erl ``perform_full_equivalence_checks``: exclusivity (strict), durable, auto-delete, then
        the type's arguments."""
        if declared.exclusive is not owner:
            raise _locked(queue)
        rs = _rs("queue", queue.name, queue.namespace)
        for key, current, received in (
            ("durable", declared.durable, durable),
            ("auto_delete", declared.auto_delete, auto_delete),
        ):
            if current != received:
                raise _inequivalent(key, rs, f"'{_bool(received)}'", f"'{_bool(current)}'")
        for name in _EQUIVALENT_ARGUMENTS:
            was, asked = declared.arguments.get(name), arguments.get(name)
            if name == "x-queue-type" and was in (None, "classic") and asked in (None, "classic"):
                continue  # (rabbit_misc.erl assert_field_equivalence: none and classic are one)
            if not (_field_type(was) == _field_type(asked) and was == asked):
                raise _inequivalent(name, rs, _shown(asked), _shown(was))

    def _queue(self, namespace: Namespace, name: str) -> Queue:
        queue = namespace.queues.get(name)
        if queue is None:
            raise failure(NOT_FOUND, f"no {_rs('queue', name, namespace)}")
        return queue

    def _exclusive_access(self, conn: ServerConnection | None, queue: Queue) -> None:
        """rabbit_amqqueue.erl ``check_exclusive_access`` (lax): another connection's exclusive queue is locked."""
        declared = self.declared.get(queue)
        if declared is not None and declared.exclusive is not None and declared.exclusive is not conn:
            raise _locked(queue)

    def consumer_count(self, queue: Queue) -> int:
        """The consumers of ``queue`` as RabbitMQ counts them: those taking messages, and those waiting their turn
        on a single-active-consumer queue."""
        declared = self.declared.get(queue)
        waiting = len(declared.waiting) if declared is not None else 0
        getters = sum(1 for consumer in self.dispatcher.consumers(queue) if _getter(consumer.link))
        return self.dispatcher.consumer_count(queue) - getters + waiting

    def purge_queue(self, conn: ServerConnection | None, name: str) -> int:
        """queue.purge: its ready messages go; how many (404 missing, 405 another connection's)."""
        queue = self._queue(self._namespace(conn), name)
        self._exclusive_access(conn, queue)
        return queue.purge()

    def delete_queue(
        self, conn: ServerConnection | None, name: str, *, if_unused: bool = False, if_empty: bool = False
    ) -> int:
        """queue.delete: the queue goes with its messages and bindings; how many ready messages it had. A missing
        queue is no error (0); another connection's is 405; ``if_unused`` with consumers, ``if_empty`` with
        messages: 406 (rabbit_amqqueue.erl ``delete_with``)."""
        namespace = self._namespace(conn)
        queue = namespace.queues.get(name)
        if queue is None:
            return 0
        self._exclusive_access(conn, queue)
        rs = _rs("queue", name, namespace)
        if if_unused and self.consumer_count(queue):
            raise failure(PRECONDITION_FAILED, f"{rs} in use")
        if if_empty and queue.depth:
            raise failure(PRECONDITION_FAILED, f"{rs} not empty")
        count = queue.depth
        self.delete_node(queue)
        return count

    def message_count(self, conn: ServerConnection | None, name: str) -> int:
        """The ready messages of queue ``name`` (404 missing)."""
        return self._queue(self._namespace(conn), name).depth

    def got_from(self, conn: ServerConnection | None, name: str) -> None:
        """A ``basic.get`` took from queue ``name``: a use of an ``x-expires`` queue (RabbitMQ's TTL documentation:
        unused means no consumers, no redeclaration and no basic.get for the period)."""
        queue = self._namespace(conn).queues.get(name)
        declared = self.declared.get(queue) if queue is not None else None
        if declared is not None:
            declared.used_at = self.dispatcher.clock.now

    # -- what the rest of the broker tells the model --------------------------------------------------
    def queue_gone(self, queue: Queue) -> None:
        """A queue was deleted (by any way): its bindings and declaration go."""
        declared = self.declared.pop(queue, None)
        if declared is not None and declared.exclusive is not None:
            owned = self._owned.get(declared.exclusive)
            if owned is not None:
                owned.pop(queue, None)
        namespace = queue.namespace
        if namespace is not None and queue.node_name == queue.name:
            self._unbind_destination(namespace, ex.QUEUE_DESTINATION, queue.name)

    def connection_closed(self, conn: ServerConnection) -> None:
        """Its exclusive queues go (rabbit_queue_collector.erl)."""
        for queue in list(self._owned.pop(conn, ())):
            if not queue.deleted:
                self.delete_node(queue)

    def consumer_refusal(self, conn: ServerConnection, queue: Queue, link: Link) -> Error | None:
        """``amqp:resource-locked`` when a 1.0 receiver may not attach to ``queue``: it is another connection's
        exclusive queue, or an exclusive consumer holds it, or the attach asks to be exclusive (link property
        ``rabbitmq:exclusive``) while the queue has consumers."""
        declared = self.declared.get(queue)
        if declared is not None and declared.exclusive is not None and declared.exclusive is not conn:
            return error(Condition.RESOURCE_LOCKED, _locked(queue).text)
        if _getter(link):  # a basic.get: no consumer, so nothing an exclusive consumer excludes
            return None
        if (declared is not None and declared.exclusive_consumer is not None) or (
            _exclusive_consumer(link) and self.consumer_count(queue)
        ):
            # rabbit_amqqueue.erl basic_consume: "~ts in exclusive use" (ACCESS_REFUSED in 0-9-1: the info says so)
            text = f"ACCESS_REFUSED - {_rs('queue', queue.name, queue.namespace)} in exclusive use"
            return Error(Symbol(Condition.RESOURCE_LOCKED.value), text, {REPLY_CODE: ACCESS_REFUSED})
        return None

    def consumer_added(self, consumer: Consumer) -> None:
        """A receiver attached to a queue: an auto-delete queue has had a consumer; an exclusive one holds it."""
        queue = consumer.queue
        if _getter(consumer.link):
            return
        exclusive = _exclusive_consumer(consumer.link)
        declared = self.declared.get(queue)
        if declared is None and exclusive:
            declared = self.declared[queue] = Declaration(True, None, False, {})
        if declared is None:
            return
        declared.had_consumer = True
        declared.consumers.add(consumer)
        if exclusive:
            declared.exclusive_consumer = consumer
        if declared.arguments.get("x-single-active-consumer") is True and not consumer.browser:
            if declared.active is None:
                declared.active = consumer
            else:
                declared.waiting.append(consumer)
                self.dispatcher.stop(consumer)  # it waits its turn (attached, with its credit)

    def consumer_gone(self, consumer: Consumer) -> None:
        """A receiver detached: an exclusive consumer lets the queue go; an auto-delete queue that has had
        consumers goes with its last one (rabbit_amqqueue.erl, auto_delete)."""
        queue = consumer.queue
        declared = self.declared.get(queue)
        if declared is None or _getter(consumer.link):
            return
        declared.consumers.discard(consumer)
        if declared.exclusive_consumer is consumer:
            declared.exclusive_consumer = None
        if consumer in declared.waiting:
            declared.waiting.remove(consumer)
        elif declared.active is consumer:
            declared.active = declared.waiting.pop(0) if declared.waiting else None
            if declared.active is not None:
                self.dispatcher.restart(declared.active)  # the oldest waiting consumer takes over
        if declared.consumers or queue.deleted:
            return
        if declared.auto_delete and declared.had_consumer:
            self.delete_node(queue)
        else:
            self._used(queue, declared)


# -- arguments -------------------------------------------------------------------------------------------
def queue_policy(arguments: Mapping[str, Any], rs: str) -> NodePolicy:
    """The policy of a queue declared with ``arguments`` (rabbit_amqqueue.erl ``declare_args`` and the check_*
    functions; a bad value is 406 ``invalid arg``): RabbitMQ's, so no dead-letter queue and no delivery limit
    unless asked."""
    queue_type = arguments.get("x-queue-type", "classic")
    if queue_type not in QUEUE_TYPES:
        raise _invalid("x-queue-type", rs, f"{{unsupported_queue_type,{queue_type!r}}}")
    allowed = _TYPE_ARGUMENTS[str(queue_type)]
    for key in arguments:
        if key in _KNOWN_ARGUMENTS and key not in allowed:
            module = f"rabbit_{queue_type}_queue"
            raise failure(PRECONDITION_FAILED, f"invalid arg '{key}' for {rs} of queue type {module}")
    ttl = _integer(arguments, "x-message-ttl", rs, least=0, most=_MAX_TTL_MS)
    _integer(arguments, "x-expires", rs, least=1, most=_MAX_TTL_MS)
    max_length = _integer(arguments, "x-max-length", rs, least=0)
    max_bytes = _integer(arguments, "x-max-length-bytes", rs, least=0)
    levels = _integer(arguments, "x-max-priority", rs, least=0, most=255, too_large="max_value_exceeded")
    limit = _integer(arguments, "x-delivery-limit", rs, least=0)
    overflow = arguments.get("x-overflow", DROP_HEAD)  # RabbitMQ's default overflow
    if overflow not in OVERFLOWS:
        raise _invalid("x-overflow", rs, f"{{invalid_overflow,{overflow!r}}}")
    exchange = _text(arguments, "x-dead-letter-exchange", rs)
    dead_letter_key = _text(arguments, "x-dead-letter-routing-key", rs)
    if dead_letter_key is not None and exchange is None:
        raise _invalid("x-dead-letter-routing-key", rs, "routing_key_but_no_dlx_defined")
    single = arguments.get("x-single-active-consumer")
    if single is not None and not isinstance(single, bool):
        raise _invalid("x-single-active-consumer", rs, '{unacceptable_type,"expected boolean"}')
    return NodePolicy(
        max_messages=_limit(max_length),
        max_bytes=_limit(max_bytes),
        overflow=str(overflow),
        max_delivery_attempts=limit or 0,
        dead_letter_address="",
        dead_letter_exchange=exchange,
        dead_letter_routing_key=dead_letter_key,
        message_ttl=ttl / 1000 if ttl is not None else None,
        max_priority=levels or 0,
        limit_ready=True,
    )


def _limit(value: int | None) -> int:
    """A length limit as ``NodePolicy`` holds it: None is none (0), RabbitMQ's 0 is "nothing at all" (-1)."""
    if value is None:
        return 0
    return value if value else -1


def _integer(
    arguments: Mapping[str, Any],
    key: str,
    rs: str,
    *,
    least: int,
    most: int | None = None,
    too_large: str = "value_too_large",
) -> int | None:
    """An integer argument (rabbit_amqqueue.erl ``check_int_arg``, ``check_non_neg_int_arg``,
    ``check_expires_arg``; rabbit_misc.erl ``check_expiry``), its error term as RabbitMQ prints it."""
    value = arguments.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        else:
            raise _invalid(key, rs, f'"expected integer, got {_field_type(value)}"')
    if value < least:
        raise _invalid(key, rs, f"{{value_negative,{value}}}" if value < 0 else f"{{value_zero,{value}}}")
    if most is not None and value > most:
        raise _invalid(key, rs, f"{{{too_large},{value}}}")
    return value


def _text(arguments: Mapping[str, Any], key: str, rs: str) -> str | None:
    value = arguments.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _invalid(key, rs, f"{{unacceptable_type,{_field_type(value)}}}")
    return value


def _invalid(key: str, rs: str, reason: str) -> RabbitError:
    return failure(PRECONDITION_FAILED, f"invalid arg '{key}' for {rs}: {reason}")


def _inequivalent(key: str, rs: str, received: str, current: str) -> RabbitError:
    text = f"inequivalent arg '{key}' for {rs}: received {received} but current is {current}"
    return failure(PRECONDITION_FAILED, text)


def _locked(queue: Queue) -> RabbitError:
    rs = _rs("queue", queue.name, queue.namespace)
    return failure(
        RESOURCE_LOCKED,
        f"cannot obtain exclusive access to locked {rs}. It could be originally declared on another connection or "
        "the exclusive property value does not match that of the original declaration.",
    )


def _rs(kind: str, name: str, namespace: Namespace | None) -> str:
    return ex.resource(kind, name, namespace.vhost if namespace is not None else "/")


def _not_default(name: str | None) -> None:
    """rabbit_channel.erl ``check_not_default_exchange``."""
    if name == ex.DEFAULT:
        raise failure(ACCESS_REFUSED, "operation not permitted on the default exchange")


def _check_name(kind: str, name: str) -> None:
    """rabbit_channel.erl ``check_name``: a new queue's or exchange's name may not start with ``amq.``."""
    if name.startswith("amq."):
        raise failure(ACCESS_REFUSED, f"{kind} name '{name}' contains reserved prefix 'amq.*'")


def _exclusive_consumer(link: Link) -> bool:
    properties = link.attach.properties
    return isinstance(properties, dict) and properties.get(EXCLUSIVE_CONSUMER) is True


def _getter(link: Link) -> bool:
    properties = link.attach.properties
    return isinstance(properties, dict) and properties.get(GETTER) is True


def _random_ids() -> Iterator[str]:
    """Server-named queues' ids: 128 random bits, URL-safe (RabbitMQ: ``rabbit_guid:binary``)."""
    while True:
        yield secrets.token_urlsafe(16)
