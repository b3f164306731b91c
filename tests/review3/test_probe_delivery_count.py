"""Probe: delivery-count 0xFFFFFFFF through the paths that count a failed delivery, journaled, and after restart."""

from __future__ import annotations

from pathlib import Path

from trio.testing import MockClock

from minibroker.amqp.definitions import Accepted, Header, Modified, Source
from minibroker.amqp.types import UInt
from minibroker.broker.policy import NodePolicy
from minibroker.broker.settings import BrokerSettings
from minibroker.testing import frames
from minibroker.testing.memory import memory_broker
from tests.broker.test_transactions_frames import client, header
from tests.server.test_durability import answer

MAX = 0xFFFFFFFF


def msg(body: str) -> bytes:
    return frames.message(body, Header(durable=True, delivery_count=UInt(MAX)))


async def test_saturated_count_journaled_and_restored(tmp_path: Path, autojump_clock: MockClock) -> None:
    settings = BrokerSettings(node_defaults=NodePolicy(max_delivery_attempts=0), transaction_timeout=5)
    async with memory_broker(settings, data_dir=tmp_path, data_sync=False) as mb:
        c = await client(mb)
        await c.sender("orders", 0)
        for i in range(3):
            await c.post(0, msg(f"m{i}"))
            assert isinstance(await answer(c), Accepted)
        # 1: modified(delivery-failed)
        await c.receiver("orders", 1)
        await c.credit(1, 1)
        (f,) = await c.take(1)
        assert header(f.payload).delivery_count == MAX
        await c.peer.disposition(f.performative.delivery_id, settled=True, state=Modified(delivery_failed=True))
        # 3: link loss with default outcome modified(delivery-failed)
        c3 = await client(mb)
        await c3.receiver("orders", 1, source=Source(address="orders", default_outcome=Modified(delivery_failed=True)))
        await c3.credit(1, 3)
        got = await c3.take(3)
        await c3.peer.aclose()
        await c.peer.expect_nothing(1)
        assert mb.broker.internal_errors == 0
        assert mb.queue("orders").depth == 3
    async with memory_broker(settings, data_dir=tmp_path, data_sync=False) as mb:
        c = await client(mb)
        await c.receiver("orders", 1)
        await c.credit(1, 3)
        got = await c.take(3)
        assert [header(f.payload).delivery_count for f in got] == [MAX] * 3
        assert mb.broker.internal_errors == 0
