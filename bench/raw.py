"""The raw-socket AMQP 1.0 clients of the benchmarks: frames built by ``minibroker.testing.frames`` and
``minibroker.amqp``, decoded with ``minibroker.amqp`` (its transfer and disposition fast path), over a
plain socket, so the client costs a few µs per message and the broker, not the client, sets the pace.

* ``RawClient`` (perf): one connection and one session whose state it follows (``RawSession``), links by
  handle (``RawLink``); pre-encoded transfers streamed as far as credit and the session window allow.
* ``RawConnection`` (soak, attacks): frames queued in ``out`` and flushed, frames received as
  (channel, performative, payload); the caller keeps the protocol state.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from minibroker.amqp import codec, fastpath
from minibroker.amqp.definitions import (
    Accepted,
    Attach,
    Begin,
    Close,
    Coordinator,
    Declared,
    Detach,
    Disposition,
    Flow,
    Open,
    SaslMechanisms,
    SaslOutcome,
    Transfer,
)
from minibroker.amqp.framing import AMQP_FRAME, AMQP_HEADER, FRAME_HEADER, SASL_FRAME, SASL_HEADER
from minibroker.amqp.types import Symbol, UInt
from minibroker.testing import frames

IO_TIMEOUT = 10.0  # seconds any single wait on the broker may take before the run counts as hung
SERIAL = 2**32


def decode_performative(body: bytes) -> tuple[Any, int]:
    """``codec.decode(body)``: the performative at the start of a frame body and where its payload starts;
    transfers and dispositions through minibroker's fast path."""
    prefix = body[:3]
    if prefix == fastpath.TRANSFER_PREFIX:
        return fastpath.decode_transfer(body)
    if prefix == fastpath.DISPOSITION_PREFIX:
        return fastpath.decode_disposition(body)
    return codec.decode(body)


# -- perf's client: one session, links by handle, pipelined transfers -------------------------------------
@dataclass
class RawLink:
    """A link of ``RawClient``: its handle and name, and its credit and delivery count."""

    handle: int
    name: str
    sender: bool
    credit: int = 0  # sender: transfers we may still send
    delivery_count: int = 0
    attached: bool = False


@dataclass
class RawSession:
    """The one session of ``RawClient``: its ids and windows, and what the broker said about deliveries."""

    next_outgoing_id: int = 0
    remote_window: int = 0
    next_incoming_id: int = 0
    sent_at: dict[int, float] = field(default_factory=dict)
    settled_ids: set[int] = field(default_factory=set)
    accepted: int = 0
    received_ids: list[int] = field(default_factory=list)
    declared: dict[int, Any] = field(default_factory=dict)  # delivery id of a declare -> txn-id


