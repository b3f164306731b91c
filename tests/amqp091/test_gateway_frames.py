"""The AMQP 0-9-1 gateway of the real server, driven frame by frame over a socket (``peer.SocketPeer``): every
channel and connection error it gives, with RabbitMQ's reply code, text and class/method ids (read in
rabbit_channel.erl, rabbit_amqqueue.erl, rabbit_exchange.erl and rabbit_basic.erl), and that the channels and
connections it did not close keep working."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from minibroker.amqp091 import definitions as d
from minibroker.amqp091.frames import MethodFrame
from minibroker.testing.thread import ThreadedBroker
from tests.amqp091.peer import SocketPeer

pytestmark = pytest.mark.timeout(30)

PUBLISH = (60, 40)


@pytest.fixture
def vhost(minibroker: ThreadedBroker) -> str:
    """How the model names the test's namespace in its texts (RabbitMQ's "in vhost '/'")."""
    return minibroker.namespace_name


@pytest.fixture
def peer(minibroker: ThreadedBroker) -> Iterator[SocketPeer]:
    with SocketPeer(minibroker.host, minibroker.port) as client:
        client.handshake()
        client.channel(1)
        yield client


def declare(peer: SocketPeer, queue: str, channel: int = 1, **flags: bool) -> d.QueueDeclareOk:
    return peer.call(channel, d.QueueDeclare(queue=queue, **flags), d.QueueDeclareOk)


def still_serves(peer: SocketPeer, channel: int = 1) -> None:
    """``channel`` still answers (a round trip on it)."""
    peer.call(channel, d.QueueDeclare(queue="alive"), d.QueueDeclareOk)


# -- 404 NOT_FOUND ------------------------------------------------------------------------------------------------
def test_passive_declare_of_a_missing_queue_is_404_and_other_channels_keep_working(
    peer: SocketPeer, vhost: str
) -> None:
    peer.channel(2)
    peer.method(1, d.QueueDeclare(queue="nosuch", passive=True))
    peer.channel_closed(1, 404, f"NOT_FOUND - no queue 'nosuch' in vhost '{vhost}'", 50, 10)
    still_serves(peer, 2)
    peer.channel(1)  # the number is free again
    still_serves(peer, 1)


def test_passive_declare_of_a_missing_exchange_is_404(peer: SocketPeer, vhost: str) -> None:
    peer.method(1, d.ExchangeDeclare(exchange="nosuch", type="direct", passive=True))
    peer.channel_closed(1, 404, f"NOT_FOUND - no exchange 'nosuch' in vhost '{vhost}'", 40, 10)
    peer.channel(1)
    still_serves(peer)


def test_publish_to_a_missing_exchange_is_404(peer: SocketPeer, vhost: str) -> None:
    peer.publish(1, b"m", exchange="nosuch", routing_key="k")
    peer.channel_closed(1, 404, f"NOT_FOUND - no exchange 'nosuch' in vhost '{vhost}'", *PUBLISH)


def test_publish_to_a_missing_exchange_in_confirm_mode_is_404(peer: SocketPeer, vhost: str) -> None:
    peer.call(1, d.ConfirmSelect(), d.ConfirmSelectOk)
    peer.publish(1, b"m", exchange="nosuch", routing_key="k")
    peer.channel_closed(1, 404, f"NOT_FOUND - no exchange 'nosuch' in vhost '{vhost}'", *PUBLISH)


def test_consume_from_a_missing_queue_is_404(peer: SocketPeer, vhost: str) -> None:
    peer.method(1, d.BasicConsume(queue="nosuch", consumer_tag="c"))
    peer.channel_closed(1, 404, f"NOT_FOUND - no queue 'nosuch' in vhost '{vhost}'", 60, 20)


def test_get_from_a_missing_queue_is_404(peer: SocketPeer, vhost: str) -> None:
    peer.method(1, d.BasicGet(queue="nosuch"))
    peer.channel_closed(1, 404, f"NOT_FOUND - no queue 'nosuch' in vhost '{vhost}'", 60, 70)


# -- 406 PRECONDITION_FAILED --------------------------------------------------------------------------------------
def test_ack_of_an_unknown_delivery_tag_is_406(peer: SocketPeer) -> None:
    peer.method(1, d.BasicAck(delivery_tag=7))
    peer.channel_closed(1, 406, "PRECONDITION_FAILED - unknown delivery tag 7", 60, 80)


def test_double_ack_is_406(peer: SocketPeer) -> None:
    declare(peer, "q")
    peer.publish(1, b"m", routing_key="q")
    peer.method(1, d.BasicGet(queue="q"))
    get_ok, _, body = peer.content(1, d.BasicGetOk)
    assert body == b"m"
    peer.method(1, d.BasicAck(delivery_tag=get_ok.delivery_tag))
    peer.method(1, d.BasicAck(delivery_tag=get_ok.delivery_tag))
    peer.channel_closed(1, 406, f"PRECONDITION_FAILED - unknown delivery tag {get_ok.delivery_tag}", 60, 80)
    peer.channel(1)
    assert declare(peer, "q").message_count == 0  # the first ack took it


def test_nack_and_reject_of_unknown_tags_are_406(peer: SocketPeer) -> None:
    peer.method(1, d.BasicReject(delivery_tag=3))
    peer.channel_closed(1, 406, "PRECONDITION_FAILED - unknown delivery tag 3", 60, 90)
    peer.channel(1)
    peer.method(1, d.BasicNack(delivery_tag=4))
    peer.channel_closed(1, 406, "PRECONDITION_FAILED - unknown delivery tag 4", 60, 120)


def test_inequivalent_redeclare_is_406(peer: SocketPeer, vhost: str) -> None:
    declare(peer, "q")
    peer.method(1, d.QueueDeclare(queue="q", durable=True))
    peer.channel_closed(
        1,
        406,
        f"PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q' in vhost '{vhost}': received 'true' but "
        "current is 'false'",
        50,
        10,
    )


def test_tx_select_on_a_confirm_channel_is_406(peer: SocketPeer) -> None:
    peer.call(1, d.ConfirmSelect(), d.ConfirmSelectOk)
    peer.method(1, d.TxSelect())
    peer.channel_closed(1, 406, "PRECONDITION_FAILED - cannot switch from confirm to tx mode", 90, 10)


def test_confirm_select_on_a_tx_channel_is_406(peer: SocketPeer) -> None:
    peer.call(1, d.TxSelect(), d.TxSelectOk)
    peer.method(1, d.ConfirmSelect())
    peer.channel_closed(1, 406, "PRECONDITION_FAILED - cannot switch from tx to confirm mode", 85, 10)


def test_tx_commit_and_rollback_without_select_are_406(peer: SocketPeer) -> None:
    peer.method(1, d.TxCommit())
    peer.channel_closed(1, 406, "PRECONDITION_FAILED - channel is not transactional", 90, 20)
    peer.channel(1)
    peer.method(1, d.TxRollback())
    peer.channel_closed(1, 406, "PRECONDITION_FAILED - channel is not transactional", 90, 30)


@pytest.mark.parametrize(
    ("expiration", "reason"),
    [
        ("soon", "no_integer"),
        ("", "no_integer"),
        ("10s", '{leftover_string,"s"}'),
        ("-1", "{value_negative,-1}"),
        ("4294967296", "{value_too_large,4294967296}"),
    ],
)
def test_an_invalid_expiration_is_406(peer: SocketPeer, expiration: str, reason: str) -> None:
    """rabbit_channel.erl ``check_expiration_header``: ``rabbit_basic:parse_expiration`` refuses anything but a
    non-negative decimal integer."""
    declare(peer, "q")
    peer.publish(1, b"m", routing_key="q", properties=d.BasicProperties(expiration=expiration))
    peer.channel_closed(1, 406, f"PRECONDITION_FAILED - invalid expiration '{expiration}': {reason}", *PUBLISH)
    peer.channel(1)
    assert declare(peer, "q").message_count == 0


def test_a_valid_expiration_is_taken(peer: SocketPeer) -> None:
    declare(peer, "q")
    peer.publish(1, b"m", routing_key="q", properties=d.BasicProperties(expiration="60000"))
    assert declare(peer, "q").message_count == 1


# -- 403 ACCESS_REFUSED -------------------------------------------------------------------------------------------
def test_declaring_an_amq_exchange_is_403(peer: SocketPeer) -> None:
    peer.method(1, d.ExchangeDeclare(exchange="amq.mine", type="direct"))
    peer.channel_closed(1, 403, "ACCESS_REFUSED - exchange name 'amq.mine' contains reserved prefix 'amq.*'", 40, 10)


def test_declaring_an_amq_queue_is_403(peer: SocketPeer) -> None:
    peer.method(1, d.QueueDeclare(queue="amq.mine"))
    peer.channel_closed(1, 403, "ACCESS_REFUSED - queue name 'amq.mine' contains reserved prefix 'amq.*'", 50, 10)


def test_an_exclusive_consumer_conflict_is_403(peer: SocketPeer, vhost: str) -> None:
    declare(peer, "q")
    peer.channel(2)
    peer.call(1, d.BasicConsume(queue="q", consumer_tag="a", exclusive=True), d.BasicConsumeOk)
    peer.method(2, d.BasicConsume(queue="q", consumer_tag="b"))
    peer.channel_closed(2, 403, f"ACCESS_REFUSED - queue 'q' in vhost '{vhost}' in exclusive use", 60, 20)
    peer.call(1, d.BasicCancel(consumer_tag="a"), d.BasicCancelOk)


def test_an_exclusive_consumer_on_a_consumed_queue_is_403(peer: SocketPeer, vhost: str) -> None:
    declare(peer, "q")
    peer.channel(2)
    peer.call(1, d.BasicConsume(queue="q", consumer_tag="a"), d.BasicConsumeOk)
    peer.method(2, d.BasicConsume(queue="q", consumer_tag="b", exclusive=True))
    peer.channel_closed(2, 403, f"ACCESS_REFUSED - queue 'q' in vhost '{vhost}' in exclusive use", 60, 20)


# -- 405 RESOURCE_LOCKED ------------------------------------------------------------------------------------------
def test_another_connections_exclusive_queue_is_405(minibroker: ThreadedBroker, peer: SocketPeer, vhost: str) -> None:
    declare(peer, "mine", exclusive=True)
    locked = (
        f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'mine' in vhost '{vhost}'. It could be "
        "originally declared on another connection or the exclusive property value does not match that of the original "
        "declaration."
    )
    with SocketPeer(minibroker.host, minibroker.port) as other:
        other.handshake()
        for number, method, ids in [
            (1, d.QueueDeclare(queue="mine", passive=True), (50, 10)),
            (2, d.BasicConsume(queue="mine"), (60, 20)),
            (3, d.BasicGet(queue="mine"), (60, 70)),
            (4, d.QueuePurge(queue="mine"), (50, 30)),
            (5, d.QueueDelete(queue="mine"), (50, 40)),
        ]:
            other.channel(number)
            other.method(number, method)
            other.channel_closed(number, 405, locked, *ids)
    assert declare(peer, "mine", passive=True).queue == "mine"


# -- connection errors --------------------------------------------------------------------------------------------
def test_reusing_a_consumer_tag_is_530_and_closes_the_connection(minibroker: ThreadedBroker, peer: SocketPeer) -> None:
    declare(peer, "q")
    peer.call(1, d.BasicConsume(queue="q", consumer_tag="c"), d.BasicConsumeOk)
    peer.method(1, d.BasicConsume(queue="q", consumer_tag="c"))
    peer.closed(530, "NOT_ALLOWED - attempt to reuse consumer tag 'c'", 60, 20)
    minibroker.wait_for(lambda: minibroker.queue("q").stats().consumers == 0)


def test_immediate_publish_is_540(peer: SocketPeer) -> None:
    peer.publish(1, b"m", routing_key="q", immediate=True)
    peer.closed(540, "NOT_IMPLEMENTED - immediate=true", *PUBLISH)


def test_qos_with_a_prefetch_size_is_540(peer: SocketPeer) -> None:
    peer.method(1, d.BasicQos(prefetch_size=5, prefetch_count=0, global_=False))
    peer.closed(540, "NOT_IMPLEMENTED - prefetch_size!=0 (5)", 60, 10)


def test_recover_without_requeue_is_540(peer: SocketPeer) -> None:
    peer.method(1, d.BasicRecover(requeue=False))
    peer.closed(540, "NOT_IMPLEMENTED - requeue=false", 60, 110)


def test_a_connection_error_leaves_other_connections_alone(minibroker: ThreadedBroker, peer: SocketPeer) -> None:
    with SocketPeer(minibroker.host, minibroker.port) as other:
        other.handshake()
        other.channel(1)
        declare(other, "q")
        peer.publish(1, b"m", routing_key="q", immediate=True)
        peer.closed(540, "NOT_IMPLEMENTED - immediate=true", *PUBLISH)
        other.publish(1, b"m", routing_key="q")
        assert declare(other, "q").message_count == 1


# -- more of RabbitMQ's refusals ------------------------------------------------------------------------------------
def test_publish_to_an_internal_exchange_is_403(peer: SocketPeer, vhost: str) -> None:
    """rabbit_channel.erl ``check_internal_exchange``: 403 (worded here as the broker's AMQP 1.0 side words it,
    rabbit_amqp_session.erl's "forbidden to publish to internal ...")."""
    peer.call(1, d.ExchangeDeclare(exchange="inside", type="fanout", internal=True), d.ExchangeDeclareOk)
    peer.publish(1, b"m", exchange="inside")
    peer.channel_closed(
        1, 403, f"ACCESS_REFUSED - forbidden to publish to internal exchange 'inside' in vhost '{vhost}'", *PUBLISH
    )


def test_binding_to_the_default_exchange_is_403(peer: SocketPeer) -> None:
    declare(peer, "q")
    peer.method(1, d.QueueBind(queue="q", exchange="", routing_key="k"))
    peer.channel_closed(1, 403, "ACCESS_REFUSED - operation not permitted on the default exchange", 50, 20)


def test_deleting_the_default_exchange_is_403(peer: SocketPeer) -> None:
    peer.method(1, d.ExchangeDelete(exchange=""))
    peer.channel_closed(1, 403, "ACCESS_REFUSED - operation not permitted on the default exchange", 40, 20)


def test_deleting_a_queue_cancels_its_consumers_elsewhere(peer: SocketPeer) -> None:
    declare(peer, "q")
    peer.channel(2)
    peer.call(2, d.BasicConsume(queue="q", consumer_tag="c"), d.BasicConsumeOk)
    assert peer.call(1, d.QueueDelete(queue="q"), d.QueueDeleteOk).message_count == 0
    cancel = peer.expect(2, d.BasicCancel)
    assert cancel.consumer_tag == "c"
    still_serves(peer, 2)


def test_many_transactional_channels_on_one_connection(peer: SocketPeer) -> None:
    """Every channel may be transactional (RabbitMQ has no per-connection limit); where the broker's limit on a
    connection's open transactions stops one, that channel fails, not the connection."""
    declare(peer, "q")
    failed = 0
    for number in range(2, 112):
        peer.channel(number)
        peer.call(number, d.TxSelect(), d.TxSelectOk)
        peer.publish(number, b"m", routing_key="q")
        peer.method(number, d.QueueDeclare(queue="q", passive=True))
        frame = peer.frame()
        assert isinstance(frame, MethodFrame), frame
        assert frame.channel == number, frame
        if isinstance(frame.method, d.ChannelClose):
            close = frame.method
            assert (close.reply_code, close.class_id, close.method_id) == (406, *PUBLISH), close
            assert close.reply_text.startswith("PRECONDITION_FAILED - no transaction: at most 100 transactions"), close
            peer.method(number, d.ChannelCloseOk())
            failed += 1
        else:
            assert isinstance(frame.method, d.QueueDeclareOk), frame
    assert failed == 10  # 110 transactional channels, 100 transactions
    still_serves(peer)


def test_anyone_may_publish_to_an_exclusive_queue(minibroker: ThreadedBroker, peer: SocketPeer) -> None:
    """Exclusivity is about consuming and declaring: RabbitMQ routes other connections' publishes to the queue."""
    declare(peer, "mine", exclusive=True)
    with SocketPeer(minibroker.host, minibroker.port) as other:
        other.handshake()
        other.channel(1)
        other.call(1, d.ConfirmSelect(), d.ConfirmSelectOk)
        other.publish(1, b"m", routing_key="mine")
        assert other.expect(1, d.BasicAck).delivery_tag == 1
    assert declare(peer, "mine", passive=True).message_count == 1


def test_an_exclusive_queue_goes_with_its_connection(minibroker: ThreadedBroker) -> None:
    with SocketPeer(minibroker.host, minibroker.port) as owner:
        owner.handshake()
        owner.channel(1)
        name = owner.call(1, d.QueueDeclare(queue="", exclusive=True), d.QueueDeclareOk).queue
        assert name.startswith("amq.gen-")
        owner.publish(1, b"m", routing_key="")  # "" in basic.publish is the default exchange's key, not the queue
    minibroker.wait_for(lambda: not minibroker.queue(name).exists)
    with SocketPeer(minibroker.host, minibroker.port) as other:
        other.handshake()
        other.channel(1)
        other.method(1, d.QueueDeclare(queue=name, passive=True))
        other.channel_closed(1, 404, f"NOT_FOUND - no queue '{name}' in vhost '{minibroker.namespace_name}'", 50, 10)


@pytest.mark.parametrize("how", ["socket dropped", "channel closed", "channel error"])
def test_what_a_closed_channel_held_comes_back_redelivered(minibroker: ThreadedBroker, how: str) -> None:
    """RabbitMQ requeues the unacked deliveries of a channel that closes (however it closes) with the redelivered
    flag set; an acked one is gone."""
    with SocketPeer(minibroker.host, minibroker.port) as client:
        client.handshake()
        client.channel(1)
        declare(client, "q")
        for n in range(4):
            client.publish(1, b"m%d" % n, routing_key="q")
        client.call(1, d.BasicConsume(queue="q", consumer_tag="c"), d.BasicConsumeOk)
        tags = [client.content(1, d.BasicDeliver)[0].delivery_tag for _ in range(4)]
        client.method(1, d.BasicAck(delivery_tag=tags[0]))
        if how == "socket dropped":
            client.sock.close()
        elif how == "channel closed":
            client.call(1, d.ChannelClose(200, "bye", 0, 0), d.ChannelCloseOk)
        else:
            client.method(1, d.BasicAck(delivery_tag=99))
            client.channel_closed(1, 406, "PRECONDITION_FAILED - unknown delivery tag 99", 60, 80)
        minibroker.wait_for(lambda: minibroker.queue("q").stats().ready == 3)
    with SocketPeer(minibroker.host, minibroker.port) as again:
        again.handshake()
        again.channel(1)
        for n in range(1, 4):
            again.method(1, d.BasicGet(queue="q", no_ack=True))
            get_ok, _, body = again.content(1, d.BasicGetOk)
            assert (body, get_ok.redelivered) == (b"m%d" % n, True)
