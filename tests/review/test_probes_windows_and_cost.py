"""Probes: credit and cost corner cases of multi-frame and aborted transfers (Part 2 §2.6.7, §2.6.14).

README/settings: ``link_credit``: "Credit granted to each producer link, topped up when half is used".
Part 2 §2.6.14 (transfer.aborted): "An aborted Message is implicitly settled"; an aborted delivery still
used one unit of link-credit (the delivery-count advanced when its first transfer arrived).

issue 11 (R9, deviation 9): cost must not grow with what the peer can pile up; README (issue 11, D1): "Frames carrying
no state inherit the state of the earlier frames" (the engine keeps every earlier state of a delivery).
"""

from __future__ import annotations

import time

import pytest
from trio.testing import MockClock

from minibroker.amqp.definitions import Accepted, Flow, TransactionalState
from minibroker.amqp.framing import AMQP_HEADER
from minibroker.broker.core import BrokerSettings
from minibroker.engine.connection import ServerConnection
from minibroker.testing import frames
from minibroker.testing.memory import MemoryBroker
from tests.broker import test_transactions_frames as frame_tests
from tests.broker.test_transactions_adversarial import BIG
from tests.broker.test_transactions_frames import client
from tests.review.helpers import gather

mb = frame_tests.mb
settings = frame_tests.settings


@pytest.mark.parametrize("settings", [BrokerSettings(link_credit=4)], ids=["link-credit-4"])
@pytest.mark.parametrize("transactional", [False, True], ids=["plain", "under-T"])
async def test_aborted_transfers_use_up_producer_credit_for_ever(
    mb: MemoryBroker, autojump_clock: MockClock, transactional: bool
) -> None:
    """Every aborted transfer uses one credit; the broker tops credit up only when a transfer completes, so
    a producer that aborts ``link_credit`` transfers in a row is left with none, and never gets more (with
    the default 1000: after 1000 aborts, e.g. a client cancelling large sends)."""
    c = await client(mb)
    txn = None
    if transactional:
        await c.coordinator()
        txn = await c.declare()
    attach = await c.peer.attach_sender("q", 1)
    assert (await c.peer.expect(Flow)).link_credit == 4
    state = TransactionalState(txn_id=txn) if txn is not None else None
    for _ in range(4):
        delivery_id = c.next_id()
        await c.peer.transfer(1, delivery_id, BIG[:200], state=state, more=True)
        await c.peer.transfer(1, None, b"", aborted=True)
    got = await gather(c.peer)
    flows = [f.performative for f in got if isinstance(f.performative, Flow) and f.performative.handle == attach.handle]
    assert flows, f"no credit left and none granted after the aborted transfers: {got}"
    assert flows[-1].link_credit, f"no credit left and none granted after the aborted transfers: {got}"
    if txn is not None:
        assert await c.discharge(txn) == Accepted()


def _engine_with_producer() -> tuple[ServerConnection, object]:
    conn = ServerConnection()
    conn.receive_data(AMQP_HEADER + frames.frame(0, frames.open_()) + frames.frame(0, frames.begin()), 0)
    (event,) = conn.receive_data(frames.frame(0, frames.attach_sender("q", 0)), 0)
    link = event.link
    conn.accept_attach(link, source=link.source, target=link.target)
    conn.grant_credit(link, 10)
    return conn, link


def _feed_partial(n: int, *, alternate: bool) -> float:
    """Seconds the engine takes to read an unfinished transfer of ``n`` empty frames whose states alternate
    between two txn-ids (or all name one), in 64 KiB reads as the server does."""
    conn, _link = _engine_with_producer()
    states = [TransactionalState(txn_id=b"a" * 16), TransactionalState(txn_id=b"b" * 16)]
    data = bytearray(frames.frame(0, frames.transfer(0, 0, state=states[0], more=True)))
    for i in range(1, n):
        state = states[i % 2] if alternate else states[0]
        data += frames.frame(0, frames.transfer(0, None, state=state, more=True))
    payload = bytes(data)
    start = time.perf_counter()
    for offset in range(0, len(payload), 65536):
        conn.receive_data(payload[offset : offset + 65536], 0)
    return time.perf_counter() - start


def test_frames_naming_alternating_transactions_cost_quadratic_time() -> None:
    """The engine copies the whole list of earlier states on every frame whose state differs from the last
    (``earlier_states = [*earlier_states, state]``): a transfer of n frames alternating two txn-ids costs
    O(n^2) in the broker's only thread, with no transaction declared and no payload (max-message-size does not
    bound it). 40,000 empty frames (1.8 MB) take seconds, during which no other connection is served."""
    n = 40_000
    same = _feed_partial(n, alternate=False)
    alternating = _feed_partial(n, alternate=True)
    assert alternating < 2.5 * same + 0.2, f"{n} frames: {same:.2f}s naming one txn-id, {alternating:.2f}s alternating"


async def test_a_stale_session_flow_that_shrinks_the_window_must_not_open_it_wide(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    """Part 2 §2.5.6: remote-incoming-window = next-incoming-id(flow) + incoming-window(flow) - next-outgoing-id.
    A flow the client sent before reading the broker's latest transfers has a next-incoming-id behind the
    broker's next-outgoing-id; if it also shrinks the window, the difference is negative: no frame may be
    sent. The engine masks it to 32 bits (``& SERIAL_MASK``), which turns -1 into 4294967295, and every held-back
    frame floods out past the client's window (here, the rest of a transactionally acquired message)."""
    from tests.broker.test_transactions_adversarial import fill_big
    from tests.broker.test_transactions_frames import TXN_ID

    await fill_big(mb, "big")
    c = frame_tests.Client(await mb.connect())
    await c.peer.open(container_id="shrinking", max_frame_size=frames.UInt(512))
    await c.peer.begin(incoming_window=4)
    await c.coordinator()
    txn = await c.declare()
    await c.receiver("big", 2)
    await c.peer.flow(2, 1, incoming_window=4, properties={TXN_ID: txn})
    await mb.settle()  # four of the ~7 frames are now on their way; we have read none of them
    # our flow, crossing them: from what we have received (nothing), we take 3 frames in all
    await c.peer.send(frames.flow(next_incoming_id=0, incoming_window=3, next_outgoing_id=2, outgoing_window=2048))
    got = [f for f in await gather(c.peer) if isinstance(f.performative, frames.Transfer)]
    assert len(got) <= 4, (
        f"{len(got)} transfer frames came against a window that allowed 3 (at most the 4 already sent)"
    )
    await c.peer.flow(incoming_window=100)  # tidy up: open the window, roll back
    await c.control(frames_discharge(txn))
    await gather(c.peer)


def frames_discharge(txn: bytes) -> object:
    from minibroker.amqp.definitions import Discharge

    return Discharge(txn_id=txn, fail=True)
