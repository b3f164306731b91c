"""What the gateway keeps for one AMQP 0-9-1 channel: its commands in order, its publishes, consumers and delivery
tags, and its mode (plain, confirm or transactional).

A channel is one inner AMQP 1.0 session (of the same number). 0-9-1 commands on a channel are answered in order
(§2.3.5: a synchronous method's answer comes before anything the client sent after it is acted on), but some need
an answer from the broker first (an attach for ``basic.consume``, a declare or discharge for the transaction
commands, a drained flow for ``basic.get``). Such a command sets ``waiting``; the commands that arrive meanwhile
wait in ``backlog`` and run, in order, once it is answered (``Gateway.run``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from minibroker.amqp091.definitions import BasicProperties, ReplyCode
from minibroker.amqp091.errors import ProtocolError

if TYPE_CHECKING:
    from minibroker.amqp091.base import Method


@dataclass(slots=True)
class Command:
    """One 0-9-1 command as the client sent it (a method, with its content when it carries one)."""

    method: Method
    properties: BasicProperties | None = None
    body: bytes | None = None


Returned = tuple[str, str, BasicProperties, bytes]
"""A mandatory publish as a ``basic.return`` would give it back: (exchange, routing key, properties, body)."""


@dataclass(slots=True)
class Published:
    """A publish sent to the broker and not yet answered: its confirm number (0: not confirming), and what a
    ``basic.return`` needs when it was mandatory."""

    seq: int
    returned: Returned | None = None
    """What a ``basic.return`` of a mandatory publish needs; None when not mandatory."""


@dataclass(slots=True)
class Consumer:
    """A ``basic.consume`` (an inner receiver link), or the link ``basic.get`` drains on a queue (``tag`` None)."""

    handle: int
    queue: str
    tag: str | None
    no_ack: bool
    limit: int = 0
    """The prefetch count when it started (0: none)."""
    credit: int = 0
    """Credit granted on the inner link and not yet used."""
    unacked: int = 0
    """Deliveries sent to the client on it and not yet acked, nacked or rejected."""
    gone: bool = False
    """The broker detached its link (its queue was deleted): its tags are still the client's, settling them does
    nothing."""
    cancelled: bool = False
    """``basic.cancel`` was answered: nothing more goes to the client; the link stays until its deliveries are
    settled (0-9-1 lets a client ack after cancelling), then detaches."""


@dataclass(slots=True)
class Unacked:
    """A delivery the client holds under a delivery tag: on which inner link, with which delivery-id."""

    consumer: Consumer
    delivery_id: int


@dataclass(slots=True)
class Wait:
    """What the command at the head of a channel waits for: ``kind`` "attach" (``key``: the link's handle), "outcome"
    (``key``: the delivery-id of a declare or discharge), "get" (``key``: the handle of the drained link) or
    "sent" (the publishes before it have reached the broker); ``then`` is called with the answer."""

    kind: str
    key: int
    then: Callable[[Any], None]


@dataclass(slots=True)
class Channel:
    """The state of one open channel."""

    number: int
    backlog: deque[Command] = field(default_factory=deque)
    waiting: Wait | None = None
    """What the command at the head waits for from the broker (None: nothing; commands run as they come)."""
    flow_active: bool = True
    # -- publishing ------------------------------------------------------------------------------------------
    relay: int | None = None
    """The handle of the channel's inner sender to the anonymous relay (attached on the first publish)."""
    in_flight: dict[int, Published] = field(default_factory=dict)
    """Publishes sent and not yet answered, by inner delivery-id."""
    confirm: bool = False
    next_seq: int = 1
    """The confirm number of the next publish (confirm mode counts publishes from 1, per channel)."""
    unconfirmed: dict[int, None] = field(default_factory=dict)
    """Confirm numbers not yet acked or nacked, in order (an ordered set)."""
    confirmed: list[int] = field(default_factory=list)
    """Confirm numbers the broker took since the last ``publish.send_confirms`` (acked together, as ranges)."""
    # -- transactions ----------------------------------------------------------------------------------------
    transactional: bool = False
    coordinator: int | None = None
    txn: bytes | None = None
    """The open inner transaction (declared on the first publish or ack after tx.select or the last commit)."""
    txn_returns: list[Returned] = field(default_factory=list)
    """The mandatory publishes of ``txn``: returned at tx.commit if they route nowhere then."""
    txn_acks: list[tuple[int, Unacked]] = field(default_factory=list)
    """Acks staged in ``txn`` (tag, delivery): given back to the client's unacked by a rollback."""
    # -- consuming -------------------------------------------------------------------------------------------
    consumers: dict[str, Consumer] = field(default_factory=dict)
    links: dict[int, Consumer] = field(default_factory=dict)
    """Every inner receiver link of the channel by handle (consumers and ``basic.get`` links)."""
    getters: dict[tuple[str, bool], Consumer] = field(default_factory=dict)
    """The ``basic.get`` link of each (queue, no_ack)."""
    next_tag: int = 1
    unacked: dict[int, Unacked] = field(default_factory=dict)
    """Delivery tags the client holds, in order."""
    prefetch_count: int = 0
    """basic.qos for consumers started from now on (0: no limit)."""
    global_prefetch: int = 0
    """basic.qos with global: a limit on unacked deliveries across the channel's consumers (0: no limit)."""
    last_queue: str = ""
    """The queue last declared on the channel: what an empty queue name means (0-9-1 §1.7.2.1)."""

    def wait(self, kind: str, key: int, then: Callable[[Any], None], command: Command | None = None) -> None:
        """Hold the channel's commands until the broker answers (``command``, when given, runs again first)."""
        if command is not None:
            self.backlog.appendleft(command)
        self.waiting = Wait(kind, key, then)

    def resolve(self, kind: str, key: int, answer: Any) -> bool:
        """Give ``answer`` to the wait for (``kind``, ``key``), if that is what the channel waits for."""
        waiting = self.waiting
        if waiting is None or waiting.kind != kind or waiting.key != key:
            return False
        self.waiting = None
        waiting.then(answer)
        return True

    def queue(self, name: str) -> str:
        """The queue a method names: an empty name is the queue last declared on the channel (0-9-1 §1.7.2: "If the
        queue name is empty, the server uses the last queue declared on the channel")."""
        name = name or self.last_queue
        if not name:
            raise ProtocolError(ReplyCode.NOT_FOUND, "NOT_FOUND - no previously declared queue")
        return name

    def take_tag(self) -> int:
        tag = self.next_tag
        self.next_tag += 1
        return tag
