"""Limits that keep one peer from taking the broker down (``[server]`` and ``[broker]`` limits).

Each limit is set small in a real broker's configuration and probed over TCP with ``ScriptedPeer``: the
extra connection, session, link, oversized message, silent socket, idle peer, transaction and staged byte is
answered with the condition the configuration file documents, and whatever was within the limit keeps
working. Heartbeats are timed exactly over memory streams under ``MockClock``. Timeouts here are 0.3 s, and
every socket wait is bounded by the peer's 5 s timeout.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from minibroker.amqp.definitions import (
    Accepted,
    AmqpValue,
    Attach,
    Begin,
    Close,
    Coordinator,
    Declare,
    Declared,
    Detach,
    Discharge,
    Disposition,
    End,
    Flow,
    Open,
    Rejected,
    SaslMechanisms,
    Source,
    TransactionalState,
    Transfer,
)
from minibroker.amqp.errors import Condition
from minibroker.amqp.framing import AMQP_HEADER, EMPTY_FRAME, SASL_HEADER
from minibroker.amqp.types import Symbol, UInt
from minibroker.config import Config
from minibroker.engine.connection import ServerConnection
from minibroker.server.app import engine_factory, warn_if_exposed
from minibroker.testing import frames
from minibroker.testing.memory import memory_broker
from minibroker.testing.peer import ScriptedPeer
from minibroker.testing.thread import ThreadedBroker, run_in_thread

HOST = "127.0.0.1"
SHORT = 0.3
"""The small timeouts configured here, in seconds."""
LIMIT_EXCEEDED = Condition.RESOURCE_LIMIT_EXCEEDED


def condition(performative: Any) -> str | None:
    return None if performative.error is None else str(performative.error.condition)


@pytest.fixture
def limited(request: pytest.FixtureRequest) -> Iterator[ThreadedBroker]:
    """A broker configured with the ``[server]``/``[broker]`` keys given by ``@pytest.mark.parametrize``."""
    server, broker = request.param
    with run_in_thread({"server": {"port": 0, **server}, "broker": broker}) as running:
        yield running


def limits(server: dict[str, Any] | None = None, broker: dict[str, Any] | None = None) -> Any:
    return pytest.mark.parametrize("limited", [(server or {}, broker or {})], indirect=True, ids=[""])


def connect(broker: ThreadedBroker) -> ScriptedPeer:
    return ScriptedPeer.connect(HOST, broker.port)


def post(peer: ScriptedPeer, handle: int, delivery_id: int, body: str = "m", *, channel: int = 0) -> Any:
    """Send one message on an attached sender link; the outcome the broker answers with."""
    peer.transfer(handle, delivery_id, frames.message(body), channel=channel)
    return peer.expect(Disposition).state


# -- connections, sessions, links ----------------------------------------------------------------------------
@limits(server={"max_connections": 2})
def test_max_connections(limited: ThreadedBroker) -> None:
    with connect(limited) as first, connect(limited) as second:
        first.open()
        second.open()
        with connect(limited) as extra:
            # the connection beyond the limit gets a clear AMQP answer, not a dropped socket
            assert isinstance(extra.open(), Open)
            assert condition(extra.expect(Close)) == LIMIT_EXCEEDED
            extra.send(Close())
            extra.expect_closed()
        for peer in (first, second):
            peer.begin()
            peer.attach_sender("still-served", handle=0)
            peer.expect(Flow)
            assert isinstance(post(peer, 0, 0), Accepted)
        first.close()
        # a slot is free again once a connection is gone (its task may need a moment to finish)
        deadline = time.monotonic() + 5.0
        while True:
            with connect(limited) as late:
                late.open()
                late.send(frames.begin())
                reply = late.receive().performative
                if isinstance(reply, Begin):
                    late.close()
                    break
                assert isinstance(reply, Close)
                assert time.monotonic() < deadline, "no connection accepted after one closed"
                time.sleep(0.01)
        second.close()
    assert limited.queue("still-served").depth == 2


@limits(server={"max_sessions": 2})
def test_max_sessions(limited: ThreadedBroker) -> None:
    with connect(limited) as peer:
        peer.open()
        peer.begin(channel=0)
        peer.begin(channel=1)
        peer.begin(channel=2)  # answered, then at once ended with the reason
        end = peer.expect(End, channel=peer.remote_channels[2])
        assert condition(end) == LIMIT_EXCEEDED
        peer.send(End(), channel=2)
        # the sessions within the limit carry on
        peer.attach_sender("sessions", handle=0, channel=1)
        peer.expect(Flow)
        assert isinstance(post(peer, 0, 0, channel=1), Accepted)
        # ending one makes room for another
        peer.send(End(), channel=0)
        peer.expect(End)
        peer.begin(channel=3)
        peer.attach_sender("sessions", handle=0, channel=3)
        peer.expect(Flow)
        assert isinstance(post(peer, 0, 0, channel=3), Accepted)
        peer.close()


@limits(server={"max_links_per_session": 2})
def test_max_links_per_session(limited: ThreadedBroker) -> None:
    with connect(limited) as peer:
        peer.open()
        assert peer.begin().handle_max == 1  # handle-max is one less than the limit
        peer.attach_sender("links", handle=0)
        peer.expect(Flow)
        peer.attach_receiver("links", handle=1)
        # the links within the limit work
        assert isinstance(post(peer, 0, 0), Accepted)
        # detaching one makes room
        peer.send(Detach(handle=UInt(1), closed=True))
        peer.expect(Detach)
        accepted = peer.attach_sender("links", handle=1, name="second-sender")
        assert accepted.target is not None
        peer.expect(Flow)
        assert isinstance(post(peer, 1, 1), Accepted)
        # a third link needs a handle above handle-max: §2.7.2 "MUST close the connection with the framing-error"
        peer.send(frames.attach_sender("links", 2))
        assert condition(peer.expect(Close)) == Condition.FRAMING_ERROR
        peer.send(Close())
        peer.expect_closed()
    assert limited.queue("links").depth == 2


# -- message size --------------------------------------------------------------------------------------------
MAX_SIZE = 1000


def sized(size: int) -> bytes:
    """An encoded message of exactly ``size`` bytes."""
    overhead = len(frames.message("x" * 300)) - 300
    payload = frames.message("x" * (size - overhead))
    assert len(payload) == size
    return payload


@limits(server={"max_message_size": MAX_SIZE})
def test_max_message_size(limited: ThreadedBroker) -> None:
    with connect(limited) as peer:
        peer.open()
        peer.begin()
        for handle, address in enumerate(["big", "multi", "small"]):
            reply = peer.attach_sender(address, handle=handle)
            assert reply.max_message_size == MAX_SIZE  # announced on attach
            peer.expect(Flow)
        assert peer.attach_receiver("small", handle=3).max_message_size == MAX_SIZE

        # a message of exactly the limit is fine
        peer.transfer(0, 0, sized(MAX_SIZE))
        assert isinstance(peer.expect(Disposition).state, Accepted)
        # one byte more, in one frame: the link is detached
        peer.transfer(0, 1, sized(MAX_SIZE + 1))
        detach = peer.expect(Detach)
        assert detach.handle == 0
        assert condition(detach) == Condition.MESSAGE_SIZE_EXCEEDED
        # in several frames, each small: detached as soon as the total is too big
        payload = sized(2 * MAX_SIZE)
        peer.transfer(1, 2, payload[:600], more=True)
        peer.transfer(1, None, payload[600:1200], more=True)
        detach = peer.expect(Detach)
        assert detach.handle == 1
        assert condition(detach) == Condition.MESSAGE_SIZE_EXCEEDED
        peer.transfer(1, None, payload[1200:])  # the rest, sent before we saw the detach, is dropped
        for handle in (0, 1):
            peer.send(Detach(handle=UInt(handle), closed=True))
        # other links are not affected
        assert isinstance(post(peer, 2, 3, "small"), Accepted)
        peer.flow(handle=3, link_credit=10)
        delivered = peer.expect_frame(Transfer)
        assert delivered.payload == frames.message("small")
        peer.close()
    assert limited.queue("big").depth == 1  # only the message within the limit
    assert limited.queue("multi").depth == 0


@limits(server={"max_message_size": MAX_SIZE})
def test_max_message_size_bounds_frames_not_just_bytes(limited: ThreadedBroker) -> None:
    # issue 12: empty continuation frames were free (a 1 kB limit let 4M of them grow the broker by 30 MiB); a
    # message takes at most max(1024, max_message_size // 256) frames
    with connect(limited) as peer:
        peer.open()
        peer.begin()
        peer.attach_sender("endless", handle=0)
        peer.expect(Flow)
        empty = frames.frame(0, frames.transfer(0, None, more=True))
        peer.transfer(0, 0, b"", more=True)
        peer.send_raw(empty * 5000)  # far more than 1024 frames, and not one byte
        while not isinstance(detach := peer.receive().performative, Detach):
            assert isinstance(detach, Flow), detach
            assert detach.handle is None, detach  # the session window, widened
        assert condition(detach) == Condition.MESSAGE_SIZE_EXCEEDED
        assert "more than 1024 frames" in str(detach.error.description)
        peer.send(Detach(handle=UInt(0), closed=True))
        # the session goes on (the broker widened its window for the frames, dropped after the detach, §2.6.2): a
        # message of exactly the limit in frames of any size is taken (bytes are counted exactly)
        peer.send(frames.attach_sender("endless", 0, "sender-again"))
        while not isinstance(reply := peer.receive().performative, Attach):
            assert isinstance(reply, Flow), reply
            assert reply.handle is None, reply
        assert peer.expect(Flow).handle == 0
        payload = sized(MAX_SIZE)
        for start in range(0, MAX_SIZE, 100):
            more = start + 100 < MAX_SIZE
            peer.transfer(0, 1 if start == 0 else None, payload[start : start + 100], more=more)
        assert isinstance(peer.expect(Disposition).state, Accepted)
        peer.close()
    assert limited.queue("endless").depth == 1


# -- handshake and idle time-outs ----------------------------------------------------------------------------
@limits(server={"handshake_timeout": SHORT})
def test_silent_socket_is_closed_after_the_handshake_timeout(limited: ThreadedBroker) -> None:
    started = time.monotonic()  # before connecting: the broker's clock cannot start earlier
    with socket.create_connection((HOST, limited.port), timeout=5.0) as sock:
        assert sock.recv(64) == b""  # not a byte from the broker: just closed
        assert SHORT <= time.monotonic() - started < SHORT + 2.0


@pytest.mark.parametrize("stall_after", ["sasl-header", "sasl-mechanisms", "amqp-header"])
@limits(server={"handshake_timeout": SHORT})
def test_stalled_handshake_is_closed_after_the_timeout(limited: ThreadedBroker, stall_after: str) -> None:
    started = time.monotonic()
    with connect(limited) as peer:
        if stall_after == "amqp-header":
            peer.send_header(AMQP_HEADER)
        else:
            peer.send_header(SASL_HEADER[:6] if stall_after == "sasl-header" else SASL_HEADER)
        if stall_after == "sasl-mechanisms":
            assert peer.expect_header() == SASL_HEADER
            peer.expect_sasl(SaslMechanisms)
        elif stall_after == "amqp-header":
            assert peer.expect_header() == AMQP_HEADER
        peer.expect_closed()
        assert SHORT <= time.monotonic() - started < SHORT + 2.0


@limits(server={"handshake_timeout": SHORT})
def test_handshake_timeout_spares_an_opened_connection(limited: ThreadedBroker) -> None:
    with connect(limited) as peer:
        peer.open(sasl="ANONYMOUS")
        time.sleep(SHORT * 2)
        peer.begin()
        peer.attach_sender("patient", handle=0)
        peer.expect(Flow)
        assert isinstance(post(peer, 0, 0), Accepted)
        peer.close()


@limits(server={"idle_timeout": SHORT})
def test_silent_peer_is_closed_after_our_idle_timeout(limited: ThreadedBroker) -> None:
    with connect(limited) as peer:
        started = time.monotonic()  # before our last frame (the open): the broker's idle clock starts later
        assert peer.open().idle_time_out == int(SHORT * 1000)  # announced in our open
        close = peer.expect(Close)
        assert SHORT <= time.monotonic() - started < SHORT + 2.0
        assert condition(close) == LIMIT_EXCEEDED
        peer.send(Close())
        peer.expect_closed()


@limits(server={"idle_timeout": SHORT})
def test_peer_sending_heartbeats_stays_connected(limited: ThreadedBroker) -> None:
    with connect(limited) as peer:
        peer.open()
        deadline = time.monotonic() + SHORT * 3  # well past the idle time-out, kept alive by empty frames
        while time.monotonic() < deadline:
            time.sleep(SHORT / 6)
            peer.send_raw(frames.heartbeat())
        peer.begin()
        peer.attach_sender("alive", handle=0)
        peer.expect(Flow)
        assert isinstance(post(peer, 0, 0), Accepted)
        peer.close()


async def test_heartbeats_at_half_the_peers_idle_timeout(autojump_clock: MockClock) -> None:
    def make_engine(conn_id: int) -> ServerConnection:
        return ServerConnection(conn_id=conn_id, now=trio.current_time())

    async with memory_broker(make_engine=make_engine) as mb:
        peer = await mb.connect()
        await peer.open(idle_time_out=UInt(1000))
        opened = trio.current_time()
        arrivals = []
        with trio.fail_after(10):
            while len(arrivals) < 4:
                data = await peer.stream.receive_some(65536)
                assert data == EMPTY_FRAME  # nothing but heartbeats, one at a time
                arrivals.append(trio.current_time() - opened)
        assert arrivals == pytest.approx([0.5, 1.0, 1.5, 2.0])
        # other traffic postpones the next heartbeat: a begin at 2.25 s is answered, then silence till 2.75 s
        await trio.sleep(0.25)
        await peer.begin()
        answered = trio.current_time() - opened
        data = await peer.stream.receive_some(65536)
        assert data == EMPTY_FRAME
        assert trio.current_time() - opened == pytest.approx(answered + 0.5)


async def test_a_peer_announcing_a_1_ms_idle_timeout_is_refused(autojump_clock: MockClock) -> None:
    # issue 12: 50 peers announcing 1 ms took a core (heartbeats every 0.5 ms each); the floor refuses them
    make_engine = engine_factory(Config())  # the default configuration
    async with memory_broker(make_engine=make_engine) as mb:
        peer = await mb.connect()
        await peer.open(idle_time_out=UInt(1))
        close = await peer.expect(Close)
        assert condition(close) == LIMIT_EXCEEDED
        assert "below the broker's minimum of 500 ms" in str(close.error.description)
        await trio.sleep(1.0)  # not one heartbeat in a second, then the broker gives up waiting for our close
        assert [f for f in peer.received if f.is_heartbeat] == []
        await peer.expect_closed()


async def test_heartbeats_no_more_often_than_the_floor(autojump_clock: MockClock) -> None:
    make_engine = engine_factory(Config.from_dict({"server": {"min_heartbeat_interval": 0.25}}))
    async with memory_broker(make_engine=make_engine) as mb:
        peer = await mb.connect()
        await peer.open(idle_time_out=UInt(300))  # half would be 150 ms: below the floor of 250 ms
        opened = trio.current_time()
        arrivals = []
        with trio.move_on_after(2.1):  # count the heartbeats over a window of 2.1 s
            while True:
                data = await peer.stream.receive_some(65536)
                assert data == EMPTY_FRAME
                arrivals.append(trio.current_time() - opened)
        assert len(arrivals) == 8
        assert arrivals == pytest.approx([0.25 * n for n in range(1, 9)])


# -- transactions --------------------------------------------------------------------------------------------
ACCEPTED_LIST = Symbol("amqp:accepted:list")
REJECTED_LIST = Symbol("amqp:rejected:list")


class Controller:
    """A coordinator link (handle 0) on an opened ``ScriptedPeer``'s session 0; numbers its deliveries."""

    def __init__(self, peer: ScriptedPeer) -> None:
        self.peer = peer
        self.next_id = 0
        peer.attach_sender(
            None,
            handle=0,
            name="txn-controller",
            source=Source(outcomes=[ACCEPTED_LIST, REJECTED_LIST]),
            target=Coordinator(capabilities=[Symbol("amqp:local-transactions")]),
        )
        peer.expect(Flow)

    def _delivery_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def control(self, body: Any) -> Any:
        """Send a declare or discharge; the state the broker settles it with."""
        self.peer.transfer(0, self._delivery_id(), frames.message(AmqpValue(body)))
        return self.peer.expect(Disposition).state

    def declare(self) -> bytes:
        state = self.control(Declare())
        assert isinstance(state, Declared), state
        return bytes(state.txn_id)

    def post(self, handle: int, txn_id: bytes, payload: bytes) -> Any:
        """A transactional post; its provisional outcome."""
        self.peer.transfer(handle, self._delivery_id(), payload, state=TransactionalState(txn_id=txn_id))
        state = self.peer.expect(Disposition).state
        assert isinstance(state, TransactionalState), state
        assert state.txn_id == txn_id
        return state.outcome

    def commit(self, txn_id: bytes) -> Any:
        return self.control(Discharge(txn_id=txn_id, fail=False))


