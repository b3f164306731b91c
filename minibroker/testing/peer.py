"""``ScriptedPeer``: a synchronous raw-socket AMQP peer for precise and negative protocol tests.

A real client library hides the frames and refuses to send wrong ones; this peer sends exactly what the
test says, in the order it says, and hands back every frame the broker answers with. Typical use::

    with ScriptedPeer.connect("127.0.0.1", port) as peer:
        peer.open()                           # header exchange, open, expect the broker's open
        peer.begin()
        peer.attach_sender("orders", handle=0)
        peer.expect(Flow)                     # the broker grants credit
        peer.transfer(0, 0, message("hi"))
        assert isinstance(peer.expect(Disposition).state, Accepted)

Every blocking call waits at most ``timeout`` seconds (set at connect) and fails with an
``AssertionError`` naming what it was waiting for and the frames it saw, never hangs a test.

Handles, delivery ids and credit are the test's to choose; the peer's ``conn`` (a sans-IO
``minibroker.testing.client.ClientConnection``) keeps the protocol's bookkeeping of whatever was sent and
received, so ``flow()`` reports consistent session ids and ``conn.session(0).links`` says what each link
counted. The composite steps (``open``, ``begin``, ``attach_*``, ``close``) are the client core's scripts.
"""

from __future__ import annotations

import socket
import time
from typing import Any, TypeVar, cast

from minibroker.amqp.definitions import Attach, Begin, Close, Open, SaslOutcome
from minibroker.amqp.framing import AMQP_FRAME, AMQP_HEADER
from minibroker.testing import client, frames
from minibroker.testing.client import (
    ClientConnection,
    Ended,
    Event,
    Expect,
    Frame,
    ProtocolHeader,
    Sasl,
    Script,
    ScriptRun,
)

P = TypeVar("P")
R = TypeVar("R")

_RECV_SIZE = 65536


def read_event(conn: ClientConnection, sock: socket.socket, deadline: float) -> Event:
    """The next header, frame or ``Ended`` of ``conn``, reading ``sock`` (blocking) as needed; ``TimeoutError``
    at ``deadline`` (a ``time.monotonic()`` value). Heartbeats are returned like any frame."""
    while (event := conn.next_event()) is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no answer from the broker in time")
        sock.settimeout(remaining)
        try:
            data = sock.recv(_RECV_SIZE)
        except ConnectionResetError:
            data = b""
        conn.receive_data(data)
    return event


