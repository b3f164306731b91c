"""Frames (Part 2 §2.3) and protocol headers (Part 2 §2.2, Part 5 §5.3.1).

A frame is an 8-byte header (size, data offset in 4-byte words, type, channel), an extended header we
never send, and a body: one performative, followed for transfers by payload bytes.
"""

from __future__ import annotations

import struct
from typing import Any

from minibroker.amqp import codec
from minibroker.amqp.composite import Composite

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
TLS_HEADER = b"AMQP\x02\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"

AMQP_FRAME = 0
SASL_FRAME = 1
MIN_MAX_FRAME_SIZE = 512  # §2.7.1: max-frame-size MUST NOT be less than this
FRAME_HEADER = struct.Struct(">IBBH")
EMPTY_FRAME = FRAME_HEADER.pack(8, 2, AMQP_FRAME, 0)


def encode_frame(channel: int, performative: Any, payload: bytes = b"", frame_type: int = AMQP_FRAME) -> bytes:
    """One frame carrying ``performative`` (any encodable value) and ``payload``."""
    body = bytearray(8)
    codec.encode_into(body, performative)
    if payload:
        body += payload
    FRAME_HEADER.pack_into(body, 0, len(body), 2, frame_type, channel)
    return bytes(body)


def encode_frame_all_fields(
    channel: int, performative: Any, payload: bytes = b"", frame_type: int = AMQP_FRAME
) -> bytes:
    """As ``encode_frame``, the performative with every field, trailing nulls included
    (``Composite.encode_all_into``: for peers that read fields by position)."""
    if not isinstance(performative, Composite):
        return encode_frame(channel, performative, payload, frame_type)
    body = bytearray(8)
    performative.encode_all_into(body)
    if payload:
        body += payload
    FRAME_HEADER.pack_into(body, 0, len(body), 2, frame_type, channel)
    return bytes(body)
