"""Durability probe of the queue's departure callback (``Queue.on_departure``, the journal's SETTLE records):
each way a journaled message leaves a queue for good is written down, and each way it stays is not, as a
restart on the same data dir shows (Part 3 §3.4 outcomes; Part 4 §4.4.2 a rolled-back acquisition)."""

from __future__ import annotations

from pathlib import Path

from trio.testing import MockClock

from minibroker.amqp.definitions import Accepted, Modified, Rejected, Released, Source, TransactionalState
from minibroker.amqp.types import Symbol, UInt
from minibroker.broker.core import BrokerSettings
from minibroker.broker.policy import NodePolicy
from minibroker.testing.memory import MemoryBroker, memory_broker
from tests.broker.test_transactions_frames import Client, client
from tests.server.test_durability import answer, durable, stored_payloads

QUEUE_KEY = ("default", "queue", "orders")
PURGED_KEY = ("default", "queue", "purged")


async def test_each_departure_is_journaled_and_nothing_else(tmp_path: Path, autojump_clock: MockClock) -> None:
    async with memory_broker(data_dir=tmp_path, data_sync=False) as mb:
        c = await client(mb)
        await c.sender("orders", 0)
        await c.sender("purged", 1)
        for i in range(7):
            await c.post(0, durable(f"m{i}"))
            assert isinstance(await answer(c), Accepted)
        for i in range(2):
            await c.post(1, durable(f"p{i}"))
            assert isinstance(await answer(c), Accepted)
        await c.coordinator(5)
        await c.receiver("orders", 2)
        await c.credit(2, 7)
        got = await c.take(7)
        ids = [int(f.performative.delivery_id) for f in got]
        outcomes = [
            Accepted(),
            Rejected(),
            Modified(delivery_failed=True),
            Released(),
            Modified(delivery_failed=True, undeliverable_here=True),
        ]
        for delivery_id, outcome in zip(ids, outcomes, strict=False):
            await c.peer.disposition(delivery_id, state=outcome)
        await mb.settle()
        txn = await c.declare(5)
        await c.peer.disposition(ids[5], state=TransactionalState(txn_id=txn, outcome=Accepted()))
        await c.discharge(txn, fail=True, handle=5)  # the acceptance rolls back: m5 stays
        await mb.settle()
        txn = await c.declare(5)
        await c.peer.disposition(ids[6], state=TransactionalState(txn_id=txn, outcome=Accepted()))
        await c.discharge(txn, handle=5)  # committed: m6 goes
        await mb.settle()
        assert mb.queue("purged").purge() == 2
        await mb.settle()
        await c.peer.expect_nothing()
    kept = stored_payloads(tmp_path)
    assert kept == [durable(f"m{i}") for i in (2, 3, 4, 5)]
    assert stored_payloads(tmp_path, PURGED_KEY) == []
    (dead,) = stored_payloads(tmp_path, ("default", "queue", "orders.DLQ"))  # the rejected one moved
    assert dead.endswith(durable("m1")[-7:])
    async with memory_broker(data_dir=tmp_path, data_sync=False) as mb:
        assert mb.writer is not None
        counts = sorted(m.delivery_count for m in mb.writer.journal.state.messages[QUEUE_KEY].values())
        assert counts == [0, 0, 1, 1]
        assert mb.queue("orders.DLQ").depth == 1
        # the recovered queue reports departures too: one accepted after the restart stays gone
        c = await client(mb)
        await c.receiver("orders", 2)
        await c.credit(2, 1)
        (first,) = await c.take(1)
        await c.peer.disposition(int(first.performative.delivery_id), state=Accepted())
        await mb.settle()
        await c.peer.expect_nothing()
    assert len(stored_payloads(tmp_path)) == 3


async def test_a_recovered_durable_subscription_journals_what_leaves_it(
    tmp_path: Path, autojump_clock: MockClock
) -> None:
    source = Source(address="topic://news", durable=UInt(2), expiry_policy=Symbol("never"))

    async def subscriber(mb: MemoryBroker) -> Client:
        c = await client(mb, "subscriber-app")
        await c.receiver("topic://news", 1, name="sub", source=source)
        return c

    async with memory_broker(data_dir=tmp_path, data_sync=False) as mb:
        c = await subscriber(mb)
        p = await client(mb, "publisher")
        await p.sender("topic://news", 0)
        for i in range(2):
            await p.post(0, durable(f"n{i}"))
            assert isinstance(await answer(p), Accepted)
    async with memory_broker(data_dir=tmp_path, data_sync=False) as mb:
        c = await subscriber(mb)
        await c.credit(1, 1)
        (first,) = await c.take(1)
        await c.peer.disposition(int(first.performative.delivery_id), state=Accepted())
        await mb.settle()
        await c.peer.expect_nothing()
    async with memory_broker(data_dir=tmp_path, data_sync=False) as mb:
        assert mb.topics == ["news"]
        (stats,) = mb.topic("news").subscriptions()
        assert (stats.durable, stats.ready) == (True, 1)  # the one accepted after the first restart stays gone


async def test_a_message_dead_lettered_after_its_last_failed_delivery_moves_in_the_journal(
    tmp_path: Path, autojump_clock: MockClock
) -> None:
    settings = BrokerSettings(node_defaults=NodePolicy(max_delivery_attempts=2))
    async with memory_broker(settings, data_dir=tmp_path, data_sync=False) as mb:
        c = await client(mb)
        await c.sender("orders", 0)
        await c.post(0, durable("failing"))
        assert isinstance(await answer(c), Accepted)
        await c.receiver("orders", 2)
        await c.credit(2, 5)
        for _ in range(2):
            (frame,) = await c.take(1)
            await c.peer.disposition(int(frame.performative.delivery_id), state=Modified(delivery_failed=True))
        await mb.settle()
        await c.peer.expect_nothing()
        assert (mb.queue("orders").depth, mb.queue("orders.DLQ").depth) == (0, 1)
    assert stored_payloads(tmp_path) == []
    (dead,) = stored_payloads(tmp_path, ("default", "queue", "orders.DLQ"))
    assert dead.endswith(durable("failing")[-12:])
