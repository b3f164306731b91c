"""Probes of the management API's Basic auth and of /metrics with odd names (issue 14 review)."""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families
from proton import Message
from proton.utils import BlockingConnection

from minibroker.testing.thread import ThreadedBroker
from tests.http.client import call, connect, http_broker

USERS = {"admin": "pa:ss:wörd", "viewer": "v1ew", "": "empty-user"}


@pytest.fixture
def broker() -> Iterator[ThreadedBroker]:
    auth = {"failure_delay": 0.0, "users": USERS, "permissions": {"admin": {"manage": True}, "viewer": {}}}
    with http_broker(auth=auth) as running:
        yield running


def raw_auth(broker: ThreadedBroker, method: str, path: str, header: str) -> int:
    conn = connect(broker)
    try:
        conn.request(method, path, headers={"authorization": header})
        response = conn.getresponse()
        body = response.read()
        assert b"pa:ss" not in body
        return response.status
    finally:
        conn.close()


def test_colons_and_non_ascii_in_a_password(broker: ThreadedBroker) -> None:
    assert call(broker, "GET", "/api/stats", auth=("admin", "pa:ss:wörd")).status == 200
    assert call(broker, "GET", "/api/stats", auth=("admin", "pa:ss")).status == 401


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/api/queues/q/messages"),
        ("DELETE", "/api/queues/q/messages"),
        ("DELETE", "/api/queues/q"),
        ("DELETE", "/api/topics/t"),
        ("DELETE", "/api/connections/1"),
        ("POST", "/api/reset"),
        ("POST", "/api/namespaces"),
        ("DELETE", "/api/namespaces/x"),
    ],
)
def test_every_change_needs_manage(broker: ThreadedBroker, method: str, path: str) -> None:
    answer = call(broker, method, path, {"body": "x"} if method == "POST" else None, auth=("viewer", "v1ew"))
    assert answer.status == 403
    assert call(broker, "GET", "/api/namespaces/x/queues", auth=("viewer", "v1ew")).status == 404


@pytest.mark.parametrize(
    "header",
    [
        "Basic !!!",
        "Bearer abc",
        "Basic " + base64.b64encode(b"\xff\xfe:x").decode(),
        "Basic " + base64.b64encode(b"no-colon").decode(),
        "Basic",
        "basic " + base64.b64encode(b"admin:wrong").decode(),
    ],
)
def test_unreadable_or_wrong_credentials_are_401_without_echo(broker: ThreadedBroker, header: str) -> None:
    assert raw_auth(broker, "GET", "/api/stats", header) == 401


def test_no_credential_is_logged(broker: ThreadedBroker, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    call(broker, "GET", "/api/stats", auth=("admin", "pa:ss:wörd"))
    call(broker, "GET", "/api/stats", auth=("admin", "pa:ss:wrong"))
    call(broker, "DELETE", "/api/queues/nope", auth=("viewer", "v1ew"))
    assert "pa:ss" not in caplog.text
    assert "v1ew" not in caplog.text


def test_metrics_of_odd_names_parse_once_per_family() -> None:
    with http_broker() as broker:
        names = ['q"uo\\te', "new\nline", "emoji-\U0001f600", "sp ace{}=,"]
        conn = BlockingConnection(broker.url.removeprefix("amqp://"), timeout=5)
        try:
            for name in names:
                conn.create_sender(name).send(Message(body="x"))
        finally:
            conn.close()
        assert call(broker, "POST", "/api/namespaces", {"name": "other"}).status == 201
        assert call(broker, "POST", "/api/namespaces/other/queues/q/messages", {"body": 1}).status == 201
        text = call(broker, "GET", "/metrics").body.decode()
        seen: set[str] = set()
        depths = {}
        for family in text_string_to_metric_families(text):
            assert family.name not in seen
            seen.add(family.name)
            for sample in family.samples:
                if sample.name == "minibroker_queue_depth":
                    depths[(sample.labels["namespace"], sample.labels["queue"])] = sample.value
        for name in names:
            assert depths[("default", name)] == 1
        assert depths[("other", "q")] == 1
        # HEAD and the metrics page agree on the length
        conn2 = connect(broker)
        conn2.request("HEAD", "/metrics")
        head = conn2.getresponse()
        assert head.status == 200
        assert head.read() == b""
        conn2.close()
