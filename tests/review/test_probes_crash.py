"""Probes: frames that made the broker core raise (an exception escaping into the trio layer).

The engine used to parse a whole read before the core handled any of its events, marking what later frames
said (a delivery settled by the peer, a link detached) at parse time; the core then gave commands for earlier
events that the engine refused with ``LocalProtocolError``, the connection was dropped and, after a close, its
cleanup lost. Now each frame is parsed only once the core has acted on the one before (``receive_events``),
so the core answers each frame as if it had come alone: these probes check that the connection is served on,
with the answers that in-order handling gives.

Part 2 §2.7.6 (disposition) lets a receiver update a delivery's state and then settle it; §2.6.3 lets a
peer detach a link as soon as it attached it. Neither may cost the connection.
"""

from __future__ import annotations

import logging

import pytest
from trio.testing import MockClock

from minibroker.amqp.definitions import (
    Accepted,
    Attach,
    Coordinator,
    Detach,
    Disposition,
    Flow,
    Released,
    Source,
    TransactionalState,
)
from minibroker.amqp.types import Symbol, UInt
from minibroker.testing import frames
from minibroker.testing.memory import MemoryBroker
from minibroker.testing.peer import ScriptedPeer
from minibroker.testing.thread import ThreadedBroker
from tests.broker import test_transactions_frames as frame_tests
from tests.broker.test_transactions_frames import _fill, client

mb = frame_tests.mb
settings = frame_tests.settings


def _disposition(first: int, *, settled: bool, state: object) -> bytes:
    return frames.frame(0, frames.disposition(first, role=frames.RECEIVER, settled=settled, state=state))


@pytest.mark.parametrize(
    "first_state",
    [Accepted(), Released(), TransactionalState(txn_id=b"never-declared", outcome=Accepted())],
    ids=["accepted", "released", "unknown-txn-id"],
)
async def test_state_update_then_settle_in_one_read(
    mb: MemoryBroker, autojump_clock: MockClock, first_state: object
) -> None:
    c = await client(mb)
    await _fill(c, "q", ["m0", "m1"])
    await c.receiver("q", 2)
    await c.credit(2, 1)
    (delivered,) = await c.take(1)
    d = delivered.performative.delivery_id
    # an unsettled disposition, then the settlement, in one write
    await c.peer.send_raw(
        _disposition(d, settled=False, state=first_state) + _disposition(d, settled=True, state=Accepted())
    )
    await mb.settle()  # (this used to raise LocalProtocolError: "... cannot be settled: the peer settled it")
    # the unsettled outcome came first: the broker settled the delivery (with released when the outcome named no
    # transaction), before it read the client's own settlement
    answer = await c.peer.expect(Disposition)
    assert (answer.role, answer.first, answer.settled) == (frames.SENDER, d, True)
    await c.credit(2, 1)
    (again,) = await c.take(1)  # the connection is still served
    await c.peer.disposition(again.performative.delivery_id, state=Accepted())
    await mb.settle()


