"""``minibroker replay CAPTURE --url URL``: play a captured client again against a broker, and compare its answers.

CAPTURE is what ``--capture`` recorded for one connection: the JSON of ``GET /api/connections/{id}/frames`` (or
a list of records from ``broker.frames()``, saved with ``json.dump``), or a pcap written by minibroker
(``GET /api/capture.pcap``, ``broker.write_pcap``). With several connections in it, ``--connection ID`` picks
one (for a pcap: the ID-th TCP connection, counting from 1).

The replay sends the client's frames ("in") as they were captured, in order, over a new TCP connection; before
each one it waits (at most ``--timeout`` seconds) until the broker has answered as many frames as it had by then
in the capture, so requests and answers interleave as they did. Then it compares the broker's frames ("out")
with the captured ones, after this normalisation of what naturally differs from one broker, or one run, to the
next:

* txn-ids: each ``declared`` txn-id becomes ``<txn-N>`` (N counting declarations), wherever it appears (a
  transactional-state, an error's description); the client's frames sent to the new broker carry the txn-ids
  *it* declared instead of the captured ones (the N-th for the N-th; a frame whose txn-id changes length is
  encoded again, a discharge's message too);
* the broker's container-id and open properties; delivery tags of the broker's transfers (``<tag>``); the
  address of a dynamic node (``<dynamic>``); a sasl-outcome's additional-data;
* heartbeats (empty frames) and times are left out.

Everything else counts: performatives in their order, every other field, the payload sizes. SASL: the captured
sasl-init goes as it was (a PLAIN password was masked with ``*`` when captured), unless URL holds credentials
(``amqp://USER:PASSWORD@HOST:PORT``): then the client authenticates with those, with PLAIN.

Exit 0 when the answers are the same, 1 with a unified diff of the normalised frames (one line per frame, its
performative first) when they differ, 2 when the capture cannot be read or the broker cannot be reached.
"""

from __future__ import annotations

import argparse
import difflib
import json
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from minibroker.amqp import codec
from minibroker.amqp.composite import Composite, DescribedSection
from minibroker.amqp.definitions import SaslInit
from minibroker.amqp.fastpath import decode_performative
from minibroker.amqp.framing import FRAME_HEADER, SASL_FRAME, encode_frame
from minibroker.amqp.types import DecodeError, Symbol
from minibroker.server.capture import IN, OUT, FrameSplitter, describe
from minibroker.server.pcap import PcapError, read_pcap

