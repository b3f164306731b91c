"""Probes: a delivery whose later frames are still held back by the consumer's session window.

Issue 11 (deviation 3) and README "Acquiring": "A delivery not completely sent (its last frames held back
by the consumer's session window) is aborted instead: its unsent frames become one transfer with
`aborted=true`, so the consumer never gets the whole message while another consumer gets it again".
README (issue 11, R3): "No consumer ever receives the complete message twice; the first consumer never receives
the rest."

Part 2 §2.6.14 / transfer.aborted: "Aborted messages should be discarded by the recipient ... An aborted
message is implicitly settled." Part 4 §4.4.3: "If the discharge indicates the failure of the transaction
the resource MUST abort or complete the sending the remainder of the message before completing the
discharge."
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
from trio.testing import MockClock

from minibroker.amqp.definitions import (
    Accepted,
    Discharge,
    Disposition,
    Released,
    TransactionalState,
    Transfer,
)
from minibroker.broker.core import BrokerSettings
from minibroker.testing import frames
from minibroker.testing.memory import MemoryBroker
from tests.broker import test_transactions_frames as frame_tests
from tests.broker.test_transactions_adversarial import discharge_all, fill_big, small_window_client
from tests.broker.test_transactions_frames import TXN_ID, client
from tests.review.helpers import answers_to, gather

mb = frame_tests.mb
settings = frame_tests.settings


async def _rest_of_first(c: Any) -> list[Any]:
    """Open the first consumer's window; return the transfer frames that then arrive."""
    await c.peer.flow(incoming_window=100)
    return [f for f in await gather(c.peer) if isinstance(f.performative, Transfer)]


@pytest.mark.parametrize("settle_state", ["txn-released", "no-state", "txn-modified"])
async def test_commit_releasing_a_partly_sent_delivery_must_not_finish_sending_it(
    mb: MemoryBroker, autojump_clock: MockClock, settle_state: str
) -> None:
    """T acquires BIG; two of its ~7 frames are out. The client settles it under T (released, or without an
    outcome: R2 gives the source's default, released) and commits. The commit puts BIG back on its queue and
    a second consumer gets it whole; then the first consumer opens its window and gets the rest too."""
    from minibroker.amqp.definitions import Modified

    await fill_big(mb, "big")
    c = await small_window_client(mb, "small-window", window=2)
    await c.coordinator()
    txn = await c.declare()
    await c.receiver("big", 2)
    await c.peer.flow(2, 1, incoming_window=2, properties={TXN_ID: txn})
    first = await c.take(2)
    assert all(t.performative.more for t in first)
    delivery_id = first[0].performative.delivery_id
    state: Any = {
        "txn-released": TransactionalState(txn_id=txn, outcome=Released()),
        "no-state": None,
        "txn-modified": TransactionalState(txn_id=txn, outcome=Modified(delivery_failed=True)),
    }[settle_state]
    await c.peer.disposition(delivery_id, settled=True, state=state)
    answer, _ = await discharge_all(c, txn)
    assert answer == Accepted()
    second = await client(mb, "second")
    await second.receiver("big", 2)
    await second.credit(2, 1)
    (whole,) = await second.take(1)  # the message is back on its queue: the second consumer gets all of it
    assert not whole.performative.more
    await second.peer.disposition(whole.performative.delivery_id, state=Accepted())
    rest = await _rest_of_first(c)
    completed = rest and rest[-1].performative.more is not True and rest[-1].performative.aborted is not True
    assert not completed, (
        f"the first consumer received the rest of a message the commit had already released to another "
        f"consumer (duplicate): {[f.performative for f in rest]}"
    )


