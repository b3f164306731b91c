"""Namespaces through the management API: deleted while in use, bad names, posts into one that is gone."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest
from proton import ConnectionException
from proton.utils import BlockingConnection

from minibroker.testing.thread import ThreadedBroker
from tests.http.client import call, http_broker, wait_until_polled


@pytest.fixture
def broker() -> Iterator[ThreadedBroker]:
    with http_broker(topics={"news": {}}) as running:
        yield running


@pytest.mark.parametrize("body", [{"name": ""}, {"name": "a/b"}, {"name": 5}, {"name": "x" * 65}, [], {"name": None}])
def test_bad_namespace_names(broker: ThreadedBroker, body: object) -> None:
    answer = call(broker, "POST", "/api/namespaces", body)
    assert answer.status in (400, 201), answer.body
    if body == {"name": None}:
        assert answer.status == 201
    else:
        assert answer.status == 400


def test_deleting_a_namespace_in_use(broker: ThreadedBroker) -> None:
    created = call(broker, "POST", "/api/namespaces", {"name": "tmp"}).json
    url = created["url"].removeprefix("amqp://")
    conn = BlockingConnection(url, timeout=5)
    try:
        conn.create_sender("q")
        waiting: list[int] = []
        path = "/api/namespaces/tmp/wait?queue=q&depth=5&timeout=5"
        waiter = threading.Thread(target=lambda: waiting.append(call(broker, "GET", path).status))
        waiter.start()
        wait_until_polled(broker)
        assert call(broker, "DELETE", "/api/namespaces/tmp").status == 200
        waiter.join(10)
        assert not waiter.is_alive()
        assert waiting == [404]
        assert call(broker, "POST", "/api/namespaces/tmp/queues/q/messages", {"body": 1}).status == 404
        assert call(broker, "GET", "/api/namespaces/tmp/queues").status == 404
        with pytest.raises(ConnectionException):  # the namespace's connections were closed
            conn.create_receiver("q")
    finally:
        with contextlib.suppress(ConnectionException):
            conn.close()
    assert call(broker, "GET", "/healthz").status == 200


def test_posting_to_a_topic_reaches_its_subscribers(broker: ThreadedBroker) -> None:
    answer = call(broker, "POST", "/api/queues/news/messages", {"body": "hi"})
    assert answer.status == 201, answer.body
