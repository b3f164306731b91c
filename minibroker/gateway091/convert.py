"""Messages between AMQP 0-9-1 and AMQP 1.0, mapped as RabbitMQ 4 maps them.

Theory of operation: the broker core stores AMQP 1.0 message bytes. A 0-9-1 publish becomes 1.0 sections with
``to_amqp10`` and a delivery to a 0-9-1 consumer is read back with ``from_amqp10``. The facts come from
RabbitMQ's ``deps/rabbit/src/mc_amqpl.erl`` (``convert_to(mc_amqp, ...)``, ``convert_from(mc_amqp, ...)``,
``from_091``/``to_091``, ``message_id``, ``is_internal_header``), ``mc_amqp.erl``
(``protocol_state_message_annotations``: ``x-exchange``/``x-routing-key``) and ``mc_util.erl``
(``is_utf8_no_null_limited``, ``urn_string_to_uuid``), and the "AMQP 0.9.1 <-> AMQP 1.0 conversions" page of
rabbitmq.com.

0-9-1 -> 1.0 (``to_amqp10``):

- header: always written; ``durable`` = (delivery-mode == 2), ``priority`` (ubyte), ``ttl`` (uint) from a
  decimal ``expiration``;
- message-annotations: every ``x-`` header (symbol key, any value), a ``CC`` array as ``x-cc``, ``type`` as
  ``x-basic-type``, and ``x-exchange`` / ``x-routing-key`` (the publish's; they replace headers of those names);
- properties: message-id / correlation-id (``urn:uuid:`` strings as uuid, else string), user-id (binary),
  reply-to ``/queues/<percent-encoded>``, content-type / content-encoding (symbols), creation-time (ms),
  app-id as group-id; cluster-id has no place and is dropped (as RabbitMQ does);
- application-properties: headers not named ``x-`` whose value is no table or array;
- body: one data section; if ``type`` is ``amqp-1.0`` and the body is 1.0 body sections, those sections.

1.0 -> 0-9-1 (``from_amqp10``): the reverse; the header's durable / priority / ttl win over the ``x-basic-*``
annotations; ``x-`` annotations become headers except the internal ones (``x-basic-*``, ``x-exchange``,
``x-routing-key``, ``x-death``); ``x-cc`` becomes ``CC``, ``x-opt-rabbitmq-received-time`` ``timestamp_in_ms``;
application-properties with string keys become headers; a message-id / correlation-id that is binary or a
string over 255 bytes goes to the header ``x-message-id`` / ``x-correlation-id``, a uuid to ``urn:uuid:...``,
a ulong to its decimal string. A body of data sections is their concatenation (a footer is dropped); any other
body (amqp-value, amqp-sequence, none) is passed as its encoded sections (with the footer) and ``type`` is
``amqp-1.0``. Delivery-annotations are ignored.

Values with no place on the other side are dropped, never an error (RabbitMQ crashes or drops): 0-9-1 decimals
(RabbitMQ's ``from_091`` has none), tables and arrays under non-``x-`` names except ``CC``; 1.0 uuid, char,
decimal32/64/128, described values, ulongs above 2**63-1, negative timestamps, map entries whose key is no
string, names or short strings over 255 bytes; maps and lists 64 levels deep (0-9-1 readers refuse them);
strings that are no UTF-8 where 1.0 needs a string (0-9-1 short strings are bytes), and non-ASCII text where
1.0 needs a symbol (§1.6.20: symbols are ASCII). A 1.0 string header value of more than 4096 bytes, or with NUL
or invalid UTF-8, is sent as binary; 1.0 binary becomes a 0-9-1 long string (``S``), as RabbitMQ's ``to_091``
does.

Only bytes that are no message raise (``ConversionError``, a ``ValueError``): a value that does not decode, a
section cut short, bytes that are no section, a header or properties section that is no list, annotations that
are no map, a data section that is no binary. A field, annotation or property of a type with no 0-9-1 place
(durable as a string, ``x-basic-priority`` as a string, a message-id that is a char, ``x-exchange`` that is no
string) is taken as absent.
"""

from __future__ import annotations

import functools
import re
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote_to_bytes

