"""AMQP 1.0 composite and described types, generated from the specification's XML.

Do not edit: run ``python tools/gen_definitions.py > minibroker/amqp/definitions.py``.

Plain slotted classes with the constructor ``@dataclass(slots=True)`` would make, written out, so that
importing this module builds no dataclass (issue 19: that was 19 ms of the broker's start-up).
"""

# ruff: noqa: E501, RUF023 (slots in wire order, as the dataclasses had them)
from __future__ import annotations

from typing import Any, ClassVar
from uuid import UUID

from minibroker.amqp.composite import Composite, DescribedSection, FieldSpec

__all__ = ["UUID"]


class Open(Composite):
    """open (transport): ``amqp:open:list``, descriptor 0x00000010."""

    __slots__ = ('container_id', 'hostname', 'max_frame_size', 'channel_max', 'idle_time_out', 'outgoing_locales', 'incoming_locales', 'offered_capabilities', 'desired_capabilities', 'properties')
    __match_args__ = ('container_id', 'hostname', 'max_frame_size', 'channel_max', 'idle_time_out', 'outgoing_locales', 'incoming_locales', 'offered_capabilities', 'desired_capabilities', 'properties')

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000010
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:open:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
        FieldSpec('container_id', 'container-id', 'string', mandatory=True),
        FieldSpec('hostname', 'hostname', 'string'),
        FieldSpec('max_frame_size', 'max-frame-size', 'uint', default='4294967295'),
        FieldSpec('channel_max', 'channel-max', 'ushort', default='65535'),
        FieldSpec('idle_time_out', 'idle-time-out', 'uint'),
        FieldSpec('outgoing_locales', 'outgoing-locales', 'symbol', multiple=True),
        FieldSpec('incoming_locales', 'incoming-locales', 'symbol', multiple=True),
        FieldSpec('offered_capabilities', 'offered-capabilities', 'symbol', multiple=True),
        FieldSpec('desired_capabilities', 'desired-capabilities', 'symbol', multiple=True),
        FieldSpec('properties', 'properties', 'fields'),
    )

    def __init__(
        self,
        container_id: str | None = None,
        hostname: str | None = None,
        max_frame_size: int | None = None,
        channel_max: int | None = None,
        idle_time_out: int | None = None,
        outgoing_locales: list[str] | None = None,
        incoming_locales: list[str] | None = None,
        offered_capabilities: list[str] | None = None,
        desired_capabilities: list[str] | None = None,
        properties: dict[Any, Any] | None = None,
    ) -> None:
        self.container_id = container_id
        self.hostname = hostname
        self.max_frame_size = max_frame_size
        self.channel_max = channel_max
        self.idle_time_out = idle_time_out
        self.outgoing_locales = outgoing_locales
        self.incoming_locales = incoming_locales
        self.offered_capabilities = offered_capabilities
        self.desired_capabilities = desired_capabilities
        self.properties = properties


class Begin(Composite):
    """begin (transport): ``amqp:begin:list``, descriptor 0x00000011."""

    __slots__ = ('remote_channel', 'next_outgoing_id', 'incoming_window', 'outgoing_window', 'handle_max', 'offered_capabilities', 'desired_capabilities', 'properties')
    __match_args__ = ('remote_channel', 'next_outgoing_id', 'incoming_window', 'outgoing_window', 'handle_max', 'offered_capabilities', 'desired_capabilities', 'properties')

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000011
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:begin:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
        FieldSpec('remote_channel', 'remote-channel', 'ushort'),
        FieldSpec('next_outgoing_id', 'next-outgoing-id', 'uint', mandatory=True),
        FieldSpec('incoming_window', 'incoming-window', 'uint', mandatory=True),
        FieldSpec('outgoing_window', 'outgoing-window', 'uint', mandatory=True),
        FieldSpec('handle_max', 'handle-max', 'uint', default='4294967295'),
        FieldSpec('offered_capabilities', 'offered-capabilities', 'symbol', multiple=True),
        FieldSpec('desired_capabilities', 'desired-capabilities', 'symbol', multiple=True),
        FieldSpec('properties', 'properties', 'fields'),
    )

    def __init__(
        self,
        remote_channel: int | None = None,
        next_outgoing_id: int | None = None,
        incoming_window: int | None = None,
        outgoing_window: int | None = None,
        handle_max: int | None = None,
        offered_capabilities: list[str] | None = None,
        desired_capabilities: list[str] | None = None,
        properties: dict[Any, Any] | None = None,
    ) -> None:
        self.remote_channel = remote_channel
        self.next_outgoing_id = next_outgoing_id
        self.incoming_window = incoming_window
        self.outgoing_window = outgoing_window
        self.handle_max = handle_max
        self.offered_capabilities = offered_capabilities
        self.desired_capabilities = desired_capabilities
        self.properties = properties


