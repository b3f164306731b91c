"""A multi-frame transfer whose frames carry different delivery states, none of them a transactional-state: it is
no transactional work (Part 4 §4.4.1 concerns frames naming transactions), so it is posted as any other."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from trio.testing import MockClock

from minibroker.amqp.definitions import Accepted, AmqpValue, Declare, Declared, Disposition, Flow, Received, Released
from minibroker.amqp.types import UInt
from minibroker.broker.core import BrokerSettings
from minibroker.testing import frames
from minibroker.testing.memory import MemoryBroker, memory_broker
from tests.broker.test_transactions_frames import client


@pytest.fixture
async def mb() -> AsyncIterator[MemoryBroker]:
    async with memory_broker(BrokerSettings(), receive_timeout=5.0) as running:
        yield running


async def test_frames_with_different_plain_states_are_not_a_transaction(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    peer = await mb.connect()
    await peer.open()
    await peer.begin()
    await peer.attach_sender("q", 0)
    await peer.expect(Flow)
    payload = frames.message("split")
    await peer.transfer(0, 0, payload[:4], more=True, state=Received(section_number=UInt(0), section_offset=UInt(0)))
    await peer.transfer(0, None, payload[4:], state=Released())
    answer = await peer.expect(Disposition)
    assert isinstance(answer.state, Accepted), answer
    assert mb.queue("q").depth == 1


async def test_a_declare_whose_frames_carry_different_plain_states_is_declared(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    c = await client(mb)
    await c.coordinator(5)
    payload = frames.message(AmqpValue(Declare()))
    await c.peer.transfer(5, 0, payload[:4], more=True, state=Received(section_number=UInt(0), section_offset=UInt(0)))
    await c.peer.transfer(5, None, payload[4:], state=Released())
    assert isinstance((await c.peer.expect(Disposition)).state, Declared)