class RawClient:
    """One connection, one session, links by handle; frames encoded by minibroker's own codec."""

    WINDOW = 1 << 20

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        host, _, port = url.rpartition(":")
        self.sock = socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.timeout = timeout
        self.session = RawSession()
        self.links: dict[int, RawLink] = {}
        self.by_name: dict[str, RawLink] = {}
        self.remote_handles: dict[int, RawLink] = {}
        self._handshake()

    # -- I/O --------------------------------------------------------------------------------------
    def _fill(self, timeout: float) -> None:
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if not ready:
            return
        self.sock.setblocking(False)
        try:
            while True:
                try:
                    chunk = self.sock.recv(1 << 20)
                except BlockingIOError:
                    break
                if not chunk:
                    raise ConnectionError("the broker closed the connection")
                self.buf += chunk
                if len(chunk) < (1 << 20):
                    break
        finally:
            self.sock.settimeout(self.timeout)

    def _take(self, n: int) -> bytes:
        deadline = time.monotonic() + self.timeout
        while len(self.buf) < n:
            if time.monotonic() > deadline:
                raise TimeoutError("no answer from the broker")
            self._fill(0.5)
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def _frames(self) -> Iterator[tuple[int, Any, bytes]]:
        buf = self.buf
        pos = 0
        try:
            while len(buf) - pos >= 8:
                size, doff, frame_type, _channel = FRAME_HEADER.unpack_from(buf, pos)
                if len(buf) - pos < size:
                    break
                body = bytes(buf[pos + doff * 4 : pos + size])
                pos += size
                if not body:
                    continue
                performative, end = decode_performative(body)
                yield frame_type, performative, body[end:]
        finally:
            del buf[:pos]

    def pump(self, timeout: float) -> None:
        """Read what has arrived (waiting up to ``timeout`` for something) and handle every frame."""
        self._fill(timeout)
        for _type, performative, payload in self._frames():
            self._handle(performative, payload)

    def _handle(self, performative: Any, payload: bytes) -> None:
        session = self.session
        if isinstance(performative, Transfer):
            session.next_incoming_id = (session.next_incoming_id + 1) % SERIAL
            link = self.remote_handles[performative.handle or 0]
            link.delivery_count += 1
            if performative.delivery_id is not None:
                session.received_ids.append(performative.delivery_id)
        elif isinstance(performative, Disposition):
            first = performative.first or 0
            last = first if performative.last is None else performative.last
            now = time.perf_counter()
            accepted = isinstance(performative.state, Accepted)
            if isinstance(performative.state, Declared):
                session.declared[first] = performative.state.txn_id
            for delivery_id in range(first, last + 1):
                sent = session.sent_at.pop(delivery_id, None)
                if sent is not None:
                    self.latencies_ms.append((now - sent) * 1000)
                if performative.settled:
                    session.settled_ids.add(delivery_id)
                if accepted:
                    session.accepted += 1
        elif isinstance(performative, Flow):
            next_incoming = performative.next_incoming_id or 0
            session.remote_window = next_incoming + (performative.incoming_window or 0) - session.next_outgoing_id
            if performative.handle is not None:
                link = self.remote_handles[performative.handle]
                if link.sender:
                    link.credit = (performative.delivery_count or 0) + (performative.link_credit or 0)
                    link.credit -= link.delivery_count
        elif isinstance(performative, Attach):
            link = self.by_name[performative.name or ""]
            link.attached = True
            if not link.sender and performative.initial_delivery_count is not None:
                link.delivery_count = performative.initial_delivery_count
            self.remote_handles[performative.handle or 0] = link
        elif isinstance(performative, Begin):
            session.remote_window = performative.incoming_window or 0
            session.next_incoming_id = performative.next_outgoing_id or 0
            self.begun = True
        elif isinstance(performative, Detach | Close):
            raise ConnectionError(f"the broker sent {performative!r}")

    latencies_ms: list[float]

    def wait(self, condition: Callable[[], bool], timeout: float | None = None) -> None:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError("the broker did not answer in time")
            self.pump(0.2)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    # -- set-up -----------------------------------------------------------------------------------
    def _handshake(self) -> None:
        self.latencies_ms = []
        self.begun = False
        self.send(frames.SASL_HEADER)
        header = self._take(8)
        if header == frames.SASL_HEADER:
            if not isinstance(self._next_sasl(), SaslMechanisms):
                raise ConnectionError("expected sasl-mechanisms")
            self.send(frames.sasl_frame(frames.sasl_anonymous()))
            outcome = self._next_sasl()
            if not isinstance(outcome, SaslOutcome) or outcome.code != 0:
                raise ConnectionError("SASL ANONYMOUS was refused")
            self.send(frames.AMQP_HEADER)
            header = self._take(8)
        if header != frames.AMQP_HEADER:
            raise ConnectionError(f"unexpected protocol header {header!r}")
        self.send(
            frames.frame(0, Open(container_id=f"bench-raw-{os.getpid()}", max_frame_size=UInt(65536)))
            + frames.frame(0, frames.begin(incoming_window=self.WINDOW, outgoing_window=self.WINDOW))
        )
        self.wait(lambda: self.begun)

    def _next_sasl(self) -> Any:
        """The next SASL frame's performative (read one frame at a time: AMQP bytes may follow)."""
        size, doff, _type, _channel = FRAME_HEADER.unpack(self._take(8))
        body = self._take(size - 8)[doff * 4 - 8 :]
        return codec.decode(body)[0]

    def attach_sender(self, address: str, name: str) -> RawLink:
        link = self._new_link(name, sender=True)
        self.send(frames.frame(0, frames.attach_sender(address, link.handle, name, snd_settle_mode=UInt(2))))
        self.wait(lambda: link.attached and link.credit > 0)
        return link

    def attach_receiver(self, address: str, name: str, credit: int) -> RawLink:
        link = self._new_link(name, sender=False)
        self.send(
            frames.frame(
                0,
                frames.attach_receiver(address, link.handle, name, snd_settle_mode=UInt(0), rcv_settle_mode=UInt(0)),
            )
        )
        self.wait(lambda: link.attached)
        self.flow(link, credit)
        return link

    def attach_coordinator(self, name: str) -> RawLink:
        """A sender link to the transaction coordinator (local transactions), once it has credit."""
        link = self._new_link(name, sender=True)
        coordinator = Coordinator(capabilities=[Symbol("amqp:local-transactions")])
        self.send(frames.frame(0, frames.attach_sender(None, link.handle, name, target=coordinator)))
        self.wait(lambda: link.attached and link.credit > 0)
        return link

    def _new_link(self, name: str, *, sender: bool) -> RawLink:
        link = RawLink(len(self.links), name, sender)
        self.links[link.handle] = link
        self.by_name[name] = link
        return link

    def flow(self, link: RawLink, credit: int) -> None:
        session = self.session
        self.send(
            frames.frame(
                0,
                frames.flow(
                    next_incoming_id=session.next_incoming_id,
                    incoming_window=self.WINDOW,
                    next_outgoing_id=session.next_outgoing_id,
                    outgoing_window=self.WINDOW,
                    handle=link.handle,
                    delivery_count=link.delivery_count,
                    link_credit=credit,
                ),
            )
        )

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.send(frames.frame(0, Close()))
            self.sock.close()

    # -- traffic ----------------------------------------------------------------------------------
    def transfer_frame(self, link: RawLink, delivery_id: int, payload: bytes, *, settled: bool) -> bytes:
        tag = delivery_id.to_bytes(4, "big")
        performative = fastpath.encode_transfer(link.handle, delivery_id, tag, 0, settled, False)
        return FRAME_HEADER.pack(8 + len(performative) + len(payload), 2, 0, 0) + performative + payload

    def stream(self, link: RawLink, encoded: list[bytes], first_id: int, stop: Callable[[], bool]) -> int:
        """Send the pre-encoded transfers (delivery ids ``first_id``...) as fast as credit and the
        session window allow; returns how many were sent (fewer when ``stop()`` said so)."""
        session = self.session
        sent = 0
        total = len(encoded)
        while sent < total:
            n = min(link.credit, session.remote_window, total - sent)
            if n > 0:
                now = time.perf_counter()
                self.send(b"".join(encoded[sent : sent + n]))
                for delivery_id in range(first_id + sent, first_id + sent + n):
                    session.sent_at[delivery_id] = now
                sent += n
                link.credit -= n
                link.delivery_count += n
                session.next_outgoing_id += n
                session.remote_window -= n
                if stop():
                    break
            self.pump(0.0 if n > 0 else 0.5)
        return sent


