"""Probes for readings of Part 4 that are arguable (reported as doubtful, not as clear deviations).

Each states the clause it relies on; each failed on the code the review read (9670db6).
"""

from __future__ import annotations

from trio.testing import MockClock

from minibroker.amqp.definitions import Accepted, Detach, Source, TransactionalState
from minibroker.amqp.types import Symbol
from minibroker.testing.memory import MemoryBroker
from tests.broker import test_transactions_frames as frame_tests
from tests.broker.test_transactions_adversarial import answer_detach
from tests.broker.test_transactions_frames import TXN_ID, _fill, client
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
    assert mb.queue("q").depth == 1


# (an outcome staged again under another transaction: see test_transactions_frames.py,
# test_outcome_staged_again_under_another_transaction_moves_there)
