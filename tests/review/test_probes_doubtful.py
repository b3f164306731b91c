"""Probes for readings of Part 4 that are arguable (reported as doubtful, not as clear deviations).

Each states the clause it relies on; each fails on the code under review.
"""

from __future__ import annotations

from trio.testing import MockClock

from minibroker.amqp.definitions import Accepted, Detach, Released, Source, TransactionalState
from minibroker.amqp.types import Symbol
from minibroker.testing.memory import MemoryBroker
from tests.broker import test_transactions_frames as frame_tests
from tests.broker.test_transactions_adversarial import answer_detach
from tests.broker.test_transactions_frames import TXN_ID, _fill, client, discharge_with
from tests.review.helpers import gather

mb = frame_tests.mb
settings = frame_tests.settings


async def test_flow_txn_id_on_a_browsing_link_is_refused_with_not_implemented(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    """§4.4.3: "If the link endpoint does not support transactional acquisition, the link MUST be terminated
    with a not-implemented error." A browsing link (distribution-mode copy) acquires nothing; the broker
    accepts the txn-id silently and sends copies that carry no transactional-state."""
    c = await client(mb)
    await _fill(c, "q", ["m0"])
    await c.coordinator()
    txn = await c.declare()
    await c.receiver("q", 2, source=Source(address="q", distribution_mode=Symbol("copy")))
    await c.credit(2, 1, properties={TXN_ID: txn})
    got = await gather(c.peer)
    detaches = [f.performative for f in got if isinstance(f.performative, Detach)]
    assert detaches, f"no detach: {got}"
    assert str(detaches[0].error.condition) == "amqp:not-implemented", got
    await answer_detach(c, 2)
    assert await c.discharge(txn) == Accepted()


async def test_settling_a_browsed_copy_does_not_claim_transactional_work(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    """§4.4 (resource to controller): "the transfer and disposition frames indicate work performed, and the
    txn-ids included MUST correctly indicate with which (if any) transaction this work is associated." The
    broker settles a browsed copy by echoing the client's transactional-state(T, accepted): it claims work in
    T that it never did (nothing is staged; the copy's outcome changes nothing)."""
    c = await client(mb)
    await _fill(c, "q", ["m0"])
    await c.coordinator()
    txn = await c.declare()
    await c.receiver("q", 2, source=Source(address="q", distribution_mode=Symbol("copy")))
    await c.credit(2, 1)
    (copy,) = await c.take(1)
    await c.peer.disposition(
        copy.performative.delivery_id, settled=False, state=TransactionalState(txn_id=txn, outcome=Accepted())
    )
    got = await gather(c.peer)
    states = [f.performative.state for f in got]
    assert not any(isinstance(s, TransactionalState) for s in states), f"the broker answered {states}"
    assert await c.discharge(txn) == Accepted()
    assert mb.broker.queues["q"].depth == 1


async def test_moving_a_staged_outcome_to_another_transaction_does_not_roll_back_both(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    """§4.4.2: "The delivery itself need not be associated with the same transaction as the outcome, or indeed
    with any transaction at all. However, the delivery MUST NOT be associated with a different non discharged
    transaction than the outcome." A delivery acquired outside any transaction is associated with none; the
    broker nevertheless treats an outcome staged in T1 as an association, so re-staging it in T2 rolls back
    both transactions and detaches both controllers (README: "A delivery whose outcome names a different open
    transaction than the one it was acquired or retired under rolls both back")."""
    c = await client(mb)
    await _fill(c, "q", ["m0"])
    await c.coordinator(handle=0)
    await c.coordinator(handle=1)
    first = await c.declare(handle=0)
    second = await c.declare(handle=1)
    await c.receiver("q", 2)
    await c.credit(2, 1)
    (delivered,) = await c.take(1)
    d = delivered.performative.delivery_id
    await c.peer.disposition(d, settled=False, state=TransactionalState(txn_id=first, outcome=Released()))
    await c.peer.disposition(d, settled=False, state=TransactionalState(txn_id=second, outcome=Accepted()))
    got = await gather(c.peer)
    assert not any(isinstance(f.performative, Detach) for f in got), f"both controllers were detached: {got}"
    assert await c.discharge(first, handle=0) == Accepted()  # the outcome moved: nothing of the first applies
    assert mb.broker.queues["q"].acquired == 1
    answer, others = await discharge_with(c, second, 1, handle=1)
    assert answer == Accepted()
    assert [f.performative.state for f in others] == [Accepted()]  # the second applies it: m0 is consumed
    assert (mb.broker.queues["q"].depth, mb.broker.queues["q"].acquired) == (0, 0)
