"""Probes: the read-ahead of producer transfers (``accept_attach(read_ahead=True)``) against frames parsed past them.

``ServerConnection.receive_events`` parses on past a run of complete transfers on producer links before the
broker handles them, on the promise that "handling such a transfer never gives a command that changes how a
later frame reads". The converse is not guarded: a later frame of the same read is *parsed* (its engine-side
effects applied) before the earlier transfers are *handled*. A flow's credit is applied at parse time, its
``txn-id`` only when the broker handles the flow; a post handled in between dispatches on that credit, outside
the transaction the flow named.

Part 4 §4.4.3 (transactions.xml, "transactional acquisition"): the txn-id of a flow "identifies the
transaction with which acquired messages will be associated"; the resource→controller transfer's txn-id
"MUST correctly indicate with which (if any) transaction this work is associated". README "Scope and endings":
"The frames of one read from a client are handled in order, each once the broker has acted on the one
before, exactly as if they had come one by one".
"""

from __future__ import annotations

import pytest
from trio.testing import MockClock

from minibroker.amqp.definitions import (
    Accepted,
    AmqpValue,
    Coordinator,
    Declare,
    Declared,
    Detach,
    Discharge,
    Disposition,
    Flow,
    Source,
    TransactionalState,
    Transfer,
)
from minibroker.amqp.types import UInt
from minibroker.testing import frames
from minibroker.testing.memory import MemoryBroker
from minibroker.testing.peer import ScriptedPeer
from minibroker.testing.thread import ThreadedBroker
from tests.broker import test_transactions_frames as frame_tests
from tests.broker.test_transactions_frames import TXN_ID, client
from tests.review.helpers import answers_to, gather, post_frame

mb = frame_tests.mb
settings = frame_tests.settings


def _flow_frame(c: frame_tests.Client, handle: int, credit: int, properties: dict | None) -> bytes:
    """The bytes of a link flow for our receiver ``handle`` (session ids as the client core counts them), not sent."""
    conn = c.peer.conn
    conn.send(conn.flow(handle, credit, delivery_count=UInt(0), properties=properties))
    return conn.data_to_send()


@pytest.mark.parametrize("presettled", [True, False], ids=["presettled-consumer", "unsettled-consumer"])
async def test_credit_of_a_txn_flow_is_not_spent_outside_the_transaction_by_a_post_read_ahead(
    mb: MemoryBroker, autojump_clock: MockClock, presettled: bool
) -> None:
    """One write: a plain post to q, then the flow that gives the (idle) consumer of q its only credit, naming T.
    Handled one by one, the post finds no credit, and the flow binds the link to T and then sends the message
    acquired under T. Read ahead, the flow's credit is in force when the post is handled but its txn-id is not:
    the message goes out outside any transaction. With a pre-settled consumer it is consumed on the spot, so the
    rollback of T, which the client asked to acquire under, cannot give it back: the message is lost."""
    await post_then_txn_flow(mb, presettled=presettled, separately=False)


async def post_then_txn_flow(mb: MemoryBroker, *, presettled: bool, separately: bool) -> None:
    """The scenario above; ``separately``: the two frames in two writes (a control, which passes)."""
    c = await client(mb)
    await c.coordinator()
    txn = await c.declare()
    await c.sender("q", 1)
    await c.receiver("q", 2, snd_settle_mode=1 if presettled else None)
    _, post = post_frame(c, 1, frames.message("m"))
    together = post + _flow_frame(c, 2, 1, {TXN_ID: txn})
    if separately:
        await c.peer.send_raw(together[: len(post)])
        await gather(c.peer)
        await c.peer.send_raw(together[len(post) :])
    else:
        await c.peer.send_raw(together)
    got = await gather(c.peer)
    transfers = [f.performative for f in got if isinstance(f.performative, Transfer)]
    assert len(transfers) == 1, got
    sent_state = transfers[0].state
    # the client rolls back T: what it acquired under T goes back to q
    discharge_id = await c.control(Discharge(txn_id=txn, fail=True))
    got = await gather(c.peer)
    answers = answers_to(got, discharge_id)
    assert [a.state for a in answers] == [Accepted()], got
    depth = mb.queue("q").depth
    await c.peer.send(Detach(handle=UInt(2), closed=True))  # (cleanup: a delivery still acquired goes back)
    await gather(c.peer)
    assert sent_state == TransactionalState(txn_id=txn), (
        f"the message was sent on the credit of a flow naming T, but not acquired under T (state {sent_state})"
    )
    assert depth == 1, "the rollback of T did not give back the message acquired on the credit of T's flow"


