"""Adversarial review of issue 19's engine receive path (``_on_frame`` split into one fast test and
``_on_connection_frame``, ``_on_transfer``'s handle checks, one-delivery dispositions): frames in the wrong phase,
on unknown or ended channels, above handle-max, of the wrong frame type, after our close, aborted and continued
transfers, dispositions with first > last or naming one delivery. Every expectation below was checked equal on
a0f32da (before issue 19's engine work) and follows AMQP 1.0 Part 2: §2.4.1 open first, §2.4.3 after close
only close, §2.7.2 handle-max framing-error, §2.5.? unattached-handle, §2.6.14 aborted, §2.7.6 disposition."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from minibroker.amqp.definitions import Accepted, Close, End, Open, SaslInit
from minibroker.amqp.framing import AMQP_HEADER, SASL_FRAME
from minibroker.amqp.types import Symbol, UInt
from minibroker.engine.events import Event
from minibroker.testing import frames
from minibroker.testing.client import parse_frames, split_header
from tests.engine.test_connection import Harness

pytestmark = pytest.mark.timeout(30)

NOT_ALLOWED = "amqp:not-allowed"
FRAMING = "amqp:connection:framing-error"


def summary(h: Harness, events: list[Event]) -> tuple[list[str], list[tuple[int, str, str | None]], str]:
    """(event kinds, (channel, performative, error condition) of each frame out, phase)."""
    data = h.conn.data_to_send()
    if data.startswith(b"AMQP"):
        data = split_header(data)[1]
    out = [(f.channel, type(f.performative).__name__, _condition(f.performative)) for f in parse_frames(data)]
    return [type(e).__name__ for e in events], out, h.conn.phase.value


def _condition(performative: Any) -> str | None:
    err = getattr(performative, "error", None)
    return None if err is None else str(err.condition)


def _link(h: Harness) -> Harness:
    h.receiving_link(0)
    return h


def session_frame_before_open() -> tuple[Harness, list[Event]]:
    h = Harness()
    return h, h.feed(AMQP_HEADER, frames.frame(0, frames.begin()))


def transfer_before_open() -> tuple[Harness, list[Event]]:
    h = Harness()
    return h, h.feed(AMQP_HEADER, frames.frame(0, frames.transfer(0, 0), b"x"))


def open_twice() -> tuple[Harness, list[Event]]:
    h = Harness().opened()
    return h, h.send(frames.open_())


def transfer_on_a_channel_never_begun() -> tuple[Harness, list[Event]]:
    h = Harness().opened()
    return h, h.send(frames.transfer(0, 0), 3, b"x")


def transfer_above_handle_max() -> tuple[Harness, list[Event]]:
    h = Harness().opened().session(handle_max=UInt(1))
    return h, h.send(frames.transfer(5, 0), 0, b"x")


def flow_above_handle_max() -> tuple[Harness, list[Event]]:
    h = Harness().opened().session(handle_max=UInt(1))
    return h, h.send(frames.flow(handle=UInt(7), delivery_count=0, link_credit=1))


def transfer_on_an_unattached_handle() -> tuple[Harness, list[Event]]:
    h = Harness().opened().session()
    return h, h.send(frames.transfer(5, 0), 0, b"x")


def transfer_in_a_sasl_frame() -> tuple[Harness, list[Event]]:
    h = _link(Harness().opened().session())
    return h, h.feed(frames.frame(0, frames.transfer(0, 0), b"x", frame_type=SASL_FRAME))


def sasl_init_after_open() -> tuple[Harness, list[Event]]:
    h = Harness().opened().session()
    return h, h.send(SaslInit(mechanism=Symbol("PLAIN")))


def not_a_performative() -> tuple[Harness, list[Event]]:
    h = Harness().opened().session()
    return h, h.feed(frames.frame(0, Accepted()))


def transfer_after_the_peers_end() -> tuple[Harness, list[Event]]:
    h = Harness().opened().session()
    h.send(End())
    h.out()
    return h, h.send(frames.transfer(0, 0), 0, b"x")


def transfer_after_our_close() -> tuple[Harness, list[Event]]:
    h = _link(Harness().opened().session())
    h.conn.close()
    h.out()
    return h, h.send(frames.transfer(0, 0), 0, b"x") + h.send(Close())


def begin_and_open_after_our_close() -> tuple[Harness, list[Event]]:
    h = Harness().opened().session()
    h.conn.close()
    h.out()
    return h, h.send(frames.begin(), 1) + h.send(Open(container_id="x"))


def disposition_first_above_last() -> tuple[Harness, list[Event]]:
    h = Harness().opened().session()
    return h, h.send(frames.disposition(5, 2, state=Accepted()))


def aborted_then_next_delivery() -> tuple[Harness, list[Event]]:
    h = _link(Harness().opened().session())
    return h, (
        h.send(frames.transfer(0, 0, more=True), 0, b"ab")
        + h.send(frames.transfer(0, None, aborted=True), 0, b"")
        + h.send(frames.transfer(0, 1), 0, b"cd")
    )


def continued_transfer() -> tuple[Harness, list[Event]]:
    h = _link(Harness().opened().session())
    return h, h.send(frames.transfer(0, 0, more=True), 0, b"ab") + h.send(frames.transfer(0, None), 0, b"cd")


def one_delivery_disposition_role_sender_twice() -> tuple[Harness, list[Event]]:
    """The peer (as sender of delivery 0) settles it, then settles it again with first == last: nothing more."""
    h = _link(Harness().opened().session())
    return h, (
        h.send(frames.transfer(0, 0, settled=False), 0, b"x")
        + h.send(frames.disposition(0, role=frames.SENDER, state=Accepted()))
        + h.send(frames.disposition(0, 0, role=frames.SENDER, settled=True, state=Accepted()))
    )


CASES: list[tuple[Callable[[], tuple[Harness, list[Event]]], Any]] = [
    (session_frame_before_open, (["ConnectionClosed"], [(0, "Open", None), (0, "Close", NOT_ALLOWED)], "close-sent")),
    (transfer_before_open, (["ConnectionClosed"], [(0, "Open", None), (0, "Close", NOT_ALLOWED)], "close-sent")),
    (open_twice, (["ConnectionClosed"], [(0, "Close", NOT_ALLOWED)], "close-sent")),
    (transfer_on_a_channel_never_begun, (["ConnectionClosed"], [(0, "Close", NOT_ALLOWED)], "close-sent")),
    (transfer_above_handle_max, (["SessionEnded", "ConnectionClosed"], [(0, "Close", FRAMING)], "finished")),
    (flow_above_handle_max, (["SessionEnded", "ConnectionClosed"], [(0, "Close", FRAMING)], "finished")),
    (
        transfer_on_an_unattached_handle,
        (["SessionEnded"], [(0, "End", "amqp:session:unattached-handle")], "opened"),
    ),
    (
        transfer_in_a_sasl_frame,
        (["LinkDetached", "SessionEnded", "ConnectionClosed"], [(0, "Close", FRAMING)], "finished"),
    ),
    (sasl_init_after_open, (["SessionEnded", "ConnectionClosed"], [(0, "Close", NOT_ALLOWED)], "close-sent")),
    (not_a_performative, (["SessionEnded", "ConnectionClosed"], [(0, "Close", NOT_ALLOWED)], "close-sent")),
    (transfer_after_the_peers_end, (["ConnectionClosed"], [(0, "Close", NOT_ALLOWED)], "close-sent")),
    (transfer_after_our_close, (["LinkDetached", "SessionEnded", "ConnectionClosed"], [], "finished")),
    (begin_and_open_after_our_close, (["SessionEnded", "ConnectionClosed"], [], "close-sent")),
    (disposition_first_above_last, ([], [], "opened")),
    (aborted_then_next_delivery, (["TransferDiscarded", "TransferReceived"], [], "opened")),
    (continued_transfer, (["TransferReceived"], [], "opened")),
    (one_delivery_disposition_role_sender_twice, (["TransferReceived", "IncomingSettled"], [], "opened")),
]


@pytest.mark.parametrize(("script", "expected"), CASES, ids=[c[0].__name__ for c in CASES])
def test_misplaced_and_edge_frames(script: Callable[[], tuple[Harness, list[Event]]], expected: Any) -> None:
    assert summary(*script()) == expected