@limits(broker={"max_transactions_per_connection": 2})
def test_max_transactions_per_connection(limited: ThreadedBroker) -> None:
    with connect(limited) as first, connect(limited) as second:
        first.open()
        first.begin()
        controller = Controller(first)
        txns = [controller.declare(), controller.declare()]
        refused = controller.control(Declare())
        assert isinstance(refused, Rejected)
        assert condition(refused) == LIMIT_EXCEEDED
        assert len(limited.transactions) == 2
        # the limit is per connection
        second.open()
        second.begin()
        other = Controller(second)
        other.control(Discharge(txn_id=other.declare(), fail=True))
        # discharging one makes room for another
        assert isinstance(controller.control(Discharge(txn_id=txns[0], fail=True)), Accepted)
        txns.append(controller.declare())
        for txn in txns[1:]:
            assert isinstance(controller.control(Discharge(txn_id=txn, fail=True)), Accepted)
        first.close()
        second.close()
    assert limited.transactions == []


@limits(broker={"max_staged_bytes": 1000})
def test_max_staged_bytes(limited: ThreadedBroker) -> None:
    with connect(limited) as peer:
        peer.open()
        peer.begin()
        controller = Controller(peer)
        peer.attach_sender("staged", handle=1)
        peer.expect(Flow)
        txn = controller.declare()
        assert isinstance(controller.post(1, txn, sized(600)), Accepted)
        refused = controller.post(1, txn, sized(600))  # 1200 bytes staged would be too many
        assert isinstance(refused, Rejected)
        assert condition(refused) == LIMIT_EXCEEDED
        failed = controller.control(Discharge(txn_id=txn, fail=False))
        assert isinstance(failed, Rejected)
        assert condition(failed) == Condition.TRANSACTION_ROLLBACK
        assert limited.queue("staged").depth == 0  # nothing of it was applied
        # a new transaction starts from zero
        txn = controller.declare()
        assert isinstance(controller.post(1, txn, sized(900)), Accepted)
        assert isinstance(controller.control(Discharge(txn_id=txn, fail=False)), Accepted)
        peer.close()
    assert limited.queue("staged").depth == 1


