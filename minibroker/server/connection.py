"""The trio task that pumps bytes between one socket and its engine.

Two loops share the connection: the reader feeds received bytes (and timeouts) to the engine and the
events to the broker core; the writer sleeps until someone marks the engine as having output, then
sends everything queued in one ``send_all``. Awaiting the write is the back-pressure: while a peer does
not read, its writer blocks and the engine stops starting deliveries at about 1 MiB queued; answers to the
peer's own frames are bounded by the reader, which stops reading a peer once they pile up past 1.5 MiB.
A finished connection gets ``_FLUSH_GRACE`` to flush, so a peer that never reads cannot hold its task.

On a plain TCP socket (not TLS) the reader reads the socket itself (``PlainSocket``: ``recv_into`` a reused
buffer, ``wait_readable`` only when it is empty) and writes a small answer with one non-blocking ``send`` as soon as
the request is handled, with no trip through the scheduler in between; what the socket does not take then is left
for the writer (``_unsent``, written before anything else), so the reader itself never blocks on a peer that does
not read. Other streams (TLS, memory streams) go through ``receive_some`` and ``send_all``.

SASL PLAIN credentials that the engine defers (``SaslPolicy.deferred``) are checked by the reader through a
``LoginChecker`` (in a worker thread), and answered with ``sasl_verdict``; meanwhile the engine parses nothing.

Nothing here lets a bug end the process: the broker core contains its own errors (``Broker.handle`` closes
the connection at fault with ``amqp:internal-error``), and every call into it from this layer is guarded
once more (a connection task closes its own connection the same way; the timer task and journal writes log
and go on).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

import trio

from minibroker.amqp.definitions import Error
from minibroker.amqp.errors import Condition, error
from minibroker.broker.core import INTERNAL_ERROR, Broker
from minibroker.broker.namespace import Namespace
from minibroker.engine.connection import ServerConnection
from minibroker.engine.events import Event
from minibroker.engine.sasl import SaslPolicy
from minibroker.server.plainsocket import PlainSocket

if TYPE_CHECKING:
    from minibroker.server.capture import ConnectionCapture
    from minibroker.server.clock import BrokerTime
    from minibroker.server.login import LoginChecker

log = logging.getLogger("minibroker.connection")
_RECEIVE_SIZE = 65536
# Bytes queued for a peer beyond which we stop reading it until its writer takes them. Above the 1 MiB at which
# the engine stops starting deliveries, so only a peer whose own frames pile up answers is paused.
_PAUSE_READING = 1536 * 1024
_DIRECT_ANSWER = 4096  # bytes of output the reader writes itself (answers to requests, not bulk)
_FLUSH_GRACE = 1.0  # seconds the writer has to flush a finished connection to a peer that may not read
_TIMER_RETRY = 0.1  # seconds the timer task waits after an error it could not contain, before it goes on


def wake_writers(broker: Broker) -> None:
    """Write what the broker journaled, and wake the writer of every connection it gave output to."""
    sink = broker.journal_sink
    if sink is not None:
        try:
            sink.write()
        except Exception:  # what the journal could not take is not acknowledged (its answers wait)
            log.exception("journal write failed; the broker goes on")
    for engine in broker.take_dirty():
        task = engine.context
        if task is not None:
            task.wake()


def fire_timers(broker: Broker, now: float) -> bool:
    """Run the broker's timers due at ``now`` (broker time) and wake the writers; False after an error the core
    could not contain (logged: the broker goes on)."""
    try:
        broker.handle_timeout(now)
    except Exception:
        log.exception("internal error in the broker's timers; the broker goes on")
        return False
    finally:
        wake_writers(broker)
    return True


async def run_broker_timer(broker: Broker, clock: BrokerTime | None = None) -> None:
    """Call ``broker.handle_timeout`` at its deadlines (message timers, transaction time-outs), for ever, on broker
    time: ``clock``'s (``minibroker.server.clock``), trio's own without one."""
    armed = trio.Event()
    deadline: float | None = None
    now = trio.current_time if clock is None else clock.time

    def rearm() -> None:
        new = broker.next_deadline()
        if new is not None and (deadline is None or new < deadline):
            armed.set()  # only an earlier deadline needs waking for

    broker.on_new_deadline = rearm
    if clock is not None:
        clock.woken = lambda: armed.set()  # virtual time moved: what is due has fired, the next deadline changed
    while True:
        try:
            deadline = broker.next_deadline()
        except Exception:  # (the core contains its own errors: this is a last resort, never a busy loop)
            log.exception("internal error in the broker's timers; retrying")
            deadline = now() + _TIMER_RETRY
        # wait for the deadline, or for an earlier one (a delivery delay added while we wait for a ttl)
        wake = (math.inf if deadline is None else deadline) if clock is None else clock.wake_at(deadline)
        with trio.move_on_at(wake):
            await armed.wait()
        armed = trio.Event()
        if deadline is None or now() < deadline:
            continue
        if not fire_timers(broker, now()):
            await trio.sleep(_TIMER_RETRY)


class Wire(Protocol):
    """What a connection task reads the socket into and writes from: an AMQP 1.0 ``ServerConnection``, or a gateway
    that speaks another protocol to the peer and AMQP 1.0 to the broker through an inner ``ServerConnection``
    (``minibroker.gateway091``). The events it returns concern the task's ``engine``."""

    @property
    def finished(self) -> bool: ...
    @property
    def has_output(self) -> bool: ...
    @property
    def output_size(self) -> int: ...
    @property
    def awaiting_verdict(self) -> bool: ...
    @property
    def authentication_failed(self) -> bool: ...
    @property
    def sasl(self) -> SaslPolicy: ...
    def receive_events(self, data: bytes | bytearray, now: float) -> Iterable[Event]: ...
    def resume_events(self, now: float) -> Iterable[Event]: ...
    def handle_timeout(self, now: float) -> Iterable[Event]: ...
    def next_deadline(self) -> float | None: ...
    def data_to_send(self) -> bytes: ...
    def take_throttled(self) -> bool: ...
    def take_credentials(self) -> tuple[str, str]: ...
    def sasl_verdict(self, ok: bool) -> None: ...
    def close(self, err: Error | None = None) -> None: ...
    def take_events(self) -> list[Event]: ...


