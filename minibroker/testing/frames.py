"""A frame factory for protocol tests (in the spirit of h2's ``FrameFactory``).

Three kinds of helpers live here:

* performative builders with the defaults a test rarely cares about (``begin()``, ``attach_sender()``,
  ``flow()`` ...), returning the dataclasses of ``minibroker.amqp.definitions``;
* frame builders returning bytes: ``frame()`` for any valid frame, ``heartbeat()``, and ``raw_frame()``
  whose header fields can each be set to a wrong value, for negative tests.

Parsing what the broker answers is ``minibroker.testing.client``'s (``ClientConnection``, ``parse_frames``).

Encoding is done by ``minibroker.amqp.framing`` and ``minibroker.amqp.codec``; nothing is re-implemented
here, so a test built with this module exercises the same encoder the broker uses to answer it.
"""

from __future__ import annotations

from typing import Any

from minibroker.amqp import codec
from minibroker.amqp.definitions import (
    AmqpValue,
    Attach,
    Begin,
    Disposition,
    Flow,
    Open,
    SaslInit,
    Source,
    Target,
    Transfer,
)
from minibroker.amqp.framing import (
    AMQP_FRAME,
    AMQP_HEADER,
    EMPTY_FRAME,
    FRAME_HEADER,
    SASL_FRAME,
    SASL_HEADER,
    TLS_HEADER,
    encode_frame,
)
from minibroker.amqp.types import Symbol, UInt

SENDER = False  # §2.8.1 role
RECEIVER = True
DEFAULT_WINDOW = 2048

__all__ = [
    "AMQP_FRAME",
    "AMQP_HEADER",
    "RECEIVER",
    "SASL_FRAME",
    "SASL_HEADER",
    "SENDER",
    "TLS_HEADER",
    "attach_receiver",
    "attach_sender",
    "begin",
    "disposition",
    "flow",
    "frame",
    "heartbeat",
    "message",
    "open_",
    "raw_frame",
    "sasl_anonymous",
    "sasl_frame",
    "sasl_plain",
    "transfer",
    "undecodable_frame",
]


# -- performatives --------------------------------------------------------------------------------
def open_(container_id: str = "test-peer", **fields: Any) -> Open:
    """An ``open``; any other field as a keyword (``max_frame_size=UInt(512)``)."""
    return Open(container_id=container_id, **fields)


def begin(
    *,
    next_outgoing_id: int = 0,
    incoming_window: int = DEFAULT_WINDOW,
    outgoing_window: int = DEFAULT_WINDOW,
    **fields: Any,
) -> Begin:
    """A ``begin`` from a client (no remote-channel)."""
    return Begin(
        next_outgoing_id=UInt(next_outgoing_id),
        incoming_window=UInt(incoming_window),
        outgoing_window=UInt(outgoing_window),
        **fields,
    )


def attach_sender(address: str | None, handle: int = 0, name: str | None = None, **fields: Any) -> Attach:
    """An ``attach`` where the peer is the sender, to the node at ``address`` (None: null target)."""
    fields.setdefault("source", Source(address=f"{name or 'sender'}-source"))
    fields.setdefault("initial_delivery_count", UInt(0))
    return Attach(
        name=name if name is not None else f"sender-{handle}",
        handle=UInt(handle),
        role=SENDER,
        target=fields.pop("target", Target(address=address)),
        **fields,
    )


def attach_receiver(address: str | None, handle: int = 0, name: str | None = None, **fields: Any) -> Attach:
    """An ``attach`` where the peer is the receiver, from the node at ``address``."""
    fields.setdefault("target", Target(address=f"{name or 'receiver'}-target"))
    return Attach(
        name=name if name is not None else f"receiver-{handle}",
        handle=UInt(handle),
        role=RECEIVER,
        source=fields.pop("source", Source(address=address)),
        **fields,
    )


