"""One ``ServerConnection`` wired to a real ``Broker``, fed bytes, checked after every chunk.

The fuzz tests (``test_fuzz.py``), the regression corpus (``test_corpus.py``) and the libFuzzer entry
point (``fuzz/atheris_engine.py``) all drive this harness, so an input that fails one fails them all.
It does what the trio layer does (``server/connection.py``) without trio: ``broker.connection_made``,
then for each chunk ``receive_data`` and ``broker.handle``, a timer tick when a deadline is due, and a
writer that drains ``data_to_send`` and calls ``broker.resume`` when the engine was throttled.

The invariants, checked after every chunk (``InvariantError`` names the one broken):

* nothing raises: ``receive_data``, ``handle_timeout`` and ``broker.handle`` never do, and the broker
  contains no internal error either (``broker.internal_errors``: it would close the connection with
  ``amqp:internal-error`` rather than raise, so the count is what shows a bug);
* the output parses as the peer would read it: a protocol header, frames, a second header after a
  successful SASL outcome, and always whole frames at the end of a chunk; no frame is larger than the
  peer's max-frame-size, and none follows our close;
* once the engine is finished it stays finished and writes nothing more, not even from the broker;
* the input buffer holds at most one frame (``max_frame_size + 8`` bytes), and the output produced by
  one chunk stays under ``OUTPUT_LIMIT``;
* the broker holds no more messages than it was sent (plus those it was given beforehand);

and at end of stream (``b""``): the broker forgets the connection, no queue has a message acquired,
and no transaction is left open.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from minibroker.amqp.definitions import Close, SaslOutcome
from minibroker.amqp.framing import AMQP_FRAME, AMQP_HEADER, MIN_MAX_FRAME_SIZE, SASL_FRAME, SASL_HEADER
from minibroker.broker.core import Broker
from minibroker.broker.message import Message
from minibroker.broker.queue import Queue
from minibroker.broker.settings import BrokerSettings
from minibroker.engine.connection import ServerConnection
from minibroker.engine.events import ConnectionClosed, Event, TransferReceived
from minibroker.engine.sasl import SaslPolicy
from minibroker.testing import frames
from minibroker.testing.client import Frame, FrameReader

MAX_FRAME_SIZE = 1024
"""Small, so that chunks longer than a frame test the input bound."""
OUTPUT_LIMIT = 4 << 20
"""Bytes one chunk of input (under 64 KiB) may make the engine queue."""
PREFILLED = "prefilled"
"""A queue holding ``prefill`` messages before the connection starts."""
_RESUME_ROUNDS = 64  # writer rounds per chunk: each resume may dispatch up to the engine's output limit


class InvariantError(AssertionError):
    """The engine or the broker broke one of the harness's invariants."""


class OutputReader:
    """Reads the engine's output as the peer would: headers where they belong, whole frames between."""

    def __init__(self) -> None:
        self.buffer = FrameReader()
        self.expect_header = True
        self.headers: list[bytes] = []
        self.frames: list[Frame] = []
        self.max_frame_size = MIN_MAX_FRAME_SIZE
        """The peer's max-frame-size: 512 until its open says otherwise (§2.7.1)."""
        self.closed = False

    def feed(self, data: bytes) -> list[Frame]:
        """Parse ``data``; return the frames it completed. Raises ``InvariantError`` on garbage, on a frame
        larger than the peer accepts, and on a frame after our close."""
        self.buffer.feed(data)
        new: list[Frame] = []
        while True:
            if self.expect_header:
                header = self.buffer.next_header()
                if header is None:
                    break
                if header not in (AMQP_HEADER, SASL_HEADER):
                    raise InvariantError(f"engine wrote {header!r} where a protocol header belongs")
                self.headers.append(header)
                self.expect_header = False
                continue
            before = len(self.buffer)
            try:
                parsed = self.buffer.next_frame()
            except ValueError as exc:
                raise InvariantError(f"engine output does not parse: {exc}") from None
            if parsed is None:
                break
            frame = Frame(*parsed)
            if frame.frame_type not in (AMQP_FRAME, SASL_FRAME):
                raise InvariantError(f"engine wrote a frame of type {frame.frame_type}")
            if before - len(self.buffer) > self.max_frame_size:
                size = before - len(self.buffer)
                raise InvariantError(f"engine wrote a {size}-byte frame, the peer takes {self.max_frame_size}: {frame}")
            if self.closed:
                raise InvariantError(f"engine wrote {frame} after its close")  # §2.4.3
            self.closed = isinstance(frame.performative, Close)
            new.append(frame)
            if isinstance(frame.performative, SaslOutcome) and frame.performative.code == 0:
                self.expect_header = True  # §5.3.2: after a successful outcome, the AMQP header follows
        if len(self.buffer):
            raise InvariantError(f"engine output ends inside a frame ({len(self.buffer)} bytes left)")
        self.frames += new
        return new


