"""Durability of a running broker (memory harness with a data dir): a full disk refuses durable work with
amqp:resource-limit-exceeded and serves everything else, then resumes by itself; compaction on a full disk
does not stop anything; expiry and delivery times survive a restart; names with NULs survive a restart; a
publish to many durable subscriptions journals its payload once.

Issue 12: items 5 (journal side), 9, 11, 12.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import trio
from trio.testing import MockClock

from minibroker.amqp.definitions import (
    Accepted,
    Disposition,
    Header,
    MessageAnnotations,
    Properties,
    Rejected,
    Source,
    TransactionalState,
)
from minibroker.amqp.errors import Condition
from minibroker.amqp.types import Long, Symbol, Timestamp, UInt
from minibroker.broker.clock import WallClock
from minibroker.testing import frames
from minibroker.testing.memory import MemoryBroker, memory_broker
from tests.broker.test_transactions_frames import Client, client
from tests.store.test_journal_faults import Disk

QUEUE_KEY = ("default", "queue", "orders")
CONTROLLER = 5
EPOCH = 1_700_000_000.0


def durable(body: str, *sections: Any, ttl: int | None = None) -> bytes:
    header = Header(durable=True, ttl=UInt(ttl) if ttl is not None else None)
    return frames.message(body, header, *sections)


async def answer(c: Client) -> Any:
    """The state of the next disposition (deliveries to a consumer of the same connection are skipped)."""
    while True:
        performative = (await c.peer.receive()).performative
        if isinstance(performative, Disposition):
            return performative.state


def refused_for_disk(state: Any) -> bool:
    return (
        isinstance(state, Rejected)
        and state.error is not None
        and str(state.error.condition) == Condition.RESOURCE_LIMIT_EXCEEDED.value
    )


async def until(predicate: Any) -> None:
    """Poll ``predicate`` (broker state changed by tasks of its own: the journal writer) for up to 5 s."""
    with trio.fail_after(5):
        while not predicate():  # noqa: ASYNC110 - nothing to wait on: the writer changes it in its own time
            await trio.sleep(0.01)


def stored_payloads(path: Path, key: tuple[str, ...] = QUEUE_KEY) -> list[bytes]:
    from minibroker.store.journal import Journal

    journal = Journal(path)
    try:
        journal.recover()
        assert journal.quarantined == [], "a half-written record was found"
        return [m.payload for _, m in sorted(journal.state.messages.get(key, {}).items())]
    finally:
        journal.close()


# -- item 9: a full disk ---------------------------------------------------------------------------------------
async def test_a_full_disk_refuses_durable_work_serves_the_rest_and_resumes(tmp_path: Path) -> None:
    async with memory_broker(data_dir=tmp_path) as mb:
        assert mb.writer is not None
        mb.writer.retry_interval = 0.02
        disk = Disk()
        mb.writer.journal.ops = disk
        c = await client(mb)
        await c.sender("orders", 0)
        for i in range(3):
            await c.post(0, durable(f"kept-{i}"))
            assert isinstance(await answer(c), Accepted)

        disk.room = 0  # the disk is full from now on
        await c.post(0, durable("refused-when-it-filled"))  # its write fails: taken back, refused
        assert refused_for_disk(await answer(c))
        await c.post(0, durable("refused-while-full"))  # refused before it is written
        assert refused_for_disk(await answer(c))
        await c.post(0, durable("pre-settled-while-full"), settled=True)  # no answer: dropped, not queued
        await c.post(0, frames.message("not durable"))  # everything else is served
        assert isinstance(await answer(c), Accepted)
        queue = mb.queue("orders")
        assert queue.depth == 4  # kept-0..2 and "not durable": nothing the journal did not take
        await c.receiver("topic://ticker", 3)  # a non-durable subscription keeps nothing in the journal ...
        await c.sender("topic://ticker", 4)
        await c.post(4, durable("durable, to a non-durable subscription"))
        assert isinstance(await answer(c), Accepted)  # ... so it takes durable messages as ever

        # a transaction with durable work: its post is refused, so is its commit
        await c.coordinator(CONTROLLER)
        txn = await c.declare(CONTROLLER)
        await c.post(0, durable("in-a-transaction"), txn=txn)
        provisional = await answer(c)
        assert isinstance(provisional, TransactionalState)
        assert refused_for_disk(provisional.outcome)
        assert not isinstance(await c.discharge(txn, handle=CONTROLLER), Accepted)
        txn = await c.declare(CONTROLLER)  # one without durable work commits
        await c.post(0, frames.message("not durable, in a transaction"), txn=txn)
        assert isinstance(await answer(c), TransactionalState)
        assert isinstance(await c.discharge(txn, handle=CONTROLLER), Accepted)

        # consumers are served; their settlements wait for the disk, in order
        await c.receiver("orders", 2)
        await c.credit(2, 10)
        received = [frame.payload for frame in await c.take(5)]
        assert received[0] == durable("kept-0")
        await c.peer.disposition(0, settled=True, state=Accepted())  # the consumer takes kept-0
        await until(lambda: queue.acquired == 4)

        disk.room = None  # space is back: the broker writes again by itself
        await until(lambda: mb.writer is not None and mb.writer.accepting and mb.writer.failed_since is None)
        await c.post(0, durable("after"))
        assert isinstance(await answer(c), Accepted)

    # after a restart: exactly what was acknowledged, less what was consumed; no half record anywhere
    assert stored_payloads(tmp_path) == [durable("kept-1"), durable("kept-2"), durable("after")]


async def test_compaction_on_a_full_disk_does_not_stop_the_broker(tmp_path: Path) -> None:
    class SnapshotsFail(Disk):
        """Writes to a new segment (a compaction's snapshot) fail; the journal's own writes go through."""

        def __init__(self) -> None:
            super().__init__()
            self.fail = True
            self.snapshots: set[int] = set()
            self.attempts = 0

        def open(self, path: Path, flags: int, mode: int = 0o644) -> int:
            fd = super().open(path, flags, mode)
            if str(path).endswith(".tmp"):
                self.snapshots.add(fd)
                self.attempts += 1
            else:
                self.snapshots.discard(fd)
            return fd

        def write(self, fd: int, data: memoryview) -> int:
            if self.fail and fd in self.snapshots:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return super().write(fd, data)

    async with memory_broker(data_dir=tmp_path) as mb:
        assert mb.writer is not None
        journal = mb.writer.journal
        disk = SnapshotsFail()
        journal.ops = disk
        journal.compact_at = 1
        c = await client(mb)
        await c.sender("orders", 0)
        await c.sender("kept", 1)
        await c.receiver("orders", 2)
        for i in range(20):  # consumed at once: the journal outgrows its live content
            await c.post(0, durable(f"m{i}", MessageAnnotations({Symbol("pad"): "x" * 500})))
            assert isinstance(await answer(c), Accepted)
        await c.credit(2, 20)
        await c.take(20)
        await c.peer.disposition(0, 19, settled=True, state=Accepted())
        await c.post(1, durable("kept-0"))  # its fsync is followed by a compaction, which fails
        assert isinstance(await answer(c), Accepted)
        await until(lambda: disk.attempts > 0)
        first = journal.segments()
        assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
        disk.fail = False
        consumed = 20
        while journal.segments() == first:  # the broker goes on; once the journal grew again, compaction works
            assert consumed < 200, "compaction was not tried again"
            await c.post(0, durable(f"m{consumed}", MessageAnnotations({Symbol("pad"): "x" * 500})))
            assert isinstance(await answer(c), Accepted)
            await c.credit(2, 1)
            await c.take(1)
            await c.peer.disposition(consumed, settled=True, state=Accepted())
            consumed += 1
            await trio.sleep(0.01)
        assert disk.attempts >= 2
        for i in range(1, 10):
            await c.post(1, durable(f"kept-{i}"))
            assert isinstance(await answer(c), Accepted)
    assert stored_payloads(tmp_path, ("default", "queue", "kept")) == [durable(f"kept-{i}") for i in range(10)]
    assert stored_payloads(tmp_path) == []


# -- item 12: expiry and delivery times survive a restart ------------------------------------------------------
def _wall_ms(trio_time: float) -> int:
    return int((trio_time + EPOCH) * 1000)


async def test_expiry_and_scheduling_survive_a_restart(tmp_path: Path, autojump_clock: MockClock) -> None:
    """The broker stops, 200 s pass, it starts again: what expired meanwhile is not delivered and leaves the
    journal; a scheduled message still waits for its time; one that expires while it waits leaves the journal
    at its delivery time."""
    async with memory_broker(data_dir=tmp_path, data_sync=False, clock=WallClock(EPOCH)) as mb:
        c = await client(mb)
        await c.sender("orders", 0)
        now = trio.current_time()
        sent = {
            "plain": durable("plain"),
            "ttl": durable("ttl", ttl=60_000),
            "absolute": durable("absolute", Properties(absolute_expiry_time=Timestamp(_wall_ms(now + 120)))),
            "scheduled": durable(
                "scheduled", MessageAnnotations({Symbol("x-opt-delivery-time"): Long(_wall_ms(now + 600))})
            ),
            "scheduled-expiring": durable(
                "scheduled-expiring",
                MessageAnnotations({Symbol("x-opt-delivery-time"): Long(_wall_ms(now + 600))}),
                ttl=300_000,
            ),
        }
        for payload in sent.values():
            await c.post(0, payload)
            assert isinstance(await answer(c), Accepted)

    # 200 s later (wall clock), the broker starts again
    later = WallClock(EPOCH + 200)
    async with memory_broker(data_dir=tmp_path, data_sync=False, clock=later, receive_timeout=1000) as mb:
        assert mb.writer is not None
        journal = mb.writer.journal
        queue = mb.queue("orders").stats()
        assert (queue.depth, queue.scheduled) == (1, 2)
        kept = {m.payload for m in journal.state.messages[QUEUE_KEY].values()}
        assert kept == {sent["plain"], sent["scheduled"], sent["scheduled-expiring"]}  # the expired ones left
        c = await client(mb)
        await c.receiver("orders", 2)
        await c.credit(2, 10)
        (first,) = await c.take(1)
        assert first.payload == sent["plain"]
        await c.peer.expect_nothing(now + 399 - trio.current_time())  # its time is 400 s after it was sent here
        (due,) = await c.take(1)
        assert due.payload == sent["scheduled"]
        assert trio.current_time() >= now + 400
        await c.peer.expect_nothing(100)  # the one that expired while it waited never comes
        kept = {m.payload for m in journal.state.messages[QUEUE_KEY].values()}
        assert kept == {sent["plain"], sent["scheduled"]}  # ... and has left the journal


# -- item 11: names with NULs survive a restart -----------------------------------------------------------------
CONTAINER = "app\x00one"
LINK = "sub\x00scriber\x00\x00x"


async def _durable_subscriber(mb: MemoryBroker, handle: int = 1, link: str = LINK) -> Client:
    c = await client(mb, CONTAINER)
    source = Source(address="topic://news", durable=UInt(2), expiry_policy=Symbol("never"))
    await c.receiver("topic://news", handle, name=link, source=source)
    return c


async def test_a_durable_subscription_named_with_nuls_survives_restarts(tmp_path: Path) -> None:
    async with memory_broker(data_dir=tmp_path) as mb:
        await _durable_subscriber(mb)
        producer = await client(mb)
        await producer.sender("topic://news", 0)
        await producer.post(0, durable("news"))
        assert isinstance(await answer(producer), Accepted)
    for _ in range(2):  # every later start works too
        async with memory_broker(data_dir=tmp_path) as mb:
            (subscription,) = mb.topic("news").subscriptions()
            assert (subscription.container, subscription.name) == (CONTAINER, LINK)
            assert subscription.depth == 1
    async with memory_broker(data_dir=tmp_path) as mb:
        c = await _durable_subscriber(mb)
        await c.credit(1, 1)
        (frame,) = await c.take(1)
        assert frame.payload == durable("news")


# -- item 5: a publish to many durable subscriptions journals its payload once ---------------------------------
async def test_a_publish_to_many_durable_subscriptions_journals_its_payload_once(tmp_path: Path) -> None:
    subscriptions = 300
    payload = durable("x" * 60_000)
    async with memory_broker(data_dir=tmp_path) as mb:
        assert mb.writer is not None
        c = await client(mb, CONTAINER)
        source = Source(address="topic://prices", durable=UInt(2), expiry_policy=Symbol("never"))
        for handle in range(1, subscriptions + 1):
            await c.receiver("topic://prices", handle, name=f"sub-{handle}", source=source)
        await c.sender("topic://prices", 0)
        await c.peer.expect_nothing(0.05)
        before = sum(p.stat().st_size for p in mb.writer.journal.segments())
        await c.post(0, payload)
        assert isinstance(await answer(c), Accepted)
        grown = sum(p.stat().st_size for p in mb.writer.journal.segments()) - before
        assert len(payload) < grown < len(payload) + subscriptions * 150, grown  # not 300 copies (18 MB)
    async with memory_broker(data_dir=tmp_path) as mb:
        topic = mb.topic("prices")
        subs = topic.subscriptions()
        assert len(subs) == subscriptions
        assert all(s.depth == 1 for s in subs)
        for s in subs:
            (message,) = topic.peek(s.container, s.name)
            assert (message.body, message.durable, message.size) == ("x" * 60_000, True, len(payload))


async def test_the_broker_goes_on_while_a_compaction_writes_its_snapshot(tmp_path: Path) -> None:
    """Review 3, finding 7: the snapshot is written in a worker thread; messages journaled meanwhile follow it."""
    import threading

    from minibroker.store.journal import Journal

    release = threading.Event()
    started = threading.Event()
    real = Journal.write_snapshot

    released: list[bool] = []

    def slow(self: Journal, compaction: Any) -> None:
        started.set()
        released.append(release.wait(5))  # on the event loop it would time out: nothing could release it
        real(self, compaction)

    async with memory_broker(data_dir=tmp_path) as mb:
        assert mb.writer is not None
        journal = mb.writer.journal
        journal.write_snapshot = slow.__get__(journal)  # type: ignore[method-assign]
        c = await client(mb)
        await c.sender("orders", 0)
        await c.sender("plain", 1)
        await c.receiver("orders", 2)
        for i in range(20):
            await c.post(0, durable(f"m{i}", MessageAnnotations({Symbol("pad"): "x" * 500})))
            assert isinstance(await answer(c), Accepted)
        await c.credit(2, 20)
        await c.take(20)
        await c.peer.disposition(0, 19, settled=True, state=Accepted())
        journal.compact_at = 1
        await c.post(0, durable("trigger"))  # its fsync is followed by a compaction, held in its thread
        assert isinstance(await answer(c), Accepted)
        await trio.to_thread.run_sync(started.wait, 10)
        await c.post(1, frames.message("not durable"))  # served while the snapshot is being written
        assert isinstance(await answer(c), Accepted)
        await c.post(0, durable("during"))  # journaled meanwhile: answered once the compaction is done
        release.set()
        assert isinstance(await answer(c), Accepted)
        await until(lambda: len(journal.segments()) == 1 and journal.segments()[0].name != "journal-00000001.log")
    assert released == [True]
    async with memory_broker(data_dir=tmp_path) as mb:
        assert mb.queue("orders").depth == 2  # trigger, during


async def test_a_durable_message_larger_than_a_journal_record_is_refused(
    tmp_path: Path, autojump_clock: MockClock, monkeypatch: Any
) -> None:
    """Review 3, finding 4: refused before it is queued (a record above MAX_RECORD would be cut at restart)."""
    from minibroker.broker import recorder as recorder_module
    from minibroker.store import records

    monkeypatch.setattr(records, "MAX_RECORD", 40_000)
    monkeypatch.setattr(recorder_module, "RECORD_MARGIN", 1_000)
    async with memory_broker(data_dir=tmp_path, data_sync=False) as mb:
        c = await client(mb)
        await c.sender("orders", 0)
        await c.post(0, durable("x" * 50_000))
        state = await answer(c)
        assert refused_for_disk(state)
        assert "journal record" in state.error.description
        await c.post(0, frames.message("y" * 50_000))  # not durable: not journaled, taken
        assert isinstance(await answer(c), Accepted)
        await c.post(0, durable("small"))
        assert isinstance(await answer(c), Accepted)
        assert mb.queue("orders").depth == 2
