"""Adversarial probes of the management API (issue 14 review): each test pins a behaviour the review checked."""

from __future__ import annotations

import json
import math
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from proton import Message
from proton.utils import BlockingConnection

from minibroker.testing.thread import ThreadedBroker
from tests.http.client import call, http_broker


@pytest.fixture
def broker() -> Iterator[ThreadedBroker]:
    with http_broker(http={"request_timeout": 2.0}) as running:
        yield running


def raw(broker: ThreadedBroker, data: bytes) -> bytes:
    assert broker.http_url is not None
    parts = urlsplit(broker.http_url)
    assert parts.hostname is not None
    with socket.create_connection((parts.hostname, parts.port), timeout=5) as sock:
        sock.sendall(data)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except (ConnectionResetError, TimeoutError):
            pass
        return b"".join(chunks)


def send_amqp(broker: ThreadedBroker, address: str, message: Message) -> None:
    conn = BlockingConnection(broker.url.removeprefix("amqp://"), timeout=5)
    try:
        conn.create_sender(address).send(message)
    finally:
        conn.close()


def test_an_encoded_slash_in_a_queue_name_never_addresses_another_route(broker: ThreadedBroker) -> None:
    send_amqp(broker, "victim", Message(body="keep me"))
    # the queue named "victim/messages" does not exist: this must not purge the queue "victim"
    answer = call(broker, "DELETE", "/api/queues/victim%2Fmessages")
    assert answer.status == 404, answer.body
    assert call(broker, "GET", "/api/queues/victim").json["depth"] == 1


def test_a_queue_whose_name_has_a_slash_is_reachable(broker: ThreadedBroker) -> None:
    send_amqp(broker, "a/b", Message(body="x"))
    answer = call(broker, "GET", "/api/queues/a%2Fb")
    assert answer.status == 200, answer.body
    assert answer.json["name"] == "a/b"
    peeked = call(broker, "GET", "/api/queues/a%2Fb/messages")
    assert peeked.status == 200
    assert peeked.json[0]["body"] == "x"


def test_head_is_answered_like_get_without_a_body(broker: ThreadedBroker) -> None:
    # RFC 9110 §9.3.2: HEAD is GET without content; a server MUST support GET and HEAD (§9.1)
    reply = raw(broker, b"HEAD /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200"), reply
    head, _, body = reply.partition(b"\r\n\r\n")
    assert body == b""
    assert b"content-length: 15" in head.lower()


def test_non_finite_floats_peeked_are_valid_json(broker: ThreadedBroker) -> None:
    send_amqp(
        broker,
        "floats",
        Message(body=[math.nan, math.inf], properties={"p": -math.inf}),
    )
    answer = call(broker, "GET", "/api/queues/floats/messages")
    assert answer.status == 200
    # strict JSON (RFC 8259) has no NaN or Infinity: a browser's JSON.parse would fail on them
    value = json.loads(answer.body, parse_constant=lambda name: pytest.fail(f"non-JSON constant {name}"))
    assert value[0]["body"] == ["NaN", "Infinity"]
    assert value[0]["application_properties"] == {"p": "-Infinity"}


@pytest.mark.parametrize(
    "path",
    [
        "/api/queues/q/messages?limit=-1",
        "/api/queues/q/messages?limit=1e9",
        "/api/queues/q/messages?limit=abc",
        "/api/wait?queue=q&depth=abc",
        "/api/wait?queue=q&depth=1&timeout=nan",
        "/api/wait?queue=q&depth=1&timeout=inf",
        "/api/wait?queue=q&depth=1&timeout=-1",
    ],
)
def test_odd_query_parameters_are_400(broker: ThreadedBroker, path: str) -> None:
    call(broker, "POST", "/api/queues/q/messages", {"body": "x"})
    assert call(broker, "GET", path).status == 400


