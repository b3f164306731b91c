"""The engine's fast-path answers on the wire are byte for byte those of the general codec (issue 19).

A traced connection sends every disposition through the general codec (``ServerConnection._send``); an
untraced one builds ``accepted``, ``declared`` and ``transactional-state`` answers with
``fastpath.encode_disposition``. The same transactions (declare, posts, a transactional accept, commit and
rollback, a txn-id of every length the broker may be given) must give the same bytes either way.
"""

from __future__ import annotations

from typing import Any

import pytest

from minibroker.amqp.definitions import (
    Accepted,
    AmqpValue,
    Coordinator,
    Declare,
    Discharge,
    Source,
    TransactionalState,
)
from minibroker.amqp.framing import AMQP_HEADER
from minibroker.broker.core import Broker
from minibroker.engine.connection import ServerConnection
from minibroker.testing import frames


def _session(traced: bool, txn_ids: list[bytes]) -> bytes:
    """Everything the broker sends for a run of transactions, with the connection traced or not."""
    broker = Broker(txn_ids=iter(txn_ids)) if txn_ids else Broker()
    trace: Any = (lambda *_: None) if traced else None
    conn = ServerConnection(trace=trace)
    broker.connection_made(conn)
    out = bytearray()

    def feed(data: bytes) -> None:
        broker.handle(conn, conn.receive_events(data, 0.0), 0.0)
        out.extend(conn.data_to_send())

    feed(AMQP_HEADER + frames.frame(0, frames.open_()) + frames.frame(0, frames.begin(incoming_window=1 << 30)))
    feed(frames.frame(0, frames.attach_sender(None, 0, "ctl", target=Coordinator(), source=Source())))
    feed(frames.frame(0, frames.attach_sender("q", 1)))
    feed(frames.frame(0, frames.attach_receiver("q", 2)))
    next_id = 0
    body = frames.message("x" * 10)
    for round_ in range(len(txn_ids) or 3):
        declare = frames.frame(0, frames.transfer(0, next_id), frames.message(AmqpValue(Declare())))
        feed(declare)
        txn_id = txn_ids[round_] if txn_ids else (round_ + 1).to_bytes(8, "big")
        state = TransactionalState(txn_id=txn_id)
        posts = b"".join(frames.frame(0, frames.transfer(1, next_id + 1 + i, state=state), body) for i in range(3))
        feed(posts)  # three posts in one read: one ranged provisional answer
        flow = frames.flow(
            next_incoming_id=3 * round_,
            incoming_window=1 << 30,
            next_outgoing_id=next_id + 4,
            outgoing_window=1 << 30,
            handle=2,
            delivery_count=3 * round_,
            link_credit=3,
        )
        feed(frames.frame(0, flow))
        accepted = TransactionalState(txn_id=txn_id, outcome=Accepted())
        for d in range(3 * round_, 3 * round_ + 3):
            feed(frames.frame(0, frames.disposition(d, settled=False, state=accepted)))
        discharge = Discharge(txn_id=txn_id, fail=round_ % 2 == 1)  # commit, then roll back, in turn
        feed(frames.frame(0, frames.transfer(0, next_id + 4), frames.message(AmqpValue(discharge))))
        next_id += 5
    return bytes(out)


@pytest.mark.parametrize("length", [0, 1, 8, 32])
def test_fast_answers_are_the_general_codecs_bytes(length: int) -> None:
    txn_ids = [bytes([n]) * length for n in range(1, 4)] if length else []
    fast = _session(False, txn_ids)
    assert b"\x00\x53\x33" in fast  # a declared went out
    assert b"\x00\x53\x34" in fast  # and a transactional-state
    assert fast == _session(True, txn_ids)
