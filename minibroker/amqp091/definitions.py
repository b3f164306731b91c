"""AMQP 0-9-1 classes, methods, content properties and constants, generated from RabbitMQ's
extended specification XML (``spec-0-9-1/amqp0-9-1.stripped.extended.xml``).

Do not edit: run ``python tools/gen_amqp091.py > minibroker/amqp091/definitions.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, ClassVar

from minibroker.amqp091.base import Method, Properties

PORT = 5672
FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_MIN_SIZE = 4096
FRAME_END = 206


class ReplyCode(IntEnum):
    """Reply codes (``<constant>`` with a class, and reply-success)."""

    REPLY_SUCCESS = 200  # success
    CONTENT_TOO_LARGE = 311  # soft-error
    NO_CONSUMERS = 313  # soft-error
    CONNECTION_FORCED = 320  # hard-error
    INVALID_PATH = 402  # hard-error
    ACCESS_REFUSED = 403  # soft-error
    NOT_FOUND = 404  # soft-error
    RESOURCE_LOCKED = 405  # soft-error
    PRECONDITION_FAILED = 406  # soft-error
    FRAME_ERROR = 501  # hard-error
    SYNTAX_ERROR = 502  # hard-error
    COMMAND_INVALID = 503  # hard-error
    CHANNEL_ERROR = 504  # hard-error
    UNEXPECTED_FRAME = 505  # hard-error
    RESOURCE_ERROR = 506  # hard-error
    NOT_ALLOWED = 530  # hard-error
    NOT_IMPLEMENTED = 540  # hard-error
    INTERNAL_ERROR = 541  # hard-error


HARD_ERRORS = frozenset({
    ReplyCode.CONNECTION_FORCED,
    ReplyCode.INVALID_PATH,
    ReplyCode.FRAME_ERROR,
    ReplyCode.SYNTAX_ERROR,
    ReplyCode.COMMAND_INVALID,
    ReplyCode.CHANNEL_ERROR,
    ReplyCode.UNEXPECTED_FRAME,
    ReplyCode.RESOURCE_ERROR,
    ReplyCode.NOT_ALLOWED,
    ReplyCode.NOT_IMPLEMENTED,
    ReplyCode.INTERNAL_ERROR,
})
"""Codes that close the connection; the other error codes close only the channel."""


@dataclass(frozen=True, slots=True)
class ConnectionStart(Method):
    """connection.start (10, 10): synchronous."""

    CLASS_ID: ClassVar[int] = 10
    METHOD_ID: ClassVar[int] = 10
    NAME: ClassVar[str] = "connection.start"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ('connection.start-ok',)
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('version_major', 'octet'),
        ('version_minor', 'octet'),
        ('server_properties', 'table'),
        ('mechanisms', 'longstr'),
        ('locales', 'longstr'),
    )

    version_major: int = 0
    version_minor: int = 0
    server_properties: dict[str, Any] = field(default_factory=dict)
    mechanisms: bytes = b""
    locales: bytes = b""


@dataclass(frozen=True, slots=True)
class ConnectionStartOk(Method):
    """connection.start-ok (10, 11): synchronous."""

    CLASS_ID: ClassVar[int] = 10
    METHOD_ID: ClassVar[int] = 11
    NAME: ClassVar[str] = "connection.start-ok"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('client_properties', 'table'),
        ('mechanism', 'shortstr'),
        ('response', 'longstr'),
        ('locale', 'shortstr'),
    )

    client_properties: dict[str, Any] = field(default_factory=dict)
    mechanism: str = ""
    response: bytes = b""
    locale: str = ""


@dataclass(frozen=True, slots=True)
class ConnectionSecure(Method):
    """connection.secure (10, 20): synchronous."""

    CLASS_ID: ClassVar[int] = 10
    METHOD_ID: ClassVar[int] = 20
    NAME: ClassVar[str] = "connection.secure"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ('connection.secure-ok',)
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('challenge', 'longstr'),
    )

    challenge: bytes = b""


@dataclass(frozen=True, slots=True)
class ConnectionSecureOk(Method):
    """connection.secure-ok (10, 21): synchronous."""

    CLASS_ID: ClassVar[int] = 10
    METHOD_ID: ClassVar[int] = 21
    NAME: ClassVar[str] = "connection.secure-ok"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('response', 'longstr'),
    )

    response: bytes = b""


@dataclass(frozen=True, slots=True)
class ConnectionTune(Method):
    """connection.tune (10, 30): synchronous."""

    CLASS_ID: ClassVar[int] = 10
    METHOD_ID: ClassVar[int] = 30
    NAME: ClassVar[str] = "connection.tune"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ('connection.tune-ok',)
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('channel_max', 'short'),
        ('frame_max', 'long'),
        ('heartbeat', 'short'),
    )

    channel_max: int = 0
    frame_max: int = 0
    heartbeat: int = 0


@dataclass(frozen=True, slots=True)
class ConnectionTuneOk(Method):
    """connection.tune-ok (10, 31): synchronous."""

    CLASS_ID: ClassVar[int] = 10
    METHOD_ID: ClassVar[int] = 31
    NAME: ClassVar[str] = "connection.tune-ok"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('channel_max', 'short'),
        ('frame_max', 'long'),
        ('heartbeat', 'short'),
    )

    channel_max: int = 0
    frame_max: int = 0
    heartbeat: int = 0


@dataclass(frozen=True, slots=True)
class ConnectionOpen(Method):
    """connection.open (10, 40): synchronous."""

    CLASS_ID: ClassVar[int] = 10
    METHOD_ID: ClassVar[int] = 40
    NAME: ClassVar[str] = "connection.open"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ('connection.open-ok',)
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('virtual_host', 'shortstr'),
        ('reserved_1', 'shortstr'),
        ('reserved_2', 'bit'),
    )

    virtual_host: str = ""
    reserved_1: str = ""
    reserved_2: bool = False


@dataclass(frozen=True, slots=True)
class ConnectionOpenOk(Method):
    """connection.open-ok (10, 41): synchronous."""

    CLASS_ID: ClassVar[int] = 10
    METHOD_ID: ClassVar[int] = 41
    NAME: ClassVar[str] = "connection.open-ok"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('reserved_1', 'shortstr'),
    )

    reserved_1: str = ""


@dataclass(frozen=True, slots=True)
class ConnectionClose(Method):
    """connection.close (10, 50): synchronous."""

    CLASS_ID: ClassVar[int] = 10
    METHOD_ID: ClassVar[int] = 50
    NAME: ClassVar[str] = "connection.close"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ('connection.close-ok',)
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('reply_code', 'short'),
        ('reply_text', 'shortstr'),
        ('class_id', 'short'),
        ('method_id', 'short'),
    )

    reply_code: int = 0
    reply_text: str = ""
    class_id: int = 0
    method_id: int = 0


@dataclass(frozen=True, slots=True)
class ConnectionCloseOk(Method):
    """connection.close-ok (10, 51): synchronous."""

    CLASS_ID: ClassVar[int] = 10
    METHOD_ID: ClassVar[int] = 51
    NAME: ClassVar[str] = "connection.close-ok"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = ()


@dataclass(frozen=True, slots=True)
class ChannelOpen(Method):
    """channel.open (20, 10): synchronous."""

    CLASS_ID: ClassVar[int] = 20
    METHOD_ID: ClassVar[int] = 10
    NAME: ClassVar[str] = "channel.open"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ('channel.open-ok',)
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('reserved_1', 'shortstr'),
    )

    reserved_1: str = ""


@dataclass(frozen=True, slots=True)
class ChannelOpenOk(Method):
    """channel.open-ok (20, 11): synchronous."""

    CLASS_ID: ClassVar[int] = 20
    METHOD_ID: ClassVar[int] = 11
    NAME: ClassVar[str] = "channel.open-ok"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('reserved_1', 'longstr'),
    )

    reserved_1: bytes = b""


@dataclass(frozen=True, slots=True)
class ChannelFlow(Method):
    """channel.flow (20, 20): synchronous."""

    CLASS_ID: ClassVar[int] = 20
    METHOD_ID: ClassVar[int] = 20
    NAME: ClassVar[str] = "channel.flow"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ('channel.flow-ok',)
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('active', 'bit'),
    )

    active: bool = False


@dataclass(frozen=True, slots=True)
class ChannelFlowOk(Method):
    """channel.flow-ok (20, 21)."""

    CLASS_ID: ClassVar[int] = 20
    METHOD_ID: ClassVar[int] = 21
    NAME: ClassVar[str] = "channel.flow-ok"
    SYNCHRONOUS: ClassVar[bool] = False
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('active', 'bit'),
    )

    active: bool = False


@dataclass(frozen=True, slots=True)
class ChannelClose(Method):
    """channel.close (20, 40): synchronous."""

    CLASS_ID: ClassVar[int] = 20
    METHOD_ID: ClassVar[int] = 40
    NAME: ClassVar[str] = "channel.close"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ('channel.close-ok',)
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('reply_code', 'short'),
        ('reply_text', 'shortstr'),
        ('class_id', 'short'),
        ('method_id', 'short'),
    )

    reply_code: int = 0
    reply_text: str = ""
    class_id: int = 0
    method_id: int = 0


@dataclass(frozen=True, slots=True)
class ChannelCloseOk(Method):
    """channel.close-ok (20, 41): synchronous."""

    CLASS_ID: ClassVar[int] = 20
    METHOD_ID: ClassVar[int] = 41
    NAME: ClassVar[str] = "channel.close-ok"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = ()


@dataclass(frozen=True, slots=True)
class ExchangeDeclare(Method):
    """exchange.declare (40, 10): synchronous."""

    CLASS_ID: ClassVar[int] = 40
    METHOD_ID: ClassVar[int] = 10
    NAME: ClassVar[str] = "exchange.declare"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ('exchange.declare-ok',)
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('reserved_1', 'short'),
        ('exchange', 'shortstr'),
        ('type', 'shortstr'),
        ('passive', 'bit'),
        ('durable', 'bit'),
        ('auto_delete', 'bit'),
        ('internal', 'bit'),
        ('no_wait', 'bit'),
        ('arguments', 'table'),
    )

    reserved_1: int = 0
    exchange: str = ""
    type: str = ""
    passive: bool = False
    durable: bool = False
    auto_delete: bool = False
    internal: bool = False
    no_wait: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ExchangeDeclareOk(Method):
    """exchange.declare-ok (40, 11): synchronous."""

    CLASS_ID: ClassVar[int] = 40
    METHOD_ID: ClassVar[int] = 11
    NAME: ClassVar[str] = "exchange.declare-ok"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = ()


@dataclass(frozen=True, slots=True)
class ExchangeDelete(Method):
    """exchange.delete (40, 20): synchronous."""

    CLASS_ID: ClassVar[int] = 40
    METHOD_ID: ClassVar[int] = 20
    NAME: ClassVar[str] = "exchange.delete"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ('exchange.delete-ok',)
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('reserved_1', 'short'),
        ('exchange', 'shortstr'),
        ('if_unused', 'bit'),
        ('no_wait', 'bit'),
    )

    reserved_1: int = 0
    exchange: str = ""
    if_unused: bool = False
    no_wait: bool = False


@dataclass(frozen=True, slots=True)
class ExchangeDeleteOk(Method):
    """exchange.delete-ok (40, 21): synchronous."""

    CLASS_ID: ClassVar[int] = 40
    METHOD_ID: ClassVar[int] = 21
    NAME: ClassVar[str] = "exchange.delete-ok"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = ()


@dataclass(frozen=True, slots=True)
class ExchangeBind(Method):
    """exchange.bind (40, 30): synchronous."""

    CLASS_ID: ClassVar[int] = 40
    METHOD_ID: ClassVar[int] = 30
    NAME: ClassVar[str] = "exchange.bind"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ('exchange.bind-ok',)
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('reserved_1', 'short'),
        ('destination', 'shortstr'),
        ('source', 'shortstr'),
        ('routing_key', 'shortstr'),
        ('no_wait', 'bit'),
        ('arguments', 'table'),
    )

    reserved_1: int = 0
    destination: str = ""
    source: str = ""
    routing_key: str = ""
    no_wait: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ExchangeBindOk(Method):
    """exchange.bind-ok (40, 31): synchronous."""

    CLASS_ID: ClassVar[int] = 40
    METHOD_ID: ClassVar[int] = 31
    NAME: ClassVar[str] = "exchange.bind-ok"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = ()


@dataclass(frozen=True, slots=True)
class ExchangeUnbind(Method):
    """exchange.unbind (40, 40): synchronous."""

    CLASS_ID: ClassVar[int] = 40
    METHOD_ID: ClassVar[int] = 40
    NAME: ClassVar[str] = "exchange.unbind"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ('exchange.unbind-ok',)
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('reserved_1', 'short'),
        ('destination', 'shortstr'),
        ('source', 'shortstr'),
        ('routing_key', 'shortstr'),
        ('no_wait', 'bit'),
        ('arguments', 'table'),
    )

    reserved_1: int = 0
    destination: str = ""
    source: str = ""
    routing_key: str = ""
    no_wait: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ExchangeUnbindOk(Method):
    """exchange.unbind-ok (40, 51): synchronous."""

    CLASS_ID: ClassVar[int] = 40
    METHOD_ID: ClassVar[int] = 51
    NAME: ClassVar[str] = "exchange.unbind-ok"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = ()


@dataclass(frozen=True, slots=True)
class QueueDeclare(Method):
    """queue.declare (50, 10): synchronous."""

    CLASS_ID: ClassVar[int] = 50
    METHOD_ID: ClassVar[int] = 10
    NAME: ClassVar[str] = "queue.declare"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ('queue.declare-ok',)
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('reserved_1', 'short'),
        ('queue', 'shortstr'),
        ('passive', 'bit'),
        ('durable', 'bit'),
        ('exclusive', 'bit'),
        ('auto_delete', 'bit'),
        ('no_wait', 'bit'),
        ('arguments', 'table'),
    )

    reserved_1: int = 0
    queue: str = ""
    passive: bool = False
    durable: bool = False
    exclusive: bool = False
    auto_delete: bool = False
    no_wait: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class QueueDeclareOk(Method):
    """queue.declare-ok (50, 11): synchronous."""

    CLASS_ID: ClassVar[int] = 50
    METHOD_ID: ClassVar[int] = 11
    NAME: ClassVar[str] = "queue.declare-ok"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('queue', 'shortstr'),
        ('message_count', 'long'),
        ('consumer_count', 'long'),
    )

    queue: str = ""
    message_count: int = 0
    consumer_count: int = 0


@dataclass(frozen=True, slots=True)
class QueueBind(Method):
    """queue.bind (50, 20): synchronous."""

    CLASS_ID: ClassVar[int] = 50
    METHOD_ID: ClassVar[int] = 20
    NAME: ClassVar[str] = "queue.bind"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ('queue.bind-ok',)
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('reserved_1', 'short'),
        ('queue', 'shortstr'),
        ('exchange', 'shortstr'),
        ('routing_key', 'shortstr'),
        ('no_wait', 'bit'),
        ('arguments', 'table'),
    )

    reserved_1: int = 0
    queue: str = ""
    exchange: str = ""
    routing_key: str = ""
    no_wait: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class QueueBindOk(Method):
    """queue.bind-ok (50, 21): synchronous."""

    CLASS_ID: ClassVar[int] = 50
    METHOD_ID: ClassVar[int] = 21
    NAME: ClassVar[str] = "queue.bind-ok"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = ()


@dataclass(frozen=True, slots=True)
class QueueUnbind(Method):
    """queue.unbind (50, 50): synchronous."""

    CLASS_ID: ClassVar[int] = 50
    METHOD_ID: ClassVar[int] = 50
    NAME: ClassVar[str] = "queue.unbind"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ('queue.unbind-ok',)
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('reserved_1', 'short'),
        ('queue', 'shortstr'),
        ('exchange', 'shortstr'),
        ('routing_key', 'shortstr'),
        ('arguments', 'table'),
    )

    reserved_1: int = 0
    queue: str = ""
    exchange: str = ""
    routing_key: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class QueueUnbindOk(Method):
    """queue.unbind-ok (50, 51): synchronous."""

    CLASS_ID: ClassVar[int] = 50
    METHOD_ID: ClassVar[int] = 51
    NAME: ClassVar[str] = "queue.unbind-ok"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = ()


@dataclass(frozen=True, slots=True)
class QueuePurge(Method):
    """queue.purge (50, 30): synchronous."""

    CLASS_ID: ClassVar[int] = 50
    METHOD_ID: ClassVar[int] = 30
    NAME: ClassVar[str] = "queue.purge"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ('queue.purge-ok',)
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('reserved_1', 'short'),
        ('queue', 'shortstr'),
        ('no_wait', 'bit'),
    )

    reserved_1: int = 0
    queue: str = ""
    no_wait: bool = False


@dataclass(frozen=True, slots=True)
class QueuePurgeOk(Method):
    """queue.purge-ok (50, 31): synchronous."""

    CLASS_ID: ClassVar[int] = 50
    METHOD_ID: ClassVar[int] = 31
    NAME: ClassVar[str] = "queue.purge-ok"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('message_count', 'long'),
    )

    message_count: int = 0


@dataclass(frozen=True, slots=True)
class QueueDelete(Method):
    """queue.delete (50, 40): synchronous."""

    CLASS_ID: ClassVar[int] = 50
    METHOD_ID: ClassVar[int] = 40
    NAME: ClassVar[str] = "queue.delete"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ('queue.delete-ok',)
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('reserved_1', 'short'),
        ('queue', 'shortstr'),
        ('if_unused', 'bit'),
        ('if_empty', 'bit'),
        ('no_wait', 'bit'),
    )

    reserved_1: int = 0
    queue: str = ""
    if_unused: bool = False
    if_empty: bool = False
    no_wait: bool = False


@dataclass(frozen=True, slots=True)
class QueueDeleteOk(Method):
    """queue.delete-ok (50, 41): synchronous."""

    CLASS_ID: ClassVar[int] = 50
    METHOD_ID: ClassVar[int] = 41
    NAME: ClassVar[str] = "queue.delete-ok"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('message_count', 'long'),
    )

    message_count: int = 0


@dataclass(frozen=True, slots=True)
class BasicProperties(Properties):
    """Content properties of class basic (60), in property-flag order."""

    CLASS_ID: ClassVar[int] = 60
    PROPERTIES: ClassVar[tuple[tuple[str, str], ...]] = (
        ('content_type', 'shortstr'),
        ('content_encoding', 'shortstr'),
        ('headers', 'table'),
        ('delivery_mode', 'octet'),
        ('priority', 'octet'),
        ('correlation_id', 'shortstr'),
        ('reply_to', 'shortstr'),
        ('expiration', 'shortstr'),
        ('message_id', 'shortstr'),
        ('timestamp', 'timestamp'),
        ('type', 'shortstr'),
        ('user_id', 'shortstr'),
        ('app_id', 'shortstr'),
        ('reserved', 'shortstr'),
    )

    content_type: str | None = None
    content_encoding: str | None = None
    headers: dict[str, Any] | None = None
    delivery_mode: int | None = None
    priority: int | None = None
    correlation_id: str | None = None
    reply_to: str | None = None
    expiration: str | None = None
    message_id: str | None = None
    timestamp: int | None = None
    type: str | None = None
    user_id: str | None = None
    app_id: str | None = None
    reserved: str | None = None


@dataclass(frozen=True, slots=True)
class BasicQos(Method):
    """basic.qos (60, 10): synchronous."""

    CLASS_ID: ClassVar[int] = 60
    METHOD_ID: ClassVar[int] = 10
    NAME: ClassVar[str] = "basic.qos"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ('basic.qos-ok',)
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('prefetch_size', 'long'),
        ('prefetch_count', 'short'),
        ('global_', 'bit'),
    )

    prefetch_size: int = 0
    prefetch_count: int = 0
    global_: bool = False


@dataclass(frozen=True, slots=True)
class BasicQosOk(Method):
    """basic.qos-ok (60, 11): synchronous."""

    CLASS_ID: ClassVar[int] = 60
    METHOD_ID: ClassVar[int] = 11
    NAME: ClassVar[str] = "basic.qos-ok"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = ()


@dataclass(frozen=True, slots=True)
class BasicConsume(Method):
    """basic.consume (60, 20): synchronous."""

    CLASS_ID: ClassVar[int] = 60
    METHOD_ID: ClassVar[int] = 20
    NAME: ClassVar[str] = "basic.consume"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ('basic.consume-ok',)
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('reserved_1', 'short'),
        ('queue', 'shortstr'),
        ('consumer_tag', 'shortstr'),
        ('no_local', 'bit'),
        ('no_ack', 'bit'),
        ('exclusive', 'bit'),
        ('no_wait', 'bit'),
        ('arguments', 'table'),
    )

    reserved_1: int = 0
    queue: str = ""
    consumer_tag: str = ""
    no_local: bool = False
    no_ack: bool = False
    exclusive: bool = False
    no_wait: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BasicConsumeOk(Method):
    """basic.consume-ok (60, 21): synchronous."""

    CLASS_ID: ClassVar[int] = 60
    METHOD_ID: ClassVar[int] = 21
    NAME: ClassVar[str] = "basic.consume-ok"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('consumer_tag', 'shortstr'),
    )

    consumer_tag: str = ""


@dataclass(frozen=True, slots=True)
class BasicCancel(Method):
    """basic.cancel (60, 30): synchronous."""

    CLASS_ID: ClassVar[int] = 60
    METHOD_ID: ClassVar[int] = 30
    NAME: ClassVar[str] = "basic.cancel"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ('basic.cancel-ok',)
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('consumer_tag', 'shortstr'),
        ('no_wait', 'bit'),
    )

    consumer_tag: str = ""
    no_wait: bool = False


@dataclass(frozen=True, slots=True)
class BasicCancelOk(Method):
    """basic.cancel-ok (60, 31): synchronous."""

    CLASS_ID: ClassVar[int] = 60
    METHOD_ID: ClassVar[int] = 31
    NAME: ClassVar[str] = "basic.cancel-ok"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('consumer_tag', 'shortstr'),
    )

    consumer_tag: str = ""


@dataclass(frozen=True, slots=True)
class BasicPublish(Method):
    """basic.publish (60, 40): content."""

    CLASS_ID: ClassVar[int] = 60
    METHOD_ID: ClassVar[int] = 40
    NAME: ClassVar[str] = "basic.publish"
    SYNCHRONOUS: ClassVar[bool] = False
    CONTENT: ClassVar[bool] = True
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('reserved_1', 'short'),
        ('exchange', 'shortstr'),
        ('routing_key', 'shortstr'),
        ('mandatory', 'bit'),
        ('immediate', 'bit'),
    )

    reserved_1: int = 0
    exchange: str = ""
    routing_key: str = ""
    mandatory: bool = False
    immediate: bool = False


@dataclass(frozen=True, slots=True)
class BasicReturn(Method):
    """basic.return (60, 50): content."""

    CLASS_ID: ClassVar[int] = 60
    METHOD_ID: ClassVar[int] = 50
    NAME: ClassVar[str] = "basic.return"
    SYNCHRONOUS: ClassVar[bool] = False
    CONTENT: ClassVar[bool] = True
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('reply_code', 'short'),
        ('reply_text', 'shortstr'),
        ('exchange', 'shortstr'),
        ('routing_key', 'shortstr'),
    )

    reply_code: int = 0
    reply_text: str = ""
    exchange: str = ""
    routing_key: str = ""


@dataclass(frozen=True, slots=True)
class BasicDeliver(Method):
    """basic.deliver (60, 60): content."""

    CLASS_ID: ClassVar[int] = 60
    METHOD_ID: ClassVar[int] = 60
    NAME: ClassVar[str] = "basic.deliver"
    SYNCHRONOUS: ClassVar[bool] = False
    CONTENT: ClassVar[bool] = True
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('consumer_tag', 'shortstr'),
        ('delivery_tag', 'longlong'),
        ('redelivered', 'bit'),
        ('exchange', 'shortstr'),
        ('routing_key', 'shortstr'),
    )

    consumer_tag: str = ""
    delivery_tag: int = 0
    redelivered: bool = False
    exchange: str = ""
    routing_key: str = ""


@dataclass(frozen=True, slots=True)
class BasicGet(Method):
    """basic.get (60, 70): synchronous."""

    CLASS_ID: ClassVar[int] = 60
    METHOD_ID: ClassVar[int] = 70
    NAME: ClassVar[str] = "basic.get"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ('basic.get-ok', 'basic.get-empty')
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('reserved_1', 'short'),
        ('queue', 'shortstr'),
        ('no_ack', 'bit'),
    )

    reserved_1: int = 0
    queue: str = ""
    no_ack: bool = False


@dataclass(frozen=True, slots=True)
class BasicGetOk(Method):
    """basic.get-ok (60, 71): synchronous, content."""

    CLASS_ID: ClassVar[int] = 60
    METHOD_ID: ClassVar[int] = 71
    NAME: ClassVar[str] = "basic.get-ok"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = True
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('delivery_tag', 'longlong'),
        ('redelivered', 'bit'),
        ('exchange', 'shortstr'),
        ('routing_key', 'shortstr'),
        ('message_count', 'long'),
    )

    delivery_tag: int = 0
    redelivered: bool = False
    exchange: str = ""
    routing_key: str = ""
    message_count: int = 0


@dataclass(frozen=True, slots=True)
class BasicGetEmpty(Method):
    """basic.get-empty (60, 72): synchronous."""

    CLASS_ID: ClassVar[int] = 60
    METHOD_ID: ClassVar[int] = 72
    NAME: ClassVar[str] = "basic.get-empty"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('reserved_1', 'shortstr'),
    )

    reserved_1: str = ""


@dataclass(frozen=True, slots=True)
class BasicAck(Method):
    """basic.ack (60, 80)."""

    CLASS_ID: ClassVar[int] = 60
    METHOD_ID: ClassVar[int] = 80
    NAME: ClassVar[str] = "basic.ack"
    SYNCHRONOUS: ClassVar[bool] = False
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('delivery_tag', 'longlong'),
        ('multiple', 'bit'),
    )

    delivery_tag: int = 0
    multiple: bool = False


@dataclass(frozen=True, slots=True)
class BasicReject(Method):
    """basic.reject (60, 90)."""

    CLASS_ID: ClassVar[int] = 60
    METHOD_ID: ClassVar[int] = 90
    NAME: ClassVar[str] = "basic.reject"
    SYNCHRONOUS: ClassVar[bool] = False
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('delivery_tag', 'longlong'),
        ('requeue', 'bit'),
    )

    delivery_tag: int = 0
    requeue: bool = False


@dataclass(frozen=True, slots=True)
class BasicRecoverAsync(Method):
    """basic.recover-async (60, 100): deprecated."""

    CLASS_ID: ClassVar[int] = 60
    METHOD_ID: ClassVar[int] = 100
    NAME: ClassVar[str] = "basic.recover-async"
    SYNCHRONOUS: ClassVar[bool] = False
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('requeue', 'bit'),
    )

    requeue: bool = False


@dataclass(frozen=True, slots=True)
class BasicRecover(Method):
    """basic.recover (60, 110)."""

    CLASS_ID: ClassVar[int] = 60
    METHOD_ID: ClassVar[int] = 110
    NAME: ClassVar[str] = "basic.recover"
    SYNCHRONOUS: ClassVar[bool] = False
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('requeue', 'bit'),
    )

    requeue: bool = False


@dataclass(frozen=True, slots=True)
class BasicRecoverOk(Method):
    """basic.recover-ok (60, 111): synchronous."""

    CLASS_ID: ClassVar[int] = 60
    METHOD_ID: ClassVar[int] = 111
    NAME: ClassVar[str] = "basic.recover-ok"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = ()


@dataclass(frozen=True, slots=True)
class BasicNack(Method):
    """basic.nack (60, 120)."""

    CLASS_ID: ClassVar[int] = 60
    METHOD_ID: ClassVar[int] = 120
    NAME: ClassVar[str] = "basic.nack"
    SYNCHRONOUS: ClassVar[bool] = False
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('delivery_tag', 'longlong'),
        ('multiple', 'bit'),
        ('requeue', 'bit'),
    )

    delivery_tag: int = 0
    multiple: bool = False
    requeue: bool = False


@dataclass(frozen=True, slots=True)
class TxSelect(Method):
    """tx.select (90, 10): synchronous."""

    CLASS_ID: ClassVar[int] = 90
    METHOD_ID: ClassVar[int] = 10
    NAME: ClassVar[str] = "tx.select"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ('tx.select-ok',)
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = ()


@dataclass(frozen=True, slots=True)
class TxSelectOk(Method):
    """tx.select-ok (90, 11): synchronous."""

    CLASS_ID: ClassVar[int] = 90
    METHOD_ID: ClassVar[int] = 11
    NAME: ClassVar[str] = "tx.select-ok"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = ()


@dataclass(frozen=True, slots=True)
class TxCommit(Method):
    """tx.commit (90, 20): synchronous."""

    CLASS_ID: ClassVar[int] = 90
    METHOD_ID: ClassVar[int] = 20
    NAME: ClassVar[str] = "tx.commit"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ('tx.commit-ok',)
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = ()


@dataclass(frozen=True, slots=True)
class TxCommitOk(Method):
    """tx.commit-ok (90, 21): synchronous."""

    CLASS_ID: ClassVar[int] = 90
    METHOD_ID: ClassVar[int] = 21
    NAME: ClassVar[str] = "tx.commit-ok"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = ()


@dataclass(frozen=True, slots=True)
class TxRollback(Method):
    """tx.rollback (90, 30): synchronous."""

    CLASS_ID: ClassVar[int] = 90
    METHOD_ID: ClassVar[int] = 30
    NAME: ClassVar[str] = "tx.rollback"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ('tx.rollback-ok',)
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = ()


@dataclass(frozen=True, slots=True)
class TxRollbackOk(Method):
    """tx.rollback-ok (90, 31): synchronous."""

    CLASS_ID: ClassVar[int] = 90
    METHOD_ID: ClassVar[int] = 31
    NAME: ClassVar[str] = "tx.rollback-ok"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = ()


@dataclass(frozen=True, slots=True)
class ConfirmSelect(Method):
    """confirm.select (85, 10): synchronous."""

    CLASS_ID: ClassVar[int] = 85
    METHOD_ID: ClassVar[int] = 10
    NAME: ClassVar[str] = "confirm.select"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ('confirm.select-ok',)
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (
        ('nowait', 'bit'),
    )

    nowait: bool = False


@dataclass(frozen=True, slots=True)
class ConfirmSelectOk(Method):
    """confirm.select-ok (85, 11): synchronous."""

    CLASS_ID: ClassVar[int] = 85
    METHOD_ID: ClassVar[int] = 11
    NAME: ClassVar[str] = "confirm.select-ok"
    SYNCHRONOUS: ClassVar[bool] = True
    CONTENT: ClassVar[bool] = False
    RESPONSES: ClassVar[tuple[str, ...]] = ()
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = ()


METHODS: dict[tuple[int, int], type[Method]] = {
    (ConnectionStart.CLASS_ID, ConnectionStart.METHOD_ID): ConnectionStart,
    (ConnectionStartOk.CLASS_ID, ConnectionStartOk.METHOD_ID): ConnectionStartOk,
    (ConnectionSecure.CLASS_ID, ConnectionSecure.METHOD_ID): ConnectionSecure,
    (ConnectionSecureOk.CLASS_ID, ConnectionSecureOk.METHOD_ID): ConnectionSecureOk,
    (ConnectionTune.CLASS_ID, ConnectionTune.METHOD_ID): ConnectionTune,
    (ConnectionTuneOk.CLASS_ID, ConnectionTuneOk.METHOD_ID): ConnectionTuneOk,
    (ConnectionOpen.CLASS_ID, ConnectionOpen.METHOD_ID): ConnectionOpen,
    (ConnectionOpenOk.CLASS_ID, ConnectionOpenOk.METHOD_ID): ConnectionOpenOk,
    (ConnectionClose.CLASS_ID, ConnectionClose.METHOD_ID): ConnectionClose,
    (ConnectionCloseOk.CLASS_ID, ConnectionCloseOk.METHOD_ID): ConnectionCloseOk,
    (ChannelOpen.CLASS_ID, ChannelOpen.METHOD_ID): ChannelOpen,
    (ChannelOpenOk.CLASS_ID, ChannelOpenOk.METHOD_ID): ChannelOpenOk,
    (ChannelFlow.CLASS_ID, ChannelFlow.METHOD_ID): ChannelFlow,
    (ChannelFlowOk.CLASS_ID, ChannelFlowOk.METHOD_ID): ChannelFlowOk,
    (ChannelClose.CLASS_ID, ChannelClose.METHOD_ID): ChannelClose,
    (ChannelCloseOk.CLASS_ID, ChannelCloseOk.METHOD_ID): ChannelCloseOk,
    (ExchangeDeclare.CLASS_ID, ExchangeDeclare.METHOD_ID): ExchangeDeclare,
    (ExchangeDeclareOk.CLASS_ID, ExchangeDeclareOk.METHOD_ID): ExchangeDeclareOk,
    (ExchangeDelete.CLASS_ID, ExchangeDelete.METHOD_ID): ExchangeDelete,
    (ExchangeDeleteOk.CLASS_ID, ExchangeDeleteOk.METHOD_ID): ExchangeDeleteOk,
    (ExchangeBind.CLASS_ID, ExchangeBind.METHOD_ID): ExchangeBind,
    (ExchangeBindOk.CLASS_ID, ExchangeBindOk.METHOD_ID): ExchangeBindOk,
    (ExchangeUnbind.CLASS_ID, ExchangeUnbind.METHOD_ID): ExchangeUnbind,
    (ExchangeUnbindOk.CLASS_ID, ExchangeUnbindOk.METHOD_ID): ExchangeUnbindOk,
    (QueueDeclare.CLASS_ID, QueueDeclare.METHOD_ID): QueueDeclare,
    (QueueDeclareOk.CLASS_ID, QueueDeclareOk.METHOD_ID): QueueDeclareOk,
    (QueueBind.CLASS_ID, QueueBind.METHOD_ID): QueueBind,
    (QueueBindOk.CLASS_ID, QueueBindOk.METHOD_ID): QueueBindOk,
    (QueueUnbind.CLASS_ID, QueueUnbind.METHOD_ID): QueueUnbind,
    (QueueUnbindOk.CLASS_ID, QueueUnbindOk.METHOD_ID): QueueUnbindOk,
    (QueuePurge.CLASS_ID, QueuePurge.METHOD_ID): QueuePurge,
    (QueuePurgeOk.CLASS_ID, QueuePurgeOk.METHOD_ID): QueuePurgeOk,
    (QueueDelete.CLASS_ID, QueueDelete.METHOD_ID): QueueDelete,
    (QueueDeleteOk.CLASS_ID, QueueDeleteOk.METHOD_ID): QueueDeleteOk,
    (BasicQos.CLASS_ID, BasicQos.METHOD_ID): BasicQos,
    (BasicQosOk.CLASS_ID, BasicQosOk.METHOD_ID): BasicQosOk,
    (BasicConsume.CLASS_ID, BasicConsume.METHOD_ID): BasicConsume,
    (BasicConsumeOk.CLASS_ID, BasicConsumeOk.METHOD_ID): BasicConsumeOk,
    (BasicCancel.CLASS_ID, BasicCancel.METHOD_ID): BasicCancel,
    (BasicCancelOk.CLASS_ID, BasicCancelOk.METHOD_ID): BasicCancelOk,
    (BasicPublish.CLASS_ID, BasicPublish.METHOD_ID): BasicPublish,
    (BasicReturn.CLASS_ID, BasicReturn.METHOD_ID): BasicReturn,
    (BasicDeliver.CLASS_ID, BasicDeliver.METHOD_ID): BasicDeliver,
    (BasicGet.CLASS_ID, BasicGet.METHOD_ID): BasicGet,
    (BasicGetOk.CLASS_ID, BasicGetOk.METHOD_ID): BasicGetOk,
    (BasicGetEmpty.CLASS_ID, BasicGetEmpty.METHOD_ID): BasicGetEmpty,
    (BasicAck.CLASS_ID, BasicAck.METHOD_ID): BasicAck,
    (BasicReject.CLASS_ID, BasicReject.METHOD_ID): BasicReject,
    (BasicRecoverAsync.CLASS_ID, BasicRecoverAsync.METHOD_ID): BasicRecoverAsync,
    (BasicRecover.CLASS_ID, BasicRecover.METHOD_ID): BasicRecover,
    (BasicRecoverOk.CLASS_ID, BasicRecoverOk.METHOD_ID): BasicRecoverOk,
    (BasicNack.CLASS_ID, BasicNack.METHOD_ID): BasicNack,
    (TxSelect.CLASS_ID, TxSelect.METHOD_ID): TxSelect,
    (TxSelectOk.CLASS_ID, TxSelectOk.METHOD_ID): TxSelectOk,
    (TxCommit.CLASS_ID, TxCommit.METHOD_ID): TxCommit,
    (TxCommitOk.CLASS_ID, TxCommitOk.METHOD_ID): TxCommitOk,
    (TxRollback.CLASS_ID, TxRollback.METHOD_ID): TxRollback,
    (TxRollbackOk.CLASS_ID, TxRollbackOk.METHOD_ID): TxRollbackOk,
    (ConfirmSelect.CLASS_ID, ConfirmSelect.METHOD_ID): ConfirmSelect,
    (ConfirmSelectOk.CLASS_ID, ConfirmSelectOk.METHOD_ID): ConfirmSelectOk,
}
"""Every method by (class-id, method-id)."""

PROPERTIES: dict[int, type[Properties]] = {
    BasicProperties.CLASS_ID: BasicProperties,
}
"""The content properties of each class that carries content, by class-id."""
