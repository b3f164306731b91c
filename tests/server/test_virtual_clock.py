"""Virtual time (issue 16 §2; ``minibroker/server/clock.py``): with the virtual clock, broker time moves only when
advanced, and every broker timer obeys it: a 2-minute transaction time-out, a 1-day ttl and a 1-hour scheduled
delivery each pass in well under a second of real time.

The in-memory tests run the real broker core, engine and connection tasks (``memory_broker`` and ``MemoryPeer``)
under ``MockClock(autojump_threshold=0)``: trio's clock jumps whenever every task is blocked, so "trio time passes,
broker time does not" is checked without sleeping for real. The proton tests drive a threaded broker with
python-qpid-proton and advance it from the test's thread.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import trio
from proton import Message, symbol
from proton.handlers import TransactionHandler
from proton.reactor import Container, Transaction
from trio.testing import MockClock

from minibroker.amqp.definitions import (
    Accepted,
    AmqpValue,
    Close,
    Declare,
    Declared,
    Discharge,
    Disposition,
    Flow,
    Header,
    MessageAnnotations,
    Properties,
    Rejected,
    Released,
    Source,
    TransactionalState,
    Transfer,
)
from minibroker.amqp.definitions import Coordinator as CoordinatorTarget
from minibroker.amqp.types import Long, Symbol, Timestamp, UInt
from minibroker.broker.clock import WallClock
from minibroker.broker.core import OFFERED_CAPABILITIES, BrokerSettings
from minibroker.broker.policy import NodePolicy
from minibroker.engine.connection import ServerConnection
from minibroker.testing import frames
from minibroker.testing.memory import MemoryBroker, MemoryPeer, memory_broker
from minibroker.testing.thread import ThreadedBroker, run_in_thread
from tests.integration.helpers import Scenario, blocking_connection, queue_depth, run

EPOCH = 1_700_000_000.0
"""Wall-clock seconds at trio time 0 in the in-memory tests (the broker's ``WallClock`` offset)."""
MINUTE = 60.0
HOUR = 3600.0
DAY = 86400.0
REAL_BUDGET = 1.0
"""Real seconds each long wait may take: "well under a second"."""


@contextmanager
def real_time_under(budget: float = REAL_BUDGET) -> Iterator[None]:
    """The block takes less than ``budget`` seconds of real (wall-clock) time."""
    started = time.monotonic()
    yield
    elapsed = time.monotonic() - started
    assert elapsed < budget, f"took {elapsed:.2f} s of real time"


def message(body: str, *, ttl_s: float | None = None, expires_at_ms: int | None = None, **annotations: Any) -> bytes:
    """An encoded message; annotations in ms, as clients send them."""
    sections: list[Any] = []
    if ttl_s is not None:
        sections.append(Header(ttl=UInt(int(ttl_s * 1000))))
    if annotations:
        sections.append(MessageAnnotations({Symbol(k.replace("_", "-")): v for k, v in annotations.items()}))
    if expires_at_ms is not None:
        sections.append(Properties(absolute_expiry_time=Timestamp(expires_at_ms)))
    return frames.message(body, *sections)


# -- in memory ---------------------------------------------------------------------------------------------------
@pytest.fixture
def settings() -> BrokerSettings:
    return BrokerSettings()


@pytest.fixture
async def mb(settings: BrokerSettings) -> AsyncIterator[MemoryBroker]:
    async with memory_broker(settings, clock=WallClock(EPOCH), clock_mode="virtual", receive_timeout=2 * DAY) as mb:
        yield mb


class Client:
    """One connection: a producer link (handle 0) to ``address``, a consumer (handle 1) and a controller (2)."""

    def __init__(self, peer: MemoryPeer) -> None:
        self.peer = peer
        self.next_id = 0

    @classmethod
    async def open(cls, mb: MemoryBroker, address: str) -> Client:
        peer = await mb.connect()
        await peer.open()
        await peer.begin()
        await peer.attach_sender(address, handle=0, name=f"producer-{address}")
        await peer.expect(Flow)
        return cls(peer)

    def _delivery_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    async def send(self, payload: bytes, handle: int = 0, **fields: Any) -> Any:
        """Send one message; the state of the broker's disposition for it."""
        await self.peer.transfer(handle, self._delivery_id(), payload, **fields)
        return (await self.peer.expect(Disposition)).state

    async def consume(self, address: str, credit: int = 10) -> None:
        await self.peer.attach_receiver(address, handle=1, name=f"consumer-{address}")
        await self.peer.flow(handle=1, link_credit=credit, delivery_count=0)

    async def receive(self) -> tuple[int, Transfer]:
        frame = await self.peer.expect_frame(Transfer)
        transfer: Transfer = frame.performative
        assert transfer.delivery_id is not None
        return int(transfer.delivery_id), transfer

    async def declare(self) -> bytes:
        """Attach a controller (handle 2) and declare a transaction; its id."""
        await self.peer.attach_sender(
            None,
            handle=2,
            name="controller",
            source=Source(outcomes=[Symbol("amqp:accepted:list"), Symbol("amqp:rejected:list")]),
            target=CoordinatorTarget(capabilities=[Symbol("amqp:local-transactions")]),
        )
        await self.peer.expect(Flow)
        state = await self.send(frames.message(AmqpValue(Declare())), handle=2)
        assert isinstance(state, Declared), state
        return bytes(state.txn_id)


def depth(mb: MemoryBroker, name: str) -> int:
    return mb.queue(name).depth


async def test_the_clock_starts_at_real_time_and_reads_as_wall_clock_seconds(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    assert mb.clock.mode == "virtual"
    assert mb.clock.now == pytest.approx(EPOCH + trio.current_time())
    before = mb.clock.now
    assert mb.clock.advance(DAY) == pytest.approx(before + DAY)
    assert mb.clock.now == pytest.approx(before + DAY)


async def test_a_one_day_ttl_passes_in_well_under_a_second(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    producer = await Client.open(mb, "orders")
    assert isinstance(await producer.send(message("perishable", ttl_s=DAY)), Accepted)
    with real_time_under():
        mb.clock.advance(DAY - 1)
        assert depth(mb, "orders") == 1
        mb.clock.advance(1)
        assert depth(mb, "orders") == 0


@pytest.mark.parametrize("settings", [BrokerSettings(transaction_timeout=1)])
async def test_time_does_not_move_by_itself(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    """Trio's clock jumps a day (MockClock): a 1 s ttl, a 1 s schedule and a 1 s transaction time-out all wait."""
    producer = await Client.open(mb, "orders")
    await producer.send(message("ttl", ttl_s=1))
    await producer.send(message("scheduled", x_opt_delivery_delay=Long(1000)))
    txn_id = await producer.declare()
    start = mb.clock.now
    await trio.sleep(DAY)
    assert trio.current_time() >= DAY
    assert mb.clock.now == start
    assert mb.queue("orders").stats().ready == 1
    assert mb.queue("orders").stats().scheduled == 1
    assert [t.txn_id for t in mb.transactions] == [txn_id]
    mb.clock.advance(1)
    assert mb.queue("orders").stats().ready == 1  # the ttl one went, the scheduled one came
    assert mb.queue("orders").peek()[0].body == "scheduled"
    assert mb.txn_stats.timed_out == 1


async def test_an_hour_scheduled_delivery_arrives_when_an_hour_is_advanced(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    producer = await Client.open(mb, "later")
    await producer.consume("later")
    await producer.send(message("scheduled", x_opt_delivery_delay=Long(int(HOUR * 1000))))
    with real_time_under():
        mb.clock.advance(HOUR - 1)
        assert mb.queue("later").stats().scheduled == 1
    await producer.peer.expect_nothing(HOUR)  # trio time passes: still nothing
    with real_time_under():
        mb.clock.advance(1)
        _, transfer = await producer.receive()
    assert transfer.delivery_id is not None


async def test_an_absolute_expiry_time_expires_when_virtual_time_passes_it(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    """The wall-clock field maps onto virtual time: "an hour from the broker's now" expires after an hour."""
    await trio.sleep(HOUR)  # trio's time and the broker's drift apart first
    producer = await Client.open(mb, "orders")
    expires_at_ms = int((mb.clock.now + HOUR) * 1000)
    await producer.send(message("perishable", expires_at_ms=expires_at_ms))
    mb.clock.advance(HOUR - 1)
    assert depth(mb, "orders") == 1
    mb.clock.advance(1)
    assert depth(mb, "orders") == 0


@pytest.mark.parametrize("settings", [BrokerSettings(transaction_timeout=2 * MINUTE)])
async def test_a_two_minute_transaction_time_out_in_well_under_a_second(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    client = await Client.open(mb, "orders")
    txn_id = await client.declare()
    provisional = await client.send(message("staged"), state=TransactionalState(txn_id=txn_id))
    assert isinstance(provisional, TransactionalState)
    with real_time_under():
        mb.clock.advance(2 * MINUTE - 1)
        (txn,) = mb.transactions
        assert txn.age == pytest.approx(2 * MINUTE - 1)
        mb.clock.advance(1)
    assert mb.txn_stats.timed_out == 1
    outcome = await client.send(frames.message(AmqpValue(Discharge(txn_id=txn_id, fail=False))), handle=2)
    assert isinstance(outcome, Rejected)
    assert outcome.error is not None
    assert outcome.error.condition == Symbol("amqp:transaction:timeout")
    assert depth(mb, "orders") == 0


@pytest.mark.parametrize("settings", [BrokerSettings(node_defaults=NodePolicy(redelivery_delay=10 * MINUTE))])
async def test_a_redelivery_delay_waits_for_virtual_time(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    producer = await Client.open(mb, "orders")
    await producer.send(message("retry me"))
    client = await Client.open(mb, "elsewhere")
    await client.consume("orders")
    delivery_id, _ = await client.receive()
    await client.peer.disposition(delivery_id, state=Released())
    await client.peer.expect_nothing(HOUR)  # trio time: nothing comes back
    mb.clock.advance(10 * MINUTE - 1)
    await client.peer.expect_nothing(1)
    mb.clock.advance(1)
    await client.receive()


@pytest.mark.parametrize("settings", [BrokerSettings(node_defaults=NodePolicy(expiry_address="expired"))])
async def test_an_advance_fires_every_due_timer_in_deadline_order(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    producer = await Client.open(mb, "orders")
    for hours in (3, 1, 2):
        await producer.send(message(f"{hours}h", ttl_s=hours * HOUR))
    await producer.send(message("5h", ttl_s=5 * HOUR))
    mb.clock.advance(4 * HOUR)  # one advance past three deadlines
    assert [m.body for m in mb.queue("expired").peek()] == ["1h", "2h", "3h"]
    assert [m.body for m in mb.queue("orders").peek()] == ["5h"]


@pytest.mark.parametrize("settings", [BrokerSettings(auto_delete_idle=300)])
async def test_each_timer_fires_at_its_own_instant(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    """The idle sweep runs every 150 s and deletes a node found idle at sweeps 300 s apart: one advance of 1000 s
    runs it at 150, 300, 450... (a single run at 1000 s would only find the node idle once)."""
    mb.post("scratch", message("x"))
    mb.queue("scratch").purge()  # created on demand, empty, no links: idle
    await trio.sleep(DAY)  # trio time is not broker time: no sweep
    assert "scratch" in mb.queues
    mb.clock.advance(1000)
    assert "scratch" not in mb.queues


@pytest.mark.parametrize("seconds", [-1, -0.001, float("nan"), float("-inf"), float("inf"), 1e300, "1", True, None])
async def test_a_negative_or_bad_advance_is_refused(mb: MemoryBroker, autojump_clock: MockClock, seconds: Any) -> None:
    before = mb.clock.now
    with pytest.raises(ValueError, match="seconds"):
        mb.clock.advance(seconds)
    assert mb.clock.now == before


async def test_an_advance_of_zero_fires_what_is_due_now(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    producer = await Client.open(mb, "orders")
    mb.clock.advance(5)
    past = int((mb.clock.now - 1) * 1000)
    await producer.send(message("already expired", expires_at_ms=past))
    await producer.send(message("fresh"))
    mb.clock.advance(0)
    assert [m.body for m in mb.queue("orders").peek()] == ["fresh"]


async def test_the_real_clock_is_trio_time_and_refuses_an_advance(autojump_clock: MockClock) -> None:
    async with memory_broker(clock=WallClock(EPOCH)) as mb:
        assert mb.clock.mode == "real"
        await trio.sleep(HOUR)
        assert mb.clock.now == pytest.approx(EPOCH + trio.current_time())
        with pytest.raises(RuntimeError, match="--clock virtual"):
            mb.clock.advance(1)


async def test_an_unknown_clock_mode_is_refused(autojump_clock: MockClock) -> None:
    with pytest.raises(ValueError, match="'sundial' is not one of real, virtual"):
        async with memory_broker(clock_mode="sundial"):
            pass


def guarded_engine(conn_id: int) -> ServerConnection:
    """An engine with a 10 s handshake time-out and a 10 s idle time-out (heartbeats to a peer that asks)."""
    return ServerConnection(offered_capabilities=list(OFFERED_CAPABILITIES), handshake_timeout=10, idle_time_out=10)


async def test_the_timers_that_protect_the_process_stay_on_real_time(autojump_clock: MockClock) -> None:
    """With the virtual clock standing still, a silent socket is still dropped after its handshake time, a silent
    peer after its idle time-out, and a peer that asks for heartbeats gets them."""
    async with memory_broker(clock_mode="virtual", make_engine=guarded_engine, receive_timeout=HOUR) as mb:
        silent = await mb.connect()
        listening = await mb.connect()
        await listening.open(idle_time_out=UInt(4000))
        started = trio.current_time()
        await silent.expect_closed()  # no header sent: the handshake time-out
        assert trio.current_time() - started == pytest.approx(10)
        close = await listening.expect(Close)  # it never sends: its idle time-out (after heartbeats came to it)
        assert close.error is not None
        assert close.error.description == "local-idle-timeout expired"
        assert sum(frame.is_heartbeat for frame in listening.received) >= 2
        assert mb.clock.time() < started + 1  # broker time did not move meanwhile


# -- python-qpid-proton against a threaded broker ---------------------------------------------------------------
@pytest.fixture
def virtual() -> Iterator[ThreadedBroker]:
    config = {"server": {"port": 0}, "broker": {"clock": "virtual", "transaction_timeout": 2 * MINUTE}}
    with run_in_thread(config) as broker:
        yield broker


class CommitAfterTwoMinutes(Scenario, TransactionHandler):  # type: ignore[misc]
    """Declare, send one message in the transaction, advance the broker's clock two minutes, then commit."""

    def __init__(self, broker: ThreadedBroker) -> None:
        super().__init__(broker.url)
        self.broker = broker
        self.outcome: str | None = None
        self.advanced_in: float | None = None

    def setup(self, container: Container) -> None:
        self.conn = self.connect()
        self.sender = container.create_sender(self.conn, "orders")
        container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event: Any) -> None:
        txn: Transaction = event.transaction
        self.sent = txn.send(self.sender, Message(body="staged"))
        self.when(lambda: self.sent.remote_state != 0, lambda: self._advance_then_commit(txn))

    def _advance_then_commit(self, txn: Transaction) -> None:
        started = time.monotonic()
        self.broker.clock.advance(2 * MINUTE)
        self.advanced_in = time.monotonic() - started
        txn.commit()

    def on_transaction_committed(self, event: Any) -> None:
        self._end("committed")

    def on_transaction_commit_failed(self, event: Any) -> None:
        self._end("commit-failed")

    def _end(self, outcome: str) -> None:
        self.outcome = outcome
        self.finish()


def test_proton_a_two_minute_transaction_time_out(virtual: ThreadedBroker) -> None:
    scenario = CommitAfterTwoMinutes(virtual)
    run(scenario)
    assert scenario.outcome == "commit-failed"
    assert scenario.advanced_in is not None
    assert scenario.advanced_in < REAL_BUDGET
    assert virtual.txn_stats.timed_out == 1
    assert queue_depth(virtual, "orders") == 0


def test_proton_a_one_day_ttl_and_an_hour_schedule(virtual: ThreadedBroker) -> None:
    assert virtual.clock.mode == "virtual"
    assert virtual.clock.now == pytest.approx(time.time(), abs=60)
    with blocking_connection(virtual) as conn:
        sender = conn.create_sender("orders")
        sender.send(Message(body="perishable", ttl=DAY))
        sender.send(Message(body="later", annotations={symbol("x-opt-delivery-delay"): int(HOUR * 1000)}))
        assert virtual.queue("orders").stats().ready == 1
        assert virtual.queue("orders").stats().scheduled == 1
        with real_time_under():
            virtual.clock.advance(HOUR)
        assert [m.body for m in virtual.queue("orders").peek()] == ["perishable", "later"]
        with real_time_under():
            virtual.clock.advance(DAY - HOUR)
        receiver = conn.create_receiver("orders")
        assert receiver.receive(timeout=5).body == "later"
        receiver.accept()
    assert virtual.queue("orders").depth == 0


def test_proton_a_real_clock_refuses_an_advance(broker: ThreadedBroker) -> None:
    assert broker.clock.mode == "real"
    assert broker.clock.now == pytest.approx(time.time(), abs=60)
    with pytest.raises(RuntimeError, match="clock is real"):
        broker.clock.advance(1)
    with pytest.raises(RuntimeError):
        broker.clock.advance(-1)  # (the mode is told first)


@pytest.mark.parametrize("clock_mode", ["real", "virtual"])
async def test_a_management_post_runs_at_broker_time_not_at_the_last_event(
    autojump_clock: MockClock, clock_mode: str
) -> None:
    """A message posted through the handle an hour after the last event lives its whole ttl (it used to be timed
    from the last event's instant, and expired at once)."""
    async with memory_broker(clock=WallClock(EPOCH), clock_mode=clock_mode, receive_timeout=2 * DAY) as mb:
        await Client.open(mb, "orders")
        await trio.sleep(HOUR + 100)  # (the idle sweep's rounds, every 150 s, are events too)
        if clock_mode == "virtual":
            mb.clock.advance(HOUR + 100)
        mb.post("orders", message("fresh", ttl_s=MINUTE))
        await trio.testing.wait_all_tasks_blocked()
        assert depth(mb, "orders") == 1
