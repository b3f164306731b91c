"""Nodes as real clients use them (DESIGN §5): queues and topics, subscriptions, dynamic nodes, the anonymous
relay and browsing, each driven by python-qpid-proton against the real broker."""

from __future__ import annotations

import re
from typing import Any

import pytest
from proton import Delivery, Endpoint, Message, Terminus, symbol
from proton.reactor import Copy, DurableSubscription, LinkOption
from proton.utils import BlockingConnection, BlockingReceiver, LinkDetached

from minibroker.testing.thread import ThreadedBroker
from tests.integration.helpers import queue_stats, send_messages, wait_for
from tests.integration.proton_options import (
    Capabilities,
    Durability,
    assert_nothing_more,
    broker_with,
    close,
    connection,
    refusal,
    remote_condition,
    send_and_wait,
    take,
)


def bodies(*values: Any) -> list[Message]:
    return [Message(body=v) for v in values]


def node_kinds(broker: ThreadedBroker) -> dict[str, str]:
    """Every node of the default namespace and its kind."""

    kinds = {name: "queue" for name in broker.queues}
    kinds.update({name: "topic" for name in broker.topics})
    return kinds


def subscriptions(broker: ThreadedBroker, topic: str) -> dict[tuple[str, str], int]:
    """The subscriptions of ``topic`` by key, with their ready messages."""
    handle = broker.topic(topic)
    assert handle.exists, topic
    return {(s.container, s.name): s.depth for s in handle.subscriptions()}


def detach(broker: ThreadedBroker, conn: BlockingConnection, receiver: BlockingReceiver) -> None:
    """Detach without closing (closed=false): what a durable subscriber does when it goes away for a while.

    (proton keeps a link REMOTE_ACTIVE after the peer's detach without closed, so we watch the broker.)
    """
    receiver.link.detach()

    def consumers() -> int:
        return sum(s.consumers for topic in broker.topics for s in broker.topic(topic).subscriptions())

    wait_for(lambda: consumers() == 0, "the detach", conn=conn)


# -- topics and queues ---------------------------------------------------------------------------------------
TOPIC_KINDS: dict[str, tuple[dict[str, Any], str, tuple[str, ...]]] = {
    # how the client says "news" is a topic: the broker's configuration, capabilities, or an address prefix
    "configured": ({"topics": {"news": {}}}, "news", ()),
    "capability": ({}, "news", ("topic",)),
    "prefix": ({}, "topic://news", ()),
}


@pytest.mark.parametrize("kind", TOPIC_KINDS)
def test_topic_gives_every_subscriber_its_own_copy(kind: str) -> None:
    config, address, capabilities = TOPIC_KINDS[kind]
    with broker_with(**config) as broker, connection(broker) as subscriber, connection(broker) as publisher:
        options: list[LinkOption] | None = [Capabilities(*capabilities)] if capabilities else None
        first = subscriber.create_receiver(address, name="first", credit=10, options=options)
        second = subscriber.create_receiver(address, name="second", credit=10, options=options)
        assert node_kinds(broker) == {"news": "topic"}  # the prefix is not part of the name
        assert len(subscriptions(broker, "news")) == 2  # one per receiver link

        sender = publisher.create_sender(address, options=options)
        for i in range(3):
            sender.send(Message(body=i))
        assert take(first, 3) == [0, 1, 2]
        assert take(second, 3) == [0, 1, 2]

        close(second)
        wait_for(lambda: len(subscriptions(broker, "news")) == 1, "the non-durable subscription to go")
        sender.send(Message(body=3))
        assert take(first, 1) == [3]
        close(first)
        wait_for(lambda: subscriptions(broker, "news") == {}, "the last subscription to go")
        sender.send(Message(body="unheard"))  # a topic without subscribers keeps nothing
        assert sum(s.depth for s in broker.topic("news").subscriptions()) == 0


QUEUE_KINDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "plain": ("work", ()),
    "capability": ("work", ("queue",)),
    "prefix": ("queue://work", ()),
}


@pytest.mark.parametrize("kind", QUEUE_KINDS)
def test_queue_consumers_compete_for_messages(broker: ThreadedBroker, kind: str) -> None:
    address, capabilities = QUEUE_KINDS[kind]
    options: list[LinkOption] | None = [Capabilities(*capabilities)] if capabilities else None
    with connection(broker) as conn:
        first = conn.create_receiver(address, name="first", credit=10, options=options)
        second = conn.create_receiver(address, name="second", credit=10, options=options)
        assert node_kinds(broker) == {"work": "queue"}
        sender = conn.create_sender(address, options=options)
        for i in range(6):
            sender.send(Message(body=i))
        fetchers = [first.fetcher, second.fetcher]
        conn.wait(lambda: sum(f.has_message for f in fetchers if f) == 6, msg="6 messages", timeout=5)
        got = [take(first, first.fetcher.has_message), take(second, second.fetcher.has_message)]  # type: ignore[union-attr]
    assert sorted(got[0] + got[1]) == list(range(6))  # each message once, to one consumer
    assert got[0]
    assert got[1]
    assert queue_stats(broker, "work") == (0, 0)