class Attach(Composite):
    """attach (transport): ``amqp:attach:list``, descriptor 0x00000012."""

    __slots__ = ('name', 'handle', 'role', 'snd_settle_mode', 'rcv_settle_mode', 'source', 'target', 'unsettled', 'incomplete_unsettled', 'initial_delivery_count', 'max_message_size', 'offered_capabilities', 'desired_capabilities', 'properties')
    __match_args__ = ('name', 'handle', 'role', 'snd_settle_mode', 'rcv_settle_mode', 'source', 'target', 'unsettled', 'incomplete_unsettled', 'initial_delivery_count', 'max_message_size', 'offered_capabilities', 'desired_capabilities', 'properties')

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000012
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:attach:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
        FieldSpec('name', 'name', 'string', mandatory=True),
        FieldSpec('handle', 'handle', 'uint', mandatory=True),
        FieldSpec('role', 'role', 'boolean', mandatory=True),
        FieldSpec('snd_settle_mode', 'snd-settle-mode', 'ubyte', default='mixed'),
        FieldSpec('rcv_settle_mode', 'rcv-settle-mode', 'ubyte', default='first'),
        FieldSpec('source', 'source', '*'),
        FieldSpec('target', 'target', '*'),
        FieldSpec('unsettled', 'unsettled', 'map'),
        FieldSpec('incomplete_unsettled', 'incomplete-unsettled', 'boolean', default='false'),
        FieldSpec('initial_delivery_count', 'initial-delivery-count', 'uint'),
        FieldSpec('max_message_size', 'max-message-size', 'ulong'),
        FieldSpec('offered_capabilities', 'offered-capabilities', 'symbol', multiple=True),
        FieldSpec('desired_capabilities', 'desired-capabilities', 'symbol', multiple=True),
        FieldSpec('properties', 'properties', 'fields'),
    )

    def __init__(
        self,
        name: str | None = None,
        handle: int | None = None,
        role: bool | None = None,
        snd_settle_mode: int | None = None,
        rcv_settle_mode: int | None = None,
        source: Any = None,
        target: Any = None,
        unsettled: dict[Any, Any] | None = None,
        incomplete_unsettled: bool | None = None,
        initial_delivery_count: int | None = None,
        max_message_size: int | None = None,
        offered_capabilities: list[str] | None = None,
        desired_capabilities: list[str] | None = None,
        properties: dict[Any, Any] | None = None,
    ) -> None:
        self.name = name
        self.handle = handle
        self.role = role
        self.snd_settle_mode = snd_settle_mode
        self.rcv_settle_mode = rcv_settle_mode
        self.source = source
        self.target = target
        self.unsettled = unsettled
        self.incomplete_unsettled = incomplete_unsettled
        self.initial_delivery_count = initial_delivery_count
        self.max_message_size = max_message_size
        self.offered_capabilities = offered_capabilities
        self.desired_capabilities = desired_capabilities
        self.properties = properties


