"""Frame capture (``--capture``, ``[broker] capture``): every byte a connection reads and writes, cut into frames.

Theory of operation
-------------------
The tap is on the raw byte stream of each ``ConnectionTask`` (what ``receive_some`` returned, what goes to
``send_all``), not in the engine: the engine is sans-IO and reads no clock, and only the stream shows the bytes
exactly as they crossed the wire (a transfer held back by the peer's window is recorded when it is written, not
when it was queued). A ``FrameSplitter`` per direction cuts the stream into protocol headers and frames (Part 2
§2.2, §2.3.1: a frame starts with its 4-byte size). Frames are kept raw, with the broker's wall time, in a deque of
at most ``capture_limit`` frames per connection (the oldest dropped, and counted); they are decoded only when
someone asks (``records``), so capturing costs a split per read, and nothing at all when it is off (the task
tests one attribute).

Credentials never stay: a SASL PLAIN password is replaced by as many ``*`` (the frame re-encoded), and a
sasl-response is blanked the same way, before the frame is kept.

A record (``describe``) is JSON as it is: ``time``, ``connection``, ``direction`` ("in" from the client, "out"
from the broker), ``kind`` ("header", "sasl", "amqp", "heartbeat" or "undecodable"), ``channel``,
``performative`` (the spec's name: "open", "sasl-init"), ``fields`` (the spec's field names; binary as hex,
symbols as strings, described types as ``{"@type": name, ...}``), ``payload_size`` and ``raw`` (the frame's
bytes in hex, which replay and pcap use).
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from minibroker.amqp.composite import Composite, DescribedSection
from minibroker.amqp.definitions import SaslInit, SaslResponse
from minibroker.amqp.fastpath import decode_performative
from minibroker.amqp.framing import AMQP_HEADER, FRAME_HEADER, SASL_FRAME, SASL_HEADER, TLS_HEADER, encode_frame
from minibroker.amqp.types import Array, DecodeError, Described

IN = "in"
OUT = "out"
REMEMBERED_CONNECTIONS = 100
"""Closed connections whose capture is kept (the oldest forgotten first)."""
_HEADERS = {AMQP_HEADER: "amqp", SASL_HEADER: "sasl", TLS_HEADER: "tls"}

Address = tuple[str, int]


class FrameSplitter:
    """Cuts one direction of a connection's byte stream into protocol headers and frames (Part 2 §2.2, §2.3).

    Bytes that cannot be a frame (a size below 8) end the splitting: they and everything after come out as one
    piece, which ``describe`` calls undecodable.
    """

    __slots__ = ("_buffer", "broken")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.broken = False

    def feed(self, data: bytes | bytearray) -> list[bytes]:
        """The complete headers and frames that ``data`` finishes, in order."""
        buffer = self._buffer
        buffer += data
        pieces: list[bytes] = []
        while buffer:
            if self.broken:
                pieces.append(bytes(buffer))
                buffer.clear()
                break
            if buffer[0] == 0x41:  # "A": a protocol header ("AMQP" and 4 bytes); no frame is 1 GiB
                size = 8
            else:
                if len(buffer) < 4:
                    break
                size = int.from_bytes(buffer[:4], "big")
                if size < 8:
                    self.broken = True
                    continue
            if len(buffer) < size:
                break
            pieces.append(bytes(buffer[:size]))
            del buffer[:size]
        return pieces


def redact(frame: bytes) -> bytes:
    """``frame`` without secrets: a SASL PLAIN password or a sasl-response's data replaced by ``*``s."""
    if len(frame) < 8 or frame[5] != SASL_FRAME:
        return frame
    body = frame[frame[4] * 4 :]
    try:
        performative, _end = decode_performative(body)
    except DecodeError:
        return frame
    if isinstance(performative, SaslInit) and performative.initial_response:
        response = performative.initial_response
        if str(performative.mechanism) == "PLAIN" and b"\x00" in response:
            keep = response.rindex(b"\x00") + 1  # authzid NUL authcid NUL passwd (RFC 4616)
            masked = response[:keep] + b"*" * (len(response) - keep)
        elif str(performative.mechanism) == "ANONYMOUS":
            return frame
        else:
            masked = b"*" * len(response)
        performative.initial_response = masked
    elif isinstance(performative, SaslResponse):
        performative.response = b"*" * len(performative.response or b"")
    else:
        return frame
    channel = FRAME_HEADER.unpack_from(frame)[3]
    return encode_frame(channel, performative, frame_type=SASL_FRAME)


BYTE_LIMIT = 16 * 1024 * 1024
"""Bytes of frames kept per connection, whatever ``capture_limit`` allows (a few large transfers must not hold
hundreds of megabytes): beyond, the oldest frames are dropped (and counted)."""


