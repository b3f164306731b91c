"""What ``Connection091`` reports to its embedder (the 0-9-1 gateway): one dataclass per event.

Credentials never appear in an event: ``CredentialsReceived`` names the user only, and the embedder takes the
password once with ``Connection091.take_credentials``.
"""

from __future__ import annotations

from dataclasses import dataclass

from minibroker.amqp091.base import Method
from minibroker.amqp091.definitions import BasicProperties


@dataclass(frozen=True, slots=True)
class CredentialsReceived:
    """connection.start-ok carried a well-formed response; answer with ``login_verdict``."""

    mechanism: str
    user: str


@dataclass(frozen=True, slots=True)
class OpenRequested:
    """connection.open for ``vhost``; answer with ``open_ok`` (or ``close``, e.g. 530 for an unknown vhost)."""

    vhost: str


@dataclass(frozen=True, slots=True)
class ChannelOpened:
    """channel.open, already answered with open-ok."""

    channel: int


@dataclass(frozen=True, slots=True)
class ChannelClosed:
    """The channel is gone for the embedder: the peer closed it (already answered with close-ok), or we sent
    channel.close (reported at once; the number is free again once the peer's close-ok arrives)."""

    channel: int
    reply_code: int
    text: str
    by_peer: bool


@dataclass(frozen=True, slots=True)
class CommandReceived:
    """A method of class exchange, queue, basic, confirm or tx on an open channel; for a content-carrying
    method (basic.publish ...) its properties and whole body, else None for both."""

    channel: int
    method: Method
    properties: BasicProperties | None = None
    body: bytes | None = None


@dataclass(frozen=True, slots=True)
class FlowRequested:
    """channel.flow from the peer, already answered with flow-ok."""

    channel: int
    active: bool


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The connection is over for the embedder, reported once: the peer closed it (answered with close-ok),
    we sent connection.close (reported at once), or the socket ended / a time-out dropped it."""

    reply_code: int
    text: str
    by_peer: bool


Event = (
    CredentialsReceived
    | OpenRequested
    | ChannelOpened
    | ChannelClosed
    | CommandReceived
    | FlowRequested
    | ConnectionClosed
)