class BrokerRun:
    """One connection to a broker (a new one unless given), and what the invariants need to remember."""

    def __init__(
        self,
        *,
        sasl_required: bool = False,
        max_frame_size: int = MAX_FRAME_SIZE,
        link_credit: int = 100,
        prefill: int = 0,
        idle_time_out: float | None = None,
        broker: Broker | None = None,
    ) -> None:
        self.broker = broker or Broker(BrokerSettings(link_credit=link_credit, transaction_timeout=30.0))
        if prefill:
            queue = self.broker.declare_queue(PREFILLED)
            for n in range(prefill):
                queue.put(Message(frames.message(f"prefilled-{n}"), seq=n))
        self.prefilled = sum(queue.held for queue in self.queues())  # held before this connection began
        self.now = 0.0
        self.events_seen = 0
        self.reader = OutputReader()
        self.events: list[Event] = []
        self.received = 0  # whole messages the broker was handed
        self.closed = 0  # ConnectionClosed events seen
        self.max_fanout = 1  # most topic subscriptions seen at once: a message is copied to each
        self.finished_seen = False
        self.conn = self._connect(
            sasl_required=sasl_required, max_frame_size=max_frame_size, idle_time_out=idle_time_out
        )

    def _connect(self, **settings: Any) -> ServerConnection:
        """A new engine, announced to the broker as the server does."""
        sasl_required = settings.pop("sasl_required", False)
        conn = ServerConnection(
            conn_id=len(self.broker.connections) + 1,
            sasl=SaslPolicy(required=sasl_required),
            handshake_timeout=60.0,
            **settings,
        )
        self.broker.connection_made(conn)
        take_events = conn.take_events

        def record() -> list[Event]:
            # events caused by the broker's own commands (a refused attach, a close from ``_send``) are
            # taken by ``broker.handle`` itself: record them too
            events = take_events()
            self._record(events)
            return events

        conn.take_events = record  # type: ignore[method-assign]
        return conn

    # -- driving --------------------------------------------------------------------------------------
    def feed(self, chunk: bytes, advance: float = 0.0) -> list[Frame]:
        """Feed one chunk (``b""`` is end of stream), then let time pass by ``advance``; check everything."""
        if not chunk:
            return self.eof()
        self.now += advance
        was_finished = self.conn.finished
        events = self._recording(self.conn.receive_events(chunk, self.now))
        self._handle(events)
        if was_finished and (self.events_seen or self.conn.has_output):
            raise InvariantError("a finished engine produced events or output")
        self._tick()
        return self._drain()

    def eof(self) -> list[Frame]:
        """End of stream: the connection must be forgotten, with nothing acquired or open in its name."""
        self._handle(self._recording(self.conn.receive_events(b"", self.now)))
        new = self._drain()
        broker = self.broker
        if self.conn in broker.connections:
            raise InvariantError("the broker still knows the connection after end of stream")
        for queue in self.queues():
            if queue.acquired > 0:
                raise InvariantError(f"{queue!r} has messages acquired after its consumers went away")
        if broker.transactions != []:
            raise InvariantError(f"transactions left open: {broker.transactions}")
        return new

    def _recording(self, events: Iterable[Event]) -> Iterator[Event]:
        """``events`` as the broker takes them (one frame at a time), recorded on the way."""
        self.events_seen = 0
        for event in events:
            self.events_seen += 1
            self._record([event])
            yield event

    def _handle(self, events: Iterable[Event]) -> None:
        conn = self.conn
        finished = conn.finished
        before = conn.output_size
        self.broker.handle(conn, events, self.now)
        if finished and conn.output_size != before:
            raise InvariantError("the broker made a finished engine write")
        self._check_state()

    def _record(self, events: list[Event]) -> None:
        self.events += events
        self.received += sum(isinstance(e, TransferReceived) for e in events)
        self.closed += sum(isinstance(e, ConnectionClosed) for e in events)
        if self.closed > 1:
            raise InvariantError("the engine reported the connection closed twice")

    def _tick(self) -> None:
        conn = self.conn
        deadline = conn.next_deadline()
        if deadline is not None and deadline <= self.now:
            was_finished = conn.finished
            events = conn.handle_timeout(self.now)
            if was_finished and (events or conn.has_output):
                raise InvariantError("a finished engine produced events or output on a time-out")
            self._handle(events)
        deadline = self.broker.next_deadline()
        if deadline is not None and deadline <= self.now:
            self.broker.handle_timeout(self.now)
            self._check_state()

    def _drain(self) -> list[Frame]:
        """Write what the engine queued, as the server's writer does (resuming a throttled engine)."""
        conn = self.conn
        new: list[Frame] = []
        for _ in range(_RESUME_ROUNDS):
            if conn.output_size >= OUTPUT_LIMIT:
                raise InvariantError(f"{conn.output_size} bytes queued for the peer")
            data = conn.data_to_send()
            self.reader.max_frame_size = conn.remote_max_frame_size
            if self.finished_seen and data:
                raise InvariantError(f"a finished engine wrote {len(data)} bytes")
            new += self.reader.feed(data)
            if not conn.take_throttled():
                break
            self.broker.resume(conn)
        else:
            raise InvariantError("the engine stayed throttled for a whole chunk")
        self.broker.take_dirty()
        if conn.finished:
            self.finished_seen = True
        elif self.finished_seen:
            raise InvariantError("a finished engine came back to life")
        return new

    # -- invariants -----------------------------------------------------------------------------------
    def queues(self) -> list[Queue]:
        """Every queue and topic subscription of every namespace."""
        found: list[Queue] = []
        for namespace in self.broker.namespaces.values():
            found += namespace.queues.values()
            for topic in namespace.topics.values():
                found += topic.subscriptions.values()
        return found

    def _check_state(self) -> None:
        conn = self.conn
        if self.broker.internal_errors:
            raise InvariantError(f"the broker contained {self.broker.internal_errors} internal error(s): see the log")
        if len(conn._in) > conn.max_frame_size + 8:
            raise InvariantError(f"{len(conn._in)} bytes buffered, more than one frame of {conn.max_frame_size}")
        if len(conn._out) >= OUTPUT_LIMIT:
            raise InvariantError(f"{len(conn._out)} bytes queued for the peer")
        subscriptions = sum(
            len(topic.subscriptions) for ns in self.broker.namespaces.values() for topic in ns.topics.values()
        )
        self.max_fanout = max(self.max_fanout, subscriptions)
        held = sum(queue.held for queue in self.queues())
        if held > self.prefilled + self.received * self.max_fanout:
            raise InvariantError(f"the broker holds {held} messages, but was sent {self.received}")