class Flow(Composite):
    """flow (transport): ``amqp:flow:list``, descriptor 0x00000013."""

    __slots__ = ('next_incoming_id', 'incoming_window', 'next_outgoing_id', 'outgoing_window', 'handle', 'delivery_count', 'link_credit', 'available', 'drain', 'echo', 'properties')
    __match_args__ = ('next_incoming_id', 'incoming_window', 'next_outgoing_id', 'outgoing_window', 'handle', 'delivery_count', 'link_credit', 'available', 'drain', 'echo', 'properties')

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000013
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:flow:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
        FieldSpec('next_incoming_id', 'next-incoming-id', 'uint'),
        FieldSpec('incoming_window', 'incoming-window', 'uint', mandatory=True),
        FieldSpec('next_outgoing_id', 'next-outgoing-id', 'uint', mandatory=True),
        FieldSpec('outgoing_window', 'outgoing-window', 'uint', mandatory=True),
        FieldSpec('handle', 'handle', 'uint'),
        FieldSpec('delivery_count', 'delivery-count', 'uint'),
        FieldSpec('link_credit', 'link-credit', 'uint'),
        FieldSpec('available', 'available', 'uint'),
        FieldSpec('drain', 'drain', 'boolean', default='false'),
        FieldSpec('echo', 'echo', 'boolean', default='false'),
        FieldSpec('properties', 'properties', 'fields'),
    )

    def __init__(
        self,
        next_incoming_id: int | None = None,
        incoming_window: int | None = None,
        next_outgoing_id: int | None = None,
        outgoing_window: int | None = None,
        handle: int | None = None,
        delivery_count: int | None = None,
        link_credit: int | None = None,
        available: int | None = None,
        drain: bool | None = None,
        echo: bool | None = None,
        properties: dict[Any, Any] | None = None,
    ) -> None:
        self.next_incoming_id = next_incoming_id
        self.incoming_window = incoming_window
        self.next_outgoing_id = next_outgoing_id
        self.outgoing_window = outgoing_window
        self.handle = handle
        self.delivery_count = delivery_count
        self.link_credit = link_credit
        self.available = available
        self.drain = drain
        self.echo = echo
        self.properties = properties


class Transfer(Composite):
    """transfer (transport): ``amqp:transfer:list``, descriptor 0x00000014."""

    __slots__ = ('handle', 'delivery_id', 'delivery_tag', 'message_format', 'settled', 'more', 'rcv_settle_mode', 'state', 'resume', 'aborted', 'batchable')
    __match_args__ = ('handle', 'delivery_id', 'delivery_tag', 'message_format', 'settled', 'more', 'rcv_settle_mode', 'state', 'resume', 'aborted', 'batchable')

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000014
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:transfer:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
        FieldSpec('handle', 'handle', 'uint', mandatory=True),
        FieldSpec('delivery_id', 'delivery-id', 'uint'),
        FieldSpec('delivery_tag', 'delivery-tag', 'binary'),
        FieldSpec('message_format', 'message-format', 'uint'),
        FieldSpec('settled', 'settled', 'boolean'),
        FieldSpec('more', 'more', 'boolean', default='false'),
        FieldSpec('rcv_settle_mode', 'rcv-settle-mode', 'ubyte'),
        FieldSpec('state', 'state', '*'),
        FieldSpec('resume', 'resume', 'boolean', default='false'),
        FieldSpec('aborted', 'aborted', 'boolean', default='false'),
        FieldSpec('batchable', 'batchable', 'boolean', default='false'),
    )

    def __init__(
        self,
        handle: int | None = None,
        delivery_id: int | None = None,
        delivery_tag: bytes | None = None,
        message_format: int | None = None,
        settled: bool | None = None,
        more: bool | None = None,
        rcv_settle_mode: int | None = None,
        state: Any = None,
        resume: bool | None = None,
        aborted: bool | None = None,
        batchable: bool | None = None,
    ) -> None:
        self.handle = handle
        self.delivery_id = delivery_id
        self.delivery_tag = delivery_tag
        self.message_format = message_format
        self.settled = settled
        self.more = more
        self.rcv_settle_mode = rcv_settle_mode
        self.state = state
        self.resume = resume
        self.aborted = aborted
        self.batchable = batchable


class Disposition(Composite):
    """disposition (transport): ``amqp:disposition:list``, descriptor 0x00000015."""

    __slots__ = ('role', 'first', 'last', 'settled', 'state', 'batchable')
    __match_args__ = ('role', 'first', 'last', 'settled', 'state', 'batchable')

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000015
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:disposition:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
        FieldSpec('role', 'role', 'boolean', mandatory=True),
        FieldSpec('first', 'first', 'uint', mandatory=True),
        FieldSpec('last', 'last', 'uint'),
        FieldSpec('settled', 'settled', 'boolean', default='false'),
        FieldSpec('state', 'state', '*'),
        FieldSpec('batchable', 'batchable', 'boolean', default='false'),
    )

    def __init__(
        self,
        role: bool | None = None,
        first: int | None = None,
        last: int | None = None,
        settled: bool | None = None,
        state: Any = None,
        batchable: bool | None = None,
    ) -> None:
        self.role = role
        self.first = first
        self.last = last
        self.settled = settled
        self.state = state
        self.batchable = batchable