class ScriptedPeer:
    """One client connection driven frame by frame over a blocking socket."""

    def __init__(self, sock: socket.socket, timeout: float = 5.0) -> None:
        self.sock = sock
        self.timeout = timeout
        self.conn = ClientConnection()
        """The protocol state: sessions, links, what each side counted."""
        self.received: list[Frame] = []
        """Every frame received so far, heartbeats included (for assertion messages)."""

    @classmethod
    def connect(cls, host: str, port: int, timeout: float = 5.0) -> ScriptedPeer:
        """Open a TCP connection to ``host:port``."""
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(sock, timeout)

    def __enter__(self) -> ScriptedPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close_socket()

    def close_socket(self) -> None:
        """Drop the TCP connection without any AMQP closing handshake."""
        self.sock.close()

    @property
    def remote_open(self) -> Open | None:
        """The broker's ``open``, once it came."""
        return self.conn.remote_open

    @property
    def remote_channels(self) -> dict[int, int]:
        """Our channel -> the broker's channel, from its answering ``begin``."""
        return self.conn.remote_channels

    # -- bytes --------------------------------------------------------------------------------------
    def send_raw(self, data: bytes) -> None:
        """Send bytes exactly as given (``OSError`` if the broker has already dropped the socket)."""
        self.conn.send_raw(data)
        self._flush()

    def _flush(self) -> None:
        self.sock.sendall(self.conn.data_to_send())

    def _next(self, deadline: float, waiting_for: str) -> ProtocolHeader | Frame | Ended:
        """The next header, frame or end of the stream; fails at ``deadline``."""
        try:
            event = read_event(self.conn, self.sock, deadline)
        except TimeoutError:
            raise AssertionError(f"timed out waiting for {waiting_for}{client.recent(self.received)}") from None
        if isinstance(event, Frame):
            self.received.append(event)
        return event

    # -- protocol headers ---------------------------------------------------------------------------
    def send_header(self, header: bytes = AMQP_HEADER) -> None:
        """Send a protocol header (any 8 bytes, or fewer/more for a negative test)."""
        self.conn.send_header(header)
        self._flush()

    def expect_header(self) -> bytes:
        """The broker's next 8 bytes, read as a protocol header."""
        self.conn.expect_header()
        event = self._next(time.monotonic() + self.timeout, "a protocol header")
        if not isinstance(event, ProtocolHeader):
            raise AssertionError("connection closed by the broker while waiting for a protocol header")
        return event.data

    # -- frames -------------------------------------------------------------------------------------
    def send(self, performative: Any, channel: int = 0, payload: bytes = b"", frame_type: int = AMQP_FRAME) -> None:
        """Send one frame."""
        self.conn.send(performative, channel, payload, frame_type)
        self._flush()

    def receive(self) -> Frame:
        """The next frame that is not a heartbeat."""
        deadline = time.monotonic() + self.timeout
        while True:
            event = self._next(deadline, "a frame")
            if isinstance(event, Ended):
                raise AssertionError(
                    f"connection closed by the broker while waiting for a frame{client.recent(self.received)}"
                )
            if isinstance(event, Frame) and not event.is_heartbeat:
                return event

    def expect_frame(self, kind: type[P], channel: int | None = None) -> Frame:
        """The next frame, which must carry a ``kind`` on ``channel`` (any channel when None)."""
        item = self.receive()
        client.check(Expect(kind, channel), item, self.received)
        return item

    def expect(self, kind: type[P], channel: int | None = None) -> P:
        """The next frame's performative, which must be a ``kind`` (see ``expect_frame``)."""
        performative: P = self.expect_frame(kind, channel).performative
        return performative

    def expect_sasl(self, kind: type[P]) -> P:
        """The next frame must be a SASL frame carrying a ``kind``."""
        item = self.receive()
        client.check(Expect(kind, 0, sasl=True), item, self.received)
        performative: P = item.performative
        return performative

    def expect_closed(self, timeout: float | None = None) -> None:
        """The broker closes the socket within ``timeout``; only heartbeats may come before."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            event = self._next(deadline, "the connection to close")
            if isinstance(event, Ended):
                if event.partial:
                    raise AssertionError(f"connection closed with {event.partial} bytes of a partial frame")
                return
            if isinstance(event, ProtocolHeader) or not event.is_heartbeat:
                raise AssertionError(f"expected the connection to close, got {event!r}")

    def run(self, script: Script[R]) -> R:
        """Run a client-core script (``minibroker.testing.client``): its sends and expectations, in order."""
        steps = ScriptRun(self.conn, script)
        step = steps.advance()
        while True:
            self._flush()
            if step is None:
                return cast(R, steps.result)
            answer: ProtocolHeader | Frame = (
                ProtocolHeader(self.expect_header()) if step.header is not None else self.receive()
            )
            client.check(step, answer, self.received)
            step = steps.advance(answer)

    # -- connection ---------------------------------------------------------------------------------
    def authenticate(self, sasl: Sasl = "ANONYMOUS") -> SaslOutcome:
        """SASL header exchange, mechanisms, init; return the broker's outcome (not checked)."""
        return self.run(client.authenticate(sasl))

    def open(self, *, sasl: Sasl | None = None, **fields: Any) -> Open:
        """Optional SASL, then AMQP header exchange, our ``open`` with ``fields``; the broker's open."""
        return self.run(client.open_connection(frames.open_(**fields), sasl))

    def close(self, error: Any = None) -> Close:
        """Send ``close``; expect the broker's close (as the next frame) and the end of the socket."""
        self.send(Close(error=error))
        reply = self.expect(Close)
        self.expect_closed()
        return reply

    # -- sessions and links -------------------------------------------------------------------------
    def begin(self, channel: int = 0, **fields: Any) -> Begin:
        """Send ``begin`` on ``channel``; return the broker's answering begin."""
        return self.run(client.begin_session(frames.begin(**fields), channel))

    def attach_sender(
        self, address: str | None, handle: int = 0, name: str | None = None, *, channel: int = 0, **fields: Any
    ) -> Attach:
        """Attach a link on which we send to ``address``; return the broker's attach.

        The broker normally follows it with a ``flow`` granting credit: ``expect(Flow)`` for it.
        """
        return self.run(client.attach_link(frames.attach_sender(address, handle, name, **fields), channel))

    def attach_receiver(
        self, address: str | None, handle: int = 0, name: str | None = None, *, channel: int = 0, **fields: Any
    ) -> Attach:
        """Attach a link on which we receive from ``address``; return the broker's attach."""
        return self.run(client.attach_link(frames.attach_receiver(address, handle, name, **fields), channel))

    def flow(
        self, handle: int | None = None, link_credit: int | None = None, *, channel: int = 0, **fields: Any
    ) -> None:
        """Send ``flow``; session ids are filled in from what this peer sent and received.

        ``delivery_count`` is left null unless given, which the broker reads as "``link_credit`` from now".
        """
        fields.setdefault("delivery_count", None)
        self.send(self.conn.flow(handle, link_credit, channel=channel, **fields), channel=channel)

    def transfer(
        self, handle: int, delivery_id: int | None, payload: bytes = b"", *, channel: int = 0, **fields: Any
    ) -> None:
        """Send one ``transfer`` frame (``more=True`` and ``delivery_id=None`` for multi-frame ones); ``fields``
        as ``frames.transfer`` takes them (``settled``, ``state``, ``tag`` ...)."""
        self.send(frames.transfer(handle, delivery_id, **fields), channel, payload)

    def disposition(self, first: int, last: int | None = None, *, channel: int = 0, **fields: Any) -> None:
        """Send ``disposition`` for deliveries ``first``..``last``; by default as their receiver, settling them
        (``fields`` as ``frames.disposition`` takes them: ``role``, ``settled``, ``state``)."""
        self.send(frames.disposition(first, last, **fields), channel)


__all__ = ["Sasl", "ScriptedPeer", "read_event"]