async def test_attach_then_detach_in_one_read(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    """A controller that attaches and, before the answer, detaches (a client giving up at once)."""
    c = await client(mb)
    attach = frames.attach_sender(
        None,
        7,
        name="short-lived-controller",
        source=Source(),
        target=Coordinator(capabilities=[Symbol("amqp:local-transactions")]),
    )
    await c.peer.send_raw(frames.frame(0, attach) + frames.frame(0, Detach(handle=UInt(7), closed=True)))
    await mb.settle()  # (this used to raise: "... is detached: only an attach not yet answered can be accepted")
    # the link must be answered attach-then-detach (§2.6.3: our attach before our detach), and the
    # connection must live on
    first = await c.peer.receive()
    assert isinstance(first.performative, Attach), f"a Detach was sent for a link never attached: {first}"
    while not isinstance((await c.peer.receive()).performative, Detach):
        pass  # the attach was answered (and credited) before the detach was read
    await c.coordinator(handle=1)
    txn = await c.declare(handle=1)
    assert await c.discharge(txn, handle=1) == Accepted()


def test_over_tcp_state_update_then_settle_kills_the_connection(
    broker: ThreadedBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="minibroker")
    with ScriptedPeer.connect("127.0.0.1", broker.port) as peer:
        peer.open()
        peer.begin()
        peer.attach_sender("q", 1)
        peer.expect(Flow)
        peer.transfer(1, 0, frames.message("m0"), settled=True)
        peer.attach_receiver("q", 2)
        peer.flow(2, 1)
        transfer = peer.receive()
        d = transfer.performative.delivery_id
        peer.send_raw(
            _disposition(d, settled=False, state=Accepted()) + _disposition(d, settled=True, state=Accepted())
        )
        assert peer.expect(Disposition).state == Accepted()  # the broker settled it before reading the settlement
        try:
            peer.attach_receiver("q", 3, name="still-there")  # the connection must still be served
        except AssertionError as exc:
            pytest.fail(f"the broker dropped the connection: {exc}")
    failures = [r for r in caplog.records if "failed" in r.getMessage()]
    assert failures == [], [r.getMessage() for r in failures]


def _consumer_with_two(peer: ScriptedPeer) -> tuple[int, int]:
    """Post m0, m1 to q (pre-settled), take both unsettled on handle 2; their delivery ids."""
    peer.open()
    peer.begin()
    peer.attach_sender("q", 1)
    peer.expect(Flow)
    peer.transfer(1, 0, frames.message("m0"), settled=True)
    peer.transfer(1, 1, frames.message("m1"), settled=True)
    peer.attach_receiver("q", 2)
    peer.flow(2, 2)
    first, second = peer.receive(), peer.receive()
    return first.performative.delivery_id, second.performative.delivery_id


@pytest.mark.parametrize("ending", ["detach", "end", "close"])
@pytest.mark.parametrize("before", ["unsettled-disposition", "attach"])
def test_over_tcp_state_update_then_link_session_or_connection_end_in_one_read(
    broker: ThreadedBroker, caplog: pytest.LogCaptureFixture, ending: str, before: str
) -> None:
    """An unsettled disposition followed, in the same write, by the end of its link, session or connection
    (rcv-settle-mode second clients do exactly this when they close). The engine settles the delivery while
    parsing the detach/end/close; the core then settles it again for the disposition and raises. With
    ``close`` the events after the disposition (the link detaches, the session end, the connection close)
    are never handled and the engine is finished, so the core is never told the connection went: the
    other unsettled message stays acquired for ever, on a queue nobody can drain."""
    from minibroker.amqp.definitions import Close, End

    caplog.set_level(logging.ERROR, logger="minibroker")
    q = broker.queue("q")
    with ScriptedPeer.connect("127.0.0.1", broker.port) as peer:
        d0, _d1 = _consumer_with_two(peer)
        tail = {
            "detach": frames.frame(0, Detach(handle=UInt(2), closed=True)),
            "end": frames.frame(0, End()),
            "close": frames.frame(0, Close()),
        }[ending]
        if before == "attach":  # a new link, attached and (by the end/close) gone in the same write
            first = frames.frame(0, frames.attach_receiver("q", 9, name="late"))
            if ending == "detach":
                tail = frames.frame(0, Detach(handle=UInt(9), closed=True))
            peer.send_raw(_disposition(d0, settled=True, state=Accepted()) + first + tail)
        else:
            peer.send_raw(_disposition(d0, settled=False, state=Accepted()) + tail)
        awaited = {"close": Close, "end": End, "detach": Detach}[ending]
        try:  # what came before the ending is answered first (a disposition, an attach): frames are taken in order
            while not isinstance(peer.receive().performative, awaited):
                pass
        except AssertionError as exc:
            pytest.fail(f"the broker dropped the connection instead of answering the {ending}: {exc}")
    # m0 accepted; m1 released by the end of its link: back on the queue
    broker.wait_for(lambda: q.acquired == 0, timeout=2.0)
    assert (q.depth, q.acquired) == (1, 0)
    failures = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert failures == []


def test_over_tcp_close_behind_a_crashing_frame_leaves_the_transaction_open_and_its_message_acquired(
    broker: ThreadedBroker,
) -> None:
    """The transactional face of the same: T acquired m1; the client closes the connection in the same write
    as an unsettled disposition of m0. §4.1 (and README "Scope and endings"): dropping the connection rolls
    back its open transactions. Here the core never learns of the close: T stays open (until the time-out,
    300 s by default; for ever with transaction_timeout 0) and m1 stays acquired."""
    from minibroker.amqp.definitions import AmqpValue, Close, Declare, Declared, Disposition

    q = broker.queue("q")
    with ScriptedPeer.connect("127.0.0.1", broker.port) as peer:
        peer.open()
        peer.begin()
        peer.attach_sender("q", 1)
        peer.expect(Flow)
        peer.transfer(1, 0, frames.message("m0"), settled=True)
        peer.transfer(1, 1, frames.message("m1"), settled=True)
        peer.attach_sender(None, 0, name="controller", source=Source(), target=Coordinator())
        peer.expect(Flow)
        peer.transfer(0, 2, frames.message(AmqpValue(Declare())))
        declared = peer.expect(Disposition).state
        assert isinstance(declared, Declared)
        peer.attach_receiver("q", 2)
        peer.flow(2, 1)
        d0 = peer.receive().performative.delivery_id
        peer.flow(2, 2, properties={Symbol("txn-id"): declared.txn_id})
        peer.receive()  # m1, acquired under T
        peer.send_raw(_disposition(d0, settled=False, state=Accepted()) + frames.frame(0, Close()))
        while not isinstance(peer.receive().performative, Close):
            pass  # the close is answered: the connection ends cleanly (it used to be dropped)
    broker.wait_for(lambda: broker.transactions == [], timeout=2.0)  # TimeoutError here: T stays open
    assert (q.depth, q.acquired) == (1, 0)


async def test_disposition_behind_a_flow_naming_an_unknown_txn_id(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    """[flow(txn-id=unknown), disposition(d, unsettled, accepted)] in one write: the flow makes the broker
    detach the consumer link (README: a flow naming an unknown id detaches it), which settles d at the engine;
    the disposition is then handled and settling d again raises "we settled it already"."""
    from minibroker.amqp.types import Symbol as Sym

    c = await client(mb)
    await _fill(c, "q", ["m0", "m1"])
    await c.receiver("q", 2)
    await c.credit(2, 1)
    (delivered,) = await c.take(1)
    d = delivered.performative.delivery_id
    flow = frames.flow(
        next_incoming_id=1,
        incoming_window=2048,
        next_outgoing_id=c.peer.conn.session(0).next_outgoing_id,
        outgoing_window=2048,
        handle=2,
        delivery_count=1,
        link_credit=1,
        properties={Sym("txn-id"): b"never-declared"},
    )
    await c.peer.send_raw(frames.frame(0, flow) + _disposition(d, settled=False, state=Accepted()))
    await mb.settle()
    detach = await c.peer.expect(Detach)
    assert detach.error is not None
    await c.peer.send(Detach(handle=UInt(2), closed=True))
    await mb.settle()
    queue = mb.queue("q")
    # the flow came first: the link was detached, which released m0, and the disposition that followed (sent
    # before the client saw the detach) is void, §2.6.2
    assert (queue.acquired, queue.depth) == (0, 2)
