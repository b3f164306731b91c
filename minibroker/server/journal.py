"""The journal's I/O loop: writes the broker's records, fsyncs them in a thread, answers what waited.

Group commit: records are written as soon as the broker produces them; one fsync then covers every record
written before it started, and the answers that waited for any of them (``accepted`` for durable transfers
and commits) go out together. With ``data_sync = "never"`` nothing waits and nothing is fsynced.
"""

from __future__ import annotations

import logging
from collections import deque

import trio

from minibroker.broker.core import Broker
from minibroker.broker.recorder import Action
from minibroker.server.connection import wake_writers
from minibroker.store.crash import crash_point
from minibroker.store.journal import Journal

log = logging.getLogger("minibroker.store")


class JournalWriter:
    """Connects a broker to its journal."""

    def __init__(self, journal: Journal, broker: Broker) -> None:
        self.journal = journal
        self.broker = broker
        self.waiting: deque[tuple[int, Action]] = deque()
        self._work = trio.Event()
        broker.journal_sink = self

    def write(self) -> None:
        """Append the broker's pending records (called after every change of broker state)."""
        entries = self.broker.take_journal()
        if not entries:
            return
        journal = self.journal
        for entry in entries:
            if entry.ops:
                position = journal.append(entry.ops)
                crash_point("after-write")
            else:
                position = journal.appended
            if entry.then is not None:
                self.waiting.append((position, entry.then))
        if self.waiting:
            if journal.synced >= self.waiting[-1][0]:
                self._answer()
            else:
                self._work.set()

    def _answer(self) -> None:
        synced = self.journal.synced
        ready: list[Action] = []
        while self.waiting and self.waiting[0][0] <= synced:
            ready.append(self.waiting.popleft()[1])
        if ready:
            self.broker.run_durable(ready, trio.current_time())
            wake_writers(self.broker)

    async def run(self) -> None:
        """fsync whenever records wait for it, for ever."""
        while True:
            await self._work.wait()
            self._work = trio.Event()
            crash_point("before-fsync")
            await trio.to_thread.run_sync(self.journal.sync)
            crash_point("after-fsync")
            self._answer()
            if self.journal.needs_compaction():
                self.journal.compact()
                log.info("journal compacted: %d live messages", self.journal.state.message_count)
