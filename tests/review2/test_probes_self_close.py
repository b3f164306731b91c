"""Probes: an answer to a read-ahead transfer that closes the connection, and the frames parsed past it.

``Outbox.answer_now`` answers a post naming an unknown transaction at once, with a rejected outcome whose
description quotes the txn-id the client sent (``Coordinator._unknown_id_error``: ``txn_id.hex()``). The
txn-id is the client's to choose and has no length limit on the wire; to a client whose max-frame-size is 512
the disposition does not fit, and the engine closes the connection with amqp:frame-size-too-small
(``ServerConnection._send``). That close is a command given while handling a transfer on a producer link,
which ``accept_attach(read_ahead=True)`` promises never happens ("no detach, end or close"): the frames of the
same read after that transfer were already parsed, and the broker goes on to handle them after its own close.
A discharge(fail=false) in that read commits its transaction although, frame by frame, it would have been
read after the close and ignored (§2.4.3 / README: "nothing follows our close"), the transaction rolled
back with the connection.

Part 2 §2.4.3 (close): after sending close "the endpoint MUST NOT send any more frames" and frames received
after it are ignored; Part 4 §4.1: a connection that goes rolls back its transactions; README "Scope and
endings": frames of one read are handled "exactly as if they had come one by one"; README "Limits and
security": minibroker "closes only what must be closed".
"""

from __future__ import annotations

from trio.testing import MockClock

from minibroker.amqp.definitions import Accepted, Close, Disposition, Rejected, Transfer
from minibroker.amqp.types import UInt
from minibroker.testing import frames
from minibroker.testing.memory import MemoryBroker
from tests.broker import test_transactions_frames as frame_tests
from tests.broker.test_transactions_adversarial import watcher
from tests.broker.test_transactions_frames import Client
from tests.review.helpers import gather, post_frame

mb = frame_tests.mb
settings = frame_tests.settings

LONG_BOGUS_ID = b"\xab" * 300  # its hex (600 characters) alone does not fit a 512-byte frame


async def _small_frames_client(mb: MemoryBroker) -> Client:
    c = Client(await mb.connect())
    await c.peer.open(container_id="small-frames", max_frame_size=UInt(512))
    await c.peer.begin()
    return c


async def test_a_post_naming_a_long_unknown_txn_id_does_not_cost_the_connection(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    """Frame by frame (no read-ahead involved): the broker's own error description does not fit the client's
    frames, and the broker closes the connection instead of answering (or shortening its description)."""
    c = await _small_frames_client(mb)
    await c.sender("q", 1)
    await c.post(1, frames.message("m"), txn=LONG_BOGUS_ID)
    got = await gather(c.peer)
    closes = [f.performative for f in got if isinstance(f.performative, Close)]
    assert not closes, f"the broker closed the connection over its own answer's length: {closes}"
    assert any(isinstance(f.performative, Disposition) for f in got), got


async def test_a_post_read_ahead_behind_one_whose_answer_would_not_fit_is_published_once(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    """One write: a post whose rejection quotes a long unknown id (too long for the client's 512-byte frames, so
    the description is cut rather than the connection closed), then an unsettled plain post: both are answered,
    and the plain one reaches the consumer exactly once. (Read ahead or not, nothing is handled after a close of
    ours: ``test_connection.py::test_nothing_read_ahead_is_handed_over_after_our_close``.)"""
    q_watcher = await watcher(mb, "q")
    c = await _small_frames_client(mb)
    await c.sender("q", 1)
    _, bad = post_frame(c, 1, frames.message("names a long unknown id"), txn=LONG_BOGUS_ID)
    _, plain = post_frame(c, 1, frames.message("sent after the bad one"))
    await c.peer.send_raw(bad + plain)
    got = await gather(c.peer)
    assert not any(isinstance(f.performative, Close) for f in got), got
    states = [f.performative.state for f in got if isinstance(f.performative, Disposition)]
    assert [type(state) for state in states] == [Rejected, Accepted], states
    seen = [f.performative for f in await gather(q_watcher.peer) if isinstance(f.performative, Transfer)]
    for transfer in seen:
        await q_watcher.peer.disposition(transfer.delivery_id, state=Accepted())
    await gather(q_watcher.peer)
    assert len(seen) == 1
