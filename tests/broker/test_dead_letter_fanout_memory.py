"""Probe: fan-out amplification comes back through dead-lettering. One publish to a topic with N subscriptions
shares one payload (issue 12, item 5); one disposition frame rejecting the N deliveries makes N dead-letter copies,
each a full copy of the payload (in memory, and in the journal for a durable message), all with the same
annotations."""

from __future__ import annotations

from pathlib import Path

from trio.testing import MockClock

from minibroker.amqp.definitions import Accepted, Rejected, Source
from minibroker.amqp.types import Symbol, UInt
from minibroker.testing.memory import memory_broker
from tests.broker.test_transactions_frames import client
from tests.server.test_durability import durable

N = 200
BODY = "x" * 60_000


async def test_rejecting_a_fanned_out_message_does_not_multiply_it(tmp_path: Path, autojump_clock: MockClock) -> None:
    async with memory_broker(data_dir=tmp_path, data_sync=False) as mb:
        assert mb.writer is not None
        c = await client(mb, "attacker")
        source = Source(address="topic://prices", durable=UInt(2), expiry_policy=Symbol("never"))
        for handle in range(1, N + 1):
            await c.receiver("topic://prices", handle, name=f"sub-{handle}", source=source)
            await c.credit(handle, 1)
        await c.sender("topic://prices", 0)
        before = sum(p.stat().st_size for p in mb.writer.journal.segments())
        await c.post(0, durable(BODY))
        deliveries = []
        accepted = False
        while len(deliveries) < N or not accepted:
            frame = await c.peer.receive()
            name = type(frame.performative).__name__
            if name == "Transfer":
                deliveries.append(frame.performative.delivery_id)
            elif name == "Disposition" and isinstance(frame.performative.state, Accepted):
                accepted = True
        published = sum(p.stat().st_size for p in mb.writer.journal.segments()) - before
        await c.peer.disposition(min(deliveries), max(deliveries), state=Rejected())  # one frame
        await c.peer.expect_nothing(0.1)
        dlq = mb.broker.queues.get("prices.DLQ")
        grown = sum(p.stat().st_size for p in mb.writer.journal.segments()) - before - published
        distinct = len({id(m.payload) for m in dlq.ready}) if dlq else 0
        print(f"publish journaled {published} B; the rejection journaled {grown} B; {distinct} distinct DLQ payloads")
        assert grown < 4 * len(BODY), f"{grown} bytes of journal for one disposition frame"
        assert distinct <= 1