class Detach(Composite):
    """detach (transport): ``amqp:detach:list``, descriptor 0x00000016."""

    __slots__ = ('handle', 'closed', 'error')
    __match_args__ = ('handle', 'closed', 'error')

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000016
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:detach:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
        FieldSpec('handle', 'handle', 'uint', mandatory=True),
        FieldSpec('closed', 'closed', 'boolean', default='false'),
        FieldSpec('error', 'error', '*'),
    )

    def __init__(
        self,
        handle: int | None = None,
        closed: bool | None = None,
        error: Any = None,
    ) -> None:
        self.handle = handle
        self.closed = closed
        self.error = error


class End(Composite):
    """end (transport): ``amqp:end:list``, descriptor 0x00000017."""

    __slots__ = ('error',)
    __match_args__ = ('error',)

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000017
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:end:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
        FieldSpec('error', 'error', '*'),
    )

    def __init__(
        self,
        error: Any = None,
    ) -> None:
        self.error = error


class Close(Composite):
    """close (transport): ``amqp:close:list``, descriptor 0x00000018."""

    __slots__ = ('error',)
    __match_args__ = ('error',)

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000018
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:close:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
        FieldSpec('error', 'error', '*'),
    )

    def __init__(
        self,
        error: Any = None,
    ) -> None:
        self.error = error


class Error(Composite):
    """error (transport): ``amqp:error:list``, descriptor 0x0000001d."""

    __slots__ = ('condition', 'description', 'info')
    __match_args__ = ('condition', 'description', 'info')

    DESCRIPTOR_CODE: ClassVar[int] = 0x0000001d
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:error:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
        FieldSpec('condition', 'condition', 'symbol', mandatory=True),
        FieldSpec('description', 'description', 'string'),
        FieldSpec('info', 'info', 'fields'),
    )

    def __init__(
        self,
        condition: str | None = None,
        description: str | None = None,
        info: dict[Any, Any] | None = None,
    ) -> None:
        self.condition = condition
        self.description = description
        self.info = info


class Header(Composite):
    """header (messaging): ``amqp:header:list``, descriptor 0x00000070."""

    __slots__ = ('durable', 'priority', 'ttl', 'first_acquirer', 'delivery_count')
    __match_args__ = ('durable', 'priority', 'ttl', 'first_acquirer', 'delivery_count')

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000070
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:header:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
        FieldSpec('durable', 'durable', 'boolean'),
        FieldSpec('priority', 'priority', 'ubyte'),
        FieldSpec('ttl', 'ttl', 'uint'),
        FieldSpec('first_acquirer', 'first-acquirer', 'boolean'),
        FieldSpec('delivery_count', 'delivery-count', 'uint'),
    )

    def __init__(
        self,
        durable: bool | None = None,
        priority: int | None = None,
        ttl: int | None = None,
        first_acquirer: bool | None = None,
        delivery_count: int | None = None,
    ) -> None:
        self.durable = durable
        self.priority = priority
        self.ttl = ttl
        self.first_acquirer = first_acquirer
        self.delivery_count = delivery_count


class DeliveryAnnotations(DescribedSection):
    """delivery-annotations (messaging): ``amqp:delivery-annotations:map``, descriptor 0x00000071."""

    __slots__ = ('value',)
    __match_args__ = ('value',)

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000071
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:delivery-annotations:map"
    SOURCE: ClassVar[str] = "fields"

    def __init__(
        self,
        value: dict[Any, Any],
    ) -> None:
        self.value = value


class MessageAnnotations(DescribedSection):
    """message-annotations (messaging): ``amqp:message-annotations:map``, descriptor 0x00000072."""

    __slots__ = ('value',)
    __match_args__ = ('value',)

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000072
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:message-annotations:map"
    SOURCE: ClassVar[str] = "fields"

    def __init__(
        self,
        value: dict[Any, Any],
    ) -> None:
        self.value = value