async def test_plain_release_of_a_partly_sent_delivery_must_not_finish_sending_it(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    """The same outside transactions (the engine-wide rule R3 states): the client settles released while
    the delivery is partly sent; the message goes to another consumer, and the rest still reaches the first."""
    await fill_big(mb, "big")
    c = await small_window_client(mb, "small-window", window=2)
    await c.receiver("big", 2)
    await c.peer.flow(2, 1, incoming_window=2)
    first = await c.take(2)
    await c.peer.disposition(first[0].performative.delivery_id, settled=True, state=Released())
    second = await client(mb, "second")
    await second.receiver("big", 2)
    await second.credit(2, 1)
    (whole,) = await second.take(1)
    assert not whole.performative.more
    await second.peer.disposition(whole.performative.delivery_id, state=Accepted())
    rest = await _rest_of_first(c)
    completed = rest and rest[-1].performative.more is not True and rest[-1].performative.aborted is not True
    assert not completed, f"both consumers received the whole message: {[f.performative for f in rest]}"


@pytest.mark.parametrize("settings", [BrokerSettings(transaction_timeout=30)], ids=["timeout-30s"])
@pytest.mark.parametrize("ending", ["failed-commit", "timed-out-then-rollback", "timed-out-then-commit"])
async def test_discharge_that_rolls_back_is_answered_only_after_the_abort(
    mb: MemoryBroker, autojump_clock: MockClock, ending: str
) -> None:
    """§4.4.3: the abort of a partly sent acquisition must go out before the discharge completes. The broker
    makes a plain discharge(fail=true) wait for it (README), but not a discharge that fails a commit, nor the
    discharge of a timed-out transaction (whose rollback happened at the time-out): those are answered at
    once, while the aborted transfer still waits behind the consumer's window."""
    await fill_big(mb, "big")
    c = await small_window_client(mb, "small-window", window=2)
    await c.coordinator()
    await c.sender(None, 5)
    txn = await c.declare()
    await c.receiver("big", 2)
    await c.peer.flow(2, 1, incoming_window=2, properties={TXN_ID: txn})
    await c.take(2)
    if ending == "failed-commit":
        await c.post(5, frames.message("no to: unroutable"), txn=txn)
        assert isinstance((await c.peer.expect(Disposition)).state, TransactionalState)
    else:
        await trio.sleep(31)
        await gather(c.peer)  # nothing can come: the window is closed
    discharge_id = await c.control(Discharge(txn_id=txn, fail=ending == "timed-out-then-rollback"))
    before = await gather(c.peer)
    assert answers_to(before, discharge_id) == [], (
        f"the discharge was completed while the abort of the partly sent acquisition was still held back: {before}"
    )
    await c.peer.flow(incoming_window=100)
    after = await gather(c.peer)
    kinds = [type(f.performative).__name__ for f in after]
    assert kinds == ["Transfer", "Disposition"], after
    assert after[0].performative.aborted is True


@pytest.mark.parametrize("transactional", [False, True], ids=["plain-accept", "commit-of-txn-accept"])
async def test_accepting_a_partly_sent_delivery_must_not_abort_it_and_consume_it(
    mb: MemoryBroker, autojump_clock: MockClock, transactional: bool
) -> None:
    """The client accepts a delivery whose first frames it has (unsettled disposition), plainly or under T and
    commits. The broker settles it with ``accepted``; its engine turns the settlement of a delivery not
    completely sent into an abort. The client gets ``aborted=true`` ("Aborted messages should be discarded by
    the recipient", §2.7.5 transfer.aborted), while the broker retires the message: nobody has it any more.
    Either the rest must be sent (the outcome is accepted), or the abort must leave the message on its queue."""
    await fill_big(mb, "big")
    c = await small_window_client(mb, "small-window", window=2)
    txn = None
    if transactional:
        await c.coordinator()
        txn = await c.declare()
    await c.receiver("big", 2)
    await c.peer.flow(2, 1, incoming_window=2, properties={TXN_ID: txn} if txn else None)
    first = await c.take(2)
    delivery_id = first[0].performative.delivery_id
    state: Any = TransactionalState(txn_id=txn, outcome=Accepted()) if txn else Accepted()
    await c.peer.disposition(delivery_id, settled=False, state=state)
    if txn is not None:
        answer, _ = await discharge_all(c, txn)
        assert answer == Accepted()
    rest = await _rest_of_first(c)
    queue = mb.queue("big")
    aborted = bool(rest) and rest[-1].performative.aborted is True
    assert not (aborted and (queue.depth, queue.acquired) == (0, 0)), (
        "the delivery was aborted (the client discards it) and the message was consumed: it is lost"
    )
