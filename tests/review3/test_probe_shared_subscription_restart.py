"""Probe: a shared durable subscription comes back from the journal as not shared (recovery subscribes with
shared=False; the journal does not keep it), so after a restart Qpid JMS cannot unsubscribe a global shared
durable subscription: its null-source attach "sub|global" finds ("", "sub") only when the subscription is shared."""

from __future__ import annotations

from pathlib import Path

from trio.testing import MockClock

from minibroker.amqp.definitions import Detach, Modified, Source, Target
from minibroker.amqp.types import Symbol, UInt
from minibroker.testing.memory import memory_broker
from tests.broker.test_transactions_frames import client

TOPIC = Symbol("topic")


def source() -> Source:
    return Source(
        address="prices",
        durable=UInt(2),
        expiry_policy=Symbol("never"),
        distribution_mode=Symbol("copy"),
        capabilities=[TOPIC, Symbol("shared"), Symbol("global")],
        default_outcome=Modified(delivery_failed=True),
    )


async def unsubscribe_finds_it(mb) -> bool:
    c = await client(mb, "jms-b")
    desired = [Symbol("shared"), Symbol("global")]
    reply = await c.peer.attach_receiver(
        None, 2, "orders|global", source=None, target=Target(), desired_capabilities=desired
    )
    return reply.source is not None


async def test_unsubscribe_a_global_shared_durable_subscription_after_a_restart(
    tmp_path: Path, autojump_clock: MockClock
) -> None:
    async with memory_broker(data_dir=tmp_path, data_sync=False) as mb:
        c = await client(mb, "jms-a")
        await c.receiver("prices", 1, name="orders|global", source=source(), target=Target())
        await c.peer.send(Detach(handle=UInt(1), closed=False))
        await c.peer.expect(Detach)
        (sub,) = mb.topic("prices").subscriptions()
        assert sub.shared
    async with memory_broker(data_dir=tmp_path, data_sync=False) as mb:
        (sub,) = mb.topic("prices").subscriptions()
        assert await unsubscribe_finds_it(mb), "Qpid JMS unsubscribe finds nothing after a restart"
        assert sub.shared, "restored as not shared"