# -- durable and shared subscriptions ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("durability", "expiry", "kept"),
    [
        pytest.param(Terminus.DELIVERIES, Terminus.EXPIRE_NEVER, True, id="unsettled-state+never"),
        pytest.param(Terminus.CONFIGURATION, Terminus.EXPIRE_NEVER, True, id="configuration+never"),
        pytest.param(Terminus.DELIVERIES, Terminus.EXPIRE_WITH_LINK, False, id="unsettled-state+link-detach"),
        pytest.param(Terminus.NONDURABLE, Terminus.EXPIRE_NEVER, False, id="none+never"),
    ],
)
def test_durable_subscription_collects_while_detached(durability: int, expiry: int, kept: bool) -> None:
    options = Durability(durability, expiry)
    with broker_with(topics={"news": {}}) as broker:
        with connection(broker, container_id="app-1") as conn:
            detach(broker, conn, conn.create_receiver("news", name="sub-a", options=options))
        send_messages(broker, "news", bodies("a", "b", "c"))
        assert subscriptions(broker, "news") == ({("app-1", "sub-a"): 3} if kept else {})

        with connection(broker, container_id="app-2") as conn:
            # the same link name from another container is another subscription
            other = conn.create_receiver("news", name="sub-a", options=options)
            assert_nothing_more(other)
            close(other)
        with connection(broker, container_id="app-1") as conn:
            resumed = conn.create_receiver("news", name="sub-a", options=options)
            if kept:
                assert take(resumed, 3) == ["a", "b", "c"]
            assert_nothing_more(resumed)
            close(resumed)  # detach with closed=true: the subscription is deleted
        assert subscriptions(broker, "news") == {}


def test_durable_subscription_survives_its_connection_and_releases_unsettled() -> None:
    with broker_with(topics={"news": {}}) as broker:
        with connection(broker, container_id="app") as conn:
            sub = conn.create_receiver("news", name="sub", credit=5, options=DurableSubscription())
            send_messages(broker, "news", bodies(1, 2))
            assert sub.receive().body == 1  # received, never settled: the connection drops
        assert subscriptions(broker, "news") == {("app", "sub"): 2}
        with connection(broker, container_id="app") as conn:
            sub = conn.create_receiver("news", name="sub", options=DurableSubscription())
            assert take(sub, 2) == [1, 2]
            close(sub)
        assert subscriptions(broker, "news") == {}


@pytest.mark.parametrize("scope", ["per-container", "global"])
def test_shared_subscription_splits_messages_between_its_links(scope: str) -> None:
    capabilities = ("shared", "global") if scope == "global" else ("shared",)
    ids = ("app-1", "app-2") if scope == "global" else ("app", "app")
    with (
        broker_with(topics={"news": {}}) as broker,
        connection(broker, container_id=ids[0]) as one,
        connection(broker, container_id=ids[1]) as two,
    ):
        options: list[LinkOption] = [Capabilities(*capabilities)]
        first = one.create_receiver("news", name="sub", credit=20, options=options)
        second = two.create_receiver("news", name="sub|2", credit=20, options=options)
        everything = one.create_receiver("news", name="all", credit=20)  # an ordinary subscriber on the side
        key = ("" if scope == "global" else "app", "sub|volatile")  # not durable: apart from a durable "sub"
        assert set(subscriptions(broker, "news")) >= {key}
        assert len(subscriptions(broker, "news")) == 2  # the shared one and the ordinary one

        send_messages(broker, "news", bodies(*range(10)))
        assert take(everything, 10) == list(range(10))
        wait_for(
            lambda: {(s.container, s.name): s.acquired for s in broker.topic("news").subscriptions()}[key] == 10,
            "every message to be sent to one of the shared links",
        )
        got_first = take(first, first.fetcher.has_message) if first.fetcher else []
        got_second = take(second, 10 - len(got_first))
        assert sorted(got_first + got_second) == list(range(10))
        assert got_first
        assert got_second

        close(first)  # the subscription lives on while a link remains
        send_messages(broker, "news", bodies("late"))
        assert take(second, 1) == ["late"]
        close(second)
        wait_for(lambda: key not in subscriptions(broker, "news"), "the shared subscription to go")


