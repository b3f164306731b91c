"""``bench.raw.RawClient``: the benchmarks' raw-socket client keeps no protocol state of its own; what it
sends pre-encoded is booked by the client core exactly as what it sends through ``ClientConnection.send``."""

from __future__ import annotations

import pytest

from bench.perf_raw import PerfClient
from bench.raw import BrokerClosed, RawClient, Unexpected, encode_transfer, runs
from minibroker.amqp.definitions import AmqpValue, Attach, Begin, Close, Flow, Transfer
from minibroker.amqp.types import UInt
from minibroker.testing import frames
from minibroker.testing.client import ClientConnection, Expect, Script, Send, parse_frames
from minibroker.testing.thread import ThreadedBroker

HOST = "127.0.0.1"


def test_runs_split_ids_into_consecutive_ranges_of_at_most_limit_across_the_serial_wrap() -> None:
    assert runs([]) == []
    assert runs([1, 2, 3, 5, 6, 0xFFFFFFFF, 0, 1, 9]) == [(1, 3), (5, 6), (0xFFFFFFFF, 1), (9, 9)]
    assert runs(range(250), 100) == [(0, 99), (100, 199), (200, 249)]
    assert runs([0xFFFFFFFE, 0xFFFFFFFF, 0, 1], 3) == [(0xFFFFFFFE, 0), (1, 1)]


def test_an_encoded_transfer_carries_the_transfer_it_is_booked_as() -> None:
    encoded = encode_transfer(3, 70000, b"payload", settled=True, channel=2)
    (frame,) = parse_frames(encoded.data)
    assert (frame.channel, frame.performative, frame.payload) == (2, encoded.transfer, b"payload")
    assert encoded.transfer.delivery_tag == (70000).to_bytes(4, "big")


def vars_of(conn: ClientConnection) -> tuple[object, ...]:
    """What the core booked of the sending side of session 0 and link 0."""
    session = conn.session(0)
    link = session.links[0]
    return (session.next_outgoing_id, session.remote_incoming_window, session.next_delivery_id,
            link.delivery_count, link.credit, link.sending)  # fmt: skip


def test_a_pre_encoded_transfer_is_booked_as_one_sent_through_send() -> None:
    def connection() -> ClientConnection:
        conn = ClientConnection()
        conn.send(frames.begin())
        conn.send(frames.attach_sender("q", 0, "s"))
        return conn

    encoded = encode_transfer(0, 0, b"x", settled=False)
    sent, pre = connection(), connection()
    sent.send(Transfer(handle=UInt(0), delivery_id=UInt(0), delivery_tag=b"\0\0\0\0", message_format=UInt(0),
                       settled=False, more=False), payload=b"x")  # fmt: skip
    pre.send_encoded(encoded.data, encoded.transfer)
    assert vars_of(sent) == vars_of(pre)
    assert pre.session(0).next_outgoing_id == pre.next_delivery_id() == 1
    assert pre.session(0).links[0].delivery_count == 1


@pytest.mark.timeout(30)
def test_stream_sends_within_credit_and_a_receiver_accepts_in_ranges(broker: ThreadedBroker) -> None:
    sender = PerfClient(f"{HOST}:{broker.port}")
    link = sender.attach_sender("raw.q", "s", snd_settle_mode=UInt(2))
    assert link.credit > 0
    assert sender.conn.session(0).remote_incoming_window > 0
    count = link.credit + 50  # more than the first grant: the broker's flows must be booked to finish
    encoded = [sender.transfer(link, frames.message(AmqpValue(i)), settled=False, offset=i) for i in range(count)]
    assert sender.stream(link, encoded) == count
    sender.wait(lambda: sender.accepted == count)
    assert sender.settled_ids == set(range(count))
    assert len(sender.latencies_ms) == count
    assert link.delivery_count == count
    assert sender.conn.violations == []

    receiver = PerfClient(f"{HOST}:{broker.port}")
    inbound = receiver.attach_receiver("raw.q", "r", 40)
    received = 0
    while received < count:
        receiver.pump(0.5)
        taken = receiver.accept_unsettled(limit=16)
        received += taken
        if taken and received < count:
            receiver.grant(inbound, 40)
            receiver.flush()
    assert received == count
    assert inbound.delivery_count == count
    assert receiver.conn.session(0).unsettled == {}
    assert receiver.conn.violations == []
    sender.close()
    receiver.close()


@pytest.mark.timeout(30)
def test_expect_skips_frames_and_a_script_step_answered_otherwise_is_unexpected(broker: ThreadedBroker) -> None:
    client = RawClient(HOST, broker.port, timeout=5.0)
    client.open("raw-test", sasl="ANONYMOUS")
    client.send(frames.attach_sender("raw.other", handle=0))
    seen: list[object] = []
    flow = client.expect(Flow, seen=seen)
    assert flow.handle == 0
    assert [type(p) for p in seen] == [Attach]
    with pytest.raises(Unexpected):
        client.run(attach_expecting_begin())
    client.send(Close())
    client.expect(Close)
    with pytest.raises(BrokerClosed):  # the broker closes the socket after its close
        client.receive(1.0)
    client.sock.close()


def attach_expecting_begin() -> Script[None]:
    """A script that attaches a link and (wrongly) expects a ``begin`` as the answer."""
    yield Send(frames.attach_sender("raw.other", handle=1, name="second"))
    yield Expect(Begin)
