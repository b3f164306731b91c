"""AMQP error conditions (Part 2 §2.8.15-§2.8.18, Part 4 §4.5.8) and the exceptions that carry them.

``ProtocolError`` subclasses say *who* is at fault (the peer) and *how* to answer: their ``scope`` tells the
engine whether to close the connection, end the session, or detach the link. They never escape the
engine's ``receive_data``: the engine turns them into the closing performative for their scope.
"""

from __future__ import annotations

from enum import Enum, StrEnum
from typing import ClassVar

from minibroker.amqp.definitions import Error
from minibroker.amqp.types import Symbol


class Condition(StrEnum):
    """Every error condition the specification defines."""

    INTERNAL_ERROR = "amqp:internal-error"
    NOT_FOUND = "amqp:not-found"
    UNAUTHORIZED_ACCESS = "amqp:unauthorized-access"
    DECODE_ERROR = "amqp:decode-error"
    RESOURCE_LIMIT_EXCEEDED = "amqp:resource-limit-exceeded"
    NOT_ALLOWED = "amqp:not-allowed"
    INVALID_FIELD = "amqp:invalid-field"
    NOT_IMPLEMENTED = "amqp:not-implemented"
    RESOURCE_LOCKED = "amqp:resource-locked"
    PRECONDITION_FAILED = "amqp:precondition-failed"
    RESOURCE_DELETED = "amqp:resource-deleted"
    ILLEGAL_STATE = "amqp:illegal-state"
    FRAME_SIZE_TOO_SMALL = "amqp:frame-size-too-small"
    CONNECTION_FORCED = "amqp:connection:forced"
    FRAMING_ERROR = "amqp:connection:framing-error"
    CONNECTION_REDIRECT = "amqp:connection:redirect"
    WINDOW_VIOLATION = "amqp:session:window-violation"
    ERRANT_LINK = "amqp:session:errant-link"
    HANDLE_IN_USE = "amqp:session:handle-in-use"
    UNATTACHED_HANDLE = "amqp:session:unattached-handle"
    DETACH_FORCED = "amqp:link:detach-forced"
    TRANSFER_LIMIT_EXCEEDED = "amqp:link:transfer-limit-exceeded"
    MESSAGE_SIZE_EXCEEDED = "amqp:link:message-size-exceeded"
    LINK_REDIRECT = "amqp:link:redirect"
    STOLEN = "amqp:link:stolen"
    UNKNOWN_TXN_ID = "amqp:transaction:unknown-id"
    TRANSACTION_ROLLBACK = "amqp:transaction:rollback"
    TRANSACTION_TIMEOUT = "amqp:transaction:timeout"


class Scope(Enum):
    """What a protocol error tears down."""

    CONNECTION = "connection"
    SESSION = "session"
    LINK = "link"


def error(condition: Condition, description: str | None = None) -> Error:
    """An ``error`` composite for ``condition``."""
    return Error(condition=Symbol(condition.value), description=description)


class LocalProtocolError(Exception):
    """Our own code misused the engine: a command given in a state where it makes no sense (settling a
    delivery twice, delivering on a link without credit). Never the peer's fault, so never sent on the wire;
    the name and the split from ``ProtocolError`` follow h11."""


class ProtocolError(Exception):
    """The peer broke the protocol; ``condition`` and ``scope`` say how to answer."""

    condition: ClassVar[Condition] = Condition.INTERNAL_ERROR
    scope: ClassVar[Scope] = Scope.CONNECTION

    def __init__(self, description: str, *, condition: Condition | None = None) -> None:
        super().__init__(description)
        self.description = description
        if condition is not None:
            self.condition = condition  # type: ignore[misc]

    def to_error(self) -> Error:
        """The ``error`` composite to send."""
        return error(self.condition, self.description)


class FramingError(ProtocolError):
    """A frame that cannot be parsed (§2.8.16 framing-error)."""

    condition = Condition.FRAMING_ERROR


class ConnectionDecodeError(ProtocolError):
    """A performative that does not decode (§2.8.15 decode-error)."""

    condition = Condition.DECODE_ERROR


class ConnectionNotAllowed(ProtocolError):
    """A frame that is not allowed in the connection's state (§2.8.15 not-allowed)."""

    condition = Condition.NOT_ALLOWED


class SessionError(ProtocolError):
    """An error that ends one session."""

    scope = Scope.SESSION


class UnattachedHandle(SessionError):
    """Use of a link handle that is not attached (§2.8.17 unattached-handle)."""

    condition = Condition.UNATTACHED_HANDLE


class HandleInUse(SessionError):
    """Attach on a handle that is already in use (§2.8.17 handle-in-use)."""

    condition = Condition.HANDLE_IN_USE


class WindowViolation(SessionError):
    """A transfer outside the session's incoming window (§2.8.17 window-violation)."""

    condition = Condition.WINDOW_VIOLATION


class LinkError(ProtocolError):
    """An error that detaches one link."""

    scope = Scope.LINK

    def __init__(self, description: str, *, handle: int, condition: Condition | None = None) -> None:
        super().__init__(description, condition=condition)
        self.handle = handle


class TransferLimitExceeded(LinkError):
    """A transfer without link credit (§2.8.18 transfer-limit-exceeded)."""

    condition = Condition.TRANSFER_LIMIT_EXCEEDED


class MessageSizeExceeded(LinkError):
    """A message larger than the link's max-message-size (§2.8.18 message-size-exceeded)."""

    condition = Condition.MESSAGE_SIZE_EXCEEDED
