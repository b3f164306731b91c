"""Event Hubs as azure-eventhub 5.x meets it (issue 17 item 10), pure parts: addresses, the starting-position
filter, the annotations of an event and the ``$management`` READ answers.

Addresses (``_producer.py`` ``EventHubProducer``: ``HUB`` or ``HUB/Partitions/N``; ``_consumer_client.py``
``_create_consumer``: ``HUB/ConsumerGroups/CG/Partitions/N``). The consumer's source carries an
``apache.org:selector-filter:string`` filter (``_transport/_pyamqp_transport.py`` ``create_source``) whose text
``_utils.py`` ``event_position_selector`` writes: ``amqp.annotation.x-opt-offset > '-1'`` (``>=`` when
inclusive), or ``x-opt-sequence-number`` / ``x-opt-enqueued-time`` (ms) likewise; the offset ``-1`` is the start
of the partition and ``@latest`` its end. ``$management`` requests (``_client_base.py``
``_get_eventhub_properties`` / ``_get_partition_properties``) have ``operation`` ``READ``, ``type``
``com.microsoft:eventhub`` or ``com.microsoft:partition``, ``name`` and ``partition`` application-properties; the
answer's status is read from ``status-code`` / ``status-description`` (``_constants.py``), its body is a map with
string keys (read back as bytes by ``_pyamqp``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from minibroker.amqp.types import Array, Long, Timestamp

READ = "READ"
ARGUMENT_OUT_OF_RANGE = "com.microsoft:argument-out-of-range"
"""A reader's starting position past the partition's end (``_constants.py`` ``NO_RETRY_ERRORS``: not retried)."""
HUB_TYPE = "com.microsoft:eventhub"
PARTITION_TYPE = "com.microsoft:partition"
SELECTOR_FILTER = "apache.org:selector-filter:string"
"""The source filter naming where a consumer starts (``_pyamqp/constants.py`` ``ApacheFilters.selector_filter``)."""
DEFAULT_CONSUMER_GROUP = "$Default"
PARTITION_COUNT = 2
"""Partitions of an event hub: the emulator has no default (``PartitionCount`` is required in its Config.json),
and the sample configuration it ships uses 2."""
SEQUENCE_NUMBER = "x-opt-sequence-number"
OFFSET = "x-opt-offset"
ENQUEUED_TIME = "x-opt-enqueued-time"
PARTITION_KEY = "x-opt-partition-key"

_PARTITIONS = "Partitions"
_CONSUMER_GROUPS = "ConsumerGroups"
_NAME = re.compile(r"[^\x00-\x1f/]{1,256}")
_POSITION = re.compile(
    r"\s*amqp\.annotation\.(x-opt-offset|x-opt-sequence-number|x-opt-enqueued-time)\s*(>=|>)\s*'([^']*)'\s*"
)


@dataclass(frozen=True)
class EventHubAddress:
    """A link address of the Event Hubs form: a partition of ``hub`` (``partition`` None: the hub itself, for a
    sender), read by ``consumer_group`` when it is a consumer's."""

    hub: str
    partition: str | None
    consumer_group: str | None = None


def parse_address(path: str) -> EventHubAddress | None:
    """``HUB/Partitions/N`` or ``HUB/ConsumerGroups/CG/Partitions/N`` (an entity path, scheme and host already
    stripped); None for any other form, or a name with control characters."""
    parts = path.split("/")
    if len(parts) == 3 and parts[1] == _PARTITIONS:
        hub, partition, group = parts[0], parts[2], None
    elif len(parts) == 5 and parts[1] == _CONSUMER_GROUPS and parts[3] == _PARTITIONS:
        hub, partition, group = parts[0], parts[4], parts[2]
    else:
        return None
    names = [hub, partition] + ([group] if group is not None else [])
    if not all(_NAME.fullmatch(name) for name in names):
        return None
    return EventHubAddress(hub, partition, group)


@dataclass(frozen=True)
class Position:
    """Where a consumer starts: the first event whose ``field`` (``offset``, ``sequence`` or ``enqueued``) is
    above ``value`` (or equal, when ``inclusive``); ``latest``: only events sent from now on."""

    field: str = "offset"
    value: int = -1
    inclusive: bool = False
    latest: bool = False


START = Position()

_FIELDS = {OFFSET: "offset", SEQUENCE_NUMBER: "sequence", ENQUEUED_TIME: "enqueued"}


