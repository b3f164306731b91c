"""Service Bus message sessions (issue 17 item 8, and the session operations of item 6), pure parts.

A session receiver's attach carries the source filter ``com.microsoft:session-filter``: a session id, or null
for "the next available session" (azure-servicebus ``_transport/_pyamqp_transport.py`` ``create_source``, where
the value is a plain string, not a described one). The broker's attach echoes the filter with the session it
chose (``PyamqpTransport.on_attach`` reads ``source.filters[SESSION_FILTER]``) and tells the lock's end in the
attach properties as ``com.microsoft:locked-until-utc``, .NET ticks (``on_attach`` subtracts
``_common/constants.py`` ``DATETIMEOFFSET_EPOCH`` and divides by 10**7). Conditions (``_common/constants.py``):
``session-cannot-be-locked`` (``SessionCannotBeLockedError``), ``session-lock-lost`` (``SessionLockLostError``),
``timeout`` (``OperationTimeoutError``).

``$management`` operations (``_servicebus_session.py``, ``_session_browser.py``): ``renew-session-lock``
(``session-id``; answer ``expiration``, a timestamp), ``get-session-state`` (answer ``session-state``, binary or
null), ``set-session-state`` (``session-id``, ``session-state``: binary or null), ``get-message-sessions``
(``last-updated-time``, ``skip``, ``top``; answer ``skip`` and ``sessions-ids``, 204 when there are none).
"""

from __future__ import annotations

from typing import Any

from minibroker.amqp.definitions import Error
from minibroker.amqp.types import Array, Described, Int, Symbol, Timestamp

SESSION_FILTER = "com.microsoft:session-filter"
LOCKED_UNTIL_UTC = "com.microsoft:locked-until-utc"
SESSION_CANNOT_BE_LOCKED = "com.microsoft:session-cannot-be-locked"
SESSION_LOCK_LOST = "com.microsoft:session-lock-lost"
TIMEOUT = "com.microsoft:timeout"
NOT_ALLOWED = "amqp:not-allowed"
INVALID_FIELD = "amqp:invalid-field"
ARGUMENT_ERROR = "com.microsoft:argument-error"
"""A request's bad field (``_common/constants.py`` ``ERROR_CODE_ARGUMENT_ERROR``: not retried by the SDK)."""

RENEW_SESSION_LOCK = "com.microsoft:renew-session-lock"
GET_SESSION_STATE = "com.microsoft:get-session-state"
SET_SESSION_STATE = "com.microsoft:set-session-state"
GET_MESSAGE_SESSIONS = "com.microsoft:get-message-sessions"

MAX_SESSION_ID_LENGTH = 128
"""Service Bus's limit on a session id (``ServiceBusMessage.session_id`` is checked against it by the SDKs)."""
_DOTNET_EPOCH_TICKS = 621355968000000000  # 1970-01-01 in .NET ticks (``_common/constants.py``)
_MAX_DATETIME_MS = 253402300799999
"""``DateTime.MaxValue`` in ms: ``last-updated-time`` saying "no filter" (``_session_browser.py``)."""


class NotRequested:
    """The source names no session filter at all (a plain receiver)."""


NOT_REQUESTED = NotRequested()


def requested(filter_set: Any) -> str | NotRequested | Error | None:
    """The session a receiver's source filter asks for: its id, None for the next available one,
    ``NOT_REQUESTED`` when there is no session filter, or the error to refuse a malformed one with."""
    if not isinstance(filter_set, dict):
        return NOT_REQUESTED
    found = next((v for k, v in filter_set.items() if str(k) == SESSION_FILTER), NOT_REQUESTED)
    if isinstance(found, NotRequested):
        return found
    if isinstance(found, Described):  # a described filter (descriptor com.microsoft:session-filter) holds the id
        found = found.value
    if found is None:
        return None
    problem = id_problem(found)
    if problem is not None:
        return Error(condition=Symbol(INVALID_FIELD), description=f"session filter: {problem}")
    return str(found)


def id_problem(value: Any) -> str | None:
    """Why ``value`` is no session id Service Bus accepts (a string of 1 to 128 characters), or None."""
    if not isinstance(value, str):
        return f"a session id is a string, not {type(value).__name__}"
    if not value or len(value) > MAX_SESSION_ID_LENGTH:
        return f"a session id has 1 to {MAX_SESSION_ID_LENGTH} characters, not {len(value)}"
    return None


def session_key(session_id: str) -> str:
    """What a session id is known by: Service Bus compares session ids without regard to case (``ABC`` and
    ``abc`` are one session; Azure/azure-sdk-for-java#48759 made the SDK compare them so too)."""
    return session_id.casefold()


def dotnet_ticks(wall_ms: int) -> int:
    """A wall-clock time in ms as .NET ticks (100 ns since 0001-01-01), as ``locked-until-utc`` carries it."""
    return _DOTNET_EPOCH_TICKS + wall_ms * 10_000


def error(condition: str, description: str) -> Error:
    """An AMQP error with a Service Bus condition (the ``servicebus`` personality writes it with every field:
    ``Composite.encode_all_into``)."""
    return Error(condition=Symbol(condition), description=description)


def lock_lost(session_id: str) -> Error:
    """The error a session receiver's link is detached with when its session lock ran out."""
    return error(SESSION_LOCK_LOST, f"the lock of session {session_id!r} was lost: it expired")


def expiration_value(wall_ms: int) -> dict[str, Any]:
    """The body of a renew-session-lock answer (``_servicebus_session.py`` ``renew_lock`` reads ms)."""
    return {"expiration": Timestamp(wall_ms)}


def state_value(state: bytes | None) -> dict[str, Any]:
    """The body of a get-session-state answer: ``session-state``, binary or null."""
    return {"session-state": state}


def sessions_value(skip: int, ids: list[str]) -> dict[str, Any]:
    """The body of a get-message-sessions answer: ``skip`` and ``sessions-ids`` (an array of strings)."""
    return {"skip": Int(skip), "sessions-ids": Array("string", ids)}


def listing_since(last_updated_ms: Any) -> int | None:
    """From ``last-updated-time``: the wall-clock ms after which a session's state must have been set to be
    listed, or None (absent, not a timestamp, or ``DateTime.MaxValue``: list sessions with messages or state)."""
    if isinstance(last_updated_ms, bool) or not isinstance(last_updated_ms, int):
        return None
    return None if last_updated_ms >= _MAX_DATETIME_MS else int(last_updated_ms)
