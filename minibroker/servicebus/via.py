"""Service Bus send-via and the one-entity rule of its local transactions (issue 17 item 9).

A sender that attaches to entity VIA with the link property ``com.microsoft:transfer-destination-address`` =
DEST sends through VIA to DEST: the .NET SDK's via-sender (azure-sdk-for-net
``sdk/servicebus/Microsoft.Azure.ServiceBus/src/Core/MessageSender.cs`` ``CreateLinkAsync``: target address =
the via entity path, link property ``AmqpClientConstants.TransferDestinationAddress`` = the destination path,
and a token for both). Service Bus runs a local transaction in one top-level entity (a queue or a topic; a
subscription and a dead-letter queue count as their queue or topic): work on a second one is refused with
amqp:not-allowed, "Local transactions cannot span multiple top-level entities such as queue or topic"
(Azure/azure-sdk-for-net#18160 and #42316, Azure/azure-sdk-for-java#29881; the .NET SDK raises
``InvalidOperationException`` for amqp:not-allowed, ``Amqp/AmqpExceptionHelper.cs``). Sending via the
transaction's entity is how a transaction reaches other entities (``Azure.Messaging.ServiceBus``
``samples/Sample06_Transactions.md``, "Transactions across entities").

Pure: what the attach names and how entities compare; the broker applies it (``broker/attach.py``,
``broker/coordinator.py``).
"""

from __future__ import annotations

from typing import NamedTuple

from minibroker.amqp.definitions import Error
from minibroker.amqp.errors import Condition, error
from minibroker.servicebus.addresses import CBS, DEAD_LETTER_QUEUE, entity_path, is_management, subscription

TRANSFER_DESTINATION = "com.microsoft:transfer-destination-address"
"""The attach property naming a via-sender's final destination (``Amqp/AmqpClientConstants.cs``)."""
ARGUMENT_ERROR = "com.microsoft:argument-error"
"""Service Bus's condition for a bad argument (``Amqp/AmqpClientConstants.cs`` ``ArgumentError``)."""
SPAN_TEXT = "Local transactions cannot span multiple top-level entities such as queue or topic."


class BadDestination(NamedTuple):
    """A transfer-destination-address that names no entity, and why."""

    reason: str


def transfer_destination(properties: object) -> str | BadDestination | None:
    """The entity path an attach's properties name as the transfer destination (URIs stripped like entity
    addresses); None when they name none; ``BadDestination`` when the value is no entity path."""
    if not isinstance(properties, dict) or TRANSFER_DESTINATION not in properties:
        return None
    value = properties[TRANSFER_DESTINATION]
    if not isinstance(value, str):
        return BadDestination(f"{TRANSFER_DESTINATION} must be a string, not {type(value).__name__}")
    path = entity_path(value)
    if not path:
        return BadDestination(f"{TRANSFER_DESTINATION} names no entity: {value!r}")
    if "\x00" in path:
        return BadDestination(f"{TRANSFER_DESTINATION} holds a NUL character: {value!r}")
    if path == CBS or is_management(path):
        return BadDestination(f"{TRANSFER_DESTINATION} names a service node, not an entity: {value!r}")
    return path


def top_level_entity(path: str) -> str:
    """The queue or topic ``path`` belongs to: ``t/Subscriptions/s`` is ``t``, ``q/$DeadLetterQueue`` is ``q``."""
    named = subscription(path)
    if named is not None:
        return named[0]
    entity, _slash, last = path.rpartition("/")
    return entity if entity and last == DEAD_LETTER_QUEUE else path


def span_error(first: str, other: str) -> Error:
    """The refusal of transactional work on ``other`` in a transaction that began on ``first``."""
    return error(Condition.NOT_ALLOWED, f"{SPAN_TEXT} (the transaction is on {first!r}, not {other!r})")
