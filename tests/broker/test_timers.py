"""Every message timer runs on trio's clock (DESIGN §3; ``broker/clock.py``): expiry, scheduled delivery and the
redelivery delay, proven over hours of virtual time in milliseconds of real time.

Each test runs the real broker core, engine and connection tasks in memory (``minibroker.testing.memory``)
under ``MockClock(autojump_threshold=0)``: whenever every task is blocked the clock jumps to the next
deadline, so "nothing happens for 599 s, then the message arrives at 600 s" is checked exactly. Wall-clock
fields (absolute-expiry-time, ``x-opt-delivery-time``, ``x-opt-scheduled-enqueue-time``) are mapped onto
trio's clock by the broker's ``WallClock``, set here to a realistic epoch offset.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from minibroker.amqp.definitions import (
    Accepted,
    Attach,
    Disposition,
    Flow,
    Header,
    MessageAnnotations,
    Properties,
    Released,
    Transfer,
)
from minibroker.amqp.types import Long, Symbol, Timestamp, UInt
from minibroker.broker.clock import WallClock
from minibroker.broker.core import BrokerSettings
from minibroker.broker.policy import NodePolicy
from minibroker.broker.views import MessageView, view_message
from minibroker.testing import frames
from minibroker.testing.memory import MemoryBroker, MemoryPeer, memory_broker

EPOCH = 1_700_000_000.0
"""Wall-clock seconds at trio time 0 in these tests (the broker's ``WallClock`` offset)."""
HOUR = 3600.0


def wall_ms(broker_time: float) -> int:
    """The wall-clock instant, in ms, of a broker-clock instant."""
    return int((broker_time + EPOCH) * 1000)


def message(body: str, *, ttl_s: float | None = None, expires_at: float | None = None, **annotations: Any) -> bytes:
    """An encoded message; annotations are given in ms, as the clients send them."""
    sections: list[Any] = []
    if ttl_s is not None:
        sections.append(Header(ttl=UInt(int(ttl_s * 1000))))
    if annotations:
        sections.append(MessageAnnotations({Symbol(k.replace("_", "-")): v for k, v in annotations.items()}))
    if expires_at is not None:
        sections.append(Properties(absolute_expiry_time=Timestamp(wall_ms(expires_at))))
    return frames.message(body, *sections)


class Client:
    """One connection with a producer link (handle 0) and, on demand, a consumer link (handle 1)."""

    def __init__(self, peer: MemoryPeer) -> None:
        self.peer = peer
        self._next_id = 0

    async def send(self, payload: bytes) -> None:
        """Send one message on the producer link; the broker must accept it."""
        await self.peer.transfer(0, self._next_id, payload)
        self._next_id += 1
        outcome = await self.peer.expect(Disposition)
        assert isinstance(outcome.state, Accepted)

    async def consume(self, address: str, credit: int = 10) -> Attach:
        """Attach a consumer link from ``address`` and grant it credit."""
        attach = await self.peer.attach_receiver(address, handle=1, name=f"consumer-{address}")
        await self.peer.flow(handle=1, link_credit=credit, delivery_count=0)
        return attach

    async def receive(self) -> tuple[int, MessageView]:
        """The next delivery: its id and the message."""
        frame = await self.peer.expect_frame(Transfer)
        transfer: Transfer = frame.performative
        assert transfer.delivery_id is not None
        return int(transfer.delivery_id), view_message(frame.payload)


@pytest.fixture
def settings() -> BrokerSettings:
    return BrokerSettings()


@pytest.fixture
async def mb(settings: BrokerSettings) -> AsyncIterator[MemoryBroker]:
    # virtual seconds: long enough for ``expect_nothing(HOUR)``; pytest-timeout bounds the real time
    async with memory_broker(settings, receive_timeout=3 * HOUR, clock=WallClock(EPOCH)) as running:
        yield running


async def client(mb: MemoryBroker, address: str) -> Client:
    peer = await mb.connect()
    await peer.open()
    await peer.begin()
    await peer.attach_sender(address, handle=0, name=f"producer-{address}")
    await peer.expect(Flow)
    return Client(peer)


def counts(mb: MemoryBroker, name: str) -> tuple[int, int, int]:
    """(ready, acquired, scheduled) of queue ``name``; zeros when it does not exist."""
    stats = mb.queue(name).stats()
    return (stats.ready, stats.acquired, stats.scheduled)


async def sleep_until(moment: float) -> None:
    await trio.sleep_until(moment)
    await trio.testing.wait_all_tasks_blocked()  # timers due at ``moment`` have run


# -- expiry ----------------------------------------------------------------------------------------------------
EXPIRY_AT_ONE_HOUR: dict[str, dict[str, float]] = {
    "ttl": {"ttl_s": HOUR},
    "absolute-expiry-time": {"expires_at": HOUR},
    "both, ttl first": {"ttl_s": HOUR, "expires_at": 2 * HOUR},
    "both, absolute first": {"ttl_s": 2 * HOUR, "expires_at": HOUR},
}


@pytest.mark.parametrize(
    "settings", [BrokerSettings(node_defaults=NodePolicy(expiry_address="expired"))], ids=["expiry_address"]
)
@pytest.mark.parametrize("expiry", EXPIRY_AT_ONE_HOUR)
async def test_message_expires_after_an_hour(mb: MemoryBroker, autojump_clock: MockClock, expiry: str) -> None:
    producer = await client(mb, "orders")
    await producer.send(message("perishable", **EXPIRY_AT_ONE_HOUR[expiry]))
    await producer.send(message("durable goods"))
    await sleep_until(HOUR - 1)
    assert counts(mb, "orders") == (2, 0, 0)
    assert counts(mb, "expired") == (0, 0, 0)
    await sleep_until(HOUR)
    assert counts(mb, "orders") == (1, 0, 0)
    assert counts(mb, "expired") == (1, 0, 0)

    consumer = await client(mb, "elsewhere")
    await consumer.consume("orders")
    assert (await consumer.receive())[1].body == "durable goods"
    await consumer.peer.expect_nothing(10)
    expired = mb.queue("expired").peek()[0]
    assert expired.annotations == {Symbol("x-opt-original-address"): "orders"}


async def test_expired_message_is_dropped_without_an_expiry_address(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    producer = await client(mb, "orders")
    await producer.send(message("perishable", ttl_s=HOUR))
    await sleep_until(HOUR)
    assert counts(mb, "orders") == (0, 0, 0)
    assert set(mb.queues) == {"orders"}


# -- scheduled delivery ------------------------------------------------------------------------------------
TEN_MINUTES = 600.0
SCHEDULES: dict[str, dict[str, Any]] = {
    "x-opt-delivery-delay": {"x_opt_delivery_delay": Long(int(TEN_MINUTES * 1000))},
    "x-opt-delivery-time": {"x_opt_delivery_time": Long(wall_ms(TEN_MINUTES))},
    "x-opt-delivery-time as timestamp": {"x_opt_delivery_time": Timestamp(wall_ms(TEN_MINUTES))},
    "x-opt-scheduled-enqueue-time": {"x_opt_scheduled_enqueue_time": Timestamp(wall_ms(TEN_MINUTES))},
}


@pytest.mark.parametrize("schedule", SCHEDULES)
async def test_scheduled_message_becomes_visible_after_ten_minutes(
    mb: MemoryBroker, autojump_clock: MockClock, schedule: str
) -> None:
    producer = await client(mb, "later")
    await producer.consume("later")
    await producer.send(message("scheduled", **SCHEDULES[schedule]))
    assert counts(mb, "later") == (0, 0, 1)
    await producer.peer.expect_nothing(TEN_MINUTES - 1)
    _, got = await producer.receive()
    assert trio.current_time() == pytest.approx(TEN_MINUTES)
    assert got.body == "scheduled"
    assert counts(mb, "later") == (0, 1, 0)


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan"), 1e300])
async def test_a_non_finite_or_absurd_delivery_time_is_ignored(
    mb: MemoryBroker, autojump_clock: MockClock, value: float
) -> None:
    producer = await client(mb, "later")
    await producer.send(message("now", x_opt_delivery_delay=value))
    assert counts(mb, "later") == (1, 0, 0)  # ready at once, not scheduled


async def test_an_earlier_deadline_rearms_the_timer(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    """A timer already waiting for a far deadline (a one-hour ttl) must wake for a nearer one added later."""
    producer = await client(mb, "later")
    await producer.consume("later")
    await producer.send(message("far", x_opt_delivery_delay=Long(int(HOUR * 1000))))
    await producer.send(message("near", x_opt_delivery_delay=Long(10_000)))
    _, got = await producer.receive()
    assert got.body == "near"
    assert trio.current_time() == pytest.approx(10)
    await producer.peer.expect_nothing(HOUR - 11)
    _, got = await producer.receive()
    assert got.body == "far"
    assert trio.current_time() == pytest.approx(HOUR)


async def test_scheduled_message_that_expires_first_is_never_delivered(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    producer = await client(mb, "later")
    await producer.consume("later")
    await producer.send(message("too late", ttl_s=60, x_opt_delivery_delay=Long(120_000)))
    await producer.peer.expect_nothing(HOUR)
    assert counts(mb, "later") == (0, 0, 0)


# -- redelivery delay --------------------------------------------------------------------------------------
@pytest.mark.parametrize("settings", [BrokerSettings(node_defaults=NodePolicy(redelivery_delay=30))], ids=["30s"])
async def test_released_message_waits_out_the_redelivery_delay(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    producer = await client(mb, "retry")
    await producer.send(message("again"))
    await producer.consume("retry")
    delivery_id, got = await producer.receive()
    assert got.body == "again"
    released_at = trio.current_time()
    await producer.peer.disposition(delivery_id, state=Released())
    await mb.settle()
    assert counts(mb, "retry") == (0, 0, 1)  # held back, not ready
    await producer.peer.expect_nothing(29)
    delivery_id, got = await producer.receive()
    assert trio.current_time() - released_at == pytest.approx(30)
    assert got.body == "again"
    await producer.peer.disposition(delivery_id, state=Accepted())
    await mb.settle()
    assert counts(mb, "retry") == (0, 0, 0)


@pytest.mark.parametrize(
    "settings",
    [BrokerSettings(node_defaults=NodePolicy(redelivery_delay=30, expiry_address="expired"))],
    ids=["30s"],
)
async def test_message_expiring_during_its_redelivery_delay_is_not_redelivered(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    producer = await client(mb, "retry")
    await producer.send(message("brief", ttl_s=10))
    await producer.consume("retry")
    delivery_id, _ = await producer.receive()
    await producer.peer.disposition(delivery_id, state=Released())
    await producer.peer.expect_nothing(HOUR)
    assert counts(mb, "retry") == (0, 0, 0)
    assert counts(mb, "expired") == (1, 0, 0)