class Properties(Composite):
    """properties (messaging): ``amqp:properties:list``, descriptor 0x00000073."""

    __slots__ = ('message_id', 'user_id', 'to', 'subject', 'reply_to', 'correlation_id', 'content_type', 'content_encoding', 'absolute_expiry_time', 'creation_time', 'group_id', 'group_sequence', 'reply_to_group_id')
    __match_args__ = ('message_id', 'user_id', 'to', 'subject', 'reply_to', 'correlation_id', 'content_type', 'content_encoding', 'absolute_expiry_time', 'creation_time', 'group_id', 'group_sequence', 'reply_to_group_id')

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000073
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:properties:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
        FieldSpec('message_id', 'message-id', '*'),
        FieldSpec('user_id', 'user-id', 'binary'),
        FieldSpec('to', 'to', '*'),
        FieldSpec('subject', 'subject', 'string'),
        FieldSpec('reply_to', 'reply-to', '*'),
        FieldSpec('correlation_id', 'correlation-id', '*'),
        FieldSpec('content_type', 'content-type', 'symbol'),
        FieldSpec('content_encoding', 'content-encoding', 'symbol'),
        FieldSpec('absolute_expiry_time', 'absolute-expiry-time', 'timestamp'),
        FieldSpec('creation_time', 'creation-time', 'timestamp'),
        FieldSpec('group_id', 'group-id', 'string'),
        FieldSpec('group_sequence', 'group-sequence', 'uint'),
        FieldSpec('reply_to_group_id', 'reply-to-group-id', 'string'),
    )

    def __init__(
        self,
        message_id: Any = None,
        user_id: bytes | None = None,
        to: Any = None,
        subject: str | None = None,
        reply_to: Any = None,
        correlation_id: Any = None,
        content_type: str | None = None,
        content_encoding: str | None = None,
        absolute_expiry_time: int | None = None,
        creation_time: int | None = None,
        group_id: str | None = None,
        group_sequence: int | None = None,
        reply_to_group_id: str | None = None,
    ) -> None:
        self.message_id = message_id
        self.user_id = user_id
        self.to = to
        self.subject = subject
        self.reply_to = reply_to
        self.correlation_id = correlation_id
        self.content_type = content_type
        self.content_encoding = content_encoding
        self.absolute_expiry_time = absolute_expiry_time
        self.creation_time = creation_time
        self.group_id = group_id
        self.group_sequence = group_sequence
        self.reply_to_group_id = reply_to_group_id


class ApplicationProperties(DescribedSection):
    """application-properties (messaging): ``amqp:application-properties:map``, descriptor 0x00000074."""

    __slots__ = ('value',)
    __match_args__ = ('value',)

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000074
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:application-properties:map"
    SOURCE: ClassVar[str] = "map"

    def __init__(
        self,
        value: dict[Any, Any],
    ) -> None:
        self.value = value


class Data(DescribedSection):
    """data (messaging): ``amqp:data:binary``, descriptor 0x00000075."""

    __slots__ = ('value',)
    __match_args__ = ('value',)

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000075
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:data:binary"
    SOURCE: ClassVar[str] = "binary"

    def __init__(
        self,
        value: bytes,
    ) -> None:
        self.value = value


class AmqpSequence(DescribedSection):
    """amqp-sequence (messaging): ``amqp:amqp-sequence:list``, descriptor 0x00000076."""

    __slots__ = ('value',)
    __match_args__ = ('value',)

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000076
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:amqp-sequence:list"
    SOURCE: ClassVar[str] = "list"

    def __init__(
        self,
        value: list[Any],
    ) -> None:
        self.value = value


class AmqpValue(DescribedSection):
    """amqp-value (messaging): ``amqp:amqp-value:*``, descriptor 0x00000077."""

    __slots__ = ('value',)
    __match_args__ = ('value',)

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000077
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:amqp-value:*"
    SOURCE: ClassVar[str] = "*"

    def __init__(
        self,
        value: Any,
    ) -> None:
        self.value = value


class Footer(DescribedSection):
    """footer (messaging): ``amqp:footer:map``, descriptor 0x00000078."""

    __slots__ = ('value',)
    __match_args__ = ('value',)

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000078
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:footer:map"
    SOURCE: ClassVar[str] = "fields"

    def __init__(
        self,
        value: dict[Any, Any],
    ) -> None:
        self.value = value


class Received(Composite):
    """received (messaging): ``amqp:received:list``, descriptor 0x00000023."""

    __slots__ = ('section_number', 'section_offset')
    __match_args__ = ('section_number', 'section_offset')

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000023
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:received:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
        FieldSpec('section_number', 'section-number', 'uint', mandatory=True),
        FieldSpec('section_offset', 'section-offset', 'ulong', mandatory=True),
    )

    def __init__(
        self,
        section_number: int | None = None,
        section_offset: int | None = None,
    ) -> None:
        self.section_number = section_number
        self.section_offset = section_offset


