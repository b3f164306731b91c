"""Review of issue 16 §1: a ``transfer`` ``delay`` fault on a transactional post, overtaken by the discharge that
follows it on the wire. A slow broker still handles one session's frames in order; the fault must not let a
commit be accepted without the post the client sent before it (a partial commit seen from outside)."""

from __future__ import annotations

from minibroker.amqp.definitions import Accepted, TransactionalState
from tests.broker.test_faults import Setup
from tests.broker.txn_driver import payload


def test_a_delayed_post_is_not_overtaken_by_its_commit() -> None:
    """The client posts m under txn, then commits; the post is delayed 5 s by a fault. Either the commit waits
    for the post (accepted, m committed) or it fails: never accepted with m missing."""
    s = Setup()
    s.faults.add("transfer", "delay", delay=5, address="q")
    peer = s.peer()
    txn = s.declare(peer)
    peer.attach_producer("s", "q")
    s.world.settle()
    peer.transfer("s", payload("m"), state=TransactionalState(txn_id=txn))
    discharge = peer.discharge("ctl", txn, fail=False)
    seen = s.settle(peer)
    s.world.advance(5)
    seen_later = s.settle(peer)
    answers = {**seen.answers, **seen_later.answers}
    committed = isinstance(answers.get(discharge, (None, False))[0], Accepted)
    assert not committed or s.depth() == 1
    # as for a partial post (§4.4.1): the controller is detached with transaction-rollback, nothing is visible
    assert [(link, str(err.condition)) for link, err in seen.detached if err is not None] == [
        ("ctl", "amqp:transaction:rollback")
    ]
    assert s.depth() == 0
