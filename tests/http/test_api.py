"""The JSON management API, every endpoint through ``http.client`` against a real broker, with AMQP traffic from
python-qpid-proton or the scripted peer where state is needed."""

from __future__ import annotations

import base64
import threading
import time
from typing import Any

import pytest
from proton import Message
from proton.utils import BlockingConnection, LinkDetached

from minibroker.amqp.definitions import (
    Close,
)
from minibroker.broker.personality import names
from minibroker.testing.peer import ScriptedPeer
from minibroker.testing.thread import ThreadedBroker
from tests.http.client import call, connect, http_broker, open_transaction, wait_until_polled


@pytest.fixture
def broker() -> Any:
    with http_broker(topics={"news": {}}) as running:
        yield running


def amqp(broker: ThreadedBroker) -> BlockingConnection:
    return BlockingConnection(broker.url.removeprefix("amqp://"), timeout=5)


def test_health_and_readiness(broker: ThreadedBroker) -> None:
    assert call(broker, "GET", "/healthz").json == {"status": "ok"}
    assert call(broker, "GET", "/readyz").status == 200


def test_http_url_is_on_loopback_and_off_by_default() -> None:
    with http_broker(server={"port": 0, "host": "127.0.0.1"}) as running:
        assert running.http_url is not None
        assert running.http_url.startswith("http://127.0.0.1:")
    from minibroker.testing.thread import run_in_thread

    with run_in_thread({"server": {"port": 0}}) as plain:
        assert plain.http_url is None


def test_post_peek_consume_and_purge(broker: ThreadedBroker) -> None:
    message = {
        "body": "hello",
        "properties": {"message_id": "m-1", "subject": "greeting", "content_type": "text/plain"},
        "application_properties": {"n": 7, "ok": True},
        "annotations": {"x-opt-tag": "a"},
        "header": {"durable": True, "priority": 6},
    }
    answer = call(broker, "POST", "/api/queues/orders/messages", message)
    assert answer.status == 201, answer.body
    assert call(broker, "POST", "/api/queues/orders/messages", {"body": {"k": [1, 2]}}).status == 201
    raw = base64.b64encode(b"\x00\xffbin").decode()
    assert call(broker, "POST", "/api/queues/orders/messages", {"body": raw, "body_encoding": "base64"}).status == 201

    peeked = call(broker, "GET", "/api/queues/orders/messages?limit=10").json
    assert [m["body"] for m in peeked] == ["hello", {"k": [1, 2]}, raw]
    assert peeked[2]["body_encoding"] == "base64"
    first = peeked[0]
    assert first["properties"] == {"message_id": "m-1", "subject": "greeting", "content_type": "text/plain"}
    assert first["application_properties"] == {"n": 7, "ok": True}
    assert first["annotations"] == {"x-opt-tag": "a"}
    assert first["header"]["durable"] is True
    assert first["header"]["priority"] == 6
    assert len(call(broker, "GET", "/api/queues/orders/messages?limit=1").json) == 1
    assert broker.queue("orders").depth == 3  # peeking consumes nothing

    conn = amqp(broker)
    try:
        receiver = conn.create_receiver("orders")
        got = receiver.receive(timeout=5)
        receiver.accept()
        assert got.body == "hello"
        assert got.subject == "greeting"
        assert got.properties == {"n": 7, "ok": True}
    finally:
        conn.close()
    assert call(broker, "DELETE", "/api/queues/orders/messages").json == {"purged": 2}
    assert call(broker, "GET", "/api/queues/orders").json["depth"] == 0


def test_messages_sent_over_amqp_are_shown(broker: ThreadedBroker) -> None:
    conn = amqp(broker)
    try:
        sender = conn.create_sender("in")
        sender.send(Message(body=b"\x01\x02", properties={"k": "v"}))
    finally:
        conn.close()
    (shown,) = call(broker, "GET", "/api/queues/in/messages").json
    assert shown["body"] == base64.b64encode(b"\x01\x02").decode()
    assert shown["body_encoding"] == "base64"
    assert shown["application_properties"] == {"k": "v"}


