"""Probe of issue 19's topic count fix (1d4023a: ``Dispatcher._published``): every way a message is published to a
topic counts once in ``minibroker_topic_messages_in_total`` (and so in the idle sweep's ``_use_mark``), as each
did before the fix -- a plain transfer, a commit's post, and a post with no link (the management API's
``Broker.post``, Service Bus batches: ``Dispatcher.inject``), which asks ``targets`` and not ``_published``."""

from __future__ import annotations

import pytest
from trio.testing import MockClock

from minibroker.amqp.definitions import Accepted, Properties, Rejected
from minibroker.broker.core import BrokerSettings
from minibroker.broker.policy import NodePolicy
from minibroker.testing import frames
from minibroker.testing.memory import memory_broker
from tests.broker.test_transactions_frames import client
from tests.http.test_metrics import answer, one, page

pytestmark = pytest.mark.timeout(60)


async def test_a_topic_counts_a_management_post(autojump_clock: MockClock) -> None:
    """A message posted to a topic through the management API (``Broker.post``) is published there: counted once,
    as it was before 1d4023a (Topic.publish counted it), alongside one plain and one committed post."""
    async with memory_broker() as mb:
        c = await client(mb, "poster")
        await c.coordinator()
        await c.receiver("topic://news", 1)
        await c.sender("topic://news", 2)
        await c.post(2, frames.message("plain", Properties(to="news")))
        assert isinstance(await answer(c), Accepted)
        txn = await c.declare()
        await c.post(2, frames.message("staged", Properties(to="news")), txn=txn)
        await answer(c)
        assert await c.discharge(txn) == Accepted()
        assert mb.broker.post(mb.broker.default, "news", frames.message("injected")) is None
        await mb.settle()
        assert one(page(mb), "minibroker_topic_messages_in_total", namespace="default", topic="news") == 3


async def test_a_topic_counts_a_dead_letter_once(autojump_clock: MockClock) -> None:
    """A message rejected on a queue whose dead-letter address is a topic is published to that topic: counted once
    (``_dead_letter`` posts it), and a rolled-back transactional post to the topic not at all."""
    settings = BrokerSettings(queues={"work": NodePolicy(dead_letter_address="news")}, topics={"news": NodePolicy()})
    async with memory_broker(settings) as mb:
        c = await client(mb, "poster")
        await c.coordinator()
        await c.receiver("topic://news", 1)
        await c.sender("work", 2)
        await c.post(2, frames.message("bad"))
        assert isinstance(await answer(c), Accepted)
        await c.receiver("work", 3)
        await c.credit(3, 1)
        (taken,) = await c.take(1)
        await c.peer.disposition(taken.performative.delivery_id, state=Rejected())
        await c.sender("topic://news", 4)
        txn = await c.declare()
        await c.post(4, frames.message("never"), txn=txn)
        await answer(c)
        assert await c.discharge(txn, fail=True) == Accepted()
        await mb.settle()
        assert one(page(mb), "minibroker_topic_messages_in_total", namespace="default", topic="news") == 1