def parse_position(text: object) -> Position | str:
    """The position a selector filter's text names (``_utils.py`` ``event_position_selector``), or why it cannot
    be read. No filter (None) is the start of the partition."""
    if text is None:
        return START
    if not isinstance(text, str):
        return f"the {SELECTOR_FILTER} filter must be a string"
    found = _POSITION.fullmatch(text)
    if found is None:
        return f"cannot read the starting position {text[:100]!r}"
    name, operator, value = found.groups()
    field = _FIELDS[name]
    if field == "offset" and value == "@latest":
        return Position(latest=True)
    try:
        number = int(value)
    except ValueError:
        return f"{name} must be an integer, not {value[:40]!r}"
    if number < -1 or number >= 1 << 63:
        return f"{name} {number} is out of range"
    return Position(field, number, operator == ">=")


def event_annotations(sequence_number: int, offset: int, enqueued_ms: int) -> dict[str, Any]:
    """The message-annotations an event carries once in a partition (``_common.py`` ``EventData``:
    ``sequence_number``, ``offset`` (a string), ``enqueued_time``)."""
    return {
        SEQUENCE_NUMBER: Long(sequence_number),
        OFFSET: str(offset),
        ENQUEUED_TIME: Timestamp(enqueued_ms),
    }


def hub_value(name: str, created_ms: int, partition_ids: list[str]) -> dict[str, Any]:
    """The body of a READ of the hub (``_client_base.py`` ``_get_eventhub_properties``)."""
    return {
        "name": name,
        "type": HUB_TYPE,
        "created_at": Timestamp(created_ms),
        "partition_count": len(partition_ids),
        "partition_ids": list(partition_ids),
    }


@dataclass(frozen=True)
class PartitionState:
    """What a READ of a partition tells (``_client_base.py`` ``_get_partition_properties``)."""

    hub: str
    partition: str
    begin_sequence_number: int
    last_sequence_number: int
    last_offset: int
    last_enqueued_ms: int
    empty: bool


def partition_value(state: PartitionState) -> dict[str, Any]:
    """The body of a READ of a partition."""
    return {
        "name": state.hub,
        "type": PARTITION_TYPE,
        "partition": state.partition,
        "begin_sequence_number": Long(state.begin_sequence_number),
        "last_enqueued_sequence_number": Long(state.last_sequence_number),
        "last_enqueued_offset": str(state.last_offset),
        "last_enqueued_time_utc": Timestamp(state.last_enqueued_ms),
        "is_partition_empty": state.empty,
    }


_SELECTOR_CODE = 0x0000468C00000004  # apache.org:selector-filter:string by its numeric descriptor


def selector_text(filter_set: object) -> object:
    """The text of the selector filter in a source's filter set (None when there is none; what else it holds,
    for ``parse_position`` to refuse)."""
    if not isinstance(filter_set, dict):
        return None
    for value in filter_set.values():
        descriptor = getattr(value, "descriptor", None)
        if descriptor in (SELECTOR_FILTER, _SELECTOR_CODE):
            return getattr(value, "value", None)
    return None


def partition_key(annotations: object) -> str | None:
    """The ``x-opt-partition-key`` of a message's annotations (``_common.py`` ``EventData`` / ``EventDataBatch``
    set it on a batch and on each of its events), None when there is none."""
    if not isinstance(annotations, dict):
        return None
    key = annotations.get(PARTITION_KEY)
    return key if isinstance(key, str) else None


PRODUCER_CAPABILITY = "com.microsoft:georeplication"
_TIMEOUT = "com.microsoft:timeout"


def names_a_producer(desired_capabilities: object, properties: object) -> bool:
    """Whether a sender's attach is an event hub producer's, by what only those send: the desired capability
    ``com.microsoft:georeplication`` (the .NET ``Azure.Messaging.EventHubs`` ``AmqpConnectionScope``
    ``CreateSendingLinkAsync``; azure-eventhub 5.15 asks for it too, but its pyamqp ``SendClient._client_ready``
    leaves it off the sender's attach), or the link property ``com.microsoft:timeout`` as a long: azure-eventhub
    5.11 to 5.15 (``_producer.py`` ``EventHubProducer``, ``_transport/_pyamqp_transport.py``
    ``create_link_properties``: ``amqp_long_value``). A timeout of another type does not count: the .NET Service
    Bus clients (``Microsoft.Azure.ServiceBus``, ``Azure.Messaging.ServiceBus``) put it on their links as a uint,
    and azure-servicebus none. The producer attaches to the hub's plain name before anything else has named it
    (``create_batch`` opens it)."""
    given = desired_capabilities.items if isinstance(desired_capabilities, Array) else desired_capabilities
    if isinstance(given, list | tuple):
        if any(isinstance(capability, str) and capability == PRODUCER_CAPABILITY for capability in given):
            return True
    elif isinstance(given, str) and given == PRODUCER_CAPABILITY:
        return True
    return isinstance(properties, dict) and type(properties.get(_TIMEOUT)) is Long
