"""A message held by the broker: opaque bytes plus what routing and redelivery need (Part 3 §3.2).

The bare and annotated message are kept exactly as the producer sent them. Only the sections before the
properties are looked at, and only when present: the header (priority, ttl, delivery-count) and the
message-annotations (scheduled delivery); the delivery-annotations are skipped by their encoded size, never
decoded. The properties section is decoded only when something needs it (anonymous relay's ``to``, an absolute
expiry time, which a cheap field count rules out for most messages). What is decoded is bounded: a header or
message-annotations section larger than the limit (``max_selector_properties_size``) makes the message
``oversized`` (refused, ``amqp:resource-limit-exceeded``), and a larger properties section is never decoded
(its ``to`` and absolute-expiry-time are taken as absent). A message goes out byte-identical unless the broker
had to change it (its delivery-count, or annotations added by dead-lettering or a ``modified`` outcome); then
only the sections before the properties are re-encoded in front of the untouched remainder.

A message whose header or message-annotations do not decode (say, annotation keys that are neither symbols nor
ulongs, §3.2.10), or whose delivery-annotations' encoded size runs past its end, is ``malformed``: the broker
refuses it (``amqp:decode-error``, see ``endpoints.py``), and such a message is never rebuilt either (it goes out as
it came), so the broker never emits a message with a lost header or two sections of one kind (§3.2: at most one of
each, in order).
"""

from __future__ import annotations

from typing import Any
from weakref import WeakSet

from minibroker.amqp import codec
from minibroker.amqp.definitions import DeliveryAnnotations, Header, MessageAnnotations, Properties
from minibroker.amqp.sections import (
    DELIVERY_ANNOTATIONS,
    HEADER,
    MESSAGE_ANNOTATIONS,
    PROPERTIES,
    section_at,
    section_end,
)
from minibroker.amqp.types import DecodeError, Symbol, UInt

_ABSOLUTE_EXPIRY_FIELD = 9  # properties fields before and including absolute-expiry-time
DEFAULT_PRIORITY = 4  # Part 3 §3.2.1
# the largest header, message-annotations or properties section decoded on arrival (the broker passes its
# ``max_selector_properties_size``; a recovered message, accepted before, passes None)
DEFAULT_SECTION_LIMIT = 64 * 1024
MAX_DELIVERY_COUNT = 0xFFFFFFFF  # header.delivery-count is a uint (§3.2.1): it saturates there
_EMPTY_HEADER = Header()  # every message's empty header (list0): read-only
_LIST0_HEADER = b"\x00\x53\x70\x45"  # an empty header section: smallulong descriptor 0x70, list0
_PROPERTIES_DESCRIPTOR = b"\x00\x53\x73"  # a properties section's descriptor, as ``section_at`` reads it


