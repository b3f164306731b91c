"""Probes: the engine items of issue 12 (4 heartbeat floor, 16 frames counted toward max-message-size, 17 handles).

Part 2 §2.7.3 attach, max-message-size: "the maximum message size supported by the link endpoint. Any attempt to
deliver a message larger than this results in a message-size-exceeded link-error" - a larger one, not a smaller
one sent in small frames.
"""

from __future__ import annotations

import pytest

from minibroker.amqp.definitions import Close, Detach
from minibroker.amqp.errors import Condition
from minibroker.amqp.types import UInt
from minibroker.engine.events import TransferReceived
from minibroker.testing import frames
from tests.engine.test_connection import Harness, condition


def test_a_message_below_max_message_size_sent_in_small_frames_is_taken() -> None:
    """A 600-byte message (limit 1000) in six frames of 100 bytes: charged 5 x 256 + 100 = 1380, and refused."""
    h = Harness(max_message_size=1000).opened().session()
    h.receiving_link(0)
    message = bytes(range(200)) * 3
    chunks = [message[i : i + 100] for i in range(0, len(message), 100)]
    events = []
    for i, chunk in enumerate(chunks):
        more = i < len(chunks) - 1
        events += h.send(frames.transfer(0, 0 if i == 0 else None, more=more), payload=chunk)
    refused = [f.performative for f in h.out() if isinstance(f.performative, Detach)]
    assert not refused, f"a {len(message)}-byte message, under the 1000-byte limit, was refused: {refused}"
    assert [type(e) for e in events] == [TransferReceived]


@pytest.mark.parametrize("kind", ["flow", "transfer", "detach"])
def test_any_handle_above_handle_max_closes_the_connection_with_framing_error(kind: str) -> None:
    """§2.7.2 begin, handle-max: "A peer that receives a handle outside the supported range MUST close the
    connection with the framing-error error-code" - any frame naming a handle, not only an attach (our begin
    announced handle-max 15; these frames name handle 5000)."""
    h = Harness(max_links=16).opened().session()
    performative = {
        "flow": frames.flow(handle=5000, link_credit=1, next_incoming_id=0, next_outgoing_id=0),
        "transfer": frames.transfer(5000, 0),
        "detach": Detach(handle=UInt(5000)),
    }[kind]
    h.send(performative)
    answers = [f.performative for f in h.out()]
    closes = [p for p in answers if isinstance(p, Close)]
    assert closes, answers
    assert condition(closes[0]) == Condition.FRAMING_ERROR, answers