async def test_credit_of_a_flow_ending_acquisition_is_not_spent_inside_the_transaction_by_a_post_read_ahead(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    """The other way round: the consumer acquires under T and has no credit left; one write holds a plain post
    to q and a flow whose properties lack txn-id (README: it "ends transactional acquisition") granting one
    credit. Read ahead, the message goes out acquired under T on that credit. The client, which ended
    acquisition under T, accepts it plainly; the broker stages that outcome in T (a plain outcome on a
    delivery acquired under T), and the rollback of T puts the accepted message back: it is delivered twice."""
    c = await client(mb)
    await c.coordinator()
    txn = await c.declare()
    await c.sender("q", 1)
    await c.receiver("q", 2)
    await c.credit(2, 0, properties={TXN_ID: txn})  # bound to T, no credit
    await gather(c.peer)
    _, post = post_frame(c, 1, frames.message("m"))
    await c.peer.send_raw(post + _flow_frame(c, 2, 1, {"no-txn": True}))
    got = await gather(c.peer)
    transfers = [f.performative for f in got if isinstance(f.performative, Transfer)]
    assert len(transfers) == 1, got
    sent_state = transfers[0].state
    await c.peer.disposition(transfers[0].delivery_id, settled=True, state=Accepted())  # consumed, plainly
    await gather(c.peer)
    discharge_id = await c.control(Discharge(txn_id=txn, fail=True))
    got = await gather(c.peer)
    answers = answers_to(got, discharge_id)
    assert [a.state for a in answers] == [Accepted()], got
    depth = mb.queue("q").depth
    if depth:
        mb.queue("q").purge()
    # read ahead: the delivery went out under T (state T), and the rollback put the accepted message back (depth 1)
    assert (sent_state, depth) == (None, 0), (
        f"a flow ended acquisition under T, yet its credit carried a delivery acquired under T ({sent_state}); the "
        f"client accepted it outside any transaction and the rollback of T put it back on its queue ({depth} there)"
    )


def test_over_tcp_a_presettled_message_taken_on_a_txn_flows_credit_is_lost_by_the_rollback(
    broker: ThreadedBroker,
) -> None:
    """The first probe against the real server in a thread, over TCP: the post and the flow in one ``sendall``.
    The pre-settled consumer receives the message outside T and the rollback of T cannot give it back."""
    q = broker.queue("q")
    with ScriptedPeer.connect("127.0.0.1", broker.port) as peer:
        peer.open()
        peer.begin()
        peer.attach_sender(None, 0, name="controller", source=Source(), target=Coordinator())
        peer.expect(Flow)
        peer.transfer(0, 0, frames.message(AmqpValue(Declare())))
        declared = peer.expect(Disposition).state
        assert isinstance(declared, Declared)
        peer.attach_sender("q", 1)
        peer.expect(Flow)
        peer.attach_receiver("q", 2, snd_settle_mode=1)
        post = frames.frame(0, frames.transfer(1, 1), frames.message("m"))
        flow = frames.flow(
            handle=2,
            link_credit=1,
            delivery_count=UInt(0),
            next_incoming_id=0,
            next_outgoing_id=2,
            properties={TXN_ID: declared.txn_id},
        )
        peer.send_raw(post + frames.frame(0, flow))
        transfer = peer.expect(Transfer)
        while not isinstance((answer := peer.receive().performative), Disposition):
            pass
        assert answer.state == Accepted()  # the post
        peer.transfer(0, 2, frames.message(AmqpValue(Discharge(txn_id=declared.txn_id, fail=True))))
        while not isinstance((answer := peer.receive().performative), Disposition):
            pass
        assert answer.state == Accepted()  # the rollback
    broker.wait_for(lambda: broker.transactions == [], timeout=2.0)
    assert (transfer.state, q.depth) == (TransactionalState(txn_id=declared.txn_id), 1), (
        f"the message taken on the credit of T's flow was sent outside T ({transfer.state}) and is gone after T's "
        f"rollback (depth {q.depth})"
    )
