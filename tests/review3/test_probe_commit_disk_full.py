"""Probe: the disk fills exactly when a commit's record is written. The commit is applied in memory, its answer
waits; once the disk has room the record is written and the commit acknowledged; a restart has it all."""

from __future__ import annotations

from pathlib import Path

from minibroker.amqp.definitions import Accepted, Discharge, Disposition, TransactionalState
from minibroker.testing.memory import memory_broker
from tests.broker.test_transactions_frames import client
from tests.server.test_durability import CONTROLLER, answer, durable, stored_payloads
from tests.store.test_journal_faults import Disk


async def test_commit_when_the_disk_fills_is_answered_once_written(tmp_path: Path) -> None:
    async with memory_broker(data_dir=tmp_path) as mb:
        assert mb.writer is not None
        mb.writer.retry_interval = 0.02
        disk = Disk()
        mb.writer.journal.ops = disk
        c = await client(mb)
        await c.sender("orders", 0)
        await c.coordinator(CONTROLLER)
        txn = await c.declare(CONTROLLER)
        for i in range(3):
            await c.post(0, durable(f"t{i}"), txn=txn)
            assert isinstance(await answer(c), TransactionalState)
        disk.room = 0
        delivery_id = await c.control(Discharge(txn_id=txn, fail=False), handle=CONTROLLER)
        await c.peer.expect_nothing(0.3)  # no answer while the record is not on disk
        disk.room = None
        d = await c.peer.expect(Disposition)
        assert d.first == delivery_id
        assert isinstance(d.state, Accepted)
    assert stored_payloads(tmp_path) == [durable(f"t{i}") for i in range(3)]
