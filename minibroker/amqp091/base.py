"""The two shapes the generated definitions take: a method (0-9-1 §2.3.5, §4.2.4) and a class's content
properties (§4.2.6.1). Plain data: encoding and decoding live in ``minibroker.amqp091.codec``.

``FIELDS`` / ``PROPERTIES`` list ``(python_name, wire_type)`` in the specification's order; a wire type is one
of the 0-9-1 domains' base types: ``bit``, ``octet``, ``short``, ``long``, ``longlong``, ``shortstr``,
``longstr``, ``timestamp``, ``table``.
"""

from __future__ import annotations

from typing import ClassVar


class Method:
    """One AMQP 0-9-1 method; subclasses are generated, one per ``<method>`` of the specification."""

    __slots__ = ()
    CLASS_ID: ClassVar[int]
    METHOD_ID: ClassVar[int]
    NAME: ClassVar[str]  # "class.method" as the specification spells it, e.g. "basic.publish"
    SYNCHRONOUS: ClassVar[bool]  # the sender waits for one of RESPONSES
    CONTENT: ClassVar[bool]  # a content header and body frames follow (§4.2.6)
    RESPONSES: ClassVar[tuple[str, ...]]
    FIELDS: ClassVar[tuple[tuple[str, str], ...]]


class Properties:
    """The content properties of one class (only ``basic`` has them); every property is optional."""

    __slots__ = ()
    CLASS_ID: ClassVar[int]
    PROPERTIES: ClassVar[tuple[tuple[str, str], ...]]
