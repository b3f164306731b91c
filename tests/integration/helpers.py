"""Shared tools for the python-qpid-proton integration tests.

Two client styles are exercised against the real broker:

* ``proton.utils.BlockingConnection`` through ``blocking_connection`` (every blocking call is bounded
  by ``BLOCKING_TIMEOUT``);
* the event-driven ``proton.reactor.Container`` through ``Scenario`` and ``run``. The container runs
  in the test's thread. A guard timer ends the run after ``Scenario.timeout`` seconds, an exception
  raised by a callback closes the scenario's connections before it is re-raised, and the run returns
  as soon as every connection's transport has closed, so a scenario never hangs a test.

Broker state is read with ``ThreadedBroker.call``, which runs a function inside the broker's thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

from proton import Connection, Data, Delivery, Described, Endpoint, Handler, Link, Message, Sender, symbol, ulong
from proton.handlers import IncomingMessageHandler, MessagingHandler
from proton.reactor import Container, LinkOption
from proton.utils import BlockingConnection

from minibroker.testing.thread import ThreadedBroker

BLOCKING_TIMEOUT = 10.0
"""Upper bound, in seconds, of each blocking proton call (generous: CI machines can be very loaded)."""
SCENARIO_TIMEOUT = 15.0
"""Upper bound, in seconds, of one event-driven scenario."""
QUIET_PERIOD = 0.3
"""How long we watch for something that must not happen (a delivery without credit)."""


# -- broker state -------------------------------------------------------------------------------------
def queue_stats(broker: ThreadedBroker, name: str) -> tuple[int, int]:
    """``(depth, acquired)`` of queue ``name``, read in the broker's thread; (0, 0) if it does not exist."""
    stats = broker.queue(name).stats()
    return (stats.depth, stats.acquired)


def queue_depth(broker: ThreadedBroker, name: str) -> int:
    """Messages ready on queue ``name``."""
    return queue_stats(broker, name)[0]