class Accepted(Composite):
    """accepted (messaging): ``amqp:accepted:list``, descriptor 0x00000024."""

    __slots__ = ()
    __match_args__ = ()

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000024
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:accepted:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
    )

    def __init__(self) -> None:
        pass


class Rejected(Composite):
    """rejected (messaging): ``amqp:rejected:list``, descriptor 0x00000025."""

    __slots__ = ('error',)
    __match_args__ = ('error',)

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000025
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:rejected:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
        FieldSpec('error', 'error', '*'),
    )

    def __init__(
        self,
        error: Any = None,
    ) -> None:
        self.error = error


class Released(Composite):
    """released (messaging): ``amqp:released:list``, descriptor 0x00000026."""

    __slots__ = ()
    __match_args__ = ()

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000026
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:released:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
    )

    def __init__(self) -> None:
        pass


class Modified(Composite):
    """modified (messaging): ``amqp:modified:list``, descriptor 0x00000027."""

    __slots__ = ('delivery_failed', 'undeliverable_here', 'message_annotations')
    __match_args__ = ('delivery_failed', 'undeliverable_here', 'message_annotations')

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000027
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:modified:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
        FieldSpec('delivery_failed', 'delivery-failed', 'boolean'),
        FieldSpec('undeliverable_here', 'undeliverable-here', 'boolean'),
        FieldSpec('message_annotations', 'message-annotations', 'fields'),
    )

    def __init__(
        self,
        delivery_failed: bool | None = None,
        undeliverable_here: bool | None = None,
        message_annotations: dict[Any, Any] | None = None,
    ) -> None:
        self.delivery_failed = delivery_failed
        self.undeliverable_here = undeliverable_here
        self.message_annotations = message_annotations


class Source(Composite):
    """source (messaging): ``amqp:source:list``, descriptor 0x00000028."""

    __slots__ = ('address', 'durable', 'expiry_policy', 'timeout', 'dynamic', 'dynamic_node_properties', 'distribution_mode', 'filter', 'default_outcome', 'outcomes', 'capabilities')
    __match_args__ = ('address', 'durable', 'expiry_policy', 'timeout', 'dynamic', 'dynamic_node_properties', 'distribution_mode', 'filter', 'default_outcome', 'outcomes', 'capabilities')

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000028
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:source:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
        FieldSpec('address', 'address', '*'),
        FieldSpec('durable', 'durable', 'uint', default='none'),
        FieldSpec('expiry_policy', 'expiry-policy', 'symbol', default='session-end'),
        FieldSpec('timeout', 'timeout', 'uint', default='0'),
        FieldSpec('dynamic', 'dynamic', 'boolean', default='false'),
        FieldSpec('dynamic_node_properties', 'dynamic-node-properties', 'fields'),
        FieldSpec('distribution_mode', 'distribution-mode', 'symbol'),
        FieldSpec('filter', 'filter', 'fields'),
        FieldSpec('default_outcome', 'default-outcome', '*'),
        FieldSpec('outcomes', 'outcomes', 'symbol', multiple=True),
        FieldSpec('capabilities', 'capabilities', 'symbol', multiple=True),
    )

    def __init__(
        self,
        address: Any = None,
        durable: int | None = None,
        expiry_policy: str | None = None,
        timeout: int | None = None,
        dynamic: bool | None = None,
        dynamic_node_properties: dict[Any, Any] | None = None,
        distribution_mode: str | None = None,
        filter: dict[Any, Any] | None = None,
        default_outcome: Any = None,
        outcomes: list[str] | None = None,
        capabilities: list[str] | None = None,
    ) -> None:
        self.address = address
        self.durable = durable
        self.expiry_policy = expiry_policy
        self.timeout = timeout
        self.dynamic = dynamic
        self.dynamic_node_properties = dynamic_node_properties
        self.distribution_mode = distribution_mode
        self.filter = filter
        self.default_outcome = default_outcome
        self.outcomes = outcomes
        self.capabilities = capabilities