EXIT_SAME, EXIT_DIFFERENT, EXIT_BAD = 0, 1, 2
DEFAULT_TIMEOUT = 2.0
_PCAP_MAGICS = (b"\xd4\xc3\xb2\xa1", b"\xa1\xb2\xc3\xd4", b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")


class BadInput(Exception):
    """The capture or the URL cannot be used (exit 2); the message says why."""


@dataclass(frozen=True)
class Frame:
    """One captured frame (or protocol header): who sent it, and its bytes."""

    direction: str
    raw: bytes


# -- reading a capture --------------------------------------------------------------------------------------
def load_capture(path: str | Path, connection: int | None = None) -> list[Frame]:
    """The frames of one connection of the capture at ``path`` (JSON or pcap); ``BadInput`` when it cannot be
    read, holds no frames, or holds several connections and ``connection`` does not pick one."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise BadInput(f"{path}: cannot read: {exc.strerror or exc}") from None
    if data[:4] in _PCAP_MAGICS:
        try:
            streams = read_pcap(data)
        except PcapError as exc:
            raise BadInput(f"{path}: {exc}") from None
        conversations = {n: [Frame(d, raw) for _t, d, raw in s.frames] for n, s in enumerate(streams, 1)}
    else:
        conversations = _json_conversations(path, data)
    conversations = {n: frames for n, frames in conversations.items() if frames}
    if not conversations:
        raise BadInput(f"{path}: no frames in it")
    if connection is not None:
        if connection not in conversations:
            known = ", ".join(str(n) for n in sorted(conversations))
            raise BadInput(f"{path}: no connection {connection} in it (it has: {known})")
        return conversations[connection]
    if len(conversations) > 1:
        known = ", ".join(str(n) for n in sorted(conversations))
        raise BadInput(f"{path}: it holds several connections ({known}): pick one with --connection")
    return next(iter(conversations.values()))


def _json_conversations(path: str | Path, data: bytes) -> dict[int, list[Frame]]:
    try:
        document = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadInput(f"{path}: neither a pcap file nor JSON: {exc}") from None
    records = document.get("frames") if isinstance(document, dict) else document
    if not isinstance(records, list):
        raise BadInput(f"{path}: expected the JSON of GET /api/connections/ID/frames, or a list of frame records")
    conversations: dict[int, list[Frame]] = {}
    for number, record in enumerate(records, 1):
        try:
            direction = record["direction"]
            raw = bytes.fromhex(record["raw"])
            conn = int(record.get("connection") or 0)
        except (TypeError, KeyError, ValueError):
            raise BadInput(f"{path}: frame {number} is not a captured frame (direction, raw in hex)") from None
        if direction not in (IN, OUT):
            raise BadInput(f"{path}: frame {number}: direction {direction!r} is neither in nor out")
        conversations.setdefault(conn, []).append(Frame(direction, raw))
    return conversations


# -- playing it again -------------------------------------------------------------------------------------
def _significant(raw: bytes) -> bool:
    """Whether a frame counts (a heartbeat, an empty frame, does not)."""
    return not (len(raw) >= 8 and raw[:4] != b"AMQP" and len(raw) <= raw[4] * 4)


def _declared_ids(frames: Sequence[bytes]) -> list[bytes]:
    """The txn-ids the broker declared in ``frames``, in order."""
    ids: list[bytes] = []
    for raw in frames:
        if b"\x00\x53\x33" not in raw:  # the declared descriptor (0x33), cheaply: most frames have none
            continue
        state = describe(0, 0.0, OUT, raw)["fields"].get("state")
        if isinstance(state, dict) and state.get("@type") == "declared":
            ids.append(bytes.fromhex(state["txn-id"]))
    return ids


class _Connection:
    """The replay's socket to the broker, and the frames it has answered so far."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.splitter = FrameSplitter()
        self.answers: list[bytes] = []
        self.counted = 0
        self.closed = False

    def wait_for(self, count: int, timeout: float) -> bool:
        """Read until the broker has sent ``count`` frames that count, or closed; False after ``timeout``."""
        deadline = time.monotonic() + timeout
        while self.counted < count and not self.closed:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return False
            except OSError:
                data = b""
            if not data:
                self.closed = True
                break
            for piece in self.splitter.feed(data):
                self.answers.append(piece)
                self.counted += _significant(piece)
        return self.counted >= count

    def send(self, raw: bytes) -> bool:
        """Send ``raw``; False when the broker is gone."""
        try:
            self.sock.sendall(raw)
        except OSError:
            self.closed = True
            return False
        return True


def _substituted(raw: bytes, pairs: list[tuple[bytes, bytes]]) -> bytes:
    """``raw`` carrying the replay broker's txn-ids where it carries the captured broker's: byte for byte when
    they are as long, else by decoding the frame (and its message sections) and encoding it again."""
    ids = {captured: replayed for captured, replayed in pairs if captured != replayed and captured in raw}
    if not ids:
        return raw
    if all(len(captured) == len(replayed) for captured, replayed in ids.items()):
        for captured, replayed in ids.items():
            raw = raw.replace(captured, replayed)
        return raw
    _size, doff, frame_type, channel = FRAME_HEADER.unpack_from(raw)
    body = raw[doff * 4 :]
    try:
        performative, end = decode_performative(body)
        payload = body[end:]
        if any(captured in payload for captured in ids):
            payload = b"".join(codec.encode(_swapped(section, ids)) for section in codec.decode_all(payload))
    except DecodeError as exc:
        raise BadInput(f"a client frame naming a txn-id cannot be re-encoded with the new one: {exc}") from None
    return encode_frame(channel, _swapped(performative, ids), payload, frame_type)


def _swapped(value: Any, ids: dict[bytes, bytes]) -> Any:
    """``value`` with each binary in ``ids`` replaced by its new value, however deep (composites are built anew,
    never changed in place: a decoded one may be shared, as the fast path's cached transactional-state is)."""
    if type(value) is bytes:
        return ids.get(value, value)
    if isinstance(value, Composite):
        return type(value)(*(_swapped(field, ids) for field in value.field_values()))
    if isinstance(value, DescribedSection):
        return type(value)(_swapped(value.value, ids))
    if isinstance(value, list):
        return [_swapped(item, ids) for item in value]
    if isinstance(value, dict):
        return {key: _swapped(item, ids) for key, item in value.items()}
    return value


def _with_credentials(raw: bytes, credentials: tuple[str, str] | None) -> bytes:
    """A client's sasl-init authenticating with ``credentials`` (PLAIN) instead, when given."""
    if credentials is None or len(raw) < 8 or raw[5] != SASL_FRAME:
        return raw
    record = describe(0, 0.0, IN, raw)
    if record["performative"] != "sasl-init":
        return raw
    user, password = credentials
    init = SaslInit(
        mechanism=Symbol("PLAIN"),
        initial_response=b"\x00" + user.encode() + b"\x00" + password.encode(),
        hostname=record["fields"].get("hostname"),
    )
    return encode_frame(0, init, frame_type=SASL_FRAME)


def replay(
    frames: Sequence[Frame], host: str, port: int, *, credentials: tuple[str, str] | None = None, timeout: float
) -> list[bytes]:
    """Send the client's side of ``frames`` to ``host:port`` as described in the module's docstring; the broker's
    frames. ``BadInput`` when the broker cannot be reached."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise BadInput(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from None
    captured_out: list[bytes] = []
    behind = 0  # answers the broker did not give where the capture had them: not waited for again
    with sock:
        conn = _Connection(sock)
        for frame in frames:
            if frame.direction == OUT:
                captured_out.append(frame.raw)
                continue
            expected = sum(map(_significant, captured_out)) - behind
            if not conn.wait_for(expected, timeout):
                behind += expected - conn.counted
            if conn.closed:
                break
            pairs = list(zip(_declared_ids(captured_out), _declared_ids(conn.answers), strict=False))
            if not conn.send(_with_credentials(_substituted(frame.raw, pairs), credentials)):
                break
        expected = sum(map(_significant, captured_out)) - behind
        conn.wait_for(expected, timeout)
        conn.wait_for(conn.counted + 1, min(timeout, 0.2))  # anything more the broker says, briefly
        return conn.answers


# -- comparing ---------------------------------------------------------------------------------------------
def normalised(frames: Sequence[bytes]) -> list[str]:
    """The broker's frames as comparable lines (see the module's docstring for what is normalised)."""
    names = {txn_id.hex(): f"<txn-{n}>" for n, txn_id in enumerate(_declared_ids(frames), 1)}
    lines = []
    for raw in frames:
        if not _significant(raw):
            continue
        record = describe(0, 0.0, OUT, raw)
        if record["kind"] == "header":
            lines.append(f"header {record['fields']['protocol']}")
            continue
        if record["kind"] == "undecodable":
            lines.append(f"undecodable {raw.hex()}")
            continue
        fields = _normal_fields(record["performative"], record["fields"])
        text = json.dumps(_named_txns(fields, names), sort_keys=True)
        size = f" payload={record['payload_size']}" if record["payload_size"] else ""
        lines.append(f"{record['performative']} channel={record['channel']} {text}{size}")
    return lines


def _normal_fields(performative: str, fields: dict[str, Any]) -> dict[str, Any]:
    fields = dict(fields)
    if performative == "open":
        fields.pop("container-id", None)
        fields.pop("properties", None)
    elif performative == "transfer" and "delivery-tag" in fields:
        fields["delivery-tag"] = "<tag>"
    elif performative == "attach":
        for end in ("source", "target"):
            terminus = fields.get(end)
            if isinstance(terminus, dict) and terminus.get("dynamic") and "address" in terminus:
                fields[end] = {**terminus, "address": "<dynamic>"}
    elif performative == "sasl-outcome":
        fields.pop("additional-data", None)
    return fields


def _named_txns(value: Any, names: dict[str, str]) -> Any:
    """``value`` with every txn-id (hex) replaced by its ``<txn-N>`` name, in strings too."""
    if isinstance(value, str):
        if value in names:
            return names[value]
        for hexed, name in names.items():
            value = value.replace(hexed, name)
        return value
    if isinstance(value, list):
        return [_named_txns(item, names) for item in value]
    if isinstance(value, dict):
        return {key: _named_txns(item, names) for key, item in value.items()}
    return value


def difference(captured: Sequence[bytes], replayed: Sequence[bytes]) -> list[str]:
    """A unified diff of the normalised answers; empty when they are the same."""
    return list(
        difflib.unified_diff(
            normalised(captured), normalised(replayed), "captured broker", "replayed broker", lineterm="", n=2
        )
    )


# -- the command ---------------------------------------------------------------------------------------------
def _endpoint(url: str) -> tuple[str, int, tuple[str, str] | None]:
    """(host, port, credentials or None) of an ``amqp://`` URL; ``BadInput`` for anything else."""
    try:
        parts = urlsplit(url if "://" in url else f"amqp://{url}")
        port = parts.port or 5672
    except ValueError as exc:
        raise BadInput(f"--url: not a valid URL: {exc}") from None
    if parts.scheme != "amqp":
        raise BadInput(f"--url: only amqp://HOST:PORT is replayed to (not {parts.scheme}://)")
    if not parts.hostname:
        raise BadInput("--url: no host in it")
    credentials = None
    if parts.username is not None:
        credentials = (unquote(parts.username), unquote(parts.password or ""))
    return parts.hostname, port, credentials


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minibroker replay",
        description="Replay the client side of a captured connection (JSON from GET /api/connections/ID/frames, "
        "or a pcap from GET /api/capture.pcap) against a broker, and compare its answers with the captured ones. "
        "Exit 0: the same; 1: different (a diff is printed); 2: bad capture or URL.",
    )
    parser.add_argument("capture", metavar="CAPTURE", help="the capture file (JSON or pcap)")
    parser.add_argument("--url", required=True, help="the broker to replay against: amqp://[USER:PASSWORD@]HOST:PORT")
    parser.add_argument("--connection", type=int, help="which connection of the capture, when it holds several")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help=f"seconds to wait for each expected answer (default {DEFAULT_TIMEOUT:g})",
    )
    return parser


def main(argv: Sequence[str]) -> int:
    """``minibroker replay``; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse's own messages went to stderr
        return EXIT_BAD if exc.code else EXIT_SAME
    if not args.timeout > 0:
        print("minibroker replay: --timeout must be positive", file=sys.stderr)
        return EXIT_BAD
    try:
        host, port, credentials = _endpoint(args.url)
        frames = load_capture(args.capture, args.connection)
        answers = replay(frames, host, port, credentials=credentials, timeout=args.timeout)
    except BadInput as exc:
        print(f"minibroker replay: {exc}", file=sys.stderr)
        return EXIT_BAD
    diff = difference([f.raw for f in frames if f.direction == OUT], answers)
    if not diff:
        count = sum(1 for f in frames if f.direction == IN)
        print(f"minibroker replay: the same answers ({count} client frames replayed)")
        return EXIT_SAME
    print("minibroker replay: the broker answered differently:")
    print("\n".join(diff))
    return EXIT_DIFFERENT


__all__ = ["BadInput", "Frame", "difference", "load_capture", "main", "normalised", "replay"]