def flow(
    *,
    next_incoming_id: int | None = 0,
    incoming_window: int = DEFAULT_WINDOW,
    next_outgoing_id: int = 0,
    outgoing_window: int = DEFAULT_WINDOW,
    handle: int | None = None,
    delivery_count: int | None = None,
    link_credit: int | None = None,
    **fields: Any,
) -> Flow:
    """A ``flow``: session-only without ``handle``, for one link with it."""
    return Flow(
        next_incoming_id=None if next_incoming_id is None else UInt(next_incoming_id),
        incoming_window=UInt(incoming_window),
        next_outgoing_id=UInt(next_outgoing_id),
        outgoing_window=UInt(outgoing_window),
        handle=None if handle is None else UInt(handle),
        delivery_count=None if delivery_count is None else UInt(delivery_count),
        link_credit=None if link_credit is None else UInt(link_credit),
        **fields,
    )


def transfer(handle: int, delivery_id: int | None, *, tag: bytes | None = None, **fields: Any) -> Transfer:
    """A ``transfer``; ``delivery_id=None`` for a continuation frame. The tag defaults to the id."""
    if tag is None and delivery_id is not None:
        tag = str(delivery_id).encode()
    if delivery_id is not None:
        fields.setdefault("message_format", UInt(0))
    return Transfer(
        handle=UInt(handle),
        delivery_id=None if delivery_id is None else UInt(delivery_id),
        delivery_tag=tag,
        **fields,
    )


def disposition(
    first: int,
    last: int | None = None,
    *,
    role: bool = RECEIVER,
    settled: bool = True,
    state: Any = None,
) -> Disposition:
    """A ``disposition`` for deliveries ``first``..``last``; by default the receiver settling them."""
    return Disposition(
        role=role,
        first=UInt(first),
        last=None if last is None else UInt(last),
        settled=settled,
        state=state,
    )


def sasl_anonymous() -> SaslInit:
    """``sasl-init`` choosing ANONYMOUS."""
    return SaslInit(mechanism=Symbol("ANONYMOUS"), initial_response=b"")


def sasl_plain(user: str, password: str) -> SaslInit:
    """``sasl-init`` choosing PLAIN with an RFC 4616 initial response."""
    response = b"\x00" + user.encode() + b"\x00" + password.encode()
    return SaslInit(mechanism=Symbol("PLAIN"), initial_response=response)


def message(body: Any = "hello", *sections: Any) -> bytes:
    """An encoded message: ``sections`` (header, properties ...) then an amqp-value ``body``.

    ``body`` may also be a section object itself (``Data(b"...")``) or ``bytes`` already encoded.
    """
    if isinstance(body, bytes):
        encoded_body = body
    elif hasattr(body, "DESCRIPTOR_CODE"):
        encoded_body = codec.encode(body)
    else:
        encoded_body = codec.encode(AmqpValue(body))
    return b"".join(codec.encode(s) for s in sections) + encoded_body


# -- frames as bytes ------------------------------------------------------------------------------
def frame(channel: int, performative: Any, payload: bytes = b"", frame_type: int = AMQP_FRAME) -> bytes:
    """A valid frame carrying ``performative`` (any encodable value) and ``payload``."""
    return encode_frame(channel, performative, payload, frame_type)


def sasl_frame(performative: Any) -> bytes:
    """A SASL frame (type 1, channel 0)."""
    return encode_frame(0, performative, frame_type=SASL_FRAME)


def heartbeat(channel: int = 0) -> bytes:
    """An empty frame (§2.4.5), the idle-time-out keep-alive."""
    if channel == 0:
        return EMPTY_FRAME
    return FRAME_HEADER.pack(8, 2, AMQP_FRAME, channel)


def raw_frame(
    *,
    size: int | None = None,
    doff: int = 2,
    type: int = AMQP_FRAME,
    channel: int = 0,
    body: bytes = b"",
) -> bytes:
    """A frame header with any field value, followed by ``body`` (extended header included, if any).

    ``size`` defaults to the true size (8 + len(body)); give it to lie about the length.
    """
    return FRAME_HEADER.pack(8 + len(body) if size is None else size, doff, type, channel) + body


def undecodable_frame(channel: int = 0) -> bytes:
    """A well-framed frame whose body is not an AMQP encoding (0xFF is no format code)."""
    return raw_frame(channel=channel, body=b"\xff\x00\x00\x00")