class ConnectionTask:
    """One accepted connection."""

    def __init__(
        self,
        conn_id: int,
        stream: trio.abc.Stream,
        broker: Broker,
        engine: ServerConnection,
        namespace: Namespace | None = None,
        failure_delay: float = 0.0,
        login: LoginChecker | None = None,
        address: str | None = None,
        checking: Callable[[bool], None] | None = None,
        capture: ConnectionCapture | None = None,
        clock: BrokerTime | None = None,
        wire: Wire | None = None,
    ) -> None:
        self.id = conn_id
        self.capture = capture
        """Where the bytes read and written are recorded (``--capture``); None: not captured."""
        self.namespace = namespace
        self.failure_delay = failure_delay
        self.login = login
        """Checks deferred PLAIN credentials; None: the engine's ``sasl.authenticate``, in a worker thread."""
        self.address = address
        """The peer's address (failed logins are limited per address)."""
        self.checking = checking
        """Told True when the peer's PLAIN credentials go to be checked, False when they are refused (the server
        closes connections under check last when too many handshakes are pending)."""
        self.stream = stream
        self.broker = broker
        self.broker_time = trio.current_time if clock is None else clock.time
        """Broker time, handed to the core (the engine's own timers, heartbeats and time-outs, keep trio's)."""
        self.engine = engine
        """The AMQP 1.0 engine the broker serves (for an AMQP 0-9-1 client, the gateway's inner connection)."""
        self.wire: Wire = engine if wire is None else wire
        """What speaks to the socket: ``engine`` itself, or an AMQP 0-9-1 gateway in front of it."""
        engine.context = self
        self._wakeup = trio.Event()
        self._output_taken = trio.Event()
        self._send_lock = trio.Lock()  # the reader answers directly when the writer is idle
        self._plain: PlainSocket | None = None
        """The plain TCP socket read and written directly (see the module's docstring); None: the stream's way."""
        self._unsent = b""
        """What the socket did not take of the reader's direct answer: the writer sends it before anything else."""

    def wake(self) -> None:
        """The engine has bytes to send."""
        self._wakeup.set()

    @property
    def flushed(self) -> bool:
        """Everything the engine gave to send is written (none held, none left unsent, no write under way)."""
        return not self.wire.has_output and not self._unsent and not self._send_lock.locked()

    @property
    def reads_socket(self) -> bool:
        """True while the task reads and writes its plain TCP socket itself (``PlainSocket``)."""
        return self._plain is not None

    async def run(self) -> None:
        broker = self.broker
        broker.connection_made(self.engine, self.namespace)
        self._plain = PlainSocket.of(self.stream)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._writer, nursery.cancel_scope)
                await self._reader()
                # the engine is finished: let the writer flush, then stop (a peer that reads nothing is not
                # waited for: its socket is closed all the same)
                self.wake()
                nursery.cancel_scope.deadline = trio.current_time() + _FLUSH_GRACE
        except Exception as exc:  # a bug in this task: close this connection with internal-error, and only it
            self._fail(exc)
            with trio.move_on_after(_FLUSH_GRACE):
                await self._send(self.wire.data_to_send())
        finally:
            if not self.wire.finished:
                self._feed(b"")
            if self._plain is not None:
                self._plain.detach()  # before the stream closes the descriptor
                self._plain = None
            with trio.CancelScope(shield=True):
                with trio.move_on_after(_FLUSH_GRACE):  # a TLS close to a peer that reads nothing
                    await self.stream.aclose()
                await trio.aclose_forcefully(self.stream)

    def _feed(self, data: bytes | bytearray) -> None:
        self._handle(self.wire.receive_events(data, trio.current_time()))
        self._publish()

    def step(self, events: Iterable[Event]) -> None:
        """Hand ``events`` of the engine to the broker and wake whoever got output: the wire's way to the broker (an
        AMQP 0-9-1 gateway steps the broker for its inner connection whenever it has work for it)."""
        self._handle(events)
        self._publish()

    def _handle(self, events: Iterable[Event]) -> None:
        """Hand ``events`` to the broker, which takes them one by one: the engine parses each frame only
        once the broker has acted on the one before."""
        try:
            self.broker.handle(self.engine, events, self.broker_time())
        except Exception as exc:  # the core contains its errors; this is the last resort
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        """An internal error while serving this connection: log it, close it with ``amqp:internal-error``, and
        let the broker clean up after it (its messages go back, its transactions roll back)."""
        log.error("internal error in connection %d; closing it with amqp:internal-error", self.id, exc_info=exc)
        try:
            self.wire.close(error(Condition.INTERNAL_ERROR, INTERNAL_ERROR))
            self.broker.handle(self.engine, self.wire.take_events(), self.broker_time())
        except Exception:
            log.exception("cleaning up connection %d after an internal error failed", self.id)

    def _publish(self, *, answer_here: bool = False) -> bool:
        """Mark what is to be written and wake the writers that have something; True when, ``answer_here``, the
        reader is to write this connection's answer itself, right after (its writer is not woken for it)."""
        broker = self.broker
        here = False
        if self.wire.has_output:
            broker.dirty.add(self.engine)
            if answer_here and self._answers_here():
                broker.dirty.discard(self.engine)
                here = True  # (decided once: what the journal's write releases meanwhile goes out with it)
        wake_writers(broker)
        return here

    def _answers_here(self) -> bool:
        engine = self.wire
        return (
            engine.output_size <= _DIRECT_ANSWER
            and not self._send_lock.locked()
            and not self._unsent
            and not engine.finished
        )

    async def _send(self, data: bytes) -> bool:
        """Write ``data``, after what the reader left unsent (one writer at a time); False when the peer is gone."""
        lock = self._send_lock
        if lock.locked():
            await lock.acquire()
        else:
            lock.acquire_nowait()  # (``async with`` would reschedule the task even when the lock is free)
        try:
            if self._unsent:
                data, self._unsent = self._unsent + data, b""
            self._taking(data)
            plain = self._plain
            # on a plain socket, one system call and no trip through the scheduler when the socket takes it all
            taken = plain.send(data) if plain is not None and data else 0
            if taken < len(data):
                await self.stream.send_all(memoryview(data)[taken:] if taken else data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return False
        finally:
            lock.release()
        self._sent(data)
        return True

    def _answer_now(self, plain: PlainSocket) -> bool:
        """Write the engine's (small) answer on the plain socket at once; what it does not take is the writer's
        (woken for it). False when the peer is gone."""
        data = self.wire.data_to_send()
        self._taking(data)
        try:
            taken = plain.send(data)
        except OSError:
            return False
        if taken < len(data):
            self._unsent = data[taken:]  # (the writer's ``_send`` says when it is written)
            self.wake()
        else:
            self._sent(data)
        return True

    def _taking(self, data: bytes) -> None:
        """``data`` is about to be written: it is captured, and the output the reader may wait for is taken."""
        self._output_taken.set()  # (a new event is made by the reader when it waits, not for every answer)
        if data and self.capture is not None:
            self.capture.sent(data, self._wall_time())

    def _sent(self, data: bytes) -> None:
        """``data`` is written: deliveries held back for the peer may go on."""
        if data and self.wire.take_throttled():
            self.broker.resume(self.engine)
            wake_writers(self.broker)

    def _wall_time(self) -> float:
        """The broker's wall-clock time now (what captured frames are stamped with)."""
        return trio.current_time() + self.broker.clock.wall.offset

    async def _receive(self, deadline: float | None) -> bytes | bytearray | None:
        """The next octets from the stream (``b""``: it ended or broke); None when ``deadline`` passes first."""
        try:
            if deadline is None:  # the common case, without a cancel scope to set up
                return await self.stream.receive_some(_RECEIVE_SIZE)
            with trio.move_on_at(deadline):
                return await self.stream.receive_some(_RECEIVE_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return b""
        return None

    async def _reader(self) -> None:
        engine = self.wire
        plain = self._plain
        receive = self._receive if plain is None else plain.receive
        while not engine.finished:
            deadline = engine.next_deadline()
            data = None
            if engine.output_size < _PAUSE_READING:
                data = await receive(deadline)
            else:
                taken = self._output_taken = trio.Event()  # set by the next write
                with trio.move_on_at(deadline if deadline is not None else float("inf")):
                    # the peer is not reading our answers: stop reading its requests until it does, so what
                    # we buffer for it stays bounded (a peer sending flows with echo, say, without reading)
                    await taken.wait()
                    continue
            if data is None:
                self._handle(engine.handle_timeout(trio.current_time()))
                self._publish()
                continue
            if self.capture is not None:
                self.capture.received(data, self._wall_time())
            self._handle(engine.receive_events(data, trio.current_time()))
            if engine.awaiting_verdict:
                await self._verify()
            elif self.failure_delay and engine.authentication_failed:
                # a failed login is answered late, so guessing passwords is slow: nobody may write the answer
                # before (another connection's reader wakes every writer with output)
                self.broker.dirty.discard(self.engine)
                await trio.sleep(self.failure_delay)
            # a small answer goes out from this task: no hand-off to the writer, one wake-up less per request
            # (bulk output is the writer's: a peer that stops reading must only ever block the writer)
            if self._publish(answer_here=True):
                # (on a plain socket without waiting: what the socket does not take goes to the writer)
                sent = self._answer_now(plain) if plain is not None else await self._send(engine.data_to_send())
                if not sent:
                    return

    async def _verify(self) -> None:
        """Check the credentials the engine holds, off the event loop, and give it the verdict. A failure is
        answered after the delay the checker says, and at the latest when the handshake time runs out."""
        engine = self.wire
        self._publish()  # what is queued before the outcome (the mechanisms) need not wait
        user, password = engine.take_credentials()
        deadline = engine.next_deadline()
        ok, delay, checked = False, self.failure_delay, False
        with trio.move_on_at(math.inf if deadline is None else deadline):
            if self.checking is not None:
                self.checking(True)
            if self.login is not None:
                ok, delay = await self.login.verify(user, password, self.address)
            else:
                ok = await trio.to_thread.run_sync(engine.sasl.authenticate, user, password)
            checked = True
            del password
            if not ok and self.checking is not None:
                self.checking(False)
            if not ok and delay:
                # a failed login is answered late, so guessing is slow; the outcome is not queued meanwhile
                await trio.sleep(delay)
        if not checked:
            return  # the handshake time ran out before the check (the broker is busy): dropped, not refused
        engine.sasl_verdict(ok)
        self._handle(engine.resume_events(trio.current_time()))

    async def _writer(self, cancel_scope: trio.CancelScope) -> None:
        engine = self.wire
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            if not await self._send(engine.data_to_send()):
                cancel_scope.cancel()
                return
            if engine.has_output:  # a wire that holds output back while the peer reads (a gateway) has more
                self._wakeup.set()
            if engine.finished and not engine.has_output:
                cancel_scope.cancel()
                return