# -- safe defaults -------------------------------------------------------------------------------------------
def test_exposed_anonymous_listener_warns_and_loopback_does_not() -> None:
    listening = re.compile(r"minibroker listening on amqp://(\S+):(\d+)")
    with ExitStack() as stack:
        procs = {
            host: stack.enter_context(
                subprocess.Popen(
                    [sys.executable, "-m", "minibroker", "--host", host, "--port", "0"],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
            for host in ("0.0.0.0", "127.0.0.1")
        }
        stderr = {}
        for host, proc in procs.items():
            try:
                assert proc.stdout is not None
                line = proc.stdout.readline()
                match = listening.match(line)
                assert match, f"unexpected first line {line!r}"
                assert match.group(1) == host
                proc.terminate()
                assert proc.wait(10) == 0
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
            assert proc.stderr is not None
            stderr[host] = proc.stderr.read()
    assert "WARNING" in stderr["0.0.0.0"]
    assert "ANONYMOUS" in stderr["0.0.0.0"]
    assert "ANONYMOUS" not in stderr["127.0.0.1"]
    assert "WARNING" not in stderr["127.0.0.1"]


def test_exposed_listener_with_users_does_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    warn_if_exposed(Config.from_dict({"server": {"host": "0.0.0.0"}, "auth": {"users": {"alice": "secret"}}}))
    warn_if_exposed(Config.from_dict({"server": {"host": "::1"}}))
    warn_if_exposed(Config.from_dict({"server": {"host": "localhost"}}))
    assert caplog.records == []
    warn_if_exposed(Config.from_dict({"server": {"host": "::"}}))
    assert "ANONYMOUS" in caplog.text