from minibroker.amqp import codec, sections
from minibroker.amqp import types as t
from minibroker.amqp.definitions import (
    ApplicationProperties,
    Data,
    Header,
    MessageAnnotations,
    Properties,
)
from minibroker.amqp091 import values as v
from minibroker.amqp091.codec import MAX_DEPTH
from minibroker.amqp091.definitions import BasicProperties

AMQP10_TYPE = "amqp-1.0"
"""The 0-9-1 ``type`` of a message whose body is encoded 1.0 body sections (``mc_amqpl``'s ``AMQP10_TYPE``)."""

_SHORTSTR = 255
_UTF8_SCAN_LIMIT = 4096  # mc_util: longer strings are sent as binary without scanning them
_LONG_HIGH = 2**63 - 1
_QUEUES = "/queues/"
_URN = re.compile(r"urn:uuid:[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\Z")
_BAD_ESCAPE = re.compile(r"%(?![0-9a-fA-F]{2})")
_INTERNAL = frozenset({"x-routing-key", "x-exchange", "x-death"})  # and x-basic-*: mc_amqpl:is_internal_header
_X_EXCHANGE = t.Symbol("x-exchange")
_X_ROUTING_KEY = t.Symbol("x-routing-key")
_X_BASIC_TYPE = t.Symbol("x-basic-type")
_X_CC = t.Symbol("x-cc")
_X_OPT_DEATHS = t.Symbol("x-opt-deaths")
_X_BASIC_DELIVERY_MODE = t.Symbol("x-basic-delivery-mode")
_X_BASIC_PRIORITY = t.Symbol("x-basic-priority")
_X_BASIC_EXPIRATION = t.Symbol("x-basic-expiration")
_BODY_CODES = frozenset({sections.DATA, sections.AMQP_SEQUENCE, sections.AMQP_VALUE, sections.FOOTER})


class ConversionError(ValueError):
    """AMQP 1.0 message bytes that are no message: a value that does not decode, a section cut short, bytes
    that are no section (Part 3 §3.2)."""


@dataclass(frozen=True, slots=True)
class Converted:
    """A 1.0 message as a 0-9-1 consumer receives it (basic.deliver / basic.get-ok and the content)."""

    properties: BasicProperties
    body: bytes
    exchange: str
    routing_key: str | None
    """The ``x-routing-key`` annotation; None without one (the consumer knows the queue it came from: a 1.0 post
    to a queue went through the default exchange with the queue's name, as RabbitMQ 4 routes ``/queues/NAME``)."""
    delivery_count: int
    """The 1.0 header's delivery-count (0 when absent): a redelivery when above 0."""


# -- shared small rules ----------------------------------------------------------------------------


