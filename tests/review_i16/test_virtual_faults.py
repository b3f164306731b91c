"""Review of issue 16: fault delays and connection closes on the virtual clock, through the real connection tasks
(memory streams) under ``MockClock(autojump_threshold=0)``: nothing moves by itself, an advance fires them."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
import trio.lowlevel
from trio.testing import MockClock

from minibroker.amqp.definitions import Accepted, Close, Disposition
from minibroker.broker.clock import WallClock
from minibroker.broker.core import BrokerSettings
from minibroker.testing.memory import MemoryBroker, memory_broker
from tests.server.test_virtual_clock import DAY, EPOCH, Client, message


@pytest.fixture
async def mb() -> AsyncIterator[MemoryBroker]:
    async with memory_broker(
        BrokerSettings(), clock=WallClock(EPOCH), clock_mode="virtual", receive_timeout=2 * DAY
    ) as mb:
        yield mb


async def test_a_transfer_delay_waits_for_virtual_time(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    """A ``transfer`` ``delay`` of 10 s: a day of trio time passes and the message is still not taken; an advance
    of 10 s takes it (accepted) and queues it."""
    mb.faults.add("transfer", "delay", delay=10, address="orders")
    producer = await Client.open(mb, "orders")
    await producer.peer.transfer(0, 0, message("late"))
    await producer.peer.expect_nothing(DAY)
    assert mb.queue("orders").depth == 0
    mb.clock.advance(9.5)
    await mb.settle()
    assert mb.queue("orders").depth == 0
    mb.clock.advance(0.5)
    assert isinstance((await producer.peer.expect(Disposition)).state, Accepted)
    assert mb.queue("orders").depth == 1
    assert mb.broker.internal_errors == 0


async def test_a_delayed_connection_close_waits_for_virtual_time(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    """``connection`` ``close`` after ``delay`` 30 s is a broker timer too: it waits for an advance."""
    mb.faults.add("connection", "close", delay=30, condition="amqp:connection:forced")
    producer = await Client.open(mb, "orders")
    await producer.peer.expect_nothing(DAY)
    mb.clock.advance(30)
    close = await producer.peer.expect(Close)
    assert close.error is not None
    assert str(close.error.condition) == "amqp:connection:forced"
    assert mb.broker.internal_errors == 0


@pytest.mark.parametrize("seconds", [math.nan, math.inf, -math.inf, 1e300, "1", True, None])
async def test_a_bad_advance_is_refused_and_changes_nothing(
    mb: MemoryBroker, autojump_clock: MockClock, seconds: Any
) -> None:
    """NaN, infinities, absurd sizes and non-numbers: ValueError, and the clock did not move."""
    before = mb.clock.now
    with pytest.raises(ValueError, match="seconds: "):
        mb.clock.advance(seconds)
    assert mb.clock.now == before
    await trio.lowlevel.checkpoint()
