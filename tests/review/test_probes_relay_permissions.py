"""Probes: a transactional anonymous-relay post refused by permissions does not fail the transaction.

Part 4 §4.4.4 ("Delivery Sent Settled By Controller"): "Should the resource be unable to process the
delivery it MUST NOT allow the successful discharge of the associated transaction."
§4.4.4 ("Delivery Sent Unsettled By Controller; Resource Settles"): "The outcome communicated by the
resource MUST be associated with the same transaction with which the transfer from controller to resource
was associated."
README "Posting": an unsettled transactional post "is answered at once with transactional-state(txn-id,
outcome=accepted), or with a rejected outcome ..., which then makes the commit fail with
amqp:transaction:rollback".

``Endpoints.transfer`` answers a relay post to an address the user may not send to with a plain
``rejected`` and returns before the coordinator sees the post: the transaction is not marked failed, so its
commit succeeds with the refused message silently missing (a pre-settled post gets no answer at all).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from minibroker.amqp.definitions import (
    Accepted,
    AmqpValue,
    Coordinator,
    Declare,
    Declared,
    Discharge,
    Disposition,
    Flow,
    Rejected,
    Source,
    TransactionalState,
)
from minibroker.testing import frames
from minibroker.testing.peer import ScriptedPeer
from minibroker.testing.thread import ThreadedBroker, run_in_thread
from tests.broker.test_transactions_frames import to

CONFIG = {
    "server": {"port": 0},
    "auth": {"users": {"carol": "pw"}, "permissions": {"carol": {"send": ["orders"], "transactions": True}}},
}


@pytest.fixture
def secured() -> Iterator[ThreadedBroker]:
    with run_in_thread(CONFIG) as running:
        yield running


@pytest.mark.parametrize("settled", [True, False], ids=["presettled-post", "unsettled-post"])
def test_refused_relay_post_under_t_must_fail_the_commit(secured: ThreadedBroker, settled: bool) -> None:
    with ScriptedPeer.connect("127.0.0.1", secured.port) as peer:
        peer.open(sasl=("PLAIN", "carol", "pw"))
        peer.begin()
        peer.attach_sender(None, 0, name="controller", source=Source(), target=Coordinator())
        peer.expect(Flow)
        peer.attach_sender(None, 1, name="relay")  # anonymous relay: permissions are checked per message
        peer.expect(Flow)
        peer.transfer(0, 0, frames.message(AmqpValue(Declare())))
        declared = peer.expect(Disposition).state
        assert isinstance(declared, Declared)
        txn = declared.txn_id
        state = TransactionalState(txn_id=txn)
        peer.transfer(1, 1, frames.message("allowed", to("orders")), state=state)
        assert peer.expect(Disposition).state == TransactionalState(txn_id=txn, outcome=Accepted())
        peer.transfer(1, 2, frames.message("refused", to("payments")), state=state, settled=settled or None)
        if not settled:
            answer = peer.expect(Disposition)
            assert answer.first == 2
            assert isinstance(answer.state, TransactionalState), (
                f"the outcome of a transactional post must name its transaction, got {answer.state}"
            )
        peer.transfer(0, 3, frames.message(AmqpValue(Discharge(txn_id=txn))))
        outcome = peer.expect(Disposition)
        assert outcome.first == 3
        assert isinstance(outcome.state, Rejected), (
            f"a commit whose post was refused must fail; got {outcome.state} with orders depth "
            f"{secured.queue('orders').depth} and the refused message nowhere"
        )
    assert secured.queue("orders").depth == 0
