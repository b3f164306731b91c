"""The journal's I/O loop: the recorder's sink, fsyncs in a thread, answers that waited, and a full disk survived.

Records are written the moment the broker makes them (``append``, into the operating system's cache); one
fsync then covers every record written before it started, and the answers that waited for any of them
(``accepted`` for durable transfers and commits) go out together (group commit). With
``data_sync = "never"`` nothing is fsynced and nothing waits.

When a write or an fsync fails (disk full, quota, I/O error) the journal is *failed*: ``accepting`` is False,
so the broker refuses new durable work with ``amqp:resource-limit-exceeded`` and serves everything else; the
records it must still keep (a consumer's settlement, a dead-letter, a commit whose record the disk refused at
the moment it filled) wait in a backlog, in order, with the answers that depend on them. Every
``retry_interval`` seconds the writer repairs the journal (cut back to the last complete record, rewrite
what a failed fsync may have lost, probe for room); once that works it writes the backlog, fsyncs, answers,
and durable work is taken again. Nothing here ends the process: a failure is logged and retried.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

import trio

from minibroker.broker.core import Broker
from minibroker.broker.recorder import Action, JournalEntry
from minibroker.server.connection import wake_writers
from minibroker.store.crash import crash_point
from minibroker.store.journal import Journal, JournalError, JournalUnavailable, RecordTooLarge
from minibroker.store.records import Op

log = logging.getLogger("minibroker.store")


class JournalWriter:
    """Connects a broker to its journal."""

    retry_interval = 1.0
    """Seconds between attempts to write again after a failure (the disk may have room again)."""

    def __init__(self, journal: Journal, broker: Broker, broker_time: Callable[[], float] = trio.current_time) -> None:
        self.journal = journal
        self.broker = broker
        self.broker_time = broker_time
        """Broker time (``minibroker.server.clock``), handed to the core with the answers that waited."""
        self.waiting: deque[tuple[int, Action]] = deque()
        self.backlog: deque[JournalEntry] = deque()
        self.failed_since: float | None = None
        self._work = trio.Event()
        broker.journal_sink = self
        for entry in broker.take_journal():  # made before we were connected (recovery's expiries)
            self.append(entry.ops, entry.then)
        broker.recorder.sink = self

    # -- the recorder's sink ------------------------------------------------------------------------------
    @property
    def accepting(self) -> bool:
        """False while the journal cannot write (new durable work is refused meanwhile)."""
        return not self.backlog and self.journal.writable

    def append(self, ops: list[Op], then: Action | None) -> None:
        """Write ``ops`` now (one record; none: a marker); ``then`` runs once it is on disk. While the journal
        cannot write, both wait in the backlog, in order."""
        if not self.accepting:
            self.backlog.append(JournalEntry(ops, then))
            self._stalled(None)
            return
        if ops:
            try:
                position = self.journal.append(ops)
            except JournalUnavailable as exc:
                self.backlog.append(JournalEntry(ops, then))
                self._stalled(exc)
                return
            except RecordTooLarge as exc:  # the broker checks sizes first: a bug; what it did is never answered
                log.error("journal: %s; not written, and what it did is not acknowledged", exc)
                return
            crash_point("after-write")
        else:
            position = self.journal.appended
        if then is not None:
            self.waiting.append((position, then))

    def try_append(self, ops: list[Op]) -> bool:
        """Write ``ops`` now if the journal takes them; False (nothing written, nothing kept) if not."""
        if not self.accepting:
            self._stalled(None)  # (logged and retried once, whoever noticed first)
            return False
        try:
            self.journal.append(ops)
        except JournalUnavailable as exc:
            self._stalled(exc)
            return False
        except RecordTooLarge as exc:
            log.error("journal: %s; refused", exc)
            return False
        crash_point("after-write")
        return True

    def _stalled(self, exc: JournalError | None) -> None:
        if self.failed_since is not None:
            return
        self.failed_since = trio.current_time()
        log.error(
            "journal: cannot write to %s (%s): durable messages and commits are refused "
            "(amqp:resource-limit-exceeded) until it can; trying again every %g s",
            self.journal.directory,
            exc if exc is not None else self.journal.error,
            self.retry_interval,
        )
        self._work.set()

    # -- after every batch of broker events ----------------------------------------------------------------
    def write(self) -> None:
        """Called after every change of broker state: answer what is durable already, or wake the fsync task."""
        for entry in self.broker.take_journal():
            self.append(entry.ops, entry.then)
        if self.waiting:
            if self.journal.synced >= self.waiting[-1][0]:
                self._answer()
            else:
                self._work.set()

    def _answer(self) -> None:
        synced = self.journal.synced
        ready: list[Action] = []
        while self.waiting and self.waiting[0][0] <= synced:
            ready.append(self.waiting.popleft()[1])
        if ready:
            self.broker.run_durable(ready, self.broker_time())
            wake_writers(self.broker)

    # -- the task ----------------------------------------------------------------------------------------
    async def run(self) -> None:
        """fsync whenever records wait for it, and recover from failures, for ever."""
        while True:
            await self._work.wait()
            self._work = trio.Event()
            try:
                if self.failed_since is not None or not self.journal.writable:
                    await self._recover()
                    continue
                crash_point("before-fsync")
                try:
                    await trio.to_thread.run_sync(self.journal.sync)
                except JournalUnavailable as exc:
                    self._stalled(exc)
                    continue
                crash_point("after-fsync")
                self._answer()
                if self.journal.needs_compaction():
                    await self._compact()
            except Exception:  # a bug must not end the broker: log it, and try again later
                log.exception("journal: unexpected error; trying again in %g s", self.retry_interval)
                await trio.sleep(self.retry_interval)
                self._work.set()

    async def _compact(self) -> None:
        """Compact the journal, its snapshot written in a worker thread: the broker goes on meanwhile (what it
        journals goes to the old segment and after the snapshot; answers wait for the end of the compaction)."""
        compaction = self.journal.begin_compaction()
        if compaction is None:
            return
        try:
            await trio.to_thread.run_sync(self.journal.write_snapshot, compaction)
        except BaseException:  # cancelled (the broker stops), or a bug: the old segments stay
            self.journal.abandon_compaction(compaction)
            raise
        try:
            compacted = self.journal.finish_compaction(compaction)
        except JournalUnavailable as exc:
            self._stalled(exc)
            return
        if compacted:
            log.info("journal compacted: %d live messages", self.journal.state.message_count)
            self._answer()  # what was appended meanwhile is fsynced in the new segment

    async def _recover(self) -> None:
        """Until the journal writes again: repair it, write the backlog, fsync; then answer and accept again."""
        while True:
            try:
                if not self.journal.writable:
                    await trio.to_thread.run_sync(self.journal.repair)
                self._write_backlog()
                await trio.to_thread.run_sync(self.journal.sync)
            except JournalUnavailable:
                await trio.sleep(self.retry_interval)
                continue
            if self.journal.writable and not self.backlog:
                break
        assert self.failed_since is not None
        log.warning("journal: writing again after %.1f s", trio.current_time() - self.failed_since)
        self.failed_since = None
        self._answer()
        wake_writers(self.broker)

    def _write_backlog(self) -> None:
        """Write the records that waited, in order (raises ``JournalUnavailable`` at the first refused)."""
        while self.backlog:
            entry = self.backlog[0]
            try:
                position = self.journal.append(entry.ops) if entry.ops else self.journal.appended
            except RecordTooLarge as exc:  # a bug (the broker checks sizes first): never answered
                log.error("journal: %s; not written, and what it did is not acknowledged", exc)
                self.backlog.popleft()
                continue
            self.backlog.popleft()
            if entry.ops:
                crash_point("after-write")
            if entry.then is not None:
                self.waiting.append((position, entry.then))

    def close(self) -> None:
        """At shutdown: a last attempt at the backlog, then close the journal."""
        if self.backlog or not self.journal.writable:
            try:
                self.journal.repair()
                self._write_backlog()
            except JournalUnavailable as exc:
                unwritten = sum(1 for entry in self.backlog if entry.ops)
                if unwritten:
                    log.error(
                        "journal: %d records could not be written before stopping (%s); what they did was never "
                        "acknowledged",
                        unwritten,
                        exc,
                    )
        self.journal.close()
