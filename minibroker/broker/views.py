"""Read-only views of broker state for tests and embedders (``broker.queue(name).peek()`` and friends).

``MessageView`` presents a stored message the way python-qpid-proton's ``Message`` does: the same
attribute names (``body``, ``id``, ``address``, ``properties`` for application-properties,
``annotations`` for message-annotations, ``instructions`` for delivery-annotations), ``ttl`` and times in
seconds. Decoding happens only here, on request, never on the hot path.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from minibroker.amqp import codec
from minibroker.amqp.definitions import (
    AmqpSequence,
    AmqpValue,
    ApplicationProperties,
    Data,
    DeliveryAnnotations,
    Footer,
    Header,
    MessageAnnotations,
    Properties,
)
from minibroker.amqp.sections import walk
from minibroker.amqp.types import DecodeError

_NO_BODY = object()


@dataclass(frozen=True)
class MessageView:
    """A message as a consumer would see it, decoded (attribute names follow proton's ``Message``)."""

    body: Any = None
    id: Any = None
    user_id: bytes | None = None
    address: str | None = None
    subject: str | None = None
    reply_to: str | None = None
    correlation_id: Any = None
    content_type: str | None = None
    content_encoding: str | None = None
    expiry_time: float | None = None
    creation_time: float | None = None
    group_id: str | None = None
    group_sequence: int | None = None
    reply_to_group_id: str | None = None
    durable: bool = False
    priority: int = 4
    ttl: float | None = None
    first_acquirer: bool = False
    delivery_count: int = 0
    instructions: dict[Any, Any] = field(default_factory=dict)
    annotations: dict[Any, Any] = field(default_factory=dict)
    properties: dict[Any, Any] = field(default_factory=dict)
    footer: dict[Any, Any] = field(default_factory=dict)
    size: int = 0
    """Bytes of the encoded message."""


PROPERTY_FIELDS: Mapping[str, str] = {
    "message_id": "id",
    "user_id": "user_id",
    "to": "address",
    "subject": "subject",
    "reply_to": "reply_to",
    "correlation_id": "correlation_id",
    "content_type": "content_type",
    "content_encoding": "content_encoding",
    "absolute_expiry_time": "expiry_time",
    "creation_time": "creation_time",
    "group_id": "group_id",
    "group_sequence": "group_sequence",
    "reply_to_group_id": "reply_to_group_id",
}
"""Each field of the properties section (§3.2.4) by its AMQP name (the management API's), and ``MessageView``'s
name of it."""


def _seconds(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000


def view_message(payload: bytes, *, delivery_count: int | None = None) -> MessageView:
    """Decode ``payload`` (an encoded message) into a ``MessageView``; undecodable parts are left out."""
    fields: dict[str, Any] = {"size": len(payload)}
    body: Any = _NO_BODY
    for section in _decoded_sections(payload):
        if isinstance(section, Header):
            fields.update(
                durable=bool(section.durable),
                priority=4 if section.priority is None else int(section.priority),
                ttl=_seconds(section.ttl),
                first_acquirer=bool(section.first_acquirer),
                delivery_count=section.delivery_count or 0,
            )
        elif isinstance(section, DeliveryAnnotations):
            fields["instructions"] = dict(section.value)
        elif isinstance(section, MessageAnnotations):
            fields["annotations"] = dict(section.value)
        elif isinstance(section, Properties):
            fields.update(
                id=section.message_id,
                user_id=section.user_id,
                address=section.to,
                subject=section.subject,
                reply_to=section.reply_to,
                correlation_id=section.correlation_id,
                content_type=section.content_type,
                content_encoding=section.content_encoding,
                expiry_time=_seconds(section.absolute_expiry_time),
                creation_time=_seconds(section.creation_time),
                group_id=section.group_id,
                group_sequence=section.group_sequence,
                reply_to_group_id=section.reply_to_group_id,
            )
        elif isinstance(section, ApplicationProperties):
            fields["properties"] = dict(section.value)
        elif isinstance(section, Data):
            body = section.value if body is _NO_BODY else [*_as_list(body), section.value]
        elif isinstance(section, AmqpSequence):
            body = section.value if body is _NO_BODY else [*_as_list(body), *section.value]
        elif isinstance(section, AmqpValue):
            body = section.value
        elif isinstance(section, Footer):
            fields["footer"] = dict(section.value)
    if delivery_count is not None:
        fields["delivery_count"] = delivery_count
    return MessageView(body=None if body is _NO_BODY else body, **fields)


def _decoded_sections(payload: bytes) -> Iterator[Any]:
    """Each section of ``payload``, decoded; one that does not decode is left out, and the walk ends where the
    sections can no longer be told apart (``amqp.sections.walk``)."""
    try:
        for section in walk(payload):
            try:
                yield codec.decode(payload, section.start)[0]
            except DecodeError:
                continue
    except DecodeError:
        return


def _as_list(body: Any) -> list[Any]:
    return body if isinstance(body, list) else [body]


@dataclass(frozen=True, kw_only=True)
class NodeCounts:
    """What a queue (or a topic's subscription) holds at one moment."""

    ready: int
    """Messages waiting for a consumer (``depth``)."""
    acquired: int
    """Messages delivered and not yet settled."""
    staged: int
    """Messages posted in open transactions, invisible until commit."""
    consumers: int
    enqueued_total: int
    """Messages that became ready (a message back from a redelivery delay counts again)."""
    dequeued_total: int
    """Messages that left for good: consumed, dead-lettered, expired, purged."""
    scheduled: int
    """Messages held back until their delivery time (``x-opt-delivery-delay`` / ``-time``)."""

    @property
    def depth(self) -> int:
        """Messages ready for delivery (the same as ``ready``)."""
        return self.ready

    def counts_json(self) -> dict[str, int]:
        """The counts as the management API names them (``depth`` for ``ready``)."""
        return {"depth": self.ready, **{name: getattr(self, name) for name in _COUNTS[1:]}}

    @staticmethod
    def counts_from_json(item: Mapping[str, Any]) -> dict[str, int]:
        """``counts_json`` read back: the keyword arguments of a ``NodeCounts`` (0 for what an older broker lacks)."""
        return {"ready": int(item.get("depth", 0)), **{name: int(item.get(name, 0)) for name in _COUNTS[1:]}}


_COUNTS = ("ready", "acquired", "staged", "consumers", "enqueued_total", "dequeued_total", "scheduled")
"""The fields of ``NodeCounts``, ``ready`` first."""


@dataclass(frozen=True, kw_only=True)
class QueueStats(NodeCounts):
    """Counts of one queue at one moment."""

    name: str


@dataclass(frozen=True)
class BindingInfo:
    """One binding of an exchange (issue 18): to a queue or to another exchange (``kind``), with its routing key and
    arguments."""

    destination: str
    kind: str
    routing_key: str
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ExchangeInfo:
    """One RabbitMQ exchange of a namespace, with its bindings in the order they were made (issue 18)."""

    name: str
    type: str
    durable: bool
    auto_delete: bool
    internal: bool
    arguments: Mapping[str, Any]
    bindings: tuple[BindingInfo, ...]

    @classmethod
    def of(cls, exchange: Any) -> ExchangeInfo:
        """The snapshot of ``exchange`` (a ``broker.exchanges.Exchange``)."""
        bindings = tuple(
            BindingInfo(b.destination, b.kind, b.key, dict(arguments)) for b, arguments in exchange.bindings.items()
        )
        return cls(
            exchange.name,
            exchange.kind,
            exchange.durable,
            exchange.auto_delete,
            exchange.internal,
            dict(exchange.arguments),
            bindings,
        )


@dataclass(frozen=True)
class ConnectionInfo:
    """One client connection."""

    id: int
    container_id: str
    hostname: str | None
    namespace: str
    user: str | None
    sessions: int
    links: int


@dataclass(frozen=True, kw_only=True)
class SubscriptionStats(NodeCounts):
    """Counts of one subscription of a topic at one moment, with what names it.

    ``container`` and ``name`` are the subscription's key as the broker holds it: the container-id and link
    name of a durable subscription (``name`` ends in ``|volatile`` for a shared non-durable one, and a global
    shared subscription has an empty ``container``); for a link's own non-durable subscription, ``#`` and the
    connection number, and the link name followed by ``#``, the channel, ``:`` and the handle.
    """

    container: str
    name: str
    durable: bool
    """Kept while no link is attached (and across restarts when the broker journals)."""
    shared: bool
    """One queue whose links compete for its messages (source capability ``shared``)."""
    held_bytes: int
    """Bytes of the messages held (ready, acquired and scheduled): what ``max_bytes`` bounds."""

    @property
    def held(self) -> int:
        """Messages the subscription holds: ready, acquired and scheduled (what ``max_messages`` bounds)."""
        return self.ready + self.acquired + self.scheduled
