"""A message held by the broker: opaque bytes plus what routing and redelivery need (Part 3 §3.2).

The bare and annotated message are kept exactly as the producer sent them. Only the header section,
which by §3.2 must come first, is decoded, and only when present: the broker needs its
delivery-count to redeliver. A message goes out byte-identical unless its delivery-count changed, in
which case only the header is re-encoded in front of the untouched remainder.
"""

from __future__ import annotations

from typing import Any

from minibroker.amqp import codec
from minibroker.amqp.definitions import DeliveryAnnotations, Header, MessageAnnotations, Properties
from minibroker.amqp.types import DecodeError, UInt

_HEADER_PREFIX = b"\x00\x53\x70"  # described, smallulong 0x70: amqp:header:list


class Message:
    """One message on a node."""

    __slots__ = ("body_offset", "delivery_count", "header", "payload", "sent_count", "seq")

    def __init__(self, payload: bytes, seq: int) -> None:
        self.payload = payload
        self.seq = seq
        self.header: Header | None = None
        self.body_offset = 0
        self.delivery_count = 0
        if payload.startswith(_HEADER_PREFIX):
            try:
                header, end = codec.decode(payload)
            except DecodeError:
                header = None
            if isinstance(header, Header):
                self.header = header
                self.body_offset = end
                self.delivery_count = header.delivery_count or 0
        self.sent_count = self.delivery_count

    @property
    def size(self) -> int:
        """Bytes of the encoded message."""
        return len(self.payload)

    @property
    def to(self) -> Any:
        """``properties.to``, decoded on first use (anonymous relay routes by it, §3.2.4)."""
        properties = self._properties()
        return properties.to if properties is not None else None

    def _properties(self) -> Properties | None:
        """The properties section: after header, delivery- and message-annotations, if present."""
        pos = self.body_offset
        payload = self.payload
        try:
            while pos < len(payload):
                section, pos = codec.decode(payload, pos)
                if isinstance(section, Properties):
                    return section
                if not isinstance(section, DeliveryAnnotations | MessageAnnotations | Header):
                    return None
        except DecodeError:
            return None
        return None

    def encoded(self) -> bytes:
        """The message as it goes to a consumer: header updated with the current delivery-count."""
        if self.delivery_count == self.sent_count:
            return self.payload
        header = Header() if self.header is None else Header(*self.header.field_values())
        header.delivery_count = UInt(self.delivery_count)
        return codec.encode(header) + self.payload[self.body_offset :]

    def __repr__(self) -> str:
        return f"Message(seq={self.seq}, size={len(self.payload)}, delivery_count={self.delivery_count})"
