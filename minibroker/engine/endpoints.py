"""Session, link and delivery records of the engine (Part 2 §2.5-§2.6).

These are plain state holders: ``connection.py`` owns every transition. The broker core only reads them
(``link.credit``, ``link.source``); it never assigns to their fields. Its own object for a link or a delivery
is handed to the engine with the command that creates the endpoint (``accept_attach(context=...)``,
``deliver(context=...)``) and read back from ``context``.
"""

from __future__ import annotations

import struct
from collections import deque
from enum import Enum
from typing import Any

from minibroker.amqp.definitions import Attach

TAG_FORMAT = struct.Struct(">Q")
"""Delivery-tags of our transfers: the link's counter, 8 octets."""
LOCK_TOKEN_FORMAT = struct.Struct(">8xQ")
"""16-octet delivery-tags (the counter after 8 zero octets): what Service Bus clients read as a GUID lock token."""

SENDER = False  # §2.8.1 role: false is sender, true is receiver
RECEIVER = True

# Serial-number arithmetic for delivery-count and transfer ids (§2.8.7, RFC 1982), modulo 2^32.
SERIAL_MASK = 0xFFFFFFFF


class LinkState(Enum):
    """Where a link is in its attach/detach handshake."""

    ATTACHING = "attaching"  # the peer's attach arrived; the broker has not answered yet
    ATTACHED = "attached"
    DETACHED = "detached"


class IncomingDelivery:
    """A delivery the peer sent us (we are the receiver)."""

    __slots__ = ("delivery_id", "earlier_states", "link", "settled", "state", "tag")

    def __init__(self, link: Link, delivery_id: int, tag: bytes, settled: bool, state: object) -> None:
        self.link = link
        self.delivery_id = delivery_id
        self.tag = tag
        # settled: at our end (the peer sent it settled, we settled it, or its link went away)
        self.settled = settled
        # state: carried by the last transfer frame that had one; earlier_states: different states carried by
        # earlier frames of a multi-frame delivery (Part 4 §4.4.1 requires all frames of a transactional post to
        # name the same transaction; the broker checks)
        self.state = state
        self.earlier_states: list[object] | None = None

    def __repr__(self) -> str:
        return f"IncomingDelivery(id={self.delivery_id}, tag={self.tag!r}, settled={self.settled})"


class OutgoingDelivery:
    """A delivery we sent the peer (we are the sender). ``context`` belongs to the broker core."""

    __slots__ = (
        "begun",
        "context",
        "delivery_id",
        "link",
        "remote_settled",
        "remote_state",
        "settled",
        "tag",
        "unsent",
    )

    def __init__(self, link: Link, delivery_id: int, tag: bytes, settled: bool, context: Any) -> None:
        self.link = link
        self.delivery_id = delivery_id
        self.tag = tag
        # settled: at our end (sent settled, settled or aborted by a command, or its link went away)
        self.settled = settled
        self.remote_settled = False
        self.remote_state: object = None
        self.context = context
        self.unsent = 0  # transfer frames of it still held back by the peer's session window (§2.5.6)
        self.begun = False  # its first frame has been written

    @property
    def open(self) -> bool:
        """Neither end has settled it: a ``settle`` command may still be given."""
        return not self.settled and not self.remote_settled

    @property
    def complete(self) -> bool:
        """Every frame of it has been written."""
        return self.unsent == 0

    def __repr__(self) -> str:
        return f"OutgoingDelivery(id={self.delivery_id}, tag={self.tag!r}, settled={self.settled})"


class Link:
    """One link endpoint. ``role`` is *our* role: SENDER when the peer attached as receiver."""

    __slots__ = (
        "attach",
        "available",
        "context",
        "credit",
        "delivery_count",
        "drain",
        "input_handle",
        "max_message_size",
        "name",
        "output_handle",
        "partial",
        "partial_delivery",
        "partial_frames",
        "rcv_settle_mode",
        "read_ahead",
        "role",
        "session",
        "snd_settle_mode",
        "source",
        "state",
        "tag_counter",
        "tag_format",
        "target",
    )

    def __init__(self, session: Session, attach: Attach, output_handle: int) -> None:
        self.session = session
        self.attach = attach
        self.name: str = attach.name or ""
        self.input_handle: int = attach.handle or 0
        self.output_handle = output_handle
        self.role: bool = not attach.role
        self.snd_settle_mode: int = 2 if attach.snd_settle_mode is None else attach.snd_settle_mode
        self.rcv_settle_mode: int = 0 if attach.rcv_settle_mode is None else attach.rcv_settle_mode
        self.source = attach.source
        self.target = attach.target
        self.state = LinkState.ATTACHING
        # Flow control (§2.6.7). For a link where we are sender, credit is what the peer granted;
        # where we are receiver, it is what we granted.
        self.delivery_count = (attach.initial_delivery_count or 0) if self.role == RECEIVER else 0
        self.credit = 0
        self.drain = False
        self.available = 0
        self.max_message_size: int | None = None
        # Incoming multi-frame transfer being reassembled (§2.6.14): its bytes so far, in one buffer (a frame costs
        # its payload and nothing more), and how many frames it took (bounded when max-message-size is set).
        self.partial: bytearray | None = None
        self.partial_delivery: IncomingDelivery | None = None
        self.partial_frames = 0
        self.tag_counter = 0
        self.tag_format = TAG_FORMAT
        """How ``tag_counter`` becomes a delivery-tag (8 octets; Service Bus lock tokens are 16, a GUID)."""
        self.context: Any = None
        """The broker core's object for this link, given with ``accept_attach``."""
        self.read_ahead = False  # see ``accept_attach``

    @property
    def is_sender(self) -> bool:
        """True when we send on this link (the peer is the receiver)."""
        return self.role == SENDER

    def __repr__(self) -> str:
        role = "sender" if self.role == SENDER else "receiver"
        return f"Link({self.name!r}, {role}, handle={self.input_handle})"


class Session:
    """One session endpoint (§2.5)."""

    __slots__ = (
        "channel",
        "context",
        "detach_sent",
        "ended",
        "handle_max",
        "incoming_unsettled",
        "incoming_window",
        "links",
        "links_by_output",
        "next_delivery_id",
        "next_incoming_id",
        "next_outgoing_id",
        "outgoing_unsettled",
        "pending",
        "remote_channel",
        "remote_incoming_window",
    )

    def __init__(self, channel: int, remote_channel: int, next_incoming_id: int, incoming_window: int) -> None:
        self.channel = channel
        self.remote_channel = remote_channel
        self.next_outgoing_id = 0
        self.next_incoming_id = next_incoming_id
        self.incoming_window = incoming_window
        self.remote_incoming_window = 0
        self.next_delivery_id = 0
        self.links: dict[int, Link] = {}  # by the peer's (input) handle
        self.links_by_output: dict[int, Link] = {}
        self.incoming_unsettled: dict[int, IncomingDelivery] = {}
        self.outgoing_unsettled: dict[int, OutgoingDelivery] = {}
        # Transfer frames waiting for the peer's incoming window to open (§2.5.6), with their delivery.
        self.pending: deque[tuple[OutgoingDelivery, bytes]] = deque()
        # §2.6.2: input handles we detached; in use until the peer's detach answers ours.
        self.detach_sent: set[int] = set()
        self.handle_max = 0xFFFFFFFF  # the highest handle the peer may attach with: what our begin announced
        self.ended = False
        self.context: Any = None

    def __repr__(self) -> str:
        return f"Session(channel={self.channel}, remote_channel={self.remote_channel})"
