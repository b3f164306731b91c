"""Ordering through the AMQP 0-9-1 gateway of the real server, frame by frame over a socket: what a channel's later
method sees of its earlier publishes (RabbitMQ's channel process handles a channel's methods in order), delivery
order and tags, and the numbering of publisher confirms."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from minibroker.amqp091 import definitions as d
from minibroker.amqp091.frames import MethodFrame, encode_content, encode_method_frame
from minibroker.testing.thread import ThreadedBroker
from tests.amqp091.peer import SocketPeer

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def peer(minibroker: ThreadedBroker) -> Iterator[SocketPeer]:
    with SocketPeer(minibroker.host, minibroker.port) as client:
        client.handshake()
        client.channel(1)
        yield client


def count(peer: SocketPeer, queue: str, channel: int = 1) -> int:
    return peer.call(channel, d.QueueDeclare(queue=queue, passive=True), d.QueueDeclareOk).message_count


def test_a_passive_declare_after_publishes_counts_them(peer: SocketPeer) -> None:
    peer.call(1, d.QueueDeclare(queue="q"), d.QueueDeclareOk)
    for n in range(1, 6):
        peer.publish(1, b"m%d" % n, routing_key="q")
        assert count(peer, "q") == n


def test_publishes_in_one_write_then_a_passive_declare(peer: SocketPeer) -> None:
    peer.call(1, d.QueueDeclare(queue="q"), d.QueueDeclareOk)
    data = b"".join(
        encode_content(1, d.BasicPublish(routing_key="q"), d.BasicProperties(), b"x" * n, 131072) for n in range(50)
    )
    peer.send(data + encode_method_frame(1, d.QueueDeclare(queue="q", passive=True)))
    assert peer.expect(1, d.QueueDeclareOk).message_count == 50


def test_basic_get_right_after_publishes_sees_them_in_order(peer: SocketPeer) -> None:
    peer.call(1, d.QueueDeclare(queue="q"), d.QueueDeclareOk)
    for n in range(5):
        peer.publish(1, b"m%d" % n, routing_key="q")
    for n in range(5):
        peer.method(1, d.BasicGet(queue="q", no_ack=True))
        get_ok, _, body = peer.content(1, d.BasicGetOk)
        assert (body, get_ok.message_count, get_ok.delivery_tag) == (b"m%d" % n, 4 - n, n + 1)
    peer.call(1, d.BasicGet(queue="q"), d.BasicGetEmpty)


def test_tx_commit_after_n_publishes_makes_exactly_n_visible(peer: SocketPeer) -> None:
    peer.channel(2)
    peer.call(1, d.QueueDeclare(queue="q"), d.QueueDeclareOk)
    peer.call(1, d.TxSelect(), d.TxSelectOk)
    for round_ in range(1, 4):
        for n in range(7):
            peer.publish(1, b"m%d" % n, routing_key="q")
        assert count(peer, "q", channel=2) == 7 * (round_ - 1)  # staged, not visible
        peer.call(1, d.TxCommit(), d.TxCommitOk)
        assert count(peer, "q", channel=2) == 7 * round_
    for _ in range(3):
        peer.publish(1, b"gone", routing_key="q")
    peer.call(1, d.TxRollback(), d.TxRollbackOk)
    peer.call(1, d.TxCommit(), d.TxCommitOk)
    assert count(peer, "q", channel=2) == 21


def test_a_consumer_gets_queue_order_with_increasing_tags(peer: SocketPeer) -> None:
    peer.call(1, d.QueueDeclare(queue="q"), d.QueueDeclareOk)
    for n in range(300):
        peer.publish(1, b"%d" % n, routing_key="q")
    peer.call(1, d.BasicQos(prefetch_count=50), d.BasicQosOk)
    peer.call(1, d.BasicConsume(queue="q", consumer_tag="c"), d.BasicConsumeOk)
    for n in range(300):
        deliver, _, body = peer.content(1, d.BasicDeliver)
        assert (deliver.consumer_tag, deliver.delivery_tag, body, deliver.redelivered) == ("c", n + 1, b"%d" % n, False)
        if n % 10 == 9:
            peer.method(1, d.BasicAck(delivery_tag=n + 1, multiple=True))
    assert count(peer, "q") == 0


def confirms(peer: SocketPeer, totals: dict[int, int]) -> dict[int, dict[int, str]]:
    """Read ack/nack frames until every confirm number of each channel (``totals``: channel -> publishes) is
    answered; each exactly once, ``multiple`` covering exactly the unconfirmed ones up to its tag."""
    answered: dict[int, dict[int, str]] = {channel: {} for channel in totals}
    while any(len(answered[channel]) < total for channel, total in totals.items()):
        frame = peer.frame()
        assert isinstance(frame, MethodFrame), frame
        assert frame.channel in totals, frame
        method = frame.method
        assert isinstance(method, (d.BasicAck, d.BasicNack)), method
        kind = "ack" if isinstance(method, d.BasicAck) else "nack"
        tag, seen = method.delivery_tag, answered[frame.channel]
        assert 1 <= tag <= totals[frame.channel], frame
        assert tag not in seen, (frame, seen)
        for t in [t for t in range(1, tag + 1) if t not in seen] if method.multiple else [tag]:
            seen[t] = kind
    return answered


def test_confirms_are_numbered_from_one_per_channel(peer: SocketPeer) -> None:
    peer.channel(2)
    peer.call(1, d.QueueDeclare(queue="q"), d.QueueDeclareOk)
    for channel in (1, 2):
        peer.call(channel, d.ConfirmSelect(), d.ConfirmSelectOk)
    for n in range(40):
        peer.publish(1, b"a", routing_key="q")
        if n % 2:
            peer.publish(2, b"b", routing_key="q")
    assert confirms(peer, {1: 40, 2: 20}) == {
        1: dict.fromkeys(range(1, 41), "ack"),
        2: dict.fromkeys(range(1, 21), "ack"),
    }
    assert count(peer, "q") == 60


def test_confirms_of_acks_and_nacks_cover_each_publish_once(peer: SocketPeer) -> None:
    """A queue at its limit with reject-publish nacks; the acks around them with ``multiple`` never cover a nacked
    number (RabbitMQ's confirms documentation: each publish is acked or nacked exactly once)."""
    peer.call(
        1,
        d.QueueDeclare(queue="small", arguments={"x-max-length": 3, "x-overflow": "reject-publish"}),
        d.QueueDeclareOk,
    )
    peer.call(1, d.QueueDeclare(queue="big"), d.QueueDeclareOk)
    peer.call(1, d.ConfirmSelect(), d.ConfirmSelectOk)
    expected = {}
    small = 0
    for n in range(1, 31):
        if n % 3 == 0:
            peer.publish(1, b"s", routing_key="small")
            small += 1
            expected[n] = "ack" if small <= 3 else "nack"
        else:
            peer.publish(1, b"b", routing_key="big")
            expected[n] = "ack"
    assert confirms(peer, {1: 30}) == {1: expected}
    assert count(peer, "small") == 3
    assert count(peer, "big") == 20


def test_an_unroutable_mandatory_publish_is_returned_then_acked(peer: SocketPeer) -> None:
    peer.call(1, d.ConfirmSelect(), d.ConfirmSelectOk)
    peer.publish(1, b"lost", routing_key="nowhere", mandatory=True)
    returned, _, body = peer.content(1, d.BasicReturn)
    assert (returned.reply_code, returned.reply_text, returned.routing_key, body) == (
        312,
        "NO_ROUTE",
        "nowhere",
        b"lost",
    )
    ack = peer.expect(1, d.BasicAck)
    assert (ack.delivery_tag, ack.multiple) == (1, False)


def test_an_unroutable_mandatory_publish_in_a_transaction_is_returned_at_commit(peer: SocketPeer) -> None:
    """rabbit_channel.erl routes a channel transaction's publishes at tx.commit, returning the unroutable mandatory
    ones (basic.return) before commit-ok; a rolled back one is never returned."""
    peer.call(1, d.QueueDeclare(queue="q"), d.QueueDeclareOk)
    peer.call(1, d.TxSelect(), d.TxSelectOk)
    peer.publish(1, b"dropped", routing_key="nowhere", mandatory=True)
    peer.call(1, d.TxRollback(), d.TxRollbackOk)
    peer.publish(1, b"kept", routing_key="q", mandatory=True)
    peer.publish(1, b"lost", routing_key="nowhere", mandatory=True)
    peer.publish(1, b"quiet", routing_key="nowhere")
    peer.method(1, d.TxCommit())
    returned, _, body = peer.content(1, d.BasicReturn)
    assert (returned.reply_code, returned.reply_text, returned.routing_key, body) == (
        312,
        "NO_ROUTE",
        "nowhere",
        b"lost",
    )
    peer.expect(1, d.TxCommitOk)
    assert count(peer, "q") == 1


def test_requeued_deliveries_come_back_redelivered_in_queue_order(peer: SocketPeer) -> None:
    peer.call(1, d.QueueDeclare(queue="q"), d.QueueDeclareOk)
    for n in range(3):
        peer.publish(1, b"m%d" % n, routing_key="q")
    peer.call(1, d.BasicQos(prefetch_count=3), d.BasicQosOk)
    peer.call(1, d.BasicConsume(queue="q", consumer_tag="c"), d.BasicConsumeOk)
    first = [peer.content(1, d.BasicDeliver) for _ in range(3)]
    assert [(m.delivery_tag, m.redelivered, body) for m, _, body in first] == [
        (1, False, b"m0"),
        (2, False, b"m1"),
        (3, False, b"m2"),
    ]
    peer.method(1, d.BasicNack(delivery_tag=3, multiple=True, requeue=True))
    again = [peer.content(1, d.BasicDeliver) for _ in range(3)]
    assert [(m.delivery_tag, m.redelivered, body) for m, _, body in again] == [
        (4, True, b"m0"),
        (5, True, b"m1"),
        (6, True, b"m2"),
    ]
    peer.call(1, d.BasicRecover(requeue=True), d.BasicRecoverOk)
    third = [peer.content(1, d.BasicDeliver) for _ in range(3)]
    assert [(m.redelivered, body) for m, _, body in third] == [(True, b"m0"), (True, b"m1"), (True, b"m2")]
    assert [m.delivery_tag for m, _, _ in third] == [7, 8, 9]
    peer.call(1, d.BasicCancel(consumer_tag="c"), d.BasicCancelOk)
    peer.method(1, d.BasicAck(delivery_tag=9, multiple=True))  # acks after the cancel still count
    peer.method(1, d.BasicAck(delivery_tag=4))  # acked above already: 406
    peer.channel_closed(1, 406, "PRECONDITION_FAILED - unknown delivery tag 4", 60, 80)
    peer.channel(1)
    assert count(peer, "q") == 0


def test_prefetch_limits_what_a_consumer_holds(peer: SocketPeer) -> None:
    peer.call(1, d.QueueDeclare(queue="q"), d.QueueDeclareOk)
    for n in range(5):
        peer.publish(1, b"m%d" % n, routing_key="q")
    peer.call(1, d.BasicQos(prefetch_count=2), d.BasicQosOk)
    peer.call(1, d.BasicConsume(queue="q", consumer_tag="c"), d.BasicConsumeOk)
    assert [peer.content(1, d.BasicDeliver)[2] for _ in range(2)] == [b"m0", b"m1"]
    with pytest.raises(TimeoutError):
        peer.frame(timeout=0.3)  # nothing more until an ack
    peer.method(1, d.BasicAck(delivery_tag=1))
    assert peer.content(1, d.BasicDeliver)[2] == b"m2"
    with pytest.raises(TimeoutError):
        peer.frame(timeout=0.3)