class Target(Composite):
    """target (messaging): ``amqp:target:list``, descriptor 0x00000029."""

    __slots__ = ('address', 'durable', 'expiry_policy', 'timeout', 'dynamic', 'dynamic_node_properties', 'capabilities')
    __match_args__ = ('address', 'durable', 'expiry_policy', 'timeout', 'dynamic', 'dynamic_node_properties', 'capabilities')

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000029
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:target:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
        FieldSpec('address', 'address', '*'),
        FieldSpec('durable', 'durable', 'uint', default='none'),
        FieldSpec('expiry_policy', 'expiry-policy', 'symbol', default='session-end'),
        FieldSpec('timeout', 'timeout', 'uint', default='0'),
        FieldSpec('dynamic', 'dynamic', 'boolean', default='false'),
        FieldSpec('dynamic_node_properties', 'dynamic-node-properties', 'fields'),
        FieldSpec('capabilities', 'capabilities', 'symbol', multiple=True),
    )

    def __init__(
        self,
        address: Any = None,
        durable: int | None = None,
        expiry_policy: str | None = None,
        timeout: int | None = None,
        dynamic: bool | None = None,
        dynamic_node_properties: dict[Any, Any] | None = None,
        capabilities: list[str] | None = None,
    ) -> None:
        self.address = address
        self.durable = durable
        self.expiry_policy = expiry_policy
        self.timeout = timeout
        self.dynamic = dynamic
        self.dynamic_node_properties = dynamic_node_properties
        self.capabilities = capabilities


class DeleteOnClose(Composite):
    """delete-on-close (messaging): ``amqp:delete-on-close:list``, descriptor 0x0000002b."""

    __slots__ = ()
    __match_args__ = ()

    DESCRIPTOR_CODE: ClassVar[int] = 0x0000002b
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:delete-on-close:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
    )

    def __init__(self) -> None:
        pass


class DeleteOnNoLinks(Composite):
    """delete-on-no-links (messaging): ``amqp:delete-on-no-links:list``, descriptor 0x0000002c."""

    __slots__ = ()
    __match_args__ = ()

    DESCRIPTOR_CODE: ClassVar[int] = 0x0000002c
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:delete-on-no-links:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
    )

    def __init__(self) -> None:
        pass


class DeleteOnNoMessages(Composite):
    """delete-on-no-messages (messaging): ``amqp:delete-on-no-messages:list``, descriptor 0x0000002d."""

    __slots__ = ()
    __match_args__ = ()

    DESCRIPTOR_CODE: ClassVar[int] = 0x0000002d
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:delete-on-no-messages:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
    )

    def __init__(self) -> None:
        pass


class DeleteOnNoLinksOrMessages(Composite):
    """delete-on-no-links-or-messages (messaging): ``amqp:delete-on-no-links-or-messages:list``, descriptor 0x0000002e."""

    __slots__ = ()
    __match_args__ = ()

    DESCRIPTOR_CODE: ClassVar[int] = 0x0000002e
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:delete-on-no-links-or-messages:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
    )

    def __init__(self) -> None:
        pass


class SaslMechanisms(Composite):
    """sasl-mechanisms (security): ``amqp:sasl-mechanisms:list``, descriptor 0x00000040."""

    __slots__ = ('sasl_server_mechanisms',)
    __match_args__ = ('sasl_server_mechanisms',)

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000040
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:sasl-mechanisms:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
        FieldSpec('sasl_server_mechanisms', 'sasl-server-mechanisms', 'symbol', mandatory=True, multiple=True),
    )

    def __init__(
        self,
        sasl_server_mechanisms: list[str] | None = None,
    ) -> None:
        self.sasl_server_mechanisms = sasl_server_mechanisms


class SaslInit(Composite):
    """sasl-init (security): ``amqp:sasl-init:list``, descriptor 0x00000041."""

    __slots__ = ('mechanism', 'initial_response', 'hostname')
    __match_args__ = ('mechanism', 'initial_response', 'hostname')

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000041
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:sasl-init:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
        FieldSpec('mechanism', 'mechanism', 'symbol', mandatory=True),
        FieldSpec('initial_response', 'initial-response', 'binary'),
        FieldSpec('hostname', 'hostname', 'string'),
    )

    def __init__(
        self,
        mechanism: str | None = None,
        initial_response: bytes | None = None,
        hostname: str | None = None,
    ) -> None:
        self.mechanism = mechanism
        self.initial_response = initial_response
        self.hostname = hostname


class SaslChallenge(Composite):
    """sasl-challenge (security): ``amqp:sasl-challenge:list``, descriptor 0x00000042."""

    __slots__ = ('challenge',)
    __match_args__ = ('challenge',)

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000042
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:sasl-challenge:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
        FieldSpec('challenge', 'challenge', 'binary', mandatory=True),
    )

    def __init__(
        self,
        challenge: bytes | None = None,
    ) -> None:
        self.challenge = challenge