@pytest.mark.parametrize(
    "body",
    [
        {"body": "s"},
        {"body": None},
        {"body": {"a": [1, {"b": None}]}},
        {"body": [1, 2.5, "x", True]},
        {"body": 2**63},
        {"body": -(2**63)},
        {"body": "\U0001f600 \u00e9"},
        {"body": "aGVsbG8=", "body_encoding": "base64"},
    ],
)
def test_every_body_shape_round_trips(broker: ThreadedBroker, body: dict[str, Any]) -> None:
    assert call(broker, "POST", "/api/queues/shapes/messages", body).status == 201
    peeked = call(broker, "GET", "/api/queues/shapes/messages").json[-1]
    assert peeked["body"] == body["body"]


@pytest.mark.parametrize(
    "body",
    [
        {"body": 2**64},
        {"body": -(2**64)},
        {"header": {"ttl": "10"}},
        {"header": {"priority": 256}},
        {"header": {"durable": 1}},
        {"properties": {"creation_time": "now"}},
        {"properties": {"message_id": -1}},
        {"properties": {"message_id": 1.5}},
        {"application_properties": {"k": [1]}},
        {"annotations": {"k": {"x": 1}}},
        {"body": "!!", "body_encoding": "base64"},
        {"body": 1, "body_encoding": "base64"},
        {"body": "x", "body_encoding": "hex"},
        {"extra": 1},
        [1, 2],
        "text",
    ],
)
def test_bad_message_fields_are_400(broker: ThreadedBroker, body: Any) -> None:
    answer = call(broker, "POST", "/api/queues/bad/messages", body)
    assert answer.status == 400, answer.body
    assert "error" in answer.json


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"POST /api/queues/q/messages HTTP/1.1\r\nHost: localhost\r\nContent-Length: -1\r\n\r\n",
        b"POST /api/queues/q/messages HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"POST /api/queues/q/messages HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"GET /\x00 HTTP/1.1\r\nHost: localhost\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(5000)) + b"\r\n",
    ],
)
def test_malformed_http_is_a_4xx_and_a_close(broker: ThreadedBroker, request_bytes: bytes) -> None:
    reply = raw(broker, request_bytes)
    assert reply[:10] in (b"HTTP/1.1 4",) or reply.startswith(b"HTTP/1.1 4"), reply[:200]
    assert call(broker, "GET", "/healthz").status == 200


def test_pipelined_and_byte_by_byte_requests(broker: ThreadedBroker) -> None:
    one = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
    last = b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    reply = raw(broker, one * 3 + last)
    assert reply.count(b"HTTP/1.1 200") == 4
    assert broker.http_url is not None
    parts = urlsplit(broker.http_url)
    with socket.create_connection((parts.hostname, parts.port), timeout=5) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for byte in last:
            sock.send(bytes([byte]))
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")


def test_non_utf8_and_odd_paths_are_4xx(broker: ThreadedBroker) -> None:
    for target in (b"/api/queues/%ff%fe", b"/api/queues/%00", b"/api/queues/..", b"*", b"/api/queues/%F0%9F%98%80"):
        reply = raw(broker, b"GET " + target + b" HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 4"), (target, reply[:200])


def test_bogus_close_condition_is_400(broker: ThreadedBroker) -> None:
    conn = BlockingConnection(broker.url.removeprefix("amqp://"), timeout=5)
    try:
        ident = call(broker, "GET", "/api/connections").json[0]["id"]
        assert call(broker, "DELETE", f"/api/connections/{ident}?condition=a%20b").status == 400
        assert call(broker, "DELETE", f"/api/connections/{ident}?condition=" + "x" * 200).status == 400
        assert call(broker, "DELETE", "/api/connections/%C2%B2").status == 400
    finally:
        conn.close()


def test_the_remote_handle_reaches_a_queue_whose_name_has_a_slash(broker: ThreadedBroker) -> None:
    import minibroker

    assert broker.http_url is not None
    send_amqp(broker, "c/d", Message(body="y"))
    remote = minibroker.connect(broker.http_url)
    assert remote.queue("c/d").depth == 1
    assert [view.body for view in remote.queue("c/d").peek()] == ["y"]
