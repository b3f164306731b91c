"""Probe: a directory fsync that fails once, right after a compaction renamed its snapshot in, leaves the journal
failed; the writer never notices (compact() returned True), so with only producers it never repairs: durable
messages are refused for ever although the disk is fine again."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import trio

from minibroker.amqp.definitions import Accepted, MessageAnnotations
from minibroker.amqp.types import Symbol
from minibroker.testing.memory import memory_broker
from tests.broker.test_transactions_frames import client
from tests.server.test_durability import answer, durable
from tests.store.test_journal_faults import Disk


class DirectoryFailsOnce(Disk):
    armed = False

    def fsync(self, fd: int) -> None:
        if self.armed and os.path.isdir(f"/proc/self/fd/{fd}"):
            self.armed = False
            raise OSError(errno.EIO, "Input/output error")
        super().fsync(fd)


async def test_durable_work_resumes_after_a_failed_directory_fsync_in_compaction(tmp_path: Path) -> None:
    async with memory_broker(data_dir=tmp_path) as mb:
        assert mb.writer is not None
        mb.writer.retry_interval = 0.02
        journal = mb.writer.journal
        disk = DirectoryFailsOnce()
        journal.ops = disk
        c = await client(mb)
        await c.sender("orders", 0)
        await c.receiver("orders", 2)
        pad = MessageAnnotations({Symbol("pad"): "x" * 500})
        for i in range(20):
            await c.post(0, durable(f"m{i}", pad))
            assert isinstance(await answer(c), Accepted)
        await c.credit(2, 20)
        await c.take(20)
        await c.peer.disposition(0, 19, settled=True, state=Accepted())
        journal.compact_at = 1
        disk.armed = True
        await c.post(0, durable("trigger"))  # its fsync is followed by a compaction whose directory fsync fails
        assert isinstance(await answer(c), Accepted)
        await trio.sleep(0.2)
        assert not disk.armed, "the compaction did not run"
        # from now on only a producer: the disk is fine; durable messages must be taken again (within 2 s)
        for i in range(20):
            await c.post(0, durable(f"later-{i}"))
            state = await answer(c)
            if isinstance(state, Accepted):
                break
            await trio.sleep(0.1)
        assert isinstance(state, Accepted), f"still refused after 2 s: {state}"