def _text(value: str) -> str | None:
    """``value`` when it encodes as UTF-8 (0-9-1 strings are decoded with surrogateescape), else None."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return value


def _symbol(value: str) -> t.Symbol | None:
    """``value`` as a symbol when it is ASCII (Part 1 §1.6.20), else None."""
    return t.Symbol(value) if value.isascii() else None


def _shortstr(value: Any) -> str | None:
    """A 1.0 string that fits a 0-9-1 short string (at most 255 bytes), else None."""
    if (
        value is not None
        and isinstance(value, str)
        and len(value) <= _SHORTSTR
        and len(value.encode("utf-8")) <= _SHORTSTR
    ):
        return str(value)
    return None


def _octet(value: Any) -> int | None:
    return int(value) if type(value) is not bool and isinstance(value, int) and 0 <= value <= 255 else None


# -- 0-9-1 field values -> 1.0 values (mc_amqpl:from_091) --------------------------------------------

_DROP: Any = object()
"""A value with no place on the other side."""

_FROM_091_RANGED: dict[type, type] = {
    v.Byte: t.Byte,
    v.UByte: t.UByte,
    v.Short: t.Short,
    v.UShort: t.UShort,
    v.Int: t.Int,
    v.UInt: t.UInt,
}


def _longstr_from_091(value: str) -> Any:
    """``S``: a string when it is UTF-8 without NUL and at most 4096 bytes, else binary (``from_091``)."""
    raw = value.encode("utf-8", "surrogateescape")
    if len(raw) <= _UTF8_SCAN_LIMIT and b"\x00" not in raw:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return raw


def _from_091(value: Any) -> Any:
    """One 0-9-1 field value as a 1.0 value, or ``_DROP``."""
    kind = type(value)
    if kind is str:
        return _longstr_from_091(value)
    if kind is bool or value is None or kind is float:
        return value
    if kind is int:
        return t.Long(value)
    ranged = _FROM_091_RANGED.get(kind)
    if ranged is not None:
        return ranged(value)
    if kind is v.Timestamp:
        ms = value * 1000
        return t.Timestamp(ms) if ms <= _LONG_HIGH else _DROP
    if kind is v.Float:
        return t.Float(value)
    if kind is bytes:
        return value
    if kind is dict:
        table: dict[Any, Any] = {}
        for key, item in value.items():
            converted, symbol = _from_091(item), _symbol(key)
            if converted is not _DROP and symbol is not None:
                table[symbol] = converted
        return table
    if kind is list:
        return [item for item in map(_from_091, value) if item is not _DROP]
    return _DROP  # Decimal: from_091 has no clause for it


# -- 1.0 values -> 0-9-1 field values (mc_amqpl:to_091) -----------------------------------------------

_TO_091_RANGED: dict[type, type] = {value: key for key, value in _FROM_091_RANGED.items()}


def _to_091(value: Any, depth: int = 0) -> Any:
    """One 1.0 value as a 0-9-1 field value, or ``_DROP``; a table or array at depth ``MAX_DEPTH`` is dropped
    from its parent (0-9-1 readers refuse it: ``minibroker.amqp091.codec.MAX_DEPTH``)."""
    kind = type(value)
    if kind is str or kind is t.Symbol:
        return str(value)
    if kind is bool or value is None or kind is float:
        return value
    if kind is int or kind is t.Long or kind is t.ULong:
        return int(value) if value <= _LONG_HIGH else _DROP
    ranged = _TO_091_RANGED.get(kind)
    if ranged is not None:
        return ranged(value)
    if kind is t.Timestamp:
        return v.Timestamp(value // 1000) if value >= 0 else _DROP
    if kind is t.Float:
        return v.Float(value)
    if kind is bytes:  # binary -> longstr
        return value.decode("utf-8", "surrogateescape")
    if kind is dict or kind is list or kind is t.Array:
        if depth >= MAX_DEPTH:
            return _DROP
        if kind is dict:
            table: dict[str, Any] = {}
            for key, item in value.items():
                converted = _to_091(item, depth + 1)
                if converted is not _DROP and _shortstr(key) is not None:
                    table[str(key)] = converted
            return table
        items = value.items if kind is t.Array else value
        return [converted for converted in (_to_091(item, depth + 1) for item in items) if converted is not _DROP]
    return _DROP  # uuid, char, decimals, described values


# -- 0-9-1 -> 1.0 -----------------------------------------------------------------------------------


def _id_to_amqp10(value: str | None) -> Any:
    """message-id / correlation-id: a ``urn:uuid:`` string as a uuid, else a string (binary if no UTF-8)."""
    if value is None:
        return None
    if _URN.match(value):
        return uuid.UUID(value[9:])
    if _text(value) is None:
        return value.encode("utf-8", "surrogateescape")
    return value


def _ttl(expiration: str | None) -> t.UInt | None:
    """The expiration property (milliseconds as a decimal string) as the header's ttl; other text is dropped
    (the gateway answers a bad expiration with 406 before converting, as RabbitMQ's channel does)."""
    if expiration is None or not expiration.isascii() or not expiration.isdigit():
        return None
    ms = int(expiration)
    return t.UInt(ms) if ms <= 0xFFFFFFFF else None


def _annotations(headers: dict[str, Any] | None, type_: str | None, exchange: str, routing_key: str) -> dict[Any, Any]:
    annotations: dict[Any, Any] = {}
    for key, value in (headers or {}).items():
        if key.startswith("x-"):
            name = _symbol(key)
        elif key == "CC" and type(value) is list:  # 1.0 application-properties hold no lists
            name = _X_CC
        else:
            continue
        converted = _from_091(value)
        if name is not None and converted is not _DROP:
            annotations.setdefault(name, converted)  # CC and x-cc: the first (RabbitMQ's lookups take it)
    if type_ is not None and _text(type_) is not None:
        annotations[_X_BASIC_TYPE] = type_
    annotations[_X_EXCHANGE] = exchange
    annotations[_X_ROUTING_KEY] = routing_key
    return annotations


def _application_properties(headers: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in headers.items():
        if key.startswith("x-") or type(value) is dict or type(value) is list or _text(key) is None:
            continue
        converted = _from_091(value)
        if converted is not _DROP:
            result[key] = converted
    return result


def _properties(p: BasicProperties, to: str | None) -> Properties | None:
    reply_to = None
    if p.reply_to is not None:
        reply_to = _QUEUES + quote(p.reply_to.encode("utf-8", "surrogateescape"), safe="")
    content_type = None if p.content_type is None else _symbol(p.content_type)
    content_encoding = None if p.content_encoding is None else _symbol(p.content_encoding)
    properties = Properties(
        message_id=_id_to_amqp10(p.message_id),
        to=to,
        user_id=None if p.user_id is None else p.user_id.encode("utf-8", "surrogateescape"),
        reply_to=reply_to,
        correlation_id=_id_to_amqp10(p.correlation_id),
        content_type=content_type,
        content_encoding=content_encoding,
        creation_time=None
        if p.timestamp is None or p.timestamp * 1000 > _LONG_HIGH
        else t.Timestamp(p.timestamp * 1000),
        group_id=None if p.app_id is None else _text(p.app_id),
    )
    return None if properties == _NO_PROPERTIES else properties


_NO_PROPERTIES = Properties()


def _body_sections(body: bytes) -> bytes | None:
    """``body`` when it is nothing but 1.0 body sections and a footer (an ``amqp-1.0`` typed body), else None."""
    try:
        found = list(sections.walk(body))
    except t.DecodeError:
        return None
    if (found[-1].end if found else 0) != len(body) or any(s.code not in _BODY_CODES for s in found):
        return None
    return body


_DURABLE_HEADER = codec.encode(Header(durable=True))
_NON_DURABLE_HEADER = codec.encode(Header(durable=False))
_MESSAGE_ANNOTATIONS = codec.encode(MessageAnnotations({}))[:3]  # the descriptor, before the map
_APPLICATION_PROPERTIES = codec.encode(ApplicationProperties({}))[:3]
_DATA = codec.encode(Data(b""))[:3]


def _has_properties(p: BasicProperties) -> bool:
    """Whether ``p`` has a field that goes into the 1.0 properties section."""
    return (
        p.message_id is not None
        or p.user_id is not None
        or p.reply_to is not None
        or p.correlation_id is not None
        or p.content_type is not None
        or p.content_encoding is not None
        or p.timestamp is not None
        or p.app_id is not None
    )


def _encode_routing_sections(
    out: bytearray, p: BasicProperties, exchange: str, routing_key: str, to: str | None
) -> None:
    """The message-annotations section and, when it has a field, the properties section."""
    out += _MESSAGE_ANNOTATIONS
    codec.encode_into(out, _annotations(p.headers, p.type, exchange, routing_key))
    if to is not None or _has_properties(p):
        props = _properties(p, to)
        if props is not None:
            codec.encode_into(out, props)


@functools.lru_cache(maxsize=1024)
def _routing_sections(exchange: str, routing_key: str, to: str | None) -> bytes:
    """``_encode_routing_sections`` of a publish without headers, type or properties: the same for every
    publish to one exchange and key, so kept (a few exchanges and keys carry most traffic; bounded)."""
    out = bytearray()
    _encode_routing_sections(out, _NO_BASIC_PROPERTIES, exchange, routing_key, to)
    return bytes(out)


_NO_BASIC_PROPERTIES = BasicProperties()


def to_amqp10(
    properties: BasicProperties, body: bytes, exchange: str, routing_key: str, to: str | None = None
) -> bytes:
    """The 1.0 message (encoded sections) of a 0-9-1 publish to ``exchange`` with ``routing_key``
    (``mc_amqpl:convert_to(mc_amqp, ...)``; the mapping is in this module's docstring). ``to``: the address in the
    properties' ``to`` (the gateway publishes through the anonymous relay, which routes by it)."""
    p = properties
    durable = p.delivery_mode == 2
    if p.priority is None and p.expiration is None:  # the usual header, already encoded
        out = bytearray(_DURABLE_HEADER if durable else _NON_DURABLE_HEADER)
    else:
        out = bytearray()
        priority = None if p.priority is None else t.UByte(p.priority)
        codec.encode_into(out, Header(durable=durable, priority=priority, ttl=_ttl(p.expiration)))
    headers = p.headers
    if headers is None and p.type is None and not _has_properties(p):
        out += _routing_sections(exchange, routing_key, to)  # the usual publish: its sections encoded once
    else:
        _encode_routing_sections(out, p, exchange, routing_key, to)
    if headers:
        application = _application_properties(headers)
        if application:
            out += _APPLICATION_PROPERTIES
            codec.encode_into(out, application)
    encoded_body = _body_sections(body) if p.type == AMQP10_TYPE else None
    if encoded_body is None:
        out += _DATA
        codec.encode_into(out, body)
    else:
        out += encoded_body
    return bytes(out)


# -- 1.0 -> 0-9-1 -----------------------------------------------------------------------------------


def _id_to_091(value: Any, header: str, headers: dict[str, Any]) -> str | None:
    """message-id / correlation-id as a 0-9-1 short string, or into ``headers`` (``mc_amqpl:message_id``)."""
    if isinstance(value, uuid.UUID):
        return f"urn:uuid:{value}"
    if type(value) is t.ULong:
        return str(int(value))
    if type(value) is bytes:
        headers.setdefault(header, value)
        return None
    if type(value) is str:
        if _shortstr(value) is not None:
            return value
        headers.setdefault(header, value)
    return None  # a char, a symbol, anything else: not a message-id type (Part 3 §3.2.11)


def _user_id(value: Any) -> str | None:
    """user-id when it is a valid short string (UTF-8, no NUL, at most 255 bytes), else dropped."""
    if type(value) is not bytes or len(value) > _SHORTSTR or b"\x00" in value:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _reply_to(value: Any) -> str | None:
    """reply-to; ``/queues/NAME`` is percent-decoded to NAME (an address that does not decode is dropped)."""
    text = _shortstr(value)
    if text is None or not text.startswith(_QUEUES):
        return text
    encoded = text[len(_QUEUES) :]
    if _BAD_ESCAPE.search(encoded):
        return None
    return unquote_to_bytes(encoded).decode("utf-8", "surrogateescape")


def _section_value(payload: bytes, section: sections.Section, kind: type) -> Any:
    """The described value of a section, which must be a ``kind`` (a list or a map): its descriptor is known."""
    try:
        value = codec.decode(payload, section.value)[0]
    except t.DecodeError as exc:
        raise ConversionError(f"message section at offset {section.start} does not decode: {exc}") from None
    if not isinstance(value, kind):
        raise ConversionError(f"message section at offset {section.start} is no {kind.__name__}")
    return value


def _fields(payload: bytes, section: sections.Section, count: int) -> list[Any]:
    """A header's or properties' fields, padded with None to ``count`` (Part 1 §1.4: trailing nulls may go).
    Their types are checked where they are used: a field of the wrong type is taken as absent."""
    fields: list[Any] = _section_value(payload, section, list)
    return fields + [None] * (count - len(fields)) if len(fields) < count else fields


def _data(payload: bytes, section: sections.Section) -> bytes:
    """A data section's binary, sliced out of the payload (vbin8 or vbin32)."""
    constructor = payload[section.value]
    if constructor == 0xA0:
        return payload[section.value + 2 : section.end]
    if constructor == 0xB0:
        return payload[section.value + 5 : section.end]
    raise ConversionError(f"data section at offset {section.start} holds no binary")


def _sections(payload: bytes) -> list[sections.Section]:
    try:
        found = list(sections.walk(payload))
    except (t.DecodeError, IndexError) as exc:
        raise ConversionError(f"not an AMQP 1.0 message: {exc}") from None
    end = found[-1].end if found else 0
    if end != len(payload):
        raise ConversionError(f"not an AMQP 1.0 message: no message section at offset {end}")
    return found


# field positions (Part 3 §3.2.1 header, §3.2.4 properties)
_DURABLE, _PRIORITY, _TTL, _DELIVERY_COUNT = 0, 1, 2, 4
_MESSAGE_ID, _USER_ID, _SUBJECT, _REPLY_TO, _CORRELATION_ID = 0, 1, 3, 4, 5
_CONTENT_TYPE, _CONTENT_ENCODING, _CREATION_TIME, _GROUP_ID = 6, 7, 9, 10
_NO_HEADER = [None] * 5
_NO_PROPERTIES_FIELDS = [None] * 11


def from_amqp10(payload: bytes) -> Converted:
    """A stored 1.0 message as a 0-9-1 consumer receives it (``mc_amqpl:convert_from(mc_amqp, ...)``).

    Raises ``ConversionError`` only, when ``payload`` is no message. Of each section kind the last counts, as
    in ``convert_from``'s fold.
    """
    header = _NO_HEADER
    annotations: dict[Any, Any] = {}
    props = _NO_PROPERTIES_FIELDS
    application: dict[Any, Any] = {}
    body_start = -1
    data: list[bytes] = []
    only_data = True
    for section in _sections(payload):
        code = section.code
        if code == sections.DATA or code == sections.AMQP_SEQUENCE or code == sections.AMQP_VALUE:
            if body_start < 0:
                body_start = section.start
            if code == sections.DATA and only_data:
                data.append(_data(payload, section))
            else:
                only_data = False
        elif code == sections.HEADER:
            header = _fields(payload, section, 5)
        elif code == sections.MESSAGE_ANNOTATIONS:
            annotations = _section_value(payload, section, dict)
        elif code == sections.PROPERTIES:
            props = _fields(payload, section, 11)
        elif code == sections.APPLICATION_PROPERTIES:
            application = _section_value(payload, section, dict)
        # delivery-annotations and the footer: nothing of them reaches 0-9-1
    type_: str | None
    if body_start >= 0 and only_data:
        body = data[0] if len(data) == 1 else b"".join(data)
        type_ = _shortstr(annotations.get(_X_BASIC_TYPE)) if annotations else None
    else:  # mc_amqpl: any other body (or none) is its encoded sections, footer included
        body = payload[body_start:] if body_start >= 0 else b""
        type_ = AMQP10_TYPE
    return _converted(header, annotations, props, application, body, type_)


def _converted(
    header: list[Any],
    annotations: dict[Any, Any],
    props: list[Any],
    application: dict[Any, Any],
    body: bytes,
    type_: str | None,
) -> Converted:
    durable = header[_DURABLE]
    delivery_mode: int | None
    if durable is True or durable is False:
        delivery_mode = 2 if durable else 1
    else:
        delivery_mode = _octet(annotations.get(_X_BASIC_DELIVERY_MODE))
    priority = _octet(header[_PRIORITY])
    if priority is None and annotations:
        priority = _octet(annotations.get(_X_BASIC_PRIORITY))
    ttl = header[_TTL]
    expiration: str | None
    if type(ttl) is t.UInt:
        expiration = str(int(ttl))
    else:
        expiration = _shortstr(annotations.get(_X_BASIC_EXPIRATION)) if annotations else None
    delivery_count = header[_DELIVERY_COUNT]
    # the order of mc_amqpl:convert_from: x- annotations, x-correlation-id, x-message-id, application-properties
    headers = _annotation_headers(annotations) if annotations else {}
    correlation_id = _id_to_091(props[_CORRELATION_ID], "x-correlation-id", headers)
    message_id = _id_to_091(props[_MESSAGE_ID], "x-message-id", headers)
    if application:
        _add_application_headers(headers, application)
    creation = props[_CREATION_TIME]
    content_type, content_encoding = props[_CONTENT_TYPE], props[_CONTENT_ENCODING]
    properties = BasicProperties(
        content_type=None if content_type is None else _shortstr(content_type),
        content_encoding=None if content_encoding is None else _shortstr(content_encoding),
        headers=headers or None,
        delivery_mode=delivery_mode,
        priority=priority,
        correlation_id=correlation_id,
        reply_to=_reply_to(props[_REPLY_TO]),
        expiration=expiration,
        message_id=message_id,
        timestamp=creation // 1000 if type(creation) is t.Timestamp and creation >= 0 else None,
        type=type_,
        user_id=_user_id(props[_USER_ID]),
        app_id=_shortstr(props[_GROUP_ID]),
    )
    exchange = _shortstr(annotations.get(_X_EXCHANGE)) or ""
    routing_key = _shortstr(annotations.get(_X_ROUTING_KEY))
    return Converted(
        properties,
        body,
        exchange,
        routing_key,
        int(delivery_count) if type(delivery_count) is t.UInt else 0,
    )


def _annotation_headers(annotations: dict[Any, Any]) -> dict[str, Any]:
    """The 0-9-1 headers from ``x-`` annotations. Headers are added with ``setdefault``: the first of a name
    wins, as RabbitMQ's table lookups take the first."""
    headers: dict[str, Any] = {}
    for key, value in annotations.items():
        if type(key) is not t.Symbol or not key.startswith("x-"):
            continue
        if key == _X_CC:
            name: str | None = "CC"
        elif key == "x-opt-rabbitmq-received-time":
            name, value = ("timestamp_in_ms", int(value)) if type(value) is t.Timestamp else (None, None)
        elif key == _X_OPT_DEATHS:
            deaths = _deaths_to_091(value)
            if deaths is not _DROP:
                headers.setdefault("x-death", deaths)
            continue
        elif key in _INTERNAL or key.startswith("x-basic-"):
            continue
        else:
            name = _shortstr(key)
        converted = _to_091(value)
        if name is not None and converted is not _DROP:
            headers.setdefault(name, converted)
    return headers


def _deaths_to_091(deaths: Any) -> Any:
    """RabbitMQ 4's ``x-opt-deaths`` (a list of maps, the latest death first) as the 0-9-1 ``x-death`` header: per
    death a table of count, reason, queue, time (the first death's, in seconds), exchange and routing-keys, with
    original-expiration before them when the death kept a ttl (mc_amqpl.erl ``convert_from_amqp_deaths`` and
    ``death_table``). A value of another shape is dropped, as RabbitMQ ignores it."""
    listed: Any = deaths.items if type(deaths) is t.Array else deaths
    if type(listed) is not list:
        return _DROP
    tables: list[dict[str, Any]] = []
    for death in listed:
        if type(death) is not dict:
            return _DROP
        fields = {str(k): item for k, item in death.items() if type(k) is t.Symbol}
        count, first = fields.get("count"), fields.get("first-time")
        keys = fields.get("routing-keys")
        keys = keys.items if type(keys) is t.Array else keys
        if not isinstance(count, int) or type(first) is not t.Timestamp or type(keys) is not list:
            return _DROP
        table: dict[str, Any] = {}
        ttl = fields.get("ttl")
        if isinstance(ttl, int):
            table["original-expiration"] = str(int(ttl))
        table.update(
            {
                "count": min(int(count), _LONG_HIGH),
                "reason": str(fields.get("reason", "")),
                "queue": str(fields.get("queue", "")),
                "time": v.Timestamp(max(0, first) // 1000),
                "exchange": str(fields.get("exchange", "")),
                "routing-keys": [str(key) for key in keys if isinstance(key, str)],
            }
        )
        tables.append(table)
    return tables


def _add_application_headers(headers: dict[str, Any], application: dict[Any, Any]) -> None:
    """Application-properties with string keys of at most 255 bytes, after the others."""
    for key, value in application.items():
        if type(key) is str and _shortstr(key) is not None:
            converted = _to_091(value)
            if converted is not _DROP:
                headers.setdefault(key, converted)


__all__ = ["AMQP10_TYPE", "ConversionError", "Converted", "from_amqp10", "to_amqp10"]