def test_queues_list_one_and_delete_detaching_consumers(broker: ThreadedBroker) -> None:
    call(broker, "POST", "/api/queues/a/messages", {"body": "x"})
    conn = amqp(broker)
    try:
        receiver = conn.create_receiver("b", credit=0)
        listed = {q["name"]: q for q in call(broker, "GET", "/api/queues").json}
        assert set(listed) >= {"a", "b"}
        assert listed["a"] == {
            "name": "a",
            "depth": 1,
            "acquired": 0,
            "staged": 0,
            "consumers": 0,
            "scheduled": 0,
            "enqueued_total": 1,
            "dequeued_total": 0,
            "kind": "auto",
        }
        assert listed["b"]["consumers"] == 1
        assert call(broker, "DELETE", "/api/queues/b").json == {"deleted": "b"}
        assert not broker.queue("b").exists
        with pytest.raises(LinkDetached, match="resource-deleted"):
            receiver.receive(timeout=5)
    finally:
        conn.close()
    assert call(broker, "GET", "/api/queues/b").status == 404
    assert call(broker, "DELETE", "/api/queues/b").status == 404


def test_topics_and_their_subscriptions(broker: ThreadedBroker) -> None:
    conn = amqp(broker)
    try:
        conn.create_receiver("news", name="sub-1")
        broker.wait_for(lambda: bool(broker.topic("news").subscriptions()))
        (topic,) = call(broker, "GET", "/api/topics").json
        assert topic["name"] == "news"
        (subscription,) = topic["subscriptions"]
        assert subscription["consumers"] == 1
        assert subscription["durable"] is False
        assert call(broker, "GET", "/api/topics/news").json == topic
    finally:
        conn.close()
    assert call(broker, "GET", "/api/topics/nope").status == 404


def test_transactions_stats_and_connections(broker: ThreadedBroker) -> None:
    host, port = broker.url.removeprefix("amqp://").rsplit(":", 1)
    with ScriptedPeer.connect(host, int(port)) as peer:
        txn_id = open_transaction(peer)
        (txn,) = call(broker, "GET", "/api/transactions").json
        assert txn["id"] == txn_id.hex()
        assert txn["posts"] == 1
        assert txn["state"] == "open"
        assert txn["age_s"] >= 0
        assert txn["retirements"] == 0
        assert txn["acquisitions"] == 0
        assert txn["failed"] is None
        assert call(broker, "GET", "/api/queues/staging").json["staged"] == 1
        stats = call(broker, "GET", "/api/stats").json
        assert stats["messages"] == {"in": 0, "out": 0, "ready": 0, "acquired": 0}
        assert stats["transactions"]["declared"] == 1
        assert stats["transactions"]["open"] == 1
        assert stats["connections"] == 1
        (info,) = call(broker, "GET", "/api/connections").json
        assert info["sessions"] == 1
        assert info["links"] == 2
        assert info["namespace"] == "default"
        assert info["peer"] == "{}:{}".format(*peer.sock.getsockname()[:2])

        answer = call(broker, "DELETE", f"/api/connections/{info['id']}?condition=amqp:connection:redirect")
        assert answer.json == {"closed": info["id"], "condition": "amqp:connection:redirect"}
        close = peer.expect(Close)
        assert close.error is not None
        assert close.error.condition == "amqp:connection:redirect"
    broker.wait_for(lambda: not broker.transactions)
    assert call(broker, "GET", "/api/stats").json["transactions"]["rolled_back"] == 1
    assert call(broker, "DELETE", f"/api/connections/{info['id']}").status == 404
    assert call(broker, "DELETE", "/api/connections/x").status == 400
    assert call(broker, "DELETE", "/api/connections/1?condition=bad%20one").status == 400


def test_reset_empties_the_namespace(broker: ThreadedBroker) -> None:
    call(broker, "POST", "/api/queues/gone/messages", {"body": "x"})
    assert call(broker, "POST", "/api/reset").status == 200
    assert "gone" not in broker.queues


def test_namespaces_create_use_and_delete(broker: ThreadedBroker) -> None:
    created = call(broker, "POST", "/api/namespaces", {"name": "t1"})
    assert created.status == 201
    assert created.json["name"] == "t1"
    assert created.json["url"].startswith("amqp://127.0.0.1:")
    assert call(broker, "POST", "/api/namespaces", {"name": "t1"}).status == 409
    assert call(broker, "POST", "/api/namespaces/t1/queues/q/messages", {"body": "in t1"}).status == 201
    assert [q["name"] for q in call(broker, "GET", "/api/namespaces/t1/queues").json] == ["q"]
    assert "q" not in broker.queues  # the default namespace does not see it
    conn = BlockingConnection(created.json["url"].removeprefix("amqp://"), timeout=5)
    try:
        assert conn.create_receiver("q").receive(timeout=5).body == "in t1"
    finally:
        conn.close()
    assert call(broker, "DELETE", "/api/namespaces/t1").json == {"deleted": "t1"}
    assert call(broker, "GET", "/api/namespaces/t1/queues").status == 404
    assert call(broker, "DELETE", "/api/namespaces/t1").status == 404
    assert call(broker, "DELETE", "/api/namespaces/default").status == 400
    anonymous = call(broker, "POST", "/api/namespaces")
    assert anonymous.status == 201
    assert anonymous.json["name"].startswith("ns-")