# -- soak's client: frames queued and flushed, the protocol state kept by the caller -------------------
class BrokerClosed(Exception):
    """The broker closed the TCP connection."""


class RawConnection:
    """One client connection speaking frames built by ``minibroker.testing.frames``.

    Outgoing bytes collect in ``out``; ``flush`` writes what the socket takes (the socket is blocking during
    set-up, non-blocking in the selector loop). ``receive`` reads once and returns the whole frames that
    arrived, as (channel, performative, payload); a heartbeat is (channel, None, b"").
    """

    def __init__(self, host: str, port: int, *, timeout: float = IO_TIMEOUT) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.inbuf = bytearray()
        self.out = bytearray()
        self.backlog: list[tuple[int, Any, bytes]] = []  # frames parsed by ``expect`` and not taken yet
        self.eof = False

    # -- writing ------------------------------------------------------------------------------------
    def queue(self, channel: int, performative: Any, payload: bytes = b"", frame_type: int = AMQP_FRAME) -> None:
        self.out += frames.frame(channel, performative, payload, frame_type)

    def queue_header(self, header: bytes) -> None:
        self.out += header

    def flush(self) -> None:
        """Write as much of ``out`` as the socket takes now (all of it while the socket is blocking)."""
        if not self.out:
            return
        if self.sock.gettimeout() != 0.0:
            self.sock.sendall(self.out)
            self.out.clear()
            return
        try:
            sent = self.sock.send(self.out)
        except BlockingIOError:
            return
        del self.out[:sent]

    # -- reading ------------------------------------------------------------------------------------
    def receive(self) -> list[tuple[int, Any, bytes]]:
        """Read once (waiting up to the timeout while blocking) and return the frames now complete."""
        try:
            data = self.sock.recv(262144)
        except BlockingIOError:
            return []
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            raise BrokerClosed("the broker closed the connection")
        self.inbuf += data
        if self.backlog:
            backlog, self.backlog = self.backlog, []
            return backlog + self._parse()
        return self._parse()

    def _parse(self) -> list[tuple[int, Any, bytes]]:
        buf = self.inbuf
        pos = 0
        size_of = len(buf)
        result: list[tuple[int, Any, bytes]] = []
        unpack = FRAME_HEADER.unpack_from
        decode = decode_performative
        while size_of - pos >= 8:
            if buf[pos : pos + 4] == b"AMQP":  # a protocol header (no frame is that large)
                header = bytes(buf[pos : pos + 8])
                if header not in (AMQP_HEADER, SASL_HEADER):
                    raise ValueError(f"unexpected protocol header {header!r}")
                pos += 8
                continue
            size, doff, _type, channel = unpack(buf, pos)
            if size_of - pos < size:
                break
            if size == doff * 4:
                result.append((channel, None, b""))
            else:
                body = bytes(buf[pos + doff * 4 : pos + size])
                performative, end = decode(body)
                result.append((channel, performative, body[end:]))
            pos += size
        del buf[:pos]
        return result

    def expect(self, kind: type, *, seen: list[Any] | None = None) -> Any:
        """Block until a frame whose performative is a ``kind`` arrives; return it (others go to ``seen``)."""
        deadline = time.monotonic() + self.timeout
        while True:
            self.backlog += self._parse()
            while self.backlog:
                _channel, performative, _payload = self.backlog.pop(0)
                if isinstance(performative, kind):
                    return performative
                if seen is not None:
                    seen.append(performative)
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {kind.__name__} from the broker within {self.timeout} s")
            self.flush()
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(262144)
            except ConnectionResetError:
                data = b""
            if not data:
                self.eof = True
                raise BrokerClosed(f"the broker closed the connection while we waited for {kind.__name__}")
            self.inbuf += data

    def open(self, container_id: str, *, sasl: bool = False, begin: Begin | None = None) -> None:
        """Protocol header(s), (SASL ANONYMOUS,) open and one session on channel 0; wait for the answers."""
        if sasl:
            self.queue_header(SASL_HEADER)
            self.queue(0, frames.sasl_anonymous(), frame_type=SASL_FRAME)
        self.queue_header(AMQP_HEADER)
        self.queue(0, frames.open_(container_id))
        self.queue(0, begin if begin is not None else frames.begin())
        self.flush()
        if sasl:
            self.expect(SaslMechanisms)
            outcome = self.expect(SaslOutcome)
            if outcome.code != 0:
                raise RuntimeError(f"SASL refused: {outcome!r}")
        self.expect(Begin)

    def close(self) -> None:
        """AMQP close, wait for the broker's, then close the socket."""
        try:
            self.sock.settimeout(self.timeout)
            self.queue(0, Close())
            self.flush()
            self.expect(Close)
        finally:
            self.sock.close()
