"""What Service Bus does to messages (issue 17 items 3 and 4), on encoded bytes.

Names and formats as the Python SDK reads them (azure-servicebus ``_common/constants.py``,
``_common/message.py`` ``ServiceBusReceivedMessage``): the lock token is the delivery-tag read as a GUID;
``x-opt-sequence-number``, ``x-opt-enqueued-time`` and ``x-opt-locked-until`` (timestamps in ms),
``x-opt-message-state`` (0 active, 1 deferred) are message-annotations; a dead-lettered message carries
``DeadLetterReason`` and ``DeadLetterErrorDescription`` application-properties and the
``x-opt-deadletter-source`` annotation. ``ServiceBusMessageBatch`` is sent as one transfer of message-format
``0x80013700`` whose body is one data section per message, each holding that message encoded
(``_pyamqp/message.py`` ``BatchMessage``, ``_pyamqp/_encode.py`` ``encode_payload``).
"""

from __future__ import annotations

from typing import Any

from minibroker.amqp import codec
from minibroker.amqp.definitions import ApplicationProperties, Data, Error, Properties
from minibroker.amqp.sections import APPLICATION_PROPERTIES, DATA, PROPERTIES, section_at, walk
from minibroker.amqp.types import DecodeError, Int, Long, Symbol, Timestamp

BATCH_FORMAT = 0x80013700
"""The message-format of a batch transfer (``_pyamqp/constants.py`` ``BATCH_MESSAGE_FORMAT``)."""
ACTIVE, DEFERRED, SCHEDULED = 0, 1, 2
"""``x-opt-message-state`` (``_common/constants.py`` ``ServiceBusMessageState``)."""
DEAD_LETTER_CONDITION = "com.microsoft:dead-letter"
"""The condition of a ``rejected`` that dead-letters (``_common/constants.py`` ``DEADLETTERNAME``)."""
LOCK_LOST_CONDITION = "com.microsoft:message-lock-lost"
DEAD_LETTER_REASON = "DeadLetterReason"
DEAD_LETTER_DESCRIPTION = "DeadLetterErrorDescription"
DEAD_LETTER_SOURCE = "x-opt-deadletter-source"
MAX_DELIVERY_REASON = "MaxDeliveryCountExceeded"


def lock_lost_error() -> Error:
    """The error of a settlement (or renewal) of a message whose lock ran out (``_common/constants.py``
    ``ERROR_CODE_MESSAGE_LOCK_LOST``)."""
    return Error(condition=Symbol(LOCK_LOST_CONDITION), description="The lock supplied is invalid: it expired.")


def split_batch(payload: bytes) -> list[bytes] | None:
    """The messages of a batch transfer's payload (one per data section); None when it is no such payload."""
    try:
        parts = []
        for section in walk(payload):
            if section.code != DATA:
                continue
            data = codec.decode(payload, section.start)[0]
            if not isinstance(data, Data) or not isinstance(data.value, bytes):
                return None
            parts.append(data.value)
    except (DecodeError, IndexError):
        return None
    return parts or None


def delivery_annotations(seq: int, locked_until_ms: int | None, state: int = ACTIVE) -> dict[str, Any]:
    """The annotations added to a message as it goes to a peek-lock or receive-and-delete receiver, or to a peek
    (``locked_until_ms`` None: no ``x-opt-locked-until``, which @azure/service-bus ``fromRheaMessage`` would
    otherwise read as a lock until 1970)."""
    annotations: dict[str, Any] = {"x-opt-sequence-number": Long(seq), "x-opt-message-state": Int(state)}
    if locked_until_ms is not None:
        annotations["x-opt-locked-until"] = Timestamp(locked_until_ms)
    return annotations


def dead_letter_info(info: Any) -> tuple[str | None, str | None]:
    """``DeadLetterReason`` and ``DeadLetterErrorDescription`` from a rejected outcome's error info."""
    if not isinstance(info, dict):
        return None, None
    values = {str(k): v for k, v in info.items()}
    reason, description = values.get(DEAD_LETTER_REASON), values.get(DEAD_LETTER_DESCRIPTION)
    return (
        reason if isinstance(reason, str) else None,
        description if isinstance(description, str) else None,
    )


def with_application_properties(payload: bytes, pos: int, extra: dict[str, Any]) -> bytes:
    """``payload`` from ``pos`` (where the properties section or what follows it starts) with ``extra`` merged into
    its application-properties (the section is made when there is none)."""
    code, _ = section_at(payload, pos)
    head = pos
    if code == PROPERTIES:
        _, head = codec.decode(payload, pos)
    code, _ = section_at(payload, head)
    merged: dict[Any, Any] = {}
    tail = head
    if code == APPLICATION_PROPERTIES:
        found, tail = codec.decode(payload, head)
        if isinstance(found, ApplicationProperties) and isinstance(found.value, dict):
            merged.update(found.value)
    merged.update({k: v for k, v in extra.items() if v is not None})
    return payload[pos:head] + codec.encode(ApplicationProperties(merged)) + payload[tail:]


def message_id_missing(payload: bytes, pos: int) -> bool:
    """Whether the message (its properties section at ``pos``, if any) has no message-id."""
    code, _ = section_at(payload, pos)
    if code != PROPERTIES:
        return True
    try:
        properties = codec.decode(payload, pos)[0]
    except (DecodeError, IndexError):
        return False  # (not ours to repair)
    return not isinstance(properties, Properties) or properties.message_id is None


def with_message_id(payload: bytes, pos: int, message_id: str) -> bytes:
    """``payload`` from ``pos`` with a properties section naming ``message_id`` (made, or completed)."""
    code, _ = section_at(payload, pos)
    if code != PROPERTIES:
        return codec.encode(Properties(message_id=message_id)) + payload[pos:]
    properties, end = codec.decode(payload, pos)
    assert isinstance(properties, Properties)
    properties.message_id = message_id
    return codec.encode(properties) + payload[end:]