def test_namespaces_are_created_with_a_personality_and_report_it(broker: ThreadedBroker) -> None:
    assert call(broker, "GET", "/api/info").json["personality"] == "minibroker"  # the broker's default
    created = call(broker, "POST", "/api/namespaces", {"name": "s", "personality": "strict"})
    assert created.status == 201, created.body
    assert created.json["personality"] == "strict"
    assert broker.call(lambda running: running.broker.namespaces["s"].personality.name) == "strict"
    assert call(broker, "GET", "/api/namespaces/s/info").json == {
        "namespace": "s",
        "url": created.json["url"],
        "personality": "strict",
    }
    plain = call(broker, "POST", "/api/namespaces", {"name": "p"})
    assert plain.json["personality"] == "minibroker"
    assert call(broker, "GET", "/api/namespaces/p/info").json["personality"] == "minibroker"


@pytest.mark.parametrize("personality", ["nobody", 3, ["strict"]])
def test_an_unknown_personality_is_400_listing_the_known_ones(broker: ThreadedBroker, personality: Any) -> None:
    answer = call(broker, "POST", "/api/namespaces", {"name": "n", "personality": personality})
    assert answer.status == 400
    assert ", ".join(names()) in answer.json["error"]
    assert call(broker, "GET", "/api/namespaces/n/info").status == 404


def test_the_configured_personality_is_the_default_namespaces() -> None:
    with http_broker(broker={"personality": "strict"}) as running:
        assert call(running, "GET", "/api/info").json["personality"] == "strict"
        assert call(running, "POST", "/api/namespaces", {}).json["personality"] == "strict"


def test_wait_is_woken_by_broker_state(broker: ThreadedBroker) -> None:
    def post_later() -> None:
        wait_until_polled(broker)
        call(broker, "POST", "/api/queues/w/messages", {"body": "late"})

    poster = threading.Thread(target=post_later)
    started = time.monotonic()
    poster.start()
    answer = call(broker, "GET", "/api/wait?queue=w&depth=1&timeout=10")
    poster.join()
    assert answer.status == 200
    assert time.monotonic() - started < 5
    assert call(broker, "GET", "/api/wait?transactions=0&timeout=1").status == 200
    timed_out = call(broker, "GET", "/api/wait?queue=w&depth=5&timeout=0.2")
    assert timed_out.status == 408
    assert "error" in timed_out.json
    assert call(broker, "GET", "/api/wait?timeout=1").status == 400
    assert call(broker, "GET", "/api/wait?queue=w&depth=x").status == 400


def test_keep_alive_serves_many_requests_on_one_connection(broker: ThreadedBroker) -> None:
    conn = connect(broker)
    try:
        for _ in range(5):
            assert call(conn, "GET", "/api/queues").status == 200
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("PUT", "/api/queues", "GET, HEAD"),
        ("POST", "/api/queues/x", "GET, HEAD, DELETE"),
        ("GET", "/api/reset", "POST"),
    ],
)
def test_wrong_method_is_405_with_allow(broker: ThreadedBroker, method: str, path: str, allow: str) -> None:
    answer = call(broker, method, path)
    assert answer.status == 405
    assert answer.headers["allow"] == allow
    assert "error" in answer.json


@pytest.mark.parametrize(
    "path",
    [
        "/api",
        "/api/nope",
        "/api/queues/nope",
        "/api/queues/nope/messages",
        "/api/namespaces/nope/queues",
    ],
)
def test_unknown_is_404_json(broker: ThreadedBroker, path: str) -> None:
    answer = call(broker, "GET", path)
    assert answer.status == 404
    assert "error" in answer.json


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b"\xff\xfe",
        b"[1, 2]",
        b'{"body": "x", "extra": 1}',
        b'{"body": "!!", "body_encoding": "base64"}',
        b'{"body": "x", "body_encoding": "hex"}',
        b'{"header": {"priority": 999}}',
        b'{"properties": {"subject": 5}}',
        b'{"application_properties": {"a": [1]}}',
    ],
)
def test_malformed_message_is_400(broker: ThreadedBroker, raw: bytes) -> None:
    answer = call(broker, "POST", "/api/queues/q/messages", raw=raw)
    assert answer.status == 400
    assert "error" in answer.json
    assert broker.queue("q").depth == 0


