"""Probe: names with NUL, non-BMP characters and ~25 kB (the attach must fit max-frame-size) survive restarts
(queue and durable subscription). Passes."""

from __future__ import annotations

from pathlib import Path

from minibroker.amqp.definitions import Accepted, Source
from minibroker.amqp.types import Symbol, UInt
from minibroker.testing.memory import memory_broker
from tests.broker.test_transactions_frames import client
from tests.server.test_durability import answer, durable

QUEUE = "or\x00ders\U0001f600\u2028"
CONTAINER = "c\x00\U0001f600" + "\x00" * 3
LINK = "l\x00\U00010348" + "y" * 25_000


async def test_odd_names_survive_restarts(tmp_path: Path) -> None:
    source = Source(address="topic://t\x00\U0001f600", durable=UInt(2), expiry_policy=Symbol("never"))
    async with memory_broker(data_dir=tmp_path) as mb:
        s = await client(mb, CONTAINER)
        await s.receiver("topic://t\x00\U0001f600", 1, name=LINK, source=source)
        p = await client(mb)
        await p.sender(QUEUE, 0)
        await p.post(0, durable("q"))
        assert isinstance(await answer(p), Accepted)
        await p.sender("topic://t\x00\U0001f600", 2)
        await p.post(2, durable("t"))
        assert isinstance(await answer(p), Accepted)
    for _ in range(2):
        async with memory_broker(data_dir=tmp_path) as mb:
            assert mb.queue(QUEUE).depth == 1
            (sub,) = mb.topic("t\x00\U0001f600").subscriptions()
            assert (sub.container, sub.name) == (CONTAINER, LINK)
            assert sub.depth == 1
