"""Crash tests for durability (DESIGN §4): after a crash a transaction is there entirely or not at all, and
nothing the broker acknowledged is lost, invented or delivered again.

* Named crash points (``MINIBROKER_CRASH_AT``), deterministic: a broker dies right after writing the
  journal record of a scripted step, before its fsync, or after it, and is restarted on its data directory
  (and, when the record was not fsynced yet, also on a copy where that record is torn).
* Random SIGKILLs: the workload of ``workload.py`` runs against a broker killed at random moments, cycle
  after cycle; then a fresh client drains what is left and the checker compares it with the client's log.
  CI runs a few cycles; ``python -m bench.crash`` runs the same at full size.
* The checker itself, on made-up logs: each kind of violation is caught, and what is allowed passes.
"""

from __future__ import annotations

import os
import random
import shutil
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from proton import Delivery, Message
from proton.handlers import MessagingHandler, TransactionHandler
from proton.reactor import Container, Transaction

from minibroker.store.crash import CRASH_EXIT_STATUS, POINTS
from tests.crash import workload
from tests.crash.workload import BrokerProcess, Report, Timer, broker, check, drain, run_cycles

CI_CYCLES = 8
QUEUE = "crash.script"
STEPS = {
    1: "commit of a transaction sending a1 a2 a3",
    2: "unsettled durable send of b1",
    3: "commit of a transaction sending c1 c2 c3 and accepting a1",
}
AFTER = {  # the queue once step N is done, in order
    0: [],
    1: ["a1", "a2", "a3"],
    2: ["a1", "a2", "a3", "b1"],
    3: ["a2", "a3", "b1", "c1", "c2", "c3"],
}