def test_delete_topic_detaches_subscribers(broker: ThreadedBroker) -> None:
    conn = amqp(broker)
    try:
        receiver = conn.create_receiver("news", name="sub-1", credit=0)
        broker.wait_for(lambda: bool(broker.topic("news").subscriptions()))
        assert call(broker, "POST", "/api/queues/news/messages", {"body": "fan-out"}).status == 201
        (subscription,) = call(broker, "GET", "/api/topics/news").json["subscriptions"]
        assert subscription["depth"] == 1
        assert call(broker, "DELETE", "/api/topics/news").json == {"deleted": "news"}
        assert not broker.topic("news").exists
        with pytest.raises(LinkDetached, match="resource-deleted"):
            receiver.receive(timeout=5)
    finally:
        conn.close()
    assert call(broker, "DELETE", "/api/topics/news").status == 404


def test_posts_the_broker_refuses() -> None:
    config = {"broker": {"auto_create": False}, "queues": {"small": {"max_messages": 1}}}
    with http_broker(**config) as broker:
        unknown = call(broker, "POST", "/api/queues/nope/messages", {"body": "x"})
        assert unknown.status == 404
        assert "amqp:not-found" in unknown.json["error"]
        assert call(broker, "POST", "/api/queues/small/messages", {"body": "1"}).status == 201
        full = call(broker, "POST", "/api/queues/small/messages", {"body": "2"})
        assert full.status == 507
        assert "resource-limit-exceeded" in full.json["error"]
        assert broker.queue("small").depth == 1


@pytest.mark.parametrize(
    "path",
    ["/api/queues", "/api/topics", "/api/transactions", "/api/stats", "/api/connections", "/api/wait?transactions=0"],
)
def test_every_reading_path_answers_in_a_namespace(broker: ThreadedBroker, path: str) -> None:
    other = broker.create_namespace("iso")
    conn = BlockingConnection(other.url.removeprefix("amqp://"), timeout=5)
    try:
        conn.create_sender("only-in-iso").send(Message(body="x"))
        answer = call(broker, "GET", path.replace("/api/", "/api/namespaces/iso/", 1))
        assert answer.status == 200
        if path == "/api/queues":
            assert [q["name"] for q in answer.json] == ["only-in-iso"]
        if path == "/api/connections":
            assert [c["namespace"] for c in answer.json] == ["iso"]
        if path == "/api/stats":
            assert answer.json["namespace"] == "iso"
            assert answer.json["connections"] == 1
    finally:
        conn.close()
    assert call(broker, "POST", "/api/namespaces/iso/reset").status == 200
    assert other.queues == []


@pytest.mark.parametrize("change", ["DELETE /api/queues/w/messages", "POST /api/reset", "DELETE /api/queues/w"])
def test_wait_is_woken_by_purge_reset_and_delete(broker: ThreadedBroker, change: str) -> None:
    call(broker, "POST", "/api/queues/w/messages", {"body": "x"})

    def change_later() -> None:
        wait_until_polled(broker)
        method, path = change.split()
        assert call(broker, method, path).status == 200

    changer = threading.Thread(target=change_later)
    started = time.monotonic()
    changer.start()
    answer = call(broker, "GET", "/api/wait?queue=w&depth=0&timeout=20")
    changer.join()
    assert answer.status == 200
    assert time.monotonic() - started < 10


def test_stats_count_messages_in_and_out(broker: ThreadedBroker) -> None:
    """Messages in are those that became ready, out those that left for good (here: purged)."""
    for body in ("x", "y", "z"):
        assert call(broker, "POST", "/api/queues/counted/messages", {"body": body}).status == 201
    assert call(broker, "DELETE", "/api/queues/counted/messages").json == {"purged": 3}
    queue = call(broker, "GET", "/api/queues/counted").json
    assert (queue["enqueued_total"], queue["dequeued_total"], queue["depth"]) == (3, 3, 0)
    messages = call(broker, "GET", "/api/stats").json["messages"]
    assert (messages["in"], messages["out"]) == (3, 3)
    assert broker.queue("counted").stats().dequeued_total == 3
