"""Where the sections of an encoded message are, found from their encodings without decoding them (Part 3 §3.2).

A message is a sequence of described values, each kind at most once and in this order: header,
delivery-annotations, message-annotations, properties, application-properties, the body (one or more data, one
or more amqp-sequence, or one amqp-value) and a footer. A section is recognised by its descriptor, the numeric
code (``0x00 0x53 0x70``: the compact form every client uses, or any other ulong encoding) or the symbolic name
(§1.2: either may be used); it is measured by its constructor and size (``codec.value_end``), so what it holds
is read only by whoever decodes it.

This is the one walker of message sections: the broker's ``Message`` reads the sections before the properties
as each message arrives (with ``section_at`` and ``section_end``, unrolled: that is the hot path, and lenient:
bytes that are no section there just end what it reads), while selectors, views and the transaction
coordinator use ``walk``, which raises ``DecodeError`` at a value that is not described. Each decodes only the
sections it needs, with ``codec.decode`` at ``Section.start``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

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
from minibroker.amqp.types import DecodeError

HEADER = Header.DESCRIPTOR_CODE
DELIVERY_ANNOTATIONS = DeliveryAnnotations.DESCRIPTOR_CODE
MESSAGE_ANNOTATIONS = MessageAnnotations.DESCRIPTOR_CODE
PROPERTIES = Properties.DESCRIPTOR_CODE
APPLICATION_PROPERTIES = ApplicationProperties.DESCRIPTOR_CODE
DATA = Data.DESCRIPTOR_CODE
AMQP_SEQUENCE = AmqpSequence.DESCRIPTOR_CODE
AMQP_VALUE = AmqpValue.DESCRIPTOR_CODE
FOOTER = Footer.DESCRIPTOR_CODE
NOT_A_SECTION = -1
"""``section_at``'s code when no message section starts there."""

_SECTION_TYPES = (
    Header,
    DeliveryAnnotations,
    MessageAnnotations,
    Properties,
    ApplicationProperties,
    Data,
    AmqpSequence,
    AmqpValue,
    Footer,
)
_NAMES: dict[str, int] = {cls.DESCRIPTOR_NAME: cls.DESCRIPTOR_CODE for cls in _SECTION_TYPES}
_ULONG_DESCRIPTORS = frozenset({0x80, 0x44})  # ulong, ulong0 (smallulong 0x53 is the fast path)
_SYMBOL_DESCRIPTORS = frozenset({0xA3, 0xB3})  # sym8, sym32


class Section(NamedTuple):
    """One section of an encoded message."""

    code: int
    """Its descriptor code: ``HEADER`` (0x70) to ``FOOTER`` (0x78)."""
    start: int
    """Offset of its descriptor: ``codec.decode(payload, start)`` decodes the whole section."""
    value: int
    """Offset of the described value."""
    end: int
    """Offset just past it."""


def section_at(payload: bytes, pos: int) -> tuple[int, int]:
    """``(code, value offset)`` of the message section that starts at ``pos``.

    The code is ``NOT_A_SECTION`` (and the offset ``pos``) when none does: at the end of ``payload``, at a value
    that is not described, or at a described value whose descriptor is no section's (or does not decode). Never
    raises.
    """
    if len(payload) < pos + 3 or payload[pos] != 0x00:
        return NOT_A_SECTION, pos
    constructor = payload[pos + 1]
    if constructor == 0x53:  # smallulong: the compact form
        code = payload[pos + 2]
        return (code, pos + 3) if HEADER <= code <= FOOTER else (NOT_A_SECTION, pos)
    if constructor not in _ULONG_DESCRIPTORS and constructor not in _SYMBOL_DESCRIPTORS:
        return NOT_A_SECTION, pos
    try:
        descriptor, value = codec.decode(payload, pos + 1)
    except DecodeError:
        return NOT_A_SECTION, pos
    if isinstance(descriptor, str):
        code = _NAMES.get(descriptor, NOT_A_SECTION)
    else:
        code = descriptor if HEADER <= descriptor <= FOOTER else NOT_A_SECTION
    return (code, value) if code != NOT_A_SECTION else (NOT_A_SECTION, pos)


def section_end(payload: bytes, value: int) -> int:
    """Where the section whose described value starts at ``value`` ends, from the value's constructor and size.

    Raises ``DecodeError`` when that encoding is no value's or runs past the end of ``payload``.
    """
    try:
        while payload[value] == 0x00:  # an amqp-value may hold a described value: step over its descriptor
            value = codec.value_end(payload, value + 1)
        return codec.value_end(payload, value)
    except IndexError:
        raise DecodeError(f"message section value at offset {value} is cut short") from None


def walk(payload: bytes, pos: int = 0, *, last: int = FOOTER) -> Iterator[Section]:
    """The sections of ``payload`` from ``pos`` on, in order, up to those of code ``last``.

    The walk stops at the end of ``payload``, at a described value that is no section, or at a section after
    ``last``, without measuring it: a reader of the sections before the body (``last=APPLICATION_PROPERTIES``)
    never reads the body's size. Raises ``DecodeError`` at a value that is not described (a message is nothing
    but sections) and when a section runs past the end of ``payload``.
    """
    while True:
        code, value = section_at(payload, pos)
        if code == NOT_A_SECTION:
            if pos < len(payload) and payload[pos] != 0x00:
                raise DecodeError(f"message section at offset {pos} is not a described value")
            return
        if code > last:
            return
        end = section_end(payload, value)
        yield Section(code, pos, value, end)
        pos = end


__all__ = [
    "AMQP_SEQUENCE",
    "AMQP_VALUE",
    "APPLICATION_PROPERTIES",
    "DATA",
    "DELIVERY_ANNOTATIONS",
    "FOOTER",
    "HEADER",
    "MESSAGE_ANNOTATIONS",
    "NOT_A_SECTION",
    "PROPERTIES",
    "Section",
    "section_at",
    "section_end",
    "walk",
]
