"""The ``ENTITY/$management`` node: Service Bus request/response operations (issue 17 item 6), pure encoding.

The Python SDK (``_base_handler.py`` ``BaseHandler._mgmt_request_response``) sends a request whose body is an
amqp-value map, whose ``operation`` application-property is ``com.microsoft:...`` (``_common/constants.py``
``REQUEST_RESPONSE_*_OPERATION``) and whose ``reply-to`` is the management node; it matches the answer by
correlation-id and reads the status from ``statusCode`` / ``statusDescription`` (``_pyamqp/management_link.py``
defaults), the body through ``_common/mgmt_handlers.py`` (``peek_op``: 200 with ``messages``, 202/204 empty;
``schedule_op``: ``sequence-numbers``; ``deferred_message_op``: ``messages`` each with ``message`` and
``lock-token``). The JS SDK reads ``status-code``: every answer carries both spellings.
"""

from __future__ import annotations

from typing import Any

from minibroker.amqp import codec
from minibroker.amqp.definitions import AmqpValue, ApplicationProperties, Properties
from minibroker.amqp.sections import AMQP_VALUE, walk
from minibroker.amqp.types import Array, DecodeError, Int, Long, Timestamp
from minibroker.servicebus.cbs import Request

RENEW_LOCK = "com.microsoft:renew-lock"
PEEK = "com.microsoft:peek-message"
SCHEDULE = "com.microsoft:schedule-message"
CANCEL_SCHEDULED = "com.microsoft:cancel-scheduled-message"
RECEIVE_BY_SEQUENCE_NUMBER = "com.microsoft:receive-by-sequence-number"
UPDATE_DISPOSITION = "com.microsoft:update-disposition"
ADD_RULE = "com.microsoft:add-rule"
REMOVE_RULE = "com.microsoft:remove-rule"
ENUMERATE_RULES = "com.microsoft:enumerate-rules"
OK, NO_CONTENT, BAD_REQUEST, FORBIDDEN, NOT_FOUND, CONFLICT, GONE, NOT_IMPLEMENTED = (
    200,
    204,
    400,
    403,
    404,
    409,
    410,
    501,
)
QUOTA_EXCEEDED = "amqp:resource-limit-exceeded"
"""The ``errorCondition`` of a request over a quota: ``ServiceBusQuotaExceededError``
(``_transport/_pyamqp_transport.py`` ``_ERROR_CODE_TO_ERROR_MAPPING``)."""
ENTITY_NOT_FOUND = "amqp:not-found"
"""The ``errorCondition`` of an unknown rule: the SDKs raise ``MessagingEntityNotFound`` for it
(``_transport/_pyamqp_transport.py`` ``_handle_amqp_exception_with_condition``)."""
ENTITY_ALREADY_EXISTS = "com.microsoft:entity-already-exists"
"""The ``errorCondition`` of a rule name taken: ``MessagingEntityAlreadyExistsError``
(``_common/constants.py`` ``ERROR_CODE_ENTITY_ALREADY_EXISTS``)."""
MESSAGE_NOT_FOUND = "com.microsoft:message-not-found"
"""The ``errorCondition`` of a 404 (``_common/constants.py`` ``ERROR_CODE_MESSAGE_NOT_FOUND``)."""
MESSAGE_LOCK_LOST = "com.microsoft:message-lock-lost"
"""The ``errorCondition`` of a settlement by a lock token not held (``_common/constants.py``
``ERROR_CODE_MESSAGE_LOCK_LOST``)."""
COMPLETED, ABANDONED, DEAD_LETTERED = "completed", "abandoned", "suspended"
"""``disposition-status`` values (``_common/constants.py`` ``SETTLEMENT_COMPLETE`` ... ``SETTLEMENT_DEADLETTER``)."""


def body(payload: bytes) -> dict[str, Any]:
    """The request's amqp-value map, its keys as strings (empty when there is none)."""
    try:
        for section in walk(payload):
            if section.code == AMQP_VALUE:
                found = codec.decode(payload, section.start)[0]
                if isinstance(found, AmqpValue) and isinstance(found.value, dict):
                    return {str(k): v for k, v in found.value.items()}
    except (DecodeError, IndexError):
        pass
    return {}


def items(value: Any) -> list[Any]:
    """The elements of a request's array (or list) field; empty for anything else."""
    if isinstance(value, Array):
        return list(value.items)
    if isinstance(value, list):
        return value
    return []


def entity_not_found(request: Request, entity: str, detail: str = "") -> bytes:
    """A 404 for ``entity`` (a rule: ``TOPIC/Subscriptions/NAME/Rules/RULE``) worded as Service Bus words it, "The
    messaging entity '...' could not be found": the JS SDK raises ``MessagingEntityNotFound`` only for that wording
    (or "status-code: 404") in the description, ``amqp:not-found`` alone giving ``ServiceCommunicationProblem``
    (``@azure/core-amqp`` ``errors.ts`` ``translate``); the Python SDK goes by the condition."""
    description = f"The messaging entity {entity!r} could not be found.{' ' + detail if detail else ''}"
    return response(request, NOT_FOUND, description, condition=ENTITY_NOT_FOUND)


def response(request: Request, status: int, description: str, value: Any = None, condition: str | None = None) -> bytes:
    """The answer to ``request``: correlation-id its message-id, the status under both spellings (``statusCode``,
    ``status-code``, and their descriptions), ``errorCondition`` when given, ``value`` as the amqp-value body."""
    properties = Properties(correlation_id=request.message_id, to=request.reply_to)
    application: dict[str, Any] = {
        "statusCode": Int(status),
        "statusDescription": description,
        "status-code": Int(status),
        "status-description": description,
    }
    if condition is not None:
        application["errorCondition"] = condition
    return codec.encode(properties) + codec.encode(ApplicationProperties(application)) + codec.encode(AmqpValue(value))


def messages_value(encoded: list[bytes], lock_tokens: list[Any] | None = None) -> dict[str, Any]:
    """The body of a peek or receive-by-sequence-number answer: ``messages``, each ``message`` (its encoding) and,
    for a locked one, its ``lock-token``."""
    entries: list[dict[str, Any]] = []
    for i, payload in enumerate(encoded):
        entry: dict[str, Any] = {"message": payload}
        if lock_tokens is not None:
            entry["lock-token"] = lock_tokens[i]
        entries.append(entry)
    return {"messages": entries}


def expirations_value(wall_ms: list[int]) -> dict[str, Any]:
    """The body of a renew-lock answer: ``expirations``, an array of timestamps (``_servicebus_receiver.py``
    ``renew_message_lock`` reads the first, in ms)."""
    return {"expirations": Array("timestamp", [Timestamp(ms) for ms in wall_ms])}


def sequence_numbers_value(numbers: list[int]) -> dict[str, Any]:
    """The body of a schedule-message answer: ``sequence-numbers``, an array of longs."""
    return {"sequence-numbers": Array("long", [Long(n) for n in numbers])}
