"""Events the engine reports: what the peer did, in the past tense."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minibroker.amqp.definitions import Error, Open
from minibroker.engine.endpoints import IncomingDelivery, Link, OutgoingDelivery, Session


class Event:
    """Base of all engine events."""

    __slots__ = ()


@dataclass(slots=True)
class Authenticated(Event):
    """SASL finished successfully (``user`` is None for ANONYMOUS)."""

    mechanism: str
    user: str | None


@dataclass(slots=True)
class CredentialsReceived(Event):
    """SASL PLAIN credentials arrived and the policy defers their check: the engine reads nothing more until
    the embedder takes them (``take_credentials``) and answers with ``sasl_verdict``. No password here."""

    mechanism: str
    user: str


@dataclass(slots=True)
class AuthenticationFailed(Event):
    """SASL failed; the connection is over (the I/O layer delays the answer against password guessing)."""

    mechanism: str


@dataclass(slots=True)
class ConnectionOpened(Event):
    """The peer's open arrived and was answered."""

    open: Open


@dataclass(slots=True)
class ConnectionClosed(Event):
    """The connection is over: the peer closed it, we closed it with ``error``, or the socket ended."""

    error: Error | None = None
    by_peer: bool = False


@dataclass(slots=True)
class SessionBegun(Event):
    """The peer began a session and it was answered."""

    session: Session


@dataclass(slots=True)
class SessionEnded(Event):
    """A session ended (its links were detached first, each with its own event)."""

    session: Session
    error: Error | None = None


@dataclass(slots=True)
class LinkAttached(Event):
    """The peer attached a link; the broker must ``accept_attach`` or ``refuse_attach`` it."""

    link: Link


@dataclass(slots=True)
class LinkDetached(Event):
    """A link is detached (by the peer, by a session end, or by an error we raised)."""

    link: Link
    closed: bool
    error: Error | None = None


@dataclass(slots=True)
class LinkFlow(Event):
    """The peer's flow changed a link's credit or drain mode, or asked for an echo."""

    link: Link
    properties: dict[Any, Any] | None = None


@dataclass(slots=True)
class SessionFlow(Event):
    """The peer's flow opened the session's outgoing window."""

    session: Session


@dataclass(slots=True)
class TransferReceived(Event):
    """A whole message arrived on a link where we are receiver."""

    link: Link
    delivery: IncomingDelivery
    payload: bytes
    message_format: int = 0


@dataclass(slots=True)
class TransferDiscarded(Event):
    """A delivery the peer sent was discarded before it was whole: the peer aborted it (§2.6.14), or it was
    dropped because its link went away (or was detached by us, §2.6.2) or broke a limit on the way.

    ``states`` are the delivery states its frames carried (a transactional post names its transaction there);
    ``link`` is None when the link was already gone when the frame came.
    """

    link: Link | None
    states: list[object]
    aborted: bool = False


@dataclass(slots=True)
class DeliveryUpdated(Event):
    """The peer's disposition for deliveries we sent (role=receiver)."""

    deliveries: list[OutgoingDelivery]
    state: object
    """What the peer sent: a delivery state (``amqp.states``) unless it broke the protocol; None for none."""
    settled: bool


@dataclass(slots=True)
class IncomingSettled(Event):
    """The peer settled deliveries it sent us (its disposition with role=sender)."""

    deliveries: list[IncomingDelivery]
    state: object
    """What the peer sent (see ``DeliveryUpdated.state``)."""