class ConnectionCapture:
    """The frames of one connection, at most ``limit`` and ``byte_limit`` bytes, the oldest dropped (and counted)
    beyond."""

    def __init__(
        self,
        conn_id: int,
        limit: int,
        client: Address | None = None,
        server: Address | None = None,
        byte_limit: int = BYTE_LIMIT,
    ) -> None:
        self.conn_id = conn_id
        self.client = client
        """The client's (host, port), None when not on a socket."""
        self.server = server
        """The broker's (host, port) this connection came in on, None when not on a socket."""
        self.frames: deque[tuple[float, str, bytes]] = deque()
        """(wall time, direction, raw frame) in the order they crossed the wire."""
        self.limit = limit
        self.byte_limit = byte_limit
        self.bytes = 0
        """Bytes of the frames kept."""
        self.dropped = 0
        self.closed = False
        self._split = {IN: FrameSplitter(), OUT: FrameSplitter()}
        self._sasl_in = True  # until the client's AMQP header, its frames may carry credentials

    def received(self, data: bytes | bytearray, now: float) -> None:
        """The client sent ``data`` (at wall time ``now``)."""
        for piece in self._split[IN].feed(data):
            if self._sasl_in:
                if piece == AMQP_HEADER:
                    self._sasl_in = False
                piece = redact(piece)
            self._keep(now, IN, piece)

    def sent(self, data: bytes | bytearray, now: float) -> None:
        """The broker sent ``data`` (at wall time ``now``)."""
        for piece in self._split[OUT].feed(data):
            self._keep(now, OUT, piece)

    def _keep(self, now: float, direction: str, piece: bytes) -> None:
        frames = self.frames
        frames.append((now, direction, piece))
        self.bytes += len(piece)
        while len(frames) > self.limit or (self.bytes > self.byte_limit and len(frames) > 1):
            self.bytes -= len(frames.popleft()[2])
            self.dropped += 1

    def records(self) -> list[dict[str, Any]]:
        """Every kept frame, decoded (``describe``)."""
        return [describe(self.conn_id, now, direction, raw) for now, direction, raw in list(self.frames)]

    def summary(self) -> dict[str, Any]:
        """What ``GET /api/connections/{id}/frames`` answers: the addresses, the counts, and the records."""
        return {
            "connection": self.conn_id,
            "client": _address(self.client),
            "server": _address(self.server),
            "closed": self.closed,
            "dropped": self.dropped,
            "frames": self.records(),
        }


def _address(address: Address | None) -> str | None:
    if address is None:
        return None
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def describe(conn_id: int, now: float, direction: str, raw: bytes) -> dict[str, Any]:
    """One captured frame as a JSON-ready record (see the module's docstring)."""
    record: dict[str, Any] = {
        "time": now,
        "connection": conn_id,
        "direction": direction,
        "kind": "undecodable",
        "channel": None,
        "performative": None,
        "fields": {},
        "payload_size": 0,
        "raw": raw.hex(),
    }
    if raw in _HEADERS:
        record.update(kind="header", fields={"protocol": _HEADERS[raw], "version": "1.0.0"})
        return record
    if len(raw) < 8 or raw[:4] == b"AMQP":
        return record
    size, doff, frame_type, channel = FRAME_HEADER.unpack_from(raw)
    if size != len(raw) or doff < 2 or doff * 4 > size:  # §2.3.1: doff is at least 2, within the frame
        return record
    body = raw[doff * 4 :]
    record["channel"] = channel
    if not body:
        record["kind"] = "heartbeat"
        return record
    try:
        performative, end = decode_performative(body)
    except DecodeError:
        return record
    if not isinstance(performative, Composite):
        return record
    record.update(
        kind="sasl" if frame_type == SASL_FRAME else "amqp",
        performative=performative.DESCRIPTOR_NAME.split(":")[1],
        fields=composite_fields(performative),
        payload_size=len(body) - end,
    )
    return record


def composite_fields(value: Composite) -> dict[str, Any]:
    """The fields of a composite that are set, by their spec names, as JSON."""
    return {spec.amqp_name: jsonable(item) for spec in value.FIELDS if (item := getattr(value, spec.name)) is not None}


def jsonable(value: Any) -> Any:
    """An AMQP value as JSON carries it: binary as hex, symbols as strings, described types by name."""
    if isinstance(value, Composite):
        return {"@type": value.DESCRIPTOR_NAME.split(":")[1], **composite_fields(value)}
    if isinstance(value, DescribedSection):
        return {"@type": value.DESCRIPTOR_NAME.split(":")[1], "value": jsonable(value.value)}
    if isinstance(value, Described):
        return {"@descriptor": jsonable(value.descriptor), "value": jsonable(value.value)}
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, Array):
        return [jsonable(item) for item in value.items]
    if isinstance(value, list | tuple):
        return [jsonable(item) for item in value]
    if isinstance(value, dict):
        return {_key(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, UUID):
        return str(value)
    return str(value)


def _key(key: Any) -> str:
    """A map key as JSON allows: text (a symbol, a string), or the JSON of any other key."""
    shown = jsonable(key)
    return shown if isinstance(shown, str) else json.dumps(shown)


@dataclass
class CaptureStore:
    """Every connection's capture: the open ones, and the last ``REMEMBERED_CONNECTIONS`` closed ones."""

    limit: int
    """Frames kept per connection (``[broker] capture_limit``)."""
    remembered: int = REMEMBERED_CONNECTIONS

    def __post_init__(self) -> None:
        self._captures: OrderedDict[int, ConnectionCapture] = OrderedDict()
        self._closed: deque[int] = deque()

    def open(self, conn_id: int, client: Address | None, server: Address | None) -> ConnectionCapture:
        """Start capturing connection ``conn_id``."""
        capture = ConnectionCapture(conn_id, self.limit, client, server)
        self._captures[conn_id] = capture
        return capture

    def close(self, conn_id: int) -> None:
        """Connection ``conn_id`` is gone: its capture is kept among the remembered ones."""
        capture = self._captures.get(conn_id)
        if capture is None or capture.closed:
            return
        capture.closed = True
        self._closed.append(conn_id)
        while len(self._closed) > self.remembered:
            self._captures.pop(self._closed.popleft(), None)

    def get(self, conn_id: int) -> ConnectionCapture | None:
        """The capture of connection ``conn_id``; None when it is unknown or forgotten."""
        return self._captures.get(conn_id)

    def all(self) -> list[ConnectionCapture]:
        """Every capture kept, in the order the connections came."""
        return list(self._captures.values())


__all__ = ["IN", "OUT", "CaptureStore", "ConnectionCapture", "FrameSplitter", "describe", "jsonable", "redact"]
