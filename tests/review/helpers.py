"""Shared helpers of the review probes (branch ``review``): batched frames and re-exported fixtures.

Every probe runs the real broker core, engine and connection tasks over in-memory streams under
pytest-trio's ``autojump_clock`` (``minibroker.testing.memory``), reusing the ``Client`` of
``tests/broker/test_transactions_frames.py``. Each probe asserts the behaviour the specification (or the
README) requires; each failed on the code the review read (commit 9670db6) and passes since the fixes of c802a4d.
"""

from __future__ import annotations

from typing import Any

from minibroker.amqp.definitions import AmqpValue, TransactionalState
from minibroker.testing import frames
from tests.broker.test_transactions_adversarial import answers_to, gather
from tests.broker.test_transactions_frames import Client

__all__ = ["answers_to", "control_frame", "gather", "post_frame"]


def control_frame(
    c: Client, body: Any, *, handle: int = 0, settled: bool = False, channel: int = 0
) -> tuple[int, bytes]:
    """The bytes of a declare/discharge transfer (not sent), and its delivery id."""
    delivery_id = c.next_id(channel)
    c.peer.conn.send(
        frames.transfer(handle, delivery_id, settled=settled or None), channel, frames.message(AmqpValue(body))
    )
    return delivery_id, c.peer.conn.data_to_send()


def post_frame(
    c: Client,
    handle: int,
    payload: bytes,
    *,
    txn: bytes | None = None,
    channel: int = 0,
    settled: bool = False,
    **fields: Any,
) -> tuple[int, bytes]:
    """The bytes of a (transactional) transfer (not sent), and its delivery id."""
    delivery_id = c.next_id(channel)
    state = TransactionalState(txn_id=txn) if txn is not None else None
    performative = frames.transfer(handle, delivery_id, state=state, settled=settled or None, **fields)
    c.peer.conn.send(performative, channel, payload)  # counted by the client core, written later by the test
    return delivery_id, c.peer.conn.data_to_send()