def split(data: bytes, sizes: Iterable[int]) -> list[bytes]:
    """Cut ``data`` into chunks of ``sizes`` (cycled, each at least 1 byte), the rest in the last one."""
    chunks = []
    pos = 0
    sizes = [max(1, s) for s in sizes] or [len(data) or 1]
    i = 0
    while pos < len(data):
        size = sizes[i % len(sizes)]
        chunks.append(data[pos : pos + size])
        pos += size
        i += 1
    return chunks


def units_of(data: bytes) -> list[bytes]:
    """Cut ``data`` where a peer's headers and frames would end, as far as their size fields are sane.

    A protocol header (``AMQP`` + 4 bytes) is one unit, a frame another; from the first size field that
    is below 8 or runs past the end, the rest is one last unit. Feeding units one per chunk lets the
    broker answer between frames, as it does for a client that waits for credit.
    """
    units = []
    pos = 0
    while pos < len(data):
        if data.startswith(b"AMQP", pos):
            size = 8
        elif len(data) - pos >= 8:
            size = int.from_bytes(data[pos : pos + 4], "big")
            if size < 8 or pos + size > len(data):
                size = len(data) - pos
        else:
            size = len(data) - pos
        units.append(data[pos : pos + size])
        pos += size
    return units


__all__ = [
    "MAX_FRAME_SIZE",
    "OUTPUT_LIMIT",
    "PREFILLED",
    "BrokerRun",
    "InvariantError",
    "OutputReader",
    "split",
    "units_of",
]