class Content:
    """What every copy of one message shares: its bytes, what was parsed of them, and its times.

    A topic gives each subscription its own ``Message``, a small record of what differs between copies
    (delivery-count, exclusions, journal id, timer); they all point at one ``Content``, so a publish to N
    subscriptions costs N records, never N copies of the bytes or of their parse. A ``Content`` is never
    changed once the message is routed, except its place (``seq``, set once by the dispatcher) and the
    selector fields decoded on first use; a copy that needs other bytes (``Message.annotate``) gets a
    ``Content`` of its own.
    """

    __slots__ = (
        "annotations",
        "annotations_end",
        "annotations_start",
        "body_offset",
        "count",
        "deliver_at",
        "expires_at",
        "expiry_properties_at",
        "fields",
        "header",
        "key",
        "limit",
        "malformed",
        "oversized",
        "payload",
        "priority",
        "properties_start",
        "seq",
    )

    def __init__(self, payload: bytes, limit: int | None = None) -> None:
        self.seq = 0
        self.limit = limit
        """The largest header, message-annotations or properties section decoded (None: any size)."""
        self.oversized = False
        """True when the header or message-annotations are larger than ``limit`` (the message is refused)."""
        self.key: tuple[int, int] = (0, 0)
        self.expires_at: float | None = None
        self.deliver_at: float | None = None
        self.fields: Any = None  # what selectors read, decoded on first use
        self.payload = payload
        self.header: Header | None = None
        self.annotations: dict[Any, Any] | None = None
        self.body_offset = 0
        self.count = 0  # the delivery-count written in ``payload``'s header
        self.priority = DEFAULT_PRIORITY
        self.malformed: str | None = None
        """Why the sections read here do not decode (the message is refused), or None."""
        pos = 0
        try:
            # the sections before the properties, each looked for where the one before ended (``amqp.sections``)
            if payload.startswith(_LIST0_HEADER) and (self.limit is None or self.limit >= len(_LIST0_HEADER)):
                # an empty header (list0), which python-qpid-proton writes in every message: nothing to decode, and
                # one shared record for them all (never changed: ``_rebuilt`` copies a header before writing it);
                # proton's properties section next is known by its descriptor: no section read at all (issue 19)
                self.header, pos = _EMPTY_HEADER, len(_LIST0_HEADER)
                if payload.startswith(_PROPERTIES_DESCRIPTOR, pos):
                    code, value = PROPERTIES, pos + len(_PROPERTIES_DESCRIPTOR)
                else:
                    code, value = section_at(payload, pos)
            else:
                code, value = section_at(payload, 0)
                if code == HEADER:
                    self._check_size(payload, 0, value, "header")
                    header, pos = codec.decode(payload)
                    if isinstance(header, Header):
                        self.header = header
                        self.count = min(int(header.delivery_count or 0), MAX_DELIVERY_COUNT)
                        if header.priority is not None:
                            self.priority = min(int(header.priority), 9)
                    code, value = section_at(payload, pos)
            self.body_offset = pos
            if code == DELIVERY_ANNOTATIONS:
                pos = section_end(payload, value)  # for the next hop: skipped by its size, never decoded
                code, value = section_at(payload, pos)
            self.annotations_start = pos
            if code == MESSAGE_ANNOTATIONS:
                self._check_size(payload, pos, value, "message-annotations")
                annotations, pos = codec.decode(payload, pos)
                if isinstance(annotations, MessageAnnotations):
                    self.annotations = annotations.value
                code, value = section_at(payload, pos)
            self.annotations_end = pos
        except (DecodeError, IndexError) as exc:
            self.malformed = str(exc)
            self.header = None
            self.annotations = None
            self.count = 0
            self.body_offset = self.annotations_start = self.annotations_end = pos = 0
            code, value = section_at(payload, 0)
        self.properties_start = pos
        # where the properties list starts when its encoded count reaches absolute-expiry-time (-1: no properties,
        # or too few fields: python-qpid-proton's empty list0), told here on the way: every arrival asks (issue 19)
        count = 0
        if code == PROPERTIES and len(payload) > value + 2:
            constructor = payload[value]
            if constructor == 0xC0:  # list8: size, count
                count = payload[value + 2]
            elif constructor == 0xD0:  # list32: size, count
                count = int.from_bytes(payload[value + 5 : value + 9], "big")
        self.expiry_properties_at = value if count >= _ABSOLUTE_EXPIRY_FIELD else -1

    def _check_size(self, payload: bytes, pos: int, value: int, name: str) -> None:
        """Refuse to decode the section at ``pos`` (its value at ``value``) when it is larger than ``limit``."""
        limit = self.limit
        if limit is not None and (size := section_end(payload, value) - pos) > limit:
            self.oversized = True
            raise DecodeError(f"{name} of {size} bytes, larger than the limit of {limit}")

    def place(self, seq: int) -> None:
        """Give the message its place in delivery order (every copy shares it: one copy per queue)."""
        self.seq = seq
        self.key = (-self.priority, seq)