def wait_for(
    predicate: Callable[[], bool],
    what: str,
    *,
    conn: BlockingConnection | None = None,
    timeout: float = BLOCKING_TIMEOUT,
) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` after ``timeout`` seconds.

    With ``conn``, its I/O is pumped between polls, so frames the client has queued (the disposition
    of a ``receiver.accept()``, say) reach the broker while we wait for their effect there.
    """
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        if conn is None:
            time.sleep(0.01)
        else:
            container = conn.container
            saved, container.timeout = container.timeout, 0.01
            try:
                container.process()
            finally:
                container.timeout = saved


# -- blocking client ----------------------------------------------------------------------------------
@contextmanager
def blocking_connection(broker: ThreadedBroker) -> Iterator[BlockingConnection]:
    """A ``BlockingConnection`` to ``broker`` whose calls time out after ``BLOCKING_TIMEOUT``."""
    conn = BlockingConnection(broker.url, timeout=BLOCKING_TIMEOUT)
    try:
        yield conn
    finally:
        conn.close()


def send_messages(broker: ThreadedBroker, address: str, messages: list[Message]) -> None:
    """Send ``messages`` to ``address`` and wait until the broker accepted each one."""
    with blocking_connection(broker) as conn:
        sender = conn.create_sender(address)
        for message in messages:
            delivery = sender.send(message)
            assert delivery.remote_state == Delivery.ACCEPTED
        sender.close()  # type: ignore[no-untyped-call]


def encode(message: Message) -> bytes:
    """The bytes of ``message`` as they travel in transfer frames."""
    return bytes(message.encode())


def section(code: int, value: Any) -> bytes:
    """One encoded message section: ``value`` described by the section's code (0x70 header ... 0x78 footer)."""
    data = Data()
    data.put_object(Described(ulong(code), value))
    return bytes(data.encode())


def send_raw(sender: Sender, payload: bytes) -> Delivery:
    """Send already encoded message bytes on ``sender`` (like ``Message.send``, without encoding)."""
    delivery = sender.delivery(sender.delivery_tag())
    sender.stream(payload)
    sender.advance()
    if sender.snd_settle_mode == Link.SND_SETTLED:
        delivery.settle()
    return delivery


def as_bytes(value: Any) -> bytes:
    """A binary value proton handed out (as a ``memoryview``) as ``bytes``."""
    return bytes(value)


def receive_raw(event: Any) -> bytes | None:
    """In ``on_delivery``: the whole payload once the last frame is in, else None (more to come)."""
    delivery = event.delivery
    if delivery.partial:
        return None
    return bytes(event.link.recv(delivery.pending))


# -- event-driven client ------------------------------------------------------------------------------
class _Timer(Handler):
    """A scheduled callback; exceptions go through the scenario so they end the run cleanly."""

    def __init__(self, scenario: Scenario, callback: Callable[[], None], *, internal: bool = False) -> None:
        self.scenario = scenario
        self.callback = callback
        self.internal = internal  # the scenario's own machinery: runs even after a failure

    def on_timer_task(self, event: Any) -> None:
        if self.internal:
            self.callback()
        else:
            self.scenario._guarded(self.callback)


class _Guarded(Handler):
    """Top-level handler: forwards every event to the scenario, turning a failure into an abort.

    After a failure only the end of the connections still matters: the test's callbacks see no more
    events, and the run stops once every transport is closed (or a second later at most).
    """

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario

    def on_unhandled(self, method: str, event: Any) -> None:
        scenario = self.scenario
        if scenario.failure is None:
            scenario._guarded(lambda: event.dispatch(scenario))
        elif method == "on_transport_closed":
            scenario._transport_closed()


class Scenario(MessagingHandler):
    """One event-driven client session against the broker at ``url``.

    Subclasses open links in ``setup`` and call ``finish()`` when their goal is reached. Callbacks may
    assert freely: a failure aborts the scenario and ``run`` re-raises it.
    """

    timeout = SCENARIO_TIMEOUT

    def __init__(self, url: str, *, raw_receive: bool = False, **options: Any) -> None:
        super().__init__(**options)
        if raw_receive:
            # The subclass reads payload bytes itself in on_delivery (see ``receive_raw``): take away
            # proton's handler that would decode them into a Message and call on_message.
            self.handlers = [h for h in cast(list[Any], self.handlers) if not isinstance(h, IncomingMessageHandler)]
        self.url = url
        self.container: Container | None = None
        self.connections: list[Connection] = []
        self.errors: list[str] = []
        self.failure: BaseException | None = None
        self.finished = False
        self.timed_out = False
        self._timers: list[Any] = []
        self._open_transports = 0

    # -- for subclasses -------------------------------------------------------------------------------
    def setup(self, container: Container) -> None:
        """Open connections and links (``self.connect()``)."""
        raise NotImplementedError

    def connect(self) -> Connection:
        """Open one more connection to the broker."""
        assert self.container is not None
        conn = self.container.connect(self.url)
        self.connections.append(conn)
        self._open_transports += 1
        return conn

    def after(self, delay: float, callback: Callable[[], None]) -> None:
        """Call ``callback`` in ``delay`` seconds (unless the scenario ended by then)."""
        assert self.container is not None
        self._timers.append(self.container.schedule(delay, _Timer(self, callback)))

    def when(self, predicate: Callable[[], bool], then: Callable[[], None], interval: float = 0.01) -> None:
        """Call ``then`` once ``predicate`` holds, polling it every ``interval`` seconds.

        Use it with broker state (``queue_stats``) as a barrier: proton may put a flow frame on the wire
        before a disposition queued earlier, so "settle, then grant credit" needs the broker to have
        taken the outcome first.
        """

        def poll() -> None:
            if predicate():
                then()
            else:
                self.after(interval, poll)

        poll()

    def finish(self) -> None:
        """The goal is reached: close every connection; the run ends when their sockets are closed."""
        self.finished = True
        self._close_all()

    def describe(self) -> str:
        """Progress shown when the scenario times out."""
        return ""

    # -- machinery ------------------------------------------------------------------------------------
    def _guarded(self, callback: Callable[[], None]) -> None:
        if self.failure is not None:
            return
        try:
            callback()
        except BaseException as exc:
            self.failure = exc
            self._close_all()
            self._stop_soon()

    def _close_all(self) -> None:
        for conn in self.connections:
            if conn.state & Endpoint.LOCAL_ACTIVE:
                conn.close()

    def _stop_soon(self) -> None:
        # A peer that never answers our close must not hold the run: stop one second later at most.
        assert self.container is not None
        self._timers.append(self.container.schedule(1.0, _Timer(self, self._stop, internal=True)))

    def _stop(self) -> None:
        for timer in self._timers:
            timer.cancel()
        if self.container is not None:
            self.container.stop()

    def _on_timeout(self) -> None:
        self.timed_out = True
        self._close_all()
        self._stop_soon()

    def on_start(self, event: Any) -> None:
        self.container = event.container
        self._timers.append(event.container.schedule(self.timeout, _Timer(self, self._on_timeout, internal=True)))
        self.setup(event.container)

    def _fail(self, error: str) -> None:
        self.errors.append(error)
        self._close_all()
        self._stop_soon()

    def on_transport_closed(self, event: Any) -> None:
        if not (self.finished or self.failure or self.timed_out or self.errors):
            self._fail(f"connection lost before the scenario finished: {event.transport.condition}")
        self._transport_closed()

    def _transport_closed(self) -> None:
        self._open_transports -= 1
        if self._open_transports <= 0:
            self._stop()

    def on_transport_error(self, event: Any) -> None:
        self._fail(f"transport error: {event.transport.condition}")

    def on_connection_error(self, event: Any) -> None:
        self._fail(f"connection closed by the broker: {event.connection.remote_condition}")

    def on_session_error(self, event: Any) -> None:
        self._fail(f"session ended by the broker: {event.session.remote_condition}")

    def on_link_error(self, event: Any) -> None:
        self._fail(f"link {event.link.name} detached by the broker: {event.link.remote_condition}")


class TransferDestination(LinkOption):  # type: ignore[misc]
    """A sender link option: Service Bus send-via, the attach property ``com.microsoft:transfer-destination-address``
    naming the final destination of what is sent to the link's target (the via entity), as the .NET SDK's
    via-sender sends it (``Microsoft.Azure.ServiceBus/src/Core/MessageSender.cs`` ``CreateLinkAsync``)."""

    def __init__(self, destination: str) -> None:
        self.destination = destination

    def apply(self, link: Link) -> None:
        link.properties = {symbol("com.microsoft:transfer-destination-address"): self.destination}


def run(scenario: Scenario) -> None:
    """Run ``scenario`` to its end in this thread; fail on a timeout, an error or a failed assertion."""
    Container(_Guarded(scenario)).run()
    if scenario.failure is not None:
        raise scenario.failure
    name = type(scenario).__name__
    assert not scenario.timed_out, f"{name} did not finish within {scenario.timeout}s. {scenario.describe()}"
    assert not scenario.errors, f"{name}: {scenario.errors}"
    assert scenario.finished, f"{name} ended without finishing. {scenario.describe()}"
