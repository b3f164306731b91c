"""One Python API, local or remote (issue 14 item 6): ``minibroker.connect(http_url)`` gives the surface of the
embedded handle, so one test body passes against both, with a real broker serving AMQP and HTTP."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import trio
from proton import Message
from proton.utils import BlockingConnection

import minibroker
from minibroker.amqp.definitions import ApplicationProperties, Close, Flow, Properties
from minibroker.broker.personality import names
from minibroker.remote import BrokerUnreachable, RemoteBroker, RemoteError
from minibroker.testing import frames
from minibroker.testing.peer import ScriptedPeer
from minibroker.testing.thread import ThreadedBroker, run_in_thread
from tests.server.test_limits import Controller

HANDLE_KINDS = ["embedded", "remote"]


@pytest.fixture(scope="module")
def served() -> Iterator[ThreadedBroker]:
    """One broker with its HTTP management API on, for the module."""
    with run_in_thread({"server": {"port": 0}, "http": {"port": 0}, "topics": {"news": {}}}) as broker:
        yield broker


def _http_url(broker: ThreadedBroker) -> str:
    url = broker.running.http_url
    assert url is not None
    return url


@pytest.fixture(params=HANDLE_KINDS)
def handle(request: pytest.FixtureRequest, served: ThreadedBroker) -> Iterator[Any]:
    """A fresh namespace of ``served``: through the embedded handle, or through ``minibroker.connect``."""
    owner: ThreadedBroker | RemoteBroker = (
        served if request.param == "embedded" else minibroker.connect(_http_url(served))
    )
    namespace = owner.create_namespace()
    try:
        yield namespace
    finally:
        namespace.drop_namespace()


def _peer(url: str) -> ScriptedPeer:
    parts = urlsplit(url)
    assert parts.hostname is not None
    assert parts.port is not None
    return ScriptedPeer.connect(parts.hostname, parts.port)


def test_the_same_body_passes_against_either_handle(handle: Any) -> None:
    assert handle.url.startswith("amqp://")
    orders = handle.queue("orders")
    assert (handle.queues, orders.exists, orders.depth, orders.peek(), orders.purge()) == ([], False, 0, [], 0)
    declared_before = handle.txn_stats.declared
    with _peer(handle.url) as peer:
        peer.open(container_id="remote-test")
        peer.begin()
        peer.attach_sender("orders", 1)
        peer.expect(Flow)
        for n in range(3):
            body = frames.message(
                f"order {n}", Properties(message_id=f"m{n}", subject="new"), ApplicationProperties({"n": n})
            )
            peer.transfer(1, n, body, settled=True)
        handle.wait_for(queue="orders", depth=3, timeout=5)
        assert handle.queues == ["orders"]
        assert orders.exists
        first = orders.peek(limit=1)
        assert [(m.body, m.id, m.subject, m.properties) for m in first] == [("order 0", "m0", "new", {"n": 0})]
        assert [m.body for m in orders.peek()] == ["order 0", "order 1", "order 2"]

        controller = Controller(peer)  # a coordinator on handle 0
        txn_id = controller.declare()
        controller.post(1, txn_id, frames.message("staged"))
        handle.wait_for(transactions=1, timeout=5)
        [txn] = handle.transactions
        assert (txn.txn_id, txn.connection, txn.posts, txn.failed) == (txn_id, "remote-test", 1, None)
        assert txn.age >= 0
        assert orders.staged == 1

        peer.attach_receiver("orders", 2)
        peer.flow(2, 1)
        peer.receive()  # the transfer of order 0, left unsettled
        stats = orders.stats()
        assert (stats.name, stats.depth, stats.ready, stats.acquired, stats.staged) == ("orders", 2, 2, 1, 1)
        assert stats.consumers == 1
        [conn] = handle.connections
        assert (conn.container_id, conn.namespace, conn.sessions, conn.links) == (
            "remote-test",
            handle.namespace_name,
            1,
            3,
        )

        assert orders.purge() == 2
        assert (orders.depth, orders.acquired) == (0, 1)
        controller.commit(txn_id)
        handle.wait_for(transactions=0, timeout=5)
        assert orders.staged == 0
        assert handle.txn_stats.declared == declared_before + 1
        with pytest.raises(TimeoutError):
            handle.wait_for(queue="orders", depth=5, timeout=0.2)

        handle.reset()
        assert (handle.queues, handle.transactions, handle.connections) == ([], [], [])
        assert str(peer.expect(Close).error.condition) == "amqp:connection:forced"


def test_namespaces_of_either_handle_are_isolated(handle: Any, served: ThreadedBroker) -> None:
    conn = BlockingConnection(handle.url, timeout=5)
    try:
        conn.create_sender("mine").send(Message(body="only here"))
    finally:
        conn.close()
    handle.wait_for(queue="mine", depth=1)
    assert "mine" not in served.queues
    assert [m.body for m in handle.queue("mine").peek()] == ["only here"]


def test_a_remote_predicate_is_a_type_error_naming_the_keyword_conditions(served: ThreadedBroker) -> None:
    remote = minibroker.connect(_http_url(served))
    with pytest.raises(TypeError, match=r"cannot run a Python predicate.*wait_for\(queue="):
        remote.wait_for(lambda: True)
    with pytest.raises(TypeError, match="queue and depth go together"):
        remote.wait_for(queue="q")


def test_the_embedded_handle_takes_a_predicate_or_keyword_conditions_not_both(served: ThreadedBroker) -> None:
    served.wait_for(lambda: True)
    served.wait_for(queue="nothing-here", depth=0)
    with pytest.raises(TypeError, match="not both"):
        served.wait_for(lambda: True, queue="q", depth=1)


def test_remote_messages_sent_through_the_api_reach_an_amqp_consumer(served: ThreadedBroker) -> None:
    remote = minibroker.connect(_http_url(served)).create_namespace()
    try:
        remote.queue("posted").send("text", application_properties={"k": "v"})
        remote.queue("posted").send(b"\x00\xffraw")
        assert [(m.body, m.properties) for m in remote.queue("posted").peek()] == [
            ("text", {"k": "v"}),
            (b"\x00\xffraw", {}),
        ]
        conn = BlockingConnection(remote.url, timeout=5)
        try:
            receiver = conn.create_receiver("posted")
            assert receiver.receive(timeout=5).body == "text"
            receiver.accept()
        finally:
            conn.close()
    finally:
        remote.drop_namespace()


def test_remote_errors_say_whose_fault() -> None:
    with socket.socket() as sock:  # a port nobody listens on: bound, never listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        remote = minibroker.connect(f"http://127.0.0.1:{port}", timeout=2)
        with pytest.raises(BrokerUnreachable, match=rf"cannot reach the broker's HTTP API at http://127.0.0.1:{port}"):
            remote.queues  # noqa: B018
    with pytest.raises(ValueError, match="not an http") as not_http:
        minibroker.connect("amqp://user:Xyzzy-9@127.0.0.1:5672")
    assert "Xyzzy-9" not in str(not_http.value)


def test_an_amqp_port_is_not_an_http_api(served: ThreadedBroker) -> None:
    remote = minibroker.connect(f"http://127.0.0.1:{served.port}", timeout=2)
    with pytest.raises(BrokerUnreachable):
        remote.queues  # noqa: B018


def test_users_need_basic_auth_and_credentials_are_never_shown() -> None:
    config = {"server": {"port": 0}, "http": {"port": 0}, "auth": {"users": {"admin": "s3cret"}}}
    with run_in_thread(config) as broker:
        http_url = _http_url(broker)
        with pytest.raises(RemoteError) as refused:
            minibroker.connect(http_url).queues  # noqa: B018
        assert refused.value.status == 401
        assert minibroker.connect(http_url, user="admin", password="s3cret").queues == []
        host = urlsplit(http_url).netloc
        with_credentials = minibroker.connect(f"http://admin:Xyzzy-9@{host}")
        with pytest.raises(RemoteError) as wrong:
            with_credentials.queues  # noqa: B018
        assert "Xyzzy-9" not in str(wrong.value)
        assert wrong.value.status == 401
        assert minibroker.connect(f"http://admin:s3cret@{host}").queues == []


def test_kind_delete_and_close_connection_on_either_handle(handle: Any) -> None:
    conn = BlockingConnection(handle.url, timeout=5)
    try:
        conn.create_sender("gone").send(Message(body="x"))
        handle.wait_for(queue="gone", depth=1)
        assert handle.queue("gone").kind == "auto"
        assert handle.queue("nothing").kind is None
        assert handle.queue("gone").delete() is True
        assert handle.queue("gone").delete() is False
        assert not handle.queue("gone").exists
        [info] = handle.connections
        assert handle.close_connection(info.id + 1000) is False
        assert handle.close_connection(info.id, description="bye") is True
        with pytest.raises(Exception, match=r"forced|bye|closed|aborted"):
            conn.create_sender("after").send(Message(body="y"))
    finally:
        conn.close()


def test_a_dropped_namespace_is_a_lookup_error_on_either_handle(handle: Any, served: ThreadedBroker) -> None:
    kind = "embedded" if isinstance(handle, ThreadedBroker) else "remote"
    owner: Any = served if kind == "embedded" else minibroker.connect(_http_url(served))
    other = owner.create_namespace()
    other.drop_namespace()
    with pytest.raises(LookupError, match="does not exist"):
        other.queue("q").depth  # noqa: B018


def test_the_info_route_names_the_namespace_and_its_amqp_url(served: ThreadedBroker) -> None:
    remote = minibroker.connect(_http_url(served) + "/")  # a trailing slash is no path prefix
    assert remote.request("GET", "/info") == {"namespace": "default", "url": served.url, "personality": "minibroker"}
    created = remote.create_namespace("info-ns")
    try:
        assert remote.namespace("info-ns").request("GET", "/info") == {
            "namespace": "info-ns",
            "url": created.url,
            "personality": "minibroker",
        }
    finally:
        created.drop_namespace()


def test_either_handle_creates_a_namespace_with_a_personality(served: ThreadedBroker) -> None:
    remote = minibroker.connect(_http_url(served))
    assert remote.personality == "minibroker"
    for owner in (served, remote):
        created: Any = owner.create_namespace(personality="strict")
        try:
            assert created.personality == "strict"
            assert remote.namespace(created.namespace_name).request("GET", "/info")["personality"] == "strict"
            name = created.namespace_name
            assert served.call(lambda running, name=name: running.broker.namespaces[name].personality.name) == "strict"
        finally:
            created.drop_namespace()
    named = remote.create_namespace("remote-strict", personality="strict")
    try:
        assert named.namespace_name == "remote-strict"
        assert named.personality == "strict"
    finally:
        named.drop_namespace()
    with pytest.raises(RemoteError, match="unknown personality 'nobody'") as info:
        remote.create_namespace("remote-nobody", personality="nobody")
    assert info.value.status == 400
    assert ", ".join(names()) in str(info.value)


async def test_the_trio_handle_takes_the_keyword_conditions_too() -> None:
    async with minibroker.serve({"server": {"port": 0}, "queues": {"a": {}}}) as broker:
        with trio.fail_after(5):
            await broker.wait_for(queue="a", depth=0)
            await broker.wait_for(transactions=0)
            with pytest.raises(TimeoutError):
                await broker.wait_for(queue="a", depth=1, timeout=0.1)
            with pytest.raises(TypeError, match="not both"):
                await broker.wait_for(lambda: True, transactions=0)
            with pytest.raises(TypeError, match="queue and depth go together"):
                await broker.wait_for(depth=1)


def test_topics_and_their_subscriptions_on_either_handle(handle: Any) -> None:
    news = handle.topic("news")
    assert (handle.topics, news.exists, news.staged, news.subscriptions()) == (["news"], True, 0, [])
    assert (handle.topic("nope").exists, handle.topic("nope").subscriptions()) == (False, [])
    conn = BlockingConnection(handle.url, timeout=5)
    try:
        conn.create_receiver("news", name="sub-1")
        [subscription] = news.subscriptions()
        assert subscription.name.startswith("sub-1")
        assert (subscription.durable, subscription.shared, subscription.consumers) == (False, False, 1)
        assert (subscription.depth, subscription.held, subscription.enqueued_total) == (0, 0, 0)
        assert news.delete() is True
        assert news.delete() is False
        assert handle.topics == []
    finally:
        conn.close()


def test_exchanges_and_bindings_that_091_clients_declared(handle: Any) -> None:
    """Issue 18: a test can look at the topology its code declared, embedded or remote alike."""
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(handle.amqp091_url + "?socket_timeout=5"))
    try:
        channel = conn.channel()
        channel.exchange_declare("orders", "topic", durable=True)
        channel.queue_declare("eu-orders")
        channel.queue_bind("eu-orders", "orders", "order.eu.#", arguments={"x-note": b"\x00bin"})
    finally:
        conn.close()
    exchanges = {e.name: e for e in handle.exchanges}
    assert {"", "amq.direct", "amq.fanout", "amq.headers", "amq.match", "amq.topic", "orders"} <= set(exchanges)
    orders = exchanges["orders"]
    assert (orders.type, orders.durable, orders.auto_delete, orders.internal) == ("topic", True, False, False)
    (binding,) = orders.bindings
    assert (binding.destination, binding.kind, binding.routing_key) == ("eu-orders", "queue", "order.eu.#")
    assert binding.arguments["x-note"] in (b"\x00bin", "AGJpbg==")  # remote: bytes as base64 text
