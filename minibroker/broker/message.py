"""A message held by the broker: opaque bytes plus what routing and redelivery need (Part 3 §3.2).

The bare and annotated message are kept exactly as the producer sent them. Only the sections before the
properties are looked at, and only when present: the header (priority, ttl, delivery-count) and the
message-annotations (scheduled delivery). The properties section is decoded only when something needs
it (anonymous relay's ``to``, an absolute expiry time, which a cheap field count rules out for most
messages). A message goes out byte-identical unless the broker had to change it (its delivery-count, or
annotations added by dead-lettering or a ``modified`` outcome); then only the sections before the
properties are re-encoded in front of the untouched remainder.
"""

from __future__ import annotations

from typing import Any

from minibroker.amqp import codec
from minibroker.amqp.definitions import DeliveryAnnotations, Header, MessageAnnotations, Properties
from minibroker.amqp.types import DecodeError, Symbol, UInt

_DESCRIBED = 0x00
_SMALLULONG = 0x53
_HEADER, _DELIVERY_ANNOTATIONS, _MESSAGE_ANNOTATIONS, _PROPERTIES = 0x70, 0x71, 0x72, 0x73
_ABSOLUTE_EXPIRY_FIELD = 9  # properties fields before and including absolute-expiry-time
DEFAULT_PRIORITY = 4  # Part 3 §3.2.1


def _section_code(payload: bytes, pos: int) -> int:
    """The descriptor code of the section at ``pos`` when it uses the compact form, else -1."""
    if len(payload) >= pos + 3 and payload[pos] == _DESCRIBED and payload[pos + 1] == _SMALLULONG:
        return payload[pos + 2]
    return -1


class Message:
    """One message on a node."""

    __slots__ = (
        "annotations",
        "annotations_end",
        "annotations_start",
        "body_offset",
        "deliver_at",
        "delivery_count",
        "durable_id",
        "excluded",
        "expires_at",
        "fields",
        "header",
        "payload",
        "priority",
        "properties_start",
        "sent_count",
        "seq",
    )

    def __init__(self, payload: bytes, seq: int = 0) -> None:
        self.seq = seq
        self.expires_at: float | None = None
        self.deliver_at: float | None = None
        self.excluded: set[Any] | None = None  # consumers that answered modified(undeliverable-here)
        self.fields: Any = None  # what selectors read, decoded on first use
        self.durable_id = 0  # its id in the journal, when it is kept there (0: not journaled)
        self._parse(payload)
        self.sent_count = self.delivery_count

    def _parse(self, payload: bytes) -> None:
        self.payload = payload
        self.header: Header | None = None
        self.annotations: dict[Any, Any] | None = None
        self.body_offset = 0
        self.delivery_count = 0
        self.priority = DEFAULT_PRIORITY
        pos = 0
        try:
            if _section_code(payload, 0) == _HEADER:
                header, pos = codec.decode(payload)
                if isinstance(header, Header):
                    self.header = header
                    self.delivery_count = header.delivery_count or 0
                    if header.priority is not None:
                        self.priority = min(int(header.priority), 9)
            self.body_offset = pos
            if _section_code(payload, pos) == _DELIVERY_ANNOTATIONS:
                pos = codec.decode(payload, pos)[1]
            self.annotations_start = pos
            if _section_code(payload, pos) == _MESSAGE_ANNOTATIONS:
                annotations, pos = codec.decode(payload, pos)
                if isinstance(annotations, MessageAnnotations):
                    self.annotations = annotations.value
            self.annotations_end = pos
        except DecodeError:
            self.header = None
            self.annotations = None
            self.body_offset = self.annotations_start = self.annotations_end = pos = 0
        self.properties_start = pos

    @property
    def size(self) -> int:
        """Bytes of the encoded message."""
        return len(self.payload)

    @property
    def durable(self) -> bool:
        return self.header is not None and bool(self.header.durable)

    @property
    def ttl(self) -> int | None:
        """header.ttl in milliseconds, or None."""
        return self.header.ttl if self.header is not None else None

    def properties(self) -> Properties | None:
        """The properties section, decoded (None when absent or undecodable)."""
        if _section_code(self.payload, self.properties_start) != _PROPERTIES:
            return None
        try:
            section = codec.decode(self.payload, self.properties_start)[0]
        except DecodeError:
            return None
        return section if isinstance(section, Properties) else None

    @property
    def to(self) -> Any:
        """``properties.to`` (anonymous relay routes by it, §3.2.4)."""
        properties = self.properties()
        return properties.to if properties is not None else None

    def absolute_expiry_time(self) -> int | None:
        """``properties.absolute-expiry-time`` in wall-clock ms; decodes only when the field can be present."""
        pos = self.properties_start
        payload = self.payload
        if _section_code(payload, pos) != _PROPERTIES or len(payload) < pos + 5:
            return None
        constructor = payload[pos + 3]
        if constructor == 0xC0:
            count = payload[pos + 5] if len(payload) > pos + 5 else 0
        elif constructor == 0xD0:
            count = int.from_bytes(payload[pos + 8 : pos + 12], "big")
        else:
            return None
        if count < _ABSOLUTE_EXPIRY_FIELD:
            return None  # trailing fields trimmed: no absolute-expiry-time
        properties = self.properties()
        return properties.absolute_expiry_time if properties is not None else None

    def annotation(self, key: str) -> Any:
        """A message-annotation value, or None."""
        return self.annotations.get(Symbol(key)) if self.annotations else None

    def encoded(self) -> bytes:
        """The message as it goes to a consumer: header updated with the current delivery-count."""
        if self.delivery_count == self.sent_count:
            return self.payload
        return self._rebuilt(self.annotations)

    def annotate(self, extra: dict[str, Any]) -> None:
        """Merge ``extra`` into the message-annotations (dead-letter reasons, ``modified`` annotations)."""
        merged = dict(self.annotations or {})
        merged.update({Symbol(k) if type(k) is str else k: v for k, v in extra.items()})
        self._parse(self._rebuilt(merged))
        self.sent_count = self.delivery_count
        self.fields = None

    def _rebuilt(self, annotations: dict[Any, Any] | None) -> bytes:
        """Header (with the current delivery-count) + original delivery-annotations + ``annotations`` + rest."""
        header = Header() if self.header is None else Header(*self.header.field_values())
        header.delivery_count = UInt(self.delivery_count) if self.delivery_count else header.delivery_count
        parts = [codec.encode(header) if header.field_values() != [None] * 5 else b""]
        parts.append(self.payload[self.body_offset : self.annotations_start])
        if annotations:
            parts.append(codec.encode(MessageAnnotations(annotations)))
        parts.append(self.payload[self.annotations_end :])
        return b"".join(parts)

    def copy(self) -> Message:
        """Another message with the same bytes (one per topic subscription)."""
        clone = Message.__new__(Message)
        for slot in Message.__slots__:
            setattr(clone, slot, getattr(self, slot))
        clone.excluded = None
        clone.durable_id = 0
        return clone

    def __repr__(self) -> str:
        return f"Message(seq={self.seq}, size={len(self.payload)}, delivery_count={self.delivery_count})"


__all__ = ["DEFAULT_PRIORITY", "DeliveryAnnotations", "Message"]
