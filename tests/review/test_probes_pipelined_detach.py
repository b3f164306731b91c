"""Probes: work the broker still does, in the same read, on a coordinator link it has just detached.

Part 4 §4.1 (transactions.xml, "transactions"): "If the control link is closed while there exist
non-discharged transactions it created, then all such transactions are immediately rolled back, and
attempts to perform further transactional work on them will lead to failure."

The broker detaches a coordinator link on its own initiative (a control error on an accepted-only
controller, §4.3; a settled declare, R7; a partial post at discharge, R6; a delivery naming two
transactions, §4.4.2). The engine has already parsed every frame of the read that carried the offending
frame, so the frames after it reach the core as events *after* the detach command, and the core handles
them as if the link were still attached: a discharge(fail=false) behind the offending frame COMMITS its
transaction and is answered ``accepted`` after the Detach frame. The client has been told (by the
detach with an error) that every transaction of that controller is rolled back, then sees the commit's
answer on a link it knows is gone: a client that believes the detach retries the work, and the retry
duplicates everything the "rolled back" transaction made visible.
"""

from __future__ import annotations

import pytest
from trio.testing import MockClock

from minibroker.amqp.definitions import (
    Accepted,
    Declare,
    Detach,
    Discharge,
    Disposition,
    TransactionalState,
)
from minibroker.testing import frames
from minibroker.testing.memory import MemoryBroker
from tests.broker import test_transactions_frames as frame_tests
from tests.broker.test_transactions_adversarial import BIG, post_ok, watcher
from tests.broker.test_transactions_frames import ACCEPTED_LIST, COORD, client
from tests.review.helpers import answers_to, control_frame, gather, post_frame

mb = frame_tests.mb
settings = frame_tests.settings


@pytest.mark.parametrize(
    "offence", ["unknown-id", "failed-commit", "settled-declare", "partial-post", "post-naming-two-transactions"]
)
async def test_discharge_pipelined_behind_a_detaching_frame_must_not_commit(
    mb: MemoryBroker, autojump_clock: MockClock, offence: str
) -> None:
    q_watcher = await watcher(mb, "q")
    c = await client(mb)
    await c.coordinator(outcomes=[ACCEPTED_LIST])  # errors travel by detaching the link (§4.3)
    await c.sender("q", 1)
    await c.sender(None, 2)  # anonymous relay
    victim = await c.declare()
    await post_ok(c, 1, "work of the victim", victim)
    batch = b""
    if offence == "unknown-id":
        _, data = control_frame(c, Discharge(txn_id=b"never-declared"))
        batch += data
    elif offence == "failed-commit":
        doomed = await c.declare()
        await c.post(2, frames.message("no to: unroutable"), txn=doomed)
        await c.peer.expect(Disposition)  # transactional-state(doomed, rejected)
        _, data = control_frame(c, Discharge(txn_id=doomed))
        batch += data
    elif offence == "settled-declare":
        _, data = control_frame(c, Declare(), settled=True)
        batch += data
    elif offence == "post-naming-two-transactions":  # D1: both roll back, and their controller goes
        one, two = await c.declare(), await c.declare()
        _, first = post_frame(c, 1, BIG[:1000], txn=one, more=True)
        last = frames.frame(0, frames.transfer(1, None, state=TransactionalState(txn_id=two)), BIG[1000:])
        batch += first + last  # (producer links read ahead: not past a transfer naming two transactions)
    else:  # a partial post under another transaction, then its discharge: §4.4.1 terminates the control link
        doomed = await c.declare()
        _, data = post_frame(c, 1, BIG[:1000], txn=doomed, more=True)
        await c.peer.send_raw(data)
        _, data = control_frame(c, Discharge(txn_id=doomed))
        batch += data
    commit_id, data = control_frame(c, Discharge(txn_id=victim, fail=False))
    batch += data
    await c.peer.send_raw(batch)  # one write: the engine parses both frames before the core handles either
    got = await gather(c.peer)
    detaches = [f.performative for f in got if isinstance(f.performative, Detach)]
    assert [d.handle for d in detaches] == [c.handles[COORD]], got
    # the spec: closing the control link rolls back every transaction it created, at once
    answers = answers_to(got, commit_id)
    assert not any(a.state == Accepted() for a in answers), (
        f"the commit was accepted on a coordinator link the broker had already detached: {got}"
    )
    queue = mb.queue("q")
    assert (queue.depth, queue.staged) == (0, 0), "the victim's work became visible after its controller was detached"
    await q_watcher.peer.expect_nothing()
    assert mb.broker.transactions == []


async def test_post_pipelined_behind_a_detaching_frame_gets_no_transactional_accept(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    """The same window, for posting: after the broker detached the controller, a post under one of its
    transactions (same read) is answered transactional-state(T, accepted), a promise about a transaction
    that is, per §4.1, already rolled back (and is, a moment later, rolled back by the core)."""
    c = await client(mb)
    await c.coordinator(outcomes=[ACCEPTED_LIST])
    await c.sender("q", 1)
    victim = await c.declare()
    _, bad = control_frame(c, Discharge(txn_id=b"never-declared"))
    post_id, post = post_frame(c, 1, frames.message("late"), txn=victim)
    await c.peer.send_raw(bad + post)
    got = await gather(c.peer)
    assert any(isinstance(f.performative, Detach) for f in got), got
    answers = answers_to(got, post_id)
    provisional = TransactionalState(txn_id=victim, outcome=Accepted())
    assert provisional not in [a.state for a in answers], (
        f"a post under a transaction of a detached controller was promised 'accepted': {got}"
    )
    assert mb.broker.txn_stats.rolled_back == 1