# -- auto-create off -----------------------------------------------------------------------------------------
def test_attach_to_an_unknown_address_is_refused_when_auto_create_is_off() -> None:
    with (
        broker_with(broker={"auto_create": False}, queues={"known": {}}, topics={"news": {}}) as broker,
        connection(broker) as conn,
    ):
        for attach in (conn.create_receiver, conn.create_sender):
            with pytest.raises(LinkDetached) as refused:
                attach("nowhere")
            assert refusal(refused.value) == "amqp:not-found"
        assert "nowhere" not in node_kinds(broker)
        # declared nodes still work
        conn.create_sender("known").send(Message(body="ok"))
        assert take(conn.create_receiver("known"), 1) == ["ok"]
        news = conn.create_receiver("news")
        conn.create_sender("news").send(Message(body="extra"))
        assert take(news, 1) == ["extra"]


# -- dynamic nodes -------------------------------------------------------------------------------------------
def test_dynamic_receiver_is_a_temporary_reply_queue(broker: ThreadedBroker) -> None:
    with connection(broker) as client, connection(broker) as service:
        requests = service.create_receiver("requests")
        replies = client.create_receiver(None, dynamic=True)
        address = replies.link.remote_source.address
        assert address
        assert replies.link.remote_source.dynamic
        assert node_kinds(broker).get(address) == "queue"

        client.create_sender("requests").send(Message(body="ping", reply_to=address, correlation_id="c-1"))
        request = requests.receive()
        requests.accept()
        responder = service.create_sender(None)  # through the anonymous relay, as request/reply services do
        responder.send(Message(address=request.reply_to, correlation_id=request.correlation_id, body="pong"))
        reply = replies.receive()
        replies.accept()
        assert (reply.body, reply.correlation_id) == ("pong", "c-1")

        close(replies)
        wait_for(lambda: address not in node_kinds(broker), "the dynamic node to be deleted")


def test_dynamic_node_is_deleted_with_its_link() -> None:
    with broker_with(broker={"auto_create": False}) as broker, connection(broker) as conn:
        first = conn.create_receiver(None, dynamic=True)
        second = conn.create_receiver(None, dynamic=True)
        addresses = {first.link.remote_source.address, second.link.remote_source.address}
        assert len(addresses) == 2  # each dynamic link gets a node of its own
        address = first.link.remote_source.address
        close(first)
        wait_for(lambda: address not in node_kinds(broker), "the dynamic node to be deleted")
        with pytest.raises(LinkDetached) as refused:
            conn.create_sender(address)
        assert refusal(refused.value) == "amqp:not-found"
        assert second.link.remote_source.address in node_kinds(broker)


def test_dynamic_topic_is_deleted_with_its_link(broker: ThreadedBroker) -> None:
    with connection(broker) as conn, connection(broker) as publisher:
        receiver = conn.create_receiver(None, dynamic=True, options=Capabilities("temporary-topic"))
        address = receiver.link.remote_source.address
        assert address
        assert node_kinds(broker).get(address) == "topic"
        publisher.create_sender(address).send(Message(body="to the temporary topic"))
        assert take(receiver, 1) == ["to the temporary topic"]
        close(receiver)
        wait_for(lambda: address not in node_kinds(broker), "the dynamic topic to be deleted")


def test_sender_to_a_deleted_dynamic_node_is_detached(broker: ThreadedBroker) -> None:
    with connection(broker) as owner, connection(broker) as other:
        receiver = owner.create_receiver(None, dynamic=True)
        address = receiver.link.remote_source.address
        sender = other.create_sender(address)
        close(receiver)
        wait_for(lambda: address not in node_kinds(broker), "the dynamic node to be deleted")
        with pytest.raises(LinkDetached) as detached:  # rather than accept messages into a node that is gone
            other.wait(lambda: bool(sender.link.state & Endpoint.REMOTE_CLOSED), msg="sender detached", timeout=5)
        assert refusal(detached.value) == "amqp:resource-deleted"


class DynamicTarget(LinkOption):
    """A sender asking for a dynamic target (how Qpid JMS creates a temporary queue)."""

    def apply(self, link: Any) -> None:
        link.target.address = None
        link.target.dynamic = True


def test_dynamic_addresses_are_unguessable_and_unique(broker: ThreadedBroker) -> None:
    # issue 12 review: ``dynamic.<conn>.<n>`` could be guessed, and squatted before the broker generated it
    with connection(broker) as conn:
        addresses = [conn.create_receiver(None, dynamic=True).link.remote_source.address for _ in range(3)]
    assert len(set(addresses)) == 3
    for address in addresses:
        assert re.fullmatch(r"dynamic\.\d+\.[0-9a-f]{32}", address), address


