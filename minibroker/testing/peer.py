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

Bookkeeping is deliberately thin: the peer counts the transfers it sends and receives on each channel
so ``flow()`` reports consistent session ids, and remembers which broker channel answered each of its
``begin``s. Everything else (handles, delivery ids, credit) is the test's to choose.
"""

from __future__ import annotations

import socket
import time
from typing import Any, TypeVar

from minibroker.amqp.definitions import (
    Attach,
    Begin,
    Close,
    Open,
    SaslMechanisms,
    SaslOutcome,
    Transfer,
)
from minibroker.amqp.framing import AMQP_FRAME, AMQP_HEADER, SASL_FRAME, SASL_HEADER
from minibroker.testing import frames
from minibroker.testing.frames import Frame, FrameBuffer

P = TypeVar("P")
Sasl = str | tuple[str, str, str]
"""``"ANONYMOUS"`` or ``("PLAIN", user, password)``."""

_RECV_SIZE = 65536


class ScriptedPeer:
    """One client connection driven frame by frame."""

    def __init__(self, sock: socket.socket, timeout: float = 5.0) -> None:
        self.sock = sock
        self.timeout = timeout
        self.received: list[Frame] = []
        """Every frame received so far, heartbeats included (for assertion messages)."""
        self.remote_open: Open | None = None
        self.remote_channels: dict[int, int] = {}
        """Our channel -> the broker's channel, from its answering ``begin``."""
        self._buffer = FrameBuffer()
        self._eof = False
        self._transfers_out: dict[int, int] = {}
        self._transfers_in: dict[int, int] = {}  # by the broker's channel

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

    # -- bytes --------------------------------------------------------------------------------------
    def send_raw(self, data: bytes) -> None:
        """Send bytes exactly as given (``OSError`` if the broker has already dropped the socket)."""
        self.sock.sendall(data)

    def _read(self, deadline: float, waiting_for: str) -> bool:
        """Read once more from the socket; False once the broker has closed it. Fails at ``deadline``."""
        if self._eof:
            return False
        remaining = deadline - time.monotonic()
        try:
            if remaining <= 0:
                raise TimeoutError
            self.sock.settimeout(remaining)
            data = self.sock.recv(_RECV_SIZE)
        except TimeoutError:
            raise AssertionError(f"timed out waiting for {waiting_for}{self._seen()}") from None
        except ConnectionResetError:
            data = b""
        if not data:
            self._eof = True
            return False
        self._buffer.feed(data)
        return True

    def _fill(self, deadline: float, waiting_for: str) -> None:
        """Read once more from the socket; fail if the broker has closed it or ``deadline`` passes."""
        if not self._read(deadline, waiting_for):
            raise AssertionError(f"connection closed by the broker while waiting for {waiting_for}{self._seen()}")

    def _seen(self) -> str:
        recent = [f for f in self.received if not f.is_heartbeat][-5:]
        return "; last frames received: " + ", ".join(map(repr, recent)) if recent else "; no frame received"

    # -- protocol headers ---------------------------------------------------------------------------
    def send_header(self, header: bytes = AMQP_HEADER) -> None:
        """Send a protocol header (any 8 bytes, or fewer/more for a negative test)."""
        self.send_raw(header)

    def expect_header(self) -> bytes:
        """The broker's next 8 bytes, read as a protocol header."""
        deadline = time.monotonic() + self.timeout
        while (header := self._buffer.next_header()) is None:
            self._fill(deadline, "a protocol header")
        return header

    # -- frames -------------------------------------------------------------------------------------
    def send(self, performative: Any, channel: int = 0, payload: bytes = b"", frame_type: int = AMQP_FRAME) -> None:
        """Send one frame."""
        if isinstance(performative, Transfer):
            self._transfers_out[channel] = self._transfers_out.get(channel, 0) + 1
        self.send_raw(frames.frame(channel, performative, payload, frame_type))

    def receive(self) -> Frame:
        """The next frame that is not a heartbeat."""
        deadline = time.monotonic() + self.timeout
        while True:
            item = self._buffer.next_frame()
            if item is None:
                self._fill(deadline, "a frame")
                continue
            self.received.append(item)
            if item.is_heartbeat:
                continue
            if isinstance(item.performative, Transfer):
                self._transfers_in[item.channel] = self._transfers_in.get(item.channel, 0) + 1
            return item

    def expect_frame(self, kind: type[P], channel: int | None = None) -> Frame:
        """The next frame, which must carry a ``kind`` on ``channel`` (any channel when None)."""
        item = self.receive()
        if not isinstance(item.performative, kind) or (channel is not None and item.channel != channel):
            where = "" if channel is None else f" on channel {channel}"
            raise AssertionError(f"expected {kind.__name__}{where}, got {item!r}{self._seen()}")
        return item

    def expect(self, kind: type[P], channel: int | None = None) -> P:
        """The next frame's performative, which must be a ``kind`` (see ``expect_frame``)."""
        performative: P = self.expect_frame(kind, channel).performative
        return performative

    def expect_closed(self, timeout: float | None = None) -> None:
        """The broker closes the socket within ``timeout``; only heartbeats may come before."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            item = self._buffer.next_frame()
            if item is not None:
                self.received.append(item)
                if not item.is_heartbeat:
                    raise AssertionError(f"expected the connection to close, got {item!r}")
                continue
            if not self._read(deadline, "the connection to close"):
                if len(self._buffer):
                    raise AssertionError(f"connection closed with {len(self._buffer)} bytes of a partial frame")
                return

    # -- connection ---------------------------------------------------------------------------------
    def authenticate(self, sasl: Sasl = "ANONYMOUS") -> SaslOutcome:
        """SASL header exchange, mechanisms, init; return the broker's outcome (not checked)."""
        self.send_header(SASL_HEADER)
        header = self.expect_header()
        if header != SASL_HEADER:
            raise AssertionError(f"expected the SASL header, got {header!r}")
        self.expect_sasl(SaslMechanisms)
        if sasl == "ANONYMOUS":
            init = frames.sasl_anonymous()
        elif isinstance(sasl, tuple) and sasl[0] == "PLAIN":
            init = frames.sasl_plain(sasl[1], sasl[2])
        else:
            raise ValueError(f"unsupported SASL choice {sasl!r}")
        self.send(init, frame_type=SASL_FRAME)
        return self.expect_sasl(SaslOutcome)

    def expect_sasl(self, kind: type[P]) -> P:
        """The next frame must be a SASL frame carrying a ``kind``."""
        item = self.expect_frame(kind, channel=0)
        if item.frame_type != SASL_FRAME:
            raise AssertionError(f"expected a SASL frame (type 1), got type {item.frame_type}: {item!r}")
        performative: P = item.performative
        return performative

    def open(self, *, sasl: Sasl | None = None, **fields: Any) -> Open:
        """Optional SASL, then AMQP header exchange, our ``open`` with ``fields``; the broker's open."""
        if sasl is not None:
            outcome = self.authenticate(sasl)
            if outcome.code != 0:
                raise AssertionError(f"SASL failed: {outcome!r}")
        self.send_header(AMQP_HEADER)
        header = self.expect_header()
        if header != AMQP_HEADER:
            raise AssertionError(f"expected the AMQP header, got {header!r}")
        self.send(frames.open_(**fields))
        self.remote_open = self.expect(Open, channel=0)
        return self.remote_open

    def close(self, error: Any = None) -> Close:
        """Send ``close``; expect the broker's close and the end of the socket."""
        self.send(Close(error=error))
        reply = self.expect(Close)
        self.expect_closed()
        return reply

    # -- sessions and links -------------------------------------------------------------------------
    def begin(self, channel: int = 0, **fields: Any) -> Begin:
        """Send ``begin`` on ``channel``; return the broker's answering begin."""
        self.send(frames.begin(**fields), channel=channel)
        item = self.expect_frame(Begin)
        reply: Begin = item.performative
        if reply.remote_channel != channel:
            raise AssertionError(f"begin answered for channel {reply.remote_channel}, not {channel}")
        self.remote_channels[channel] = item.channel
        return reply

    def attach_sender(
        self, address: str | None, handle: int = 0, name: str | None = None, *, channel: int = 0, **fields: Any
    ) -> Attach:
        """Attach a link on which we send to ``address``; return the broker's attach.

        The broker normally follows it with a ``flow`` granting credit: ``expect(Flow)`` for it.
        """
        self.send(frames.attach_sender(address, handle, name, **fields), channel=channel)
        return self.expect(Attach)

    def attach_receiver(
        self, address: str | None, handle: int = 0, name: str | None = None, *, channel: int = 0, **fields: Any
    ) -> Attach:
        """Attach a link on which we receive from ``address``; return the broker's attach."""
        self.send(frames.attach_receiver(address, handle, name, **fields), channel=channel)
        return self.expect(Attach)

    def flow(
        self, handle: int | None = None, link_credit: int | None = None, *, channel: int = 0, **fields: Any
    ) -> None:
        """Send ``flow``; session ids are filled in from what this peer sent and received.

        ``delivery_count`` is left null unless given, which the broker reads as "``link_credit`` from now".
        """
        remote = self.remote_channels.get(channel, channel)
        fields.setdefault("next_incoming_id", self._transfers_in.get(remote, 0))
        fields.setdefault("next_outgoing_id", self._transfers_out.get(channel, 0))
        self.send(frames.flow(handle=handle, link_credit=link_credit, **fields), channel=channel)

    def transfer(
        self,
        handle: int,
        delivery_id: int | None,
        payload: bytes = b"",
        *,
        settled: bool | None = None,
        state: Any = None,
        channel: int = 0,
        **fields: Any,
    ) -> None:
        """Send one ``transfer`` frame (``more=True`` and ``delivery_id=None`` for multi-frame ones)."""
        self.send(frames.transfer(handle, delivery_id, settled=settled, state=state, **fields), channel, payload)

    def disposition(
        self,
        first: int,
        last: int | None = None,
        *,
        role: bool = frames.RECEIVER,
        settled: bool = True,
        state: Any = None,
        channel: int = 0,
    ) -> None:
        """Send ``disposition`` for deliveries ``first``..``last`` (by default as their receiver)."""
        self.send(frames.disposition(first, last, role=role, settled=settled, state=state), channel)


__all__ = ["Sasl", "ScriptedPeer"]
