"""RabbitMQ exchanges and bindings (issue 18): pure types, matching and routing, no broker state.

An exchange routes a message by its routing key (and, for a headers exchange, its headers) along its bindings
to queues and to other exchanges (exchange-to-exchange bindings, a RabbitMQ extension). Every namespace has
the exchanges every RabbitMQ virtual host has (``PREDECLARED``): the default exchange ``""``, which routes a key
to the queue of that name (every queue's implicit binding), and ``amq.direct``, ``amq.fanout``, ``amq.topic``,
``amq.headers``, ``amq.match``.

Matching follows RabbitMQ's exchange types (rabbitmq/rabbitmq-server, deps/rabbit/src/):

- direct: the binding key equals the routing key;
- fanout: every binding;
- topic (rabbit_exchange_type_topic.erl, rabbit_db_topic_exchange.erl ``split_topic_key_binary``): keys are
  words split at every ``.`` (the empty key is no word at all, ``a..b`` is three words, the middle one empty);
  ``*`` in a binding key matches exactly one word, ``#`` zero or more;
- headers (rabbit_exchange_type_headers.erl): the binding's ``x-match`` is ``all`` (the default), ``any``,
  ``all-with-x`` or ``any-with-x``; other binding arguments are compared with the message's headers, those
  starting with ``x-`` skipped unless ``-with-x``; an argument whose value is None matches a header's presence.

Also here: RabbitMQ 4 addresses (``parse_v2``), which every personality understands.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple
from urllib.parse import unquote

from minibroker.amqp.definitions import Error
from minibroker.amqp.errors import Condition, error

DIRECT, FANOUT, TOPIC, HEADERS = "direct", "fanout", "topic", "headers"
KINDS = (DIRECT, FANOUT, TOPIC, HEADERS)
DEFAULT = ""
"""The default exchange: routes a key to the queue of that name."""
DEFAULT_ALIAS = "amq.default"
"""How a RabbitMQ 4 address (and RabbitMQ's 0-9-1 ``exchange.declare``) names the default exchange."""
PREDECLARED: dict[str, str] = {
    DEFAULT: DIRECT,
    "amq.direct": DIRECT,
    "amq.fanout": FANOUT,
    "amq.topic": TOPIC,
    "amq.headers": HEADERS,
    "amq.match": HEADERS,
}
"""The exchanges of every namespace, by name, with their type (rabbit_exchange.erl ``declare_default_exchanges``)."""
X_MATCH = "x-match"
X_MATCH_VALUES = ("all", "any", "all-with-x", "any-with-x")
QUEUE_DESTINATION, EXCHANGE_DESTINATION = "queue", "exchange"


def words(key: str) -> list[str]:
    """A topic key's words: split at every ``.``; the empty key has none (``split_topic_key_binary``)."""
    return key.split(".") if key else []


def topic_matches(pattern: str, key: str) -> bool:
    """Whether the topic binding key ``pattern`` matches the routing key ``key`` (``*`` one word, ``#`` any
    number); in time proportional to the product of their word counts, whatever the pattern."""
    wanted, given = words(pattern), words(key)
    # reachable: the numbers of key words consumed after each pattern word (a set, so "#.#.#" stays cheap)
    reachable = {0}
    for word in wanted:
        if word == "#":
            reachable = set(range(min(reachable), len(given) + 1)) if reachable else set()
        elif word == "*":
            reachable = {n + 1 for n in reachable if n < len(given)}
        else:
            reachable = {n + 1 for n in reachable if n < len(given) and given[n] == word}
        if not reachable:
            return False
    return len(given) in reachable


def headers_match(arguments: Mapping[str, Any], headers: Mapping[str, Any]) -> bool:
    """Whether a headers-exchange binding with ``arguments`` matches a message with ``headers``
    (rabbit_exchange_type_headers.erl ``route``, ``match``, ``match_x``, ``match_all``, ``match_any``)."""
    mode = arguments.get(X_MATCH)
    with_x = mode in ("all-with-x", "any-with-x")
    results = (
        (name in headers) if value is None else (name in headers and _equal(headers[name], value))
        for name, value in arguments.items()
        if name != X_MATCH and (with_x or not name.startswith("x-"))
    )
    if mode in ("any", "any-with-x"):
        return any(results)
    return all(results)


def _equal(a: Any, b: Any) -> bool:
    """Header equality as RabbitMQ compares field values (``=:=``): a bool is no number."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


def x_match_error(arguments: Mapping[str, Any]) -> str | None:
    """Why a headers binding's ``x-match`` is invalid (rabbit_exchange_type_headers.erl ``validate_binding``)."""
    mode = arguments.get(X_MATCH)
    if mode is None or mode in X_MATCH_VALUES:
        return None
    if isinstance(mode, str):
        return f"Invalid x-match field value {mode!r}; expected all, any, all-with-x, or any-with-x"
    return f"Invalid x-match field type (value {mode!r}); expected longstr"


class Binding(NamedTuple):
    """One binding of an exchange: to a queue or to another exchange (``kind``), with its key and (in a hashable
    form) its arguments; the exchange keeps the arguments themselves (``Exchange.bindings``)."""

    kind: str
    destination: str
    key: str
    arguments: Any = ()


def binding(kind: str, destination: str, key: str, arguments: Mapping[str, Any] | None = None) -> Binding:
    """A binding; equal bindings (same arguments in any order) are one (RabbitMQ: bind is idempotent)."""
    return Binding(kind, destination, key, _frozen(dict(arguments or {})))


def _frozen(value: Any) -> Any:
    """A hashable form of an argument value (tables and arrays nest; a bool is no number)."""
    if isinstance(value, Mapping):
        return ("table", tuple(sorted(((str(k), _frozen(v)) for k, v in value.items()), key=lambda item: item[0])))
    if isinstance(value, list | tuple):
        return ("array", tuple(_frozen(v) for v in value))
    try:
        hash(value)
    except TypeError:
        return ("repr", repr(value))
    return (type(value).__name__, value)


class Exchange:
    """One exchange of a namespace, with its bindings in the order they were made."""

    __slots__ = ("arguments", "auto_delete", "bindings", "deleted", "durable", "internal", "kind", "name")

    def __init__(
        self,
        name: str,
        kind: str,
        *,
        durable: bool = True,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: Mapping[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.kind = kind
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments: dict[str, Any] = dict(arguments or {})
        self.bindings: dict[Binding, Mapping[str, Any]] = {}
        """Its bindings, each with its arguments, in the order they were made."""
        self.deleted = False

    def matching(self, key: str, headers: Callable[[], Mapping[str, Any]]) -> list[Binding]:
        """The bindings a message with routing key ``key`` takes (``headers``: its headers, read only by a headers
        exchange)."""
        kind = self.kind
        if kind == FANOUT:
            return list(self.bindings)
        if kind == DIRECT:
            return [b for b in self.bindings if b.key == key]
        if kind == TOPIC:
            return [b for b in self.bindings if topic_matches(b.key, key)]
        table = headers()
        return [b for b, arguments in self.bindings.items() if headers_match(arguments, table)]

    def __repr__(self) -> str:
        return f"Exchange({self.name!r}, {self.kind}, bindings={len(self.bindings)})"


def predeclared() -> dict[str, Exchange]:
    """A namespace's exchanges when it is made: the ``PREDECLARED`` ones."""
    return {name: Exchange(name, kind) for name, kind in PREDECLARED.items()}


def route(
    exchanges: Mapping[str, Exchange], start: Exchange, key: str, headers: Callable[[], Mapping[str, Any]]
) -> list[str]:
    """The names of the queues a message published to ``start`` with routing key ``key`` reaches, each once, in
    the order found; exchange-to-exchange bindings are followed (each exchange once: cycles end), as
    rabbit_exchange.erl ``route`` does. The default exchange names the queue ``key`` (whether it exists is the
    caller's to check)."""
    queues: dict[str, None] = {}
    seen = {start.name}
    pending = [start]
    while pending:
        exchange = pending.pop(0)
        if exchange.name == DEFAULT:
            queues[key] = None
            continue
        for found in exchange.matching(key, headers):
            if found.kind == QUEUE_DESTINATION:
                queues[found.destination] = None
            elif found.destination not in seen:
                seen.add(found.destination)
                target = exchanges.get(found.destination)
                if target is not None:
                    pending.append(target)
    return list(queues)


class Route:
    """A message's way into an exchange: the exchange and the routing key; what a post to an exchange stages and
    routes (at commit, for a transactional one)."""

    __slots__ = ("exchange", "key", "namespace", "staged")

    def __init__(self, namespace: Any, exchange: Exchange, key: str) -> None:
        self.namespace = namespace
        """The namespace of the exchange (its ``exchanges`` and ``queues`` are what the route reaches)."""
        self.exchange = exchange
        self.key = key
        self.staged = 0

    @property
    def name(self) -> str:
        return self.exchange.name

    @property
    def deleted(self) -> bool:
        return self.exchange.deleted

    def __repr__(self) -> str:
        return f"Route({self.exchange.name!r}, {self.key!r})"


# -- RabbitMQ 4 addresses (rabbit_amqp_session.erl ``parse_target_v2_string0`` and the source's ``/queues/``) -----
class Address(NamedTuple):
    """What a RabbitMQ 4 address names: a queue, or an exchange with a routing key (None: the message's own)."""

    queue: str | None
    exchange: str | None = None
    key: str | None = None


QUEUES_PREFIX, EXCHANGES_PREFIX = "/queues/", "/exchanges/"
_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def is_v2(address: str) -> bool:
    """Whether ``address`` is in a RabbitMQ 4 address's name space (``/queues/...``, ``/exchanges/...``)."""
    return address.startswith(QUEUES_PREFIX) or address.startswith(EXCHANGES_PREFIX)


def resource(kind: str, name: str, vhost: str) -> str:
    """A queue or exchange as RabbitMQ names one in its errors (rabbit_misc.erl ``rs``): ``queue 'q' in vhost '/'``."""
    return f"{kind} '{name}' in vhost '{vhost}'"


def missing_queue(name: str, vhost: str) -> Error:
    """RabbitMQ's refusal of an address naming a queue that does not exist (rabbit_amqp_session.erl
    ``link_error_not_found``; the text of rabbit_amqqueue.erl ``not_found``)."""
    return error(Condition.NOT_FOUND, f"no {resource('queue', name, vhost)}")


def missing_exchange(name: str, vhost: str) -> Error:
    """RabbitMQ's refusal of an address naming an exchange that does not exist."""
    return error(Condition.NOT_FOUND, f"no {resource('exchange', name, vhost)}")


def bad_address(address: str) -> Error:
    return error(Condition.INVALID_FIELD, f"Attach refused: bad address {address!r} (RabbitMQ 4 address v2)")


def parse_v2(address: str, *, source: bool) -> Address | Error:
    """The queue or exchange a RabbitMQ 4 address names.

    ``/queues/NAME`` is queue NAME (everything after ``/queues/``, slashes included); a target may also be
    ``/exchanges/NAME/KEY`` or ``/exchanges/NAME`` (the key is then the message's: ``x-routing-key`` or its
    subject). ``amq.default`` names the default exchange (as the 0-9-1 gateway addresses it; RabbitMQ 4 itself
    refuses it). Segments are percent-decoded, a malformed escape being a bad address as ``cow_uri:urldecode``
    makes it; anything else is ``amqp:invalid-field``.
    """
    if address.startswith(QUEUES_PREFIX):
        name = _urldecode(address[len(QUEUES_PREFIX) :])
        return bad_address(address) if not name else Address(name)
    if not source and address.startswith(EXCHANGES_PREFIX):
        segments = address[len(EXCHANGES_PREFIX) :].split("/")
        if len(segments) > 2 or segments[0] == "":
            return bad_address(address)
        exchange = _urldecode(segments[0])
        key = _urldecode(segments[1]) if len(segments) == 2 else None
        if exchange is None or (len(segments) == 2 and key is None):
            return bad_address(address)
        return Address(None, DEFAULT if exchange == DEFAULT_ALIAS else exchange, key)
    return bad_address(address)


def named_node(address: str) -> str:
    """The node a fault rule's ``address`` names for a RabbitMQ 4 ``address``: the queue of ``/queues/NAME``, the
    queue the default exchange routes ``/exchanges/amq.default/NAME`` to, the exchange of ``/exchanges/NAME/KEY``
    (so a rule on "orders" meets what a 0-9-1 client publishes to it through the default exchange); any other
    address as it is."""
    found = parse_v2(address, source=False) if is_v2(address) else None
    if not isinstance(found, Address):
        return address
    if found.queue is not None:
        return found.queue
    if found.exchange == DEFAULT and found.key is not None:
        return found.key
    return found.exchange or address


def _urldecode(segment: str) -> str | None:
    """A percent-decoded address segment; None when an escape is malformed (RabbitMQ's cow_uri:urldecode fails)."""
    return None if _ESCAPE.search(segment) else unquote(segment)