class SaslResponse(Composite):
    """sasl-response (security): ``amqp:sasl-response:list``, descriptor 0x00000043."""

    __slots__ = ('response',)
    __match_args__ = ('response',)

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000043
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:sasl-response:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
        FieldSpec('response', 'response', 'binary', mandatory=True),
    )

    def __init__(
        self,
        response: bytes | None = None,
    ) -> None:
        self.response = response


class SaslOutcome(Composite):
    """sasl-outcome (security): ``amqp:sasl-outcome:list``, descriptor 0x00000044."""

    __slots__ = ('code', 'additional_data')
    __match_args__ = ('code', 'additional_data')

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000044
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:sasl-outcome:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
        FieldSpec('code', 'code', 'ubyte', mandatory=True),
        FieldSpec('additional_data', 'additional-data', 'binary'),
    )

    def __init__(
        self,
        code: int | None = None,
        additional_data: bytes | None = None,
    ) -> None:
        self.code = code
        self.additional_data = additional_data


class Coordinator(Composite):
    """coordinator (transactions): ``amqp:coordinator:list``, descriptor 0x00000030."""

    __slots__ = ('capabilities',)
    __match_args__ = ('capabilities',)

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000030
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:coordinator:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
        FieldSpec('capabilities', 'capabilities', 'symbol', multiple=True),
    )

    def __init__(
        self,
        capabilities: list[str] | None = None,
    ) -> None:
        self.capabilities = capabilities


class Declare(Composite):
    """declare (transactions): ``amqp:declare:list``, descriptor 0x00000031."""

    __slots__ = ('global_id',)
    __match_args__ = ('global_id',)

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000031
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:declare:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
        FieldSpec('global_id', 'global-id', '*'),
    )

    def __init__(
        self,
        global_id: Any = None,
    ) -> None:
        self.global_id = global_id


class Discharge(Composite):
    """discharge (transactions): ``amqp:discharge:list``, descriptor 0x00000032."""

    __slots__ = ('txn_id', 'fail')
    __match_args__ = ('txn_id', 'fail')

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000032
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:discharge:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
        FieldSpec('txn_id', 'txn-id', '*', mandatory=True),
        FieldSpec('fail', 'fail', 'boolean'),
    )

    def __init__(
        self,
        txn_id: Any = None,
        fail: bool | None = None,
    ) -> None:
        self.txn_id = txn_id
        self.fail = fail


class Declared(Composite):
    """declared (transactions): ``amqp:declared:list``, descriptor 0x00000033."""

    __slots__ = ('txn_id',)
    __match_args__ = ('txn_id',)

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000033
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:declared:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
        FieldSpec('txn_id', 'txn-id', '*', mandatory=True),
    )

    def __init__(
        self,
        txn_id: Any = None,
    ) -> None:
        self.txn_id = txn_id


class TransactionalState(Composite):
    """transactional-state (transactions): ``amqp:transactional-state:list``, descriptor 0x00000034."""

    __slots__ = ('txn_id', 'outcome')
    __match_args__ = ('txn_id', 'outcome')

    DESCRIPTOR_CODE: ClassVar[int] = 0x00000034
    DESCRIPTOR_NAME: ClassVar[str] = "amqp:transactional-state:list"
    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (
        FieldSpec('txn_id', 'txn-id', '*', mandatory=True),
        FieldSpec('outcome', 'outcome', '*'),
    )

    def __init__(
        self,
        txn_id: Any = None,
        outcome: Any = None,
    ) -> None:
        self.txn_id = txn_id
        self.outcome = outcome


ALL_TYPES: tuple[type, ...] = (
    Open,
    Begin,
    Attach,
    Flow,
    Transfer,
    Disposition,
    Detach,
    End,
    Close,
    Error,
    Header,
    DeliveryAnnotations,
    MessageAnnotations,
    Properties,
    ApplicationProperties,
    Data,
    AmqpSequence,
    AmqpValue,
    Footer,
    Received,
    Accepted,
    Rejected,
    Released,
    Modified,
    Source,
    Target,
    DeleteOnClose,
    DeleteOnNoLinks,
    DeleteOnNoMessages,
    DeleteOnNoLinksOrMessages,
    SaslMechanisms,
    SaslInit,
    SaslChallenge,
    SaslResponse,
    SaslOutcome,
    Coordinator,
    Declare,
    Discharge,
    Declared,
    TransactionalState,
)
