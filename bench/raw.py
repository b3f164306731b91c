"""The raw-socket AMQP 1.0 client of the benchmarks: a plain socket around the test kit's sans-IO client core.

``RawClient`` moves bytes; ``minibroker.testing.client.ClientConnection`` (its ``conn``) parses every frame and
keeps the protocol's bookkeeping of whatever was sent and received: sessions, links, credit, delivery counts,
windows, ids, the deliveries we hold unsettled. The handshakes are the core's scripts, run by its scripted
peer (``minibroker.testing.peer``). The client costs a few µs per message, so the broker sets the pace:

* frames are encoded by ``minibroker.amqp`` and ``minibroker.testing.frames``; the hot paths send
  pre-encoded (or template-patched) transfers through ``ClientConnection.send_encoded``, which writes the
  bytes as given and books the transfer they carry;
* blocking use (perf, attacks, churn): ``run`` a script, ``expect`` a frame, ``wait`` for a condition,
  ``stream`` pre-encoded transfers as far as credit and the session window allow;
* non-blocking use (soak's selector loop): ``flush`` writes what the socket takes and keeps the rest in
  ``out``; ``receive`` reads once and returns the frames now complete.

Subclasses see every frame the client takes from the core (``on_frame``) and every batch ``stream`` sends
(``on_streamed``): perf's client times and tallies the broker's dispositions there.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, TypeVar

from minibroker.amqp import fastpath
from minibroker.amqp.definitions import Accepted, Attach, Begin, Close, Transfer
from minibroker.amqp.framing import AMQP_FRAME, AMQP_HEADER, FRAME_HEADER, SASL_HEADER
from minibroker.testing import client, frames
from minibroker.testing.client import ClientConnection, Ended, Event, Frame, Link, Sasl, Script
from minibroker.testing.peer import ScriptedPeer, read_event

IO_TIMEOUT = 10.0  # seconds any single wait on the broker may take before the run counts as hung
RECV_SIZE = 1 << 20
SERIAL_MASK = 0xFFFFFFFF
R = TypeVar("R")


class BrokerClosed(Exception):
    """The broker closed the TCP connection."""


class Unexpected(ConnectionError):
    """The broker answered a step of a script otherwise than the step expects (another frame, the end of the
    stream, or nothing in time)."""


class Encoded(NamedTuple):
    """A pre-encoded transfer frame and the transfer it carries (for the core's bookkeeping)."""

    data: bytes
    transfer: Transfer


def encode_transfer(handle: int, delivery_id: int, payload: bytes, *, settled: bool, channel: int = 0) -> Encoded:
    """A one-frame transfer (tag: the delivery id, 4 bytes) through minibroker's fast path, and its performative,
    decoded back from the very bytes so the two cannot disagree."""
    tag = delivery_id.to_bytes(4, "big")
    performative = fastpath.encode_transfer(handle, delivery_id, tag, 0, settled, False)
    data = FRAME_HEADER.pack(8 + len(performative) + len(payload), 2, AMQP_FRAME, channel) + performative + payload
    return Encoded(data, fastpath.decode_transfer(performative)[0])


def runs(ids: Iterable[int], limit: int | None = None) -> list[tuple[int, int]]:
    """``ids`` (in order) as ranges ``(first, last)`` of consecutive ids (serial numbers, §2.7.5), each at most
    ``limit`` long."""
    ids = list(ids)
    if ids and ids[0] <= ids[-1] and ids == list(range(ids[0], ids[-1] + 1)):  # the usual case: one run
        end, step = ids[-1] + 1, limit or len(ids)
        return [(first, min(first + step, end) - 1) for first in range(ids[0], end, step)]
    found: list[tuple[int, int]] = []
    longest = SERIAL_MASK if limit is None else limit - 1
    for delivery_id in ids:
        if found:
            first, last = found[-1]
            if delivery_id == (last + 1) & SERIAL_MASK and (delivery_id - first) & SERIAL_MASK <= longest:
                found[-1] = (first, delivery_id)
                continue
        found.append((delivery_id, delivery_id))
    return found


class RawClient:
    """One AMQP connection over a plain socket; the protocol state is ``conn``'s (see the module docstring)."""

    def __init__(self, host: str, port: int, *, timeout: float = IO_TIMEOUT) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.peer = ScriptedPeer(self.sock, timeout)
        """Runs the client-core scripts (handshakes) on the same socket and connection."""
        self.conn: ClientConnection = self.peer.conn
        """The protocol state: sessions, links, what each side counted."""
        self.out = bytearray()
        """Bytes taken from ``conn`` that the socket did not take yet (non-blocking mode)."""
        self.eof = False

    # -- hooks --------------------------------------------------------------------------------------
    def on_frame(self, frame: Frame) -> None:
        """Called with every frame the client takes from the core, heartbeats included."""

    def on_streamed(self, batch: Sequence[Encoded]) -> None:
        """Called by ``stream`` with each batch of transfers just before it is written."""

    # -- writing ------------------------------------------------------------------------------------
    def send(self, performative: Any, channel: int = 0, payload: bytes = b"", frame_type: int = AMQP_FRAME) -> None:
        """Queue one frame (written by the next ``flush``)."""
        self.conn.send(performative, channel, payload, frame_type)

    def flush(self) -> None:
        """Write what is queued: all of it while the socket blocks, what the socket takes now when it does not."""
        self.out += self.conn.data_to_send()
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
    def _frame(self, event: Event) -> Frame:
        """``event``, a frame or the end of the stream, as a frame for ``on_frame``; ``BrokerClosed`` at the end."""
        if isinstance(event, Ended):
            self.eof = True
            raise BrokerClosed("the broker closed the connection")
        if not isinstance(event, Frame):
            raise TypeError(f"not a frame: {event!r}")
        self.on_frame(event)
        return event

    def _taken(self, event: Event) -> Frame | None:
        """``event`` as a frame; None for a protocol header (which must be AMQP's or SASL's)."""
        if isinstance(event, client.ProtocolHeader):
            if event.data not in (AMQP_HEADER, SASL_HEADER):
                raise ConnectionError(f"unexpected protocol header {event.data!r}")
            return None
        return self._frame(event)

    def receive(self, timeout: float | None = None, size: int = RECV_SIZE) -> list[Frame]:
        """The frames complete now, heartbeats included: those already read, else after one read of the socket
        (of at most ``size`` bytes, waiting up to ``timeout`` when given, else as the socket's mode says).
        ``BrokerClosed`` at the end of the stream, once every frame before it was taken."""
        found = self._complete()
        if found:
            return found
        if timeout is not None and not select.select([self.sock], [], [], timeout)[0]:
            return found
        try:
            data = self.sock.recv(size)
        except BlockingIOError:
            return found
        except ConnectionResetError:
            data = b""
        self.conn.receive_data(data)
        return self._complete()

    def _complete(self) -> list[Frame]:
        """Every frame complete in the core; ``BrokerClosed`` if the stream ended before any."""
        found: list[Frame] = []
        next_event, on_frame = self.conn.next_event, self.on_frame
        while (event := next_event()) is not None:
            if type(event) is Frame:  # the common case first
                on_frame(event)
                found.append(event)
            elif isinstance(event, Ended) and found:
                break  # raised by the next call, once the frames before it are taken
            elif (frame := self._taken(event)) is not None:
                found.append(frame)
        return found

    def next_frame(self, deadline: float) -> Frame:
        """The next frame (blocking), heartbeats included; ``TimeoutError`` at ``deadline`` (monotonic)."""
        while True:
            frame = self._taken(read_event(self.conn, self.sock, deadline))
            if frame is not None:
                return frame

    def expect(self, kind: type | tuple[type, ...], *, seen: list[Any] | None = None) -> Any:
        """Flush, then block until a frame whose performative is a ``kind`` arrives; return the performative
        (the others go to ``seen``, heartbeats as None)."""
        self.flush()
        deadline = time.monotonic() + self.timeout
        name = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        try:
            while not isinstance(performative := self.next_frame(deadline).performative, kind):
                if seen is not None:
                    seen.append(performative)
        except TimeoutError:
            raise TimeoutError(f"no {name} from the broker within {self.timeout} s") from None
        except BrokerClosed:
            raise BrokerClosed(f"the broker closed the connection while we waited for {name}") from None
        return performative

    def pump(self, timeout: float) -> None:
        """Take every frame that arrives within ``timeout`` (at most one read), for ``on_frame``."""
        self.receive(timeout)

    def wait(self, condition: Callable[[], bool], timeout: float | None = None) -> None:
        """Flush, then take frames until ``condition()``; ``TimeoutError`` after ``timeout`` (default: the
        client's)."""
        self.flush()
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError("the broker did not answer in time")
            self.pump(0.2)

    # -- composite steps ----------------------------------------------------------------------------
    def run(self, script: Script[R]) -> R:
        """Run a client-core script through the scripted peer (each expectation takes the next frame, heartbeats
        aside; these frames are not passed to ``on_frame``); ``Unexpected`` when the broker answers a step
        otherwise, closes the connection or does not answer in time."""
        self.flush()
        try:
            return self.peer.run(script)
        except AssertionError as exc:
            raise Unexpected(str(exc)) from None

    def open(self, container_id: str, *, sasl: Sasl | None = None, begin: Begin | None = None, **fields: Any) -> Begin:
        """(SASL,) the AMQP header exchange, ``open`` and one session on channel 0; the broker's ``begin``.
        ``PermissionError`` when SASL fails."""
        if sasl is not None:
            outcome = self.run(client.authenticate(sasl))
            if outcome.code != 0:
                raise PermissionError(f"SASL outcome {outcome.code}")
        self.run(client.open_connection(frames.open_(container_id, **fields)))
        return self.run(client.begin_session(begin if begin is not None else frames.begin(), 0))

    def attach(self, attach: Attach, channel: int = 0) -> Link:
        """Attach a link and wait for the broker's attach; our end of it (a ``flow`` granting credit usually
        follows: ``wait`` or ``expect`` it)."""
        self.run(client.attach_link(attach, channel))
        return self.conn.session(channel).links[int(attach.handle or 0)]

    def accept_unsettled(self, channel: int = 0, limit: int | None = None) -> int:
        """Accept (settled) every delivery we received and hold unsettled on ``channel``'s session, one
        disposition per range of consecutive ids (at most ``limit`` long); how many."""
        unsettled = self.conn.session(channel).unsettled
        count = len(unsettled)
        for first, last in runs(unsettled, limit):
            self.send(frames.disposition(first, last if last != first else None, state=Accepted()), channel)
        return count

    def stream(
        self, link: Link, encoded: Sequence[Encoded], stop: Callable[[], bool] | None = None, channel: int = 0
    ) -> int:
        """Send the pre-encoded transfers as fast as ``link``'s credit and the session window allow; how many
        were sent (fewer when ``stop()`` said so after a batch)."""
        session = self.conn.session(channel)
        sent = 0
        total = len(encoded)
        while sent < total:
            n = min(link.credit, session.remote_incoming_window, total - sent)
            if n > 0:
                batch = encoded[sent : sent + n]
                send = self.conn.send_encoded
                for data, transfer in batch:
                    send(data, transfer, channel)
                self.on_streamed(batch)
                self.flush()
                sent += n
                if stop is not None and stop():
                    break
            self.pump(0.0 if n > 0 else 0.5)
        return sent

    def close(self) -> None:
        """AMQP close, the broker's close awaited, then the socket closed."""
        try:
            self.sock.settimeout(self.timeout)
            self.run(client.close_connection(Close()))
        finally:
            self.sock.close()


__all__ = ["IO_TIMEOUT", "BrokerClosed", "Encoded", "RawClient", "Unexpected", "encode_transfer", "runs"]