class Message:
    """One message on one node (a queue, or one subscription of a topic): a record over a shared ``Content``."""

    __slots__ = ("content", "delivery_count", "durable_id", "excluded", "size", "timer")

    def __init__(self, payload: bytes, seq: int = 0, *, limit: int | None = DEFAULT_SECTION_LIMIT) -> None:
        content = self.content = Content(payload, limit)
        # bytes of the encoded message: a field set wherever ``content`` is (here, ``sharing``, ``annotate``), not a
        # property: a post reads it twice, a delivery once (issue 19)
        self.size = len(payload)
        if seq:
            content.place(seq)
        self.delivery_count = content.count
        # consumers that answered modified(undeliverable-here), held weakly: one that goes away is forgotten
        self.excluded: WeakSet[Any] | None = None
        self.durable_id = 0  # its id in the journal, when it is kept there (0: not journaled)
        self.timer: Any = None  # the expiry timer entry it holds (``timers.py``), told when it leaves for good

    @classmethod
    def sharing(cls, other: Message) -> Message:
        """A new record over ``other``'s content (the copy a topic gives each further subscription)."""
        clone = cls.__new__(cls)
        clone.content = other.content
        clone.size = other.size
        clone.delivery_count = other.delivery_count
        clone.excluded = None
        clone.durable_id = 0
        clone.timer = None
        return clone

    # -- what the content says ----------------------------------------------------------------------
    @property
    def payload(self) -> bytes:
        """The bytes as the producer sent them (or as the broker last rebuilt them for this copy)."""
        return self.content.payload

    @property
    def header(self) -> Header | None:
        return self.content.header

    @property
    def annotations(self) -> dict[Any, Any] | None:
        return self.content.annotations

    @property
    def priority(self) -> int:
        return self.content.priority

    @property
    def seq(self) -> int:
        return self.content.seq

    @seq.setter
    def seq(self, seq: int) -> None:
        self.content.place(seq)

    @property
    def expires_at(self) -> float | None:
        return self.content.expires_at

    @expires_at.setter
    def expires_at(self, when: float | None) -> None:
        self.content.expires_at = when

    @property
    def deliver_at(self) -> float | None:
        return self.content.deliver_at

    @deliver_at.setter
    def deliver_at(self, when: float | None) -> None:
        self.content.deliver_at = when

    @property
    def fields(self) -> Any:
        return self.content.fields

    @fields.setter
    def fields(self, fields: Any) -> None:
        self.content.fields = fields

    @property
    def properties_start(self) -> int:
        return self.content.properties_start

    @property
    def oversized(self) -> bool:
        """Whether the header or message-annotations are larger than the limit (see ``Content``)."""
        return self.content.oversized

    @property
    def malformed(self) -> str | None:
        """Why the header or annotations do not decode, or None (see ``Content``)."""
        return self.content.malformed

    @property
    def durable(self) -> bool:
        header = self.content.header
        return header is not None and bool(header.durable)

    @property
    def ttl(self) -> int | None:
        """header.ttl in milliseconds, or None."""
        header = self.content.header
        return header.ttl if header is not None else None

    def properties(self) -> Properties | None:
        """The properties section, decoded (None when absent or undecodable)."""
        return self._read_properties()[0]

    def undecodable_properties(self) -> str | None:
        """Why the message's properties section does not decode (``properties`` gave None although there is one
        within the limit), or None: it decodes, there is none, or it is larger than the limit (as if absent)."""
        return self._read_properties()[1]

    def _read_properties(self) -> tuple[Properties | None, str | None]:
        """The properties section decoded, or why one within the limit does not decode (None, None: there is
        none, or it is larger than the limit and so never decoded, as if absent)."""
        payload, pos, limit = self.payload, self.properties_start, self.content.limit
        code, value = section_at(payload, pos)
        if code != PROPERTIES:
            return None, None
        try:
            if limit is not None and section_end(payload, value) - pos > limit:
                return None, None
            section = codec.decode(payload, pos)[0]
        except (DecodeError, IndexError) as exc:
            return None, str(exc)
        if isinstance(section, Properties):
            return section, None
        return None, "not a properties list"

    @property
    def to(self) -> Any:
        """``properties.to`` (anonymous relay routes by it, §3.2.4)."""
        properties = self.properties()
        return properties.to if properties is not None else None

    def absolute_expiry_time(self) -> int | None:
        """``properties.absolute-expiry-time`` in wall-clock ms; decodes only when the field can be present."""
        if self.content.expiry_properties_at < 0:
            return None  # no properties, or trailing fields trimmed: no absolute-expiry-time
        properties = self.properties()
        return properties.absolute_expiry_time if properties is not None else None

    def annotation(self, key: str) -> Any:
        """A message-annotation value, or None."""
        return self.annotations.get(Symbol(key)) if self.annotations else None

    def encoded(self) -> bytes:
        """The message as it goes to a consumer: header updated with the current delivery-count."""
        content = self.content
        if self.delivery_count == content.count:
            return content.payload
        return self._rebuilt(content.annotations)

    def annotate(self, extra: dict[str, Any], payload: bytes | None = None) -> None:
        """Merge ``extra`` into the message-annotations (dead-letter reasons, ``modified`` annotations).

        This copy gets a content of its own (other copies keep theirs), with the same place and times. Only
        for a copy on no ready list (acquired, or not yet posted): its delivery order does not change anyway.
        ``payload``: the bytes this gives, made already for another copy of the same content (then shared).
        """
        old = self.content
        if payload is None:
            merged = dict(old.annotations or {})
            merged.update({Symbol(k) if type(k) is str else k: v for k, v in extra.items()})
            payload = self._rebuilt(merged)
        content = Content(payload)
        content.seq, content.key = old.seq, old.key
        content.expires_at, content.deliver_at = old.expires_at, old.deliver_at
        self.content = content
        self.size = len(payload)

    def rewritten(self, extra: dict[str, Any], rest: bytes | None = None, *, durable: bool = False) -> bytes:
        """The message as it goes out with ``extra`` merged into its message-annotations, the header's
        delivery-count always written (0 too), and ``rest`` (from the properties on) in place of its own when
        given: a Service Bus delivery or dead-letter (``minibroker.servicebus.messages``); ``durable``: the header
        says durable (a message a Service Bus entity takes is stored). Nothing is kept."""
        merged = dict(self.content.annotations or {})
        merged.update({Symbol(k) if type(k) is str else k: v for k, v in extra.items()})
        return self._rebuilt(merged, explicit_count=True, rest=rest, durable=durable)

    def _rebuilt(
        self,
        annotations: dict[Any, Any] | None,
        *,
        explicit_count: bool = False,
        rest: bytes | None = None,
        durable: bool = False,
    ) -> bytes:
        """Header (with the current delivery-count) + original delivery-annotations + ``annotations`` + rest.
        A malformed message is not rebuilt: where its sections end is not known, and none may appear twice."""
        content = self.content
        if content.malformed is not None:
            return content.payload
        header = Header() if content.header is None else Header(*content.header.field_values())
        count = min(self.delivery_count, MAX_DELIVERY_COUNT)
        header.delivery_count = UInt(count) if count or explicit_count else header.delivery_count
        header.durable = True if durable else header.durable
        parts = [codec.encode(header) if header.field_values() != [None] * 5 else b""]
        payload = content.payload
        parts.append(payload[content.body_offset : content.annotations_start])
        if annotations:
            parts.append(codec.encode(MessageAnnotations(annotations)))
        parts.append(payload[content.annotations_end :] if rest is None else rest)
        return b"".join(parts)

    def copy(self) -> Message:
        """Another record of the same message (shared bytes), with no exclusions, journal id or timer."""
        return Message.sharing(self)

    def __repr__(self) -> str:
        return f"Message(seq={self.seq}, size={len(self.payload)}, delivery_count={self.delivery_count})"


__all__ = ["DEFAULT_PRIORITY", "MAX_DELIVERY_COUNT", "Content", "DeliveryAnnotations", "Message"]
