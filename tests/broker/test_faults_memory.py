"""Fault injection through the trio layer (issue 16 §1): a dropped connection's socket really ends with no close
frame, whichever connection's read caused the drop, and delayed actions run on the broker's timer. The real
connection tasks over memory streams, under a ``MockClock``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio
from trio.testing import MockClock

from minibroker.amqp.definitions import Accepted, Disposition, Flow, Transfer
from minibroker.broker.core import BrokerSettings
from minibroker.testing import frames
from minibroker.testing.memory import MemoryBroker, MemoryPeer, memory_broker


@pytest.fixture
async def mb() -> AsyncIterator[MemoryBroker]:
    async with memory_broker(BrokerSettings(), receive_timeout=5.0) as running:
        yield running


async def opened(mb: MemoryBroker, container: str) -> MemoryPeer:
    peer = await mb.connect()
    await peer.open(container_id=container)
    await peer.begin()
    return peer


async def test_a_drop_caused_by_another_connection_ends_the_socket(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    mb.faults.add("deliver", "drop-connection", container_id="reader")
    reader = await opened(mb, "reader")
    await reader.attach_receiver("q", 0)
    await reader.flow(0, 10, delivery_count=0)
    writer = await opened(mb, "writer")
    await writer.attach_sender("q", 0)
    await writer.expect(Flow)
    await writer.transfer(0, 0, frames.message("m"))
    assert isinstance((await writer.expect(Disposition)).state, Accepted)
    await reader.expect_closed()  # no transfer, no close: the stream just ends
    await mb.settle()
    assert [c.container_id for c in mb.connections] == ["writer"]
    assert mb.queue("q").depth == 1


async def test_a_connection_rule_drops_an_open_connection_at_once(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    peer = await opened(mb, "victim")
    mb.faults.add("connection", "drop")
    await peer.expect_closed()


async def test_a_delivery_delay_runs_on_the_broker_timer(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    mb.faults.add("deliver", "delay", delay=3)
    peer = await opened(mb, "c")
    await peer.attach_sender("q", 0)
    await peer.expect(Flow)
    await peer.transfer(0, 0, frames.message("late"))
    await peer.expect(Disposition)
    await peer.attach_receiver("q", 1)
    start = trio.current_time()
    await peer.flow(1, 1, delivery_count=0)
    transfer = await peer.expect_frame(Transfer)
    assert transfer.payload == frames.message("late")
    assert trio.current_time() - start == pytest.approx(3)  # (under 5 s: the peer's receive timeout)