# -- named crash points ---------------------------------------------------------------------------------
class Script(MessagingHandler, TransactionHandler):  # type: ignore[misc]
    """Runs STEPS one after the other, each once the previous one was acknowledged; stops at the end, when
    the connection breaks, or after ``timeout`` seconds. ``acknowledged``: the steps the broker confirmed."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        super().__init__(prefetch=0, auto_accept=False)
        self.url = url
        self.timeout = timeout
        self.step = 0
        self.acknowledged: list[int] = []
        self.ended = ""
        self.plain: Any = None
        self.a1: Any = None
        self.sends: list[Any] = []

    def on_start(self, event: Any) -> None:
        self.container = event.container
        self.conn = self.container.connect(self.url, reconnect=False)
        self.sender = self.container.create_sender(self.conn, QUEUE)
        self.receiver = self.container.create_receiver(self.conn, QUEUE)
        self.container.schedule(self.timeout, Timer(lambda: self._end("timed out")))
        self._next()

    def _next(self) -> None:
        self.step += 1
        if self.step == 1:
            self.container.declare_transaction(self.conn, handler=self)
        elif self.step == 2:
            self.plain = self.sender.send(Message(body="b1", durable=True))
        elif self.step == 3:
            self.receiver.flow(1)  # a1, to accept in the transaction
        else:
            self._end("done")

    def on_message(self, event: Any) -> None:
        assert event.message.body == "a1"
        self.a1 = event.delivery
        self.container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event: Any) -> None:
        txn = event.transaction
        names = ["a1", "a2", "a3"] if self.step == 1 else ["c1", "c2", "c3"]
        self.sends = [txn.send(self.sender, Message(body=name, durable=True)) for name in names]
        if self.step == 3:
            txn.accept(self.a1)
        self._commit_when_posted(txn)

    def _commit_when_posted(self, txn: Transaction) -> None:
        if any(d.remote_state == 0 for d in self.sends):
            self.container.schedule(0.005, Timer(lambda: self._commit_when_posted(txn)))
        else:
            txn.commit()

    def on_transaction_committed(self, event: Any) -> None:
        if event.delivery.remote_state == Delivery.ACCEPTED:
            self.acknowledged.append(self.step)
            self._next()

    def on_accepted(self, event: Any) -> None:
        if event.delivery == self.plain:
            self.acknowledged.append(self.step)
            self._next()

    def _end(self, how: str) -> None:
        if not self.ended:
            self.ended = how
            self.conn.close()
            self.container.stop()

    def on_transport_error(self, event: Any) -> None:
        self._end("disconnected")

    def on_disconnected(self, event: Any) -> None:
        self._end("disconnected")


@dataclass
class Crashed:
    status: int  # the broker's exit status
    script: Script
    contents: list[str]  # the queue after a restart
    torn: list[str] | None  # the queue after a restart on a copy whose last record lost its last byte


def _drain_restarted(data_dir: Path, stderr: Path) -> list[str]:
    with broker(data_dir, stderr_path=stderr) as restarted:
        return drain(restarted.url, [QUEUE], subscription=False)


def _crash_at(data_dir: Path, point: str, step: int, *, tear: bool) -> Crashed:
    """Run the script against a broker set to crash at ``point`` on its ``step``-th journal record; restart
    it and drain the queue. With ``tear``, also restart on a copy of the data directory whose last record
    is torn (as an unsynced write may be after a power cut)."""
    data_dir.mkdir(parents=True)
    stderr = data_dir.parent / f"{data_dir.name}.stderr"
    process = BrokerProcess(data_dir, env={"MINIBROKER_CRASH_AT": f"{point}:{step}"}, stderr_path=stderr)
    try:
        script = Script(process.url)
        Container(script).run()
        status = process.wait(10)
    finally:
        process.kill()
    if not tear:
        return Crashed(status, script, _drain_restarted(data_dir, stderr), None)
    copy = data_dir.parent / f"{data_dir.name}-torn"
    shutil.copytree(data_dir, copy)
    last = sorted(copy.glob("journal-*.log"))[-1]
    os.truncate(last, last.stat().st_size - 1)
    with ThreadPoolExecutor(2) as pool:  # two restarts, on two directories, side by side
        contents, torn = pool.map(_drain_restarted, [data_dir, copy], [stderr, copy.with_suffix(".stderr")])
    return Crashed(status, script, contents, torn)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("point", POINTS)
def test_named_crash_point_keeps_transactions_whole(point: str, tmp_path: Path) -> None:
    # one broker per step (a crash point fires once per broker life); the steps run side by side
    tear = point != "after-fsync"
    with ThreadPoolExecutor(len(STEPS)) as pool:
        results = list(pool.map(lambda step: _crash_at(tmp_path / f"step{step}", point, step, tear=tear), STEPS))
    for (step, what), crashed in zip(STEPS.items(), results, strict=True):
        script, contents = crashed.script, crashed.contents
        context = f"crash {point}:{step} ({what}); client: {script.ended}, acknowledged {script.acknowledged}"
        assert crashed.status == CRASH_EXIT_STATUS, f"{context}: broker exit status {crashed.status}"
        assert script.ended == "disconnected", context
        # everything before the crash was acknowledged; the step that crashed was not
        assert script.acknowledged == list(range(1, step)), context
        if point == "after-fsync":
            # the record was on disk: the step is there entirely, though the client never heard so
            assert contents == AFTER[step], f"{context}: queue holds {contents}"
        else:
            # entirely there or entirely absent, never partly (and never out of order)
            assert contents in (AFTER[step - 1], AFTER[step]), f"{context}: queue holds {contents}"
            # the unsynced record torn: recovery drops all of it, and keeps everything acknowledged before
            assert crashed.torn == AFTER[step - 1], f"{context}, last record torn: queue holds {crashed.torn}"


# -- random SIGKILLs ------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_random_kills_lose_invent_and_duplicate_nothing(tmp_path: Path) -> None:
    seed = int(os.environ.get("MINIBROKER_CRASH_SEED", random.randrange(1 << 30)))
    run = run_cycles(tmp_path, CI_CYCLES, seed=seed)
    report = run.report
    context = (
        f"seed {seed} (MINIBROKER_CRASH_SEED), {run.seconds:.1f} s, {run.point_crashes} deaths at crash points, "
        f"log in {tmp_path}\n{report.summary()}"
    )
    assert report.cycles == CI_CYCLES, context
    assert report.acknowledged > 0, context
    assert report.lost == [], context
    assert report.unexpected == [], context
    assert report.illegal_duplicates == [], context
    assert report.partial == [], context


def test_workload_knows_the_crash_points() -> None:
    # workload.py runs in a process of its own without importing minibroker (slow to import): it keeps copies
    assert (workload.CRASH_POINTS, workload.CRASH_EXIT_STATUS) == (POINTS, CRASH_EXIT_STATUS)


# -- the checker ----------------------------------------------------------------------------------------
def _check(lines: str, drained: dict[str, int]) -> Report:
    return check(lines.strip().splitlines(), Counter(drained))


ACKED_X = "cycle 1\nsend-requested x q\nsent-accepted x\n"


@pytest.mark.parametrize(
    ("log", "drained", "verdict"),
    [
        pytest.param(ACKED_X, {"x": 1}, {}, id="acknowledged-and-there"),
        pytest.param(ACKED_X, {}, {"lost": ["x"]}, id="acknowledged-and-missing"),
        pytest.param(ACKED_X + "received x q\naccepting x\n", {}, {}, id="consumed-before-the-crash"),
        pytest.param("cycle 1\nsend-requested x q\n", {}, {}, id="in-doubt-send-missing"),
        pytest.param("cycle 1\nsend-requested x q\n", {"x": 1}, {}, id="in-doubt-send-there"),
        pytest.param(
            "cycle 1\nsend-requested x q\nsend-failed x rejected\n", {"x": 1}, {"unexpected": 1}, id="refused"
        ),
        pytest.param("cycle 1\n", {"y": 1}, {"unexpected": 1}, id="never-sent"),
        pytest.param(
            "cycle 1\ntxn-declared t\ntxn-send t y q\nabort-requested t y\n", {"y": 1}, {"unexpected": 1}, id="aborted"
        ),
        pytest.param("cycle 1\ntxn-declared t\ntxn-send t y q\n", {"y": 1}, {"unexpected": 1}, id="never-discharged"),
        pytest.param(
            "cycle 1\ntxn-declared t\ntxn-send t y q\ntxn-send t z q\ntxn-requested t y z\ncommitted t y z\n",
            {"y": 1},
            {"lost": ["z"]},
            id="committed-and-half-missing",
        ),
        pytest.param(
            "cycle 1\ntxn-declared t\ntxn-send t y q\ntxn-send t z q\ntxn-requested t y z\n",
            {"y": 1},
            {"partial": 1},
            id="in-doubt-commit-half-there",
        ),
        pytest.param(
            "cycle 1\ntxn-declared t\ntxn-send t y q\ntxn-send t z q\ntxn-requested t y z\n",
            {},
            {},
            id="in-doubt-commit-absent",
        ),
        pytest.param(
            ACKED_X + "received x q\naccepting x\ncycle 2\nreceived x q\n",
            {},
            {"allowed_duplicates": ["x"]},
            id="plain-accept-undone-by-crash",
        ),
        pytest.param(
            ACKED_X + "received x q\naccepting x\nreceived x q\n",
            {},
            {"illegal_duplicates": 1},
            id="plain-accept-undone-without-crash",
        ),
        pytest.param(
            ACKED_X + "received x q\ntxn-declared t\ntxn-accept t x\ntxn-requested t\ncommitted t\ncycle 2\n",
            {"x": 1},
            {"illegal_duplicates": 1},
            id="committed-accept-undone",
        ),
        pytest.param(
            ACKED_X + "received x q\ntxn-declared t\ntxn-accept t x\ntxn-requested t\ncycle 2\n",
            {"x": 1},
            {"allowed_duplicates": ["x"]},
            id="in-doubt-accept-undone",
        ),
        pytest.param(
            ACKED_X + "received x q\ntxn-declared t\ntxn-accept t x\ntxn-send t y q\ntxn-requested t y\ncycle 2\n",
            {},
            {"lost": ["x"]},
            id="in-doubt-commit-absent-yet-its-accept-applied",
        ),
        pytest.param(ACKED_X, {"x": 2}, {"illegal_duplicates": 1}, id="there-twice"),
    ],
)
def test_checker_classifies(log: str, drained: dict[str, int], verdict: dict[str, Any]) -> None:
    report = _check(log, drained)
    for name in ("lost", "unexpected", "allowed_duplicates", "illegal_duplicates", "partial"):
        expected = verdict.get(name, [])
        found: list[str] = getattr(report, name)
        if isinstance(expected, int):
            assert len(found) == expected, (name, found)
        else:
            assert found == expected, (name, found)
    assert report.ok == (not set(verdict) - {"allowed_duplicates"})