def test_no_node_is_made_in_the_dynamic_name_space_on_demand(broker: ThreadedBroker) -> None:
    with connection(broker) as conn:
        for attach in (lambda: conn.create_receiver("dynamic.2.1"), lambda: conn.create_sender("dynamic.2.1")):
            with pytest.raises(LinkDetached) as refused:
                attach()
            assert refusal(refused.value) == "amqp:not-found"
        relay = conn.create_sender(None)
        delivery = send_and_wait(conn, relay, Message(address="dynamic.2.1", body="squat"))
        assert delivery.remote_state == Delivery.REJECTED
        assert remote_condition(delivery) == "amqp:not-found"
    assert not [name for name in node_kinds(broker) if name.startswith("dynamic.")]


def test_only_the_creating_connection_receives_from_a_dynamic_node(broker: ThreadedBroker) -> None:
    # as a JMS temporary queue: made by a dynamic sender, consumed on the same connection, sent to by anyone
    with connection(broker) as owner, connection(broker) as other:
        temporary = owner.create_sender(None, options=DynamicTarget())
        address = temporary.link.remote_target.address
        assert address in node_kinds(broker)
        with pytest.raises(LinkDetached) as refused:
            other.create_receiver(address)
        assert refusal(refused.value) == "amqp:unauthorized-access"
        receiver = owner.create_receiver(address, credit=10)
        other.create_sender(address).send(Message(body="reply"))
        assert take(receiver, 1) == ["reply"]


# -- anonymous relay -----------------------------------------------------------------------------------------
def test_anonymous_relay_routes_each_message_by_its_to() -> None:
    with broker_with(topics={"news": {}}) as broker, connection(broker) as conn:
        assert conn.conn is not None
        assert symbol("ANONYMOUS-RELAY") in conn.conn.remote_offered_capabilities
        news = conn.create_receiver("news", credit=10)
        relay = conn.create_sender(None)
        assert relay.link.remote_target.address is None
        for to, body in [("left", 1), ("right", 2), ("left", 3), ("news", 4), ("topic://news", 5)]:
            relay.send(Message(address=to, body=body))
        assert queue_stats(broker, "left") == (2, 0)
        assert queue_stats(broker, "right") == (1, 0)
        assert take(news, 2) == [4, 5]
        assert take(conn.create_receiver("left"), 2) == [1, 3]


def test_anonymous_relay_rejects_what_it_cannot_route() -> None:
    with (
        broker_with(broker={"auto_create": False}, queues={"known": {}}) as broker,
        connection(broker) as conn,
    ):
        relay = conn.create_sender(None)
        for message in (Message(address="nowhere", body=1), Message(body="no to at all")):
            delivery = send_and_wait(conn, relay, message)
            assert delivery.remote_state == Delivery.REJECTED
            assert remote_condition(delivery) == "amqp:not-found"
        delivery = send_and_wait(conn, relay, Message(address="known", body="fine"))  # the link is still usable
        assert delivery.remote_state == Delivery.ACCEPTED
        assert queue_stats(broker, "known") == (1, 0)
        assert "nowhere" not in node_kinds(broker)


# -- browsing ------------------------------------------------------------------------------------------------
def test_browser_reads_without_consuming(broker: ThreadedBroker) -> None:
    send_messages(broker, "browsed", bodies("a", "b", "c"))
    with connection(broker) as conn:
        browser = conn.create_receiver("browsed", name="browser-1", credit=10, options=Copy())
        assert browser.link.remote_source.distribution_mode == Terminus.DIST_MODE_COPY
        assert take(browser, 3) == ["a", "b", "c"]  # accepting a browsed copy changes nothing
        wait_for(lambda: queue_stats(broker, "browsed") == (3, 0), "the queue to stay whole", conn=conn)

        again = conn.create_receiver("browsed", name="browser-2", credit=10, options=Copy())
        assert take(again, 3) == ["a", "b", "c"]
        send_messages(broker, "browsed", bodies("d"))
        assert take(browser, 1) == ["d"]  # a browser sees what arrives later

        consumer = conn.create_receiver("browsed", name="consumer", credit=10)
        assert consumer.link.remote_source.distribution_mode in (None, Terminus.DIST_MODE_MOVE)
        assert take(consumer, 4) == ["a", "b", "c", "d"]
        wait_for(lambda: queue_stats(broker, "browsed") == (0, 0), "the consumer to take everything", conn=conn)
        assert_nothing_more(browser)
