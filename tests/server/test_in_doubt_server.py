"""Check-back (issue 16 §4) on the server's own timer task: the real connection tasks over memory streams, under
``MockClock(autojump_threshold=0)``, so the broker's clock moves only with trio's and a 60 s immunity and 30 s
intervals pass in no real time. The producer's connection is dropped (its stream closed, no AMQP close). With a
data dir: an in-doubt transaction committed later is journaled like any commit; one never resolved is gone after
a restart (in-doubt transactions live in memory only)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from trio.testing import MockClock

from minibroker.amqp import codec
from minibroker.amqp.definitions import (
    AmqpValue,
    ApplicationProperties,
    Coordinator,
    Declare,
    Disposition,
    Flow,
    Header,
    Source,
    TransactionalState,
    Transfer,
)
from minibroker.amqp.types import Symbol
from minibroker.broker.checkback import CHECK_ADDRESS, CHECK_BACK, CheckBackSettings
from minibroker.broker.core import BrokerSettings
from minibroker.testing import frames
from minibroker.testing.memory import MemoryBroker, MemoryPeer, memory_broker

CONTAINER = "orders-app"


async def lose_a_transaction(mb: MemoryBroker) -> bytes:
    """Declare with check-back, post one durable message to ``q``, drop the connection; the txn-id."""
    producer = await mb.connect()
    await producer.open(container_id=CONTAINER)
    await producer.begin()
    capabilities = [Symbol("amqp:local-transactions"), Symbol(CHECK_BACK)]
    source = Source(outcomes=[Symbol("amqp:accepted:list"), Symbol("amqp:rejected:list")])
    await producer.attach_sender(None, 0, name="ctl", source=source, target=Coordinator(capabilities=capabilities))
    await producer.expect(Flow)
    await producer.transfer(0, 0, frames.message(AmqpValue(Declare())))
    txn_id: bytes = (await producer.expect(Disposition)).state.txn_id
    await producer.attach_sender("q", 1, name="out")
    await producer.expect(Flow)
    message = frames.message("m1", Header(durable=True))
    await producer.transfer(1, 1, message, state=TransactionalState(txn_id=txn_id))
    await producer.expect(Disposition)
    await producer.aclose()
    await mb.settle()
    return txn_id


async def listen(mb: MemoryBroker) -> MemoryPeer:
    peer = await mb.connect()
    await peer.open(container_id=CONTAINER)
    await peer.begin()
    await peer.attach_receiver(CHECK_ADDRESS, 0, name="checks")
    await peer.flow(0, 10)
    return peer


async def next_check(peer: MemoryPeer) -> int:
    frame = await peer.expect_frame(Transfer)
    (props,) = [s for s in codec.decode_all(frame.payload) if isinstance(s, ApplicationProperties)]
    check: int = props.value["check"]
    return check


@pytest.mark.timeout(10)
async def test_checks_then_abandonment_on_the_broker_clock(autojump_clock: MockClock) -> None:
    settings = BrokerSettings(check_back=CheckBackSettings(check_immunity=60, check_interval=30, check_max=2))
    async with memory_broker(settings, receive_timeout=120) as mb:
        lost_at = trio.current_time()
        await lose_a_transaction(mb)
        assert [t.state for t in mb.transactions] == ["in-doubt"]
        peer = await listen(mb)
        assert await next_check(peer) == 1
        assert trio.current_time() - lost_at == pytest.approx(60)
        assert await next_check(peer) == 2
        assert trio.current_time() - lost_at == pytest.approx(90)
        await peer.expect_nothing(29)
        assert [t.state for t in mb.transactions] == ["in-doubt"]
        await trio.sleep(1.5)
        assert mb.transactions == []
        assert mb.txn_stats.abandoned == 1
        assert mb.queue("q").stats().staged == 0


async def test_a_commit_of_an_in_doubt_transaction_is_journaled(tmp_path: Path) -> None:
    async with memory_broker(data_dir=tmp_path) as mb:
        txn_id = await lose_a_transaction(mb)
        assert mb.resolve_transaction(txn_id) == "committed"
        await mb.settle()
    async with memory_broker(data_dir=tmp_path) as mb:
        assert [m.body for m in mb.queue("q").peek()] == ["m1"]


async def test_an_unresolved_in_doubt_transaction_does_not_survive_a_restart(tmp_path: Path) -> None:
    async with memory_broker(data_dir=tmp_path) as mb:
        await lose_a_transaction(mb)
        assert [t.state for t in mb.transactions] == ["in-doubt"]
    async with memory_broker(data_dir=tmp_path) as mb:
        assert mb.transactions == []
        assert mb.queue("q").depth == 0
