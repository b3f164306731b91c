"""The HTTP listener's bounds: huge bodies 413, slow clients 408 while others are served, malformed HTTP 400,
oversized heads 431, too many connections; and the broker keeps serving AMQP meanwhile."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from proton import Message
from proton.utils import BlockingConnection

from minibroker.testing.thread import ThreadedBroker
from tests.http.client import call, connect, http_broker


@pytest.fixture
def broker() -> Iterator[ThreadedBroker]:
    with http_broker(http={"max_body_size": 1000, "request_timeout": 0.5, "max_connections": 4}) as running:
        yield running


def raw_socket(broker: ThreadedBroker) -> socket.socket:
    assert broker.http_url is not None
    parts = urlsplit(broker.http_url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=5)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:  # closed with our data unread: a reset, after what it sent
        pass
    return b"".join(chunks)


def status_of(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1])


def amqp_round_trip(broker: ThreadedBroker) -> None:
    conn = BlockingConnection(broker.url.removeprefix("amqp://"), timeout=5)
    try:
        conn.create_sender("rt").send(Message(body="still serving"))
        receiver = conn.create_receiver("rt")
        assert receiver.receive(timeout=5).body == "still serving"
        receiver.accept()
    finally:
        conn.close()


def test_a_body_over_the_limit_is_413(broker: ThreadedBroker) -> None:
    answer = call(broker, "POST", "/api/queues/q/messages", {"body": "x" * 2000})
    assert answer.status == 413
    assert "error" in answer.json
    assert broker.queue("q").depth == 0


def test_a_chunked_body_over_the_limit_is_413(broker: ThreadedBroker) -> None:
    with raw_socket(broker) as sock:
        sock.sendall(b"POST /api/queues/q/messages HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(3):
            sock.sendall(b"1f4\r\n" + b"a" * 500 + b"\r\n")
        assert status_of(read_all(sock)) == 413


def test_a_slow_client_gets_408_while_another_is_served(broker: ThreadedBroker) -> None:
    with raw_socket(broker) as slow:
        slow.sendall(b"GET /api/queues HTTP/1.1\r\nHost: localhost\r\n")  # the head never ends
        started = time.monotonic()
        assert call(broker, "GET", "/healthz").status == 200  # served meanwhile
        amqp_round_trip(broker)
        reply = read_all(slow)
        assert status_of(reply) == 408
        assert b'"error"' in reply
        assert time.monotonic() - started < 5


def test_a_body_that_stops_coming_is_408(broker: ThreadedBroker) -> None:
    with raw_socket(broker) as sock:
        sock.sendall(b"POST /api/queues/q/messages HTTP/1.1\r\nHost: localhost\r\nContent-Length: 50\r\n\r\n{")
        assert status_of(read_all(sock)) == 408


def test_an_idle_keep_alive_connection_is_closed_quietly(broker: ThreadedBroker) -> None:
    with raw_socket(broker) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        reply = read_all(sock)  # the answer, then the close after request_timeout of silence
        assert status_of(reply) == 200
        assert reply.count(b"HTTP/1.1") == 1


@pytest.mark.parametrize(
    "garbage",
    [
        b"NOT HTTP AT ALL\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\n\r\n",  # HTTP/1.1 without Host
        b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nContent-Length: nope\r\n\r\n",
        b"\x00\x01\x02\x03\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nbad header line\r\n\r\n",
    ],
)
def test_malformed_http_is_400_and_the_broker_goes_on(broker: ThreadedBroker, garbage: bytes) -> None:
    with raw_socket(broker) as sock:
        sock.sendall(garbage)
        assert status_of(read_all(sock)) == 400
    assert call(broker, "GET", "/healthz").status == 200
    amqp_round_trip(broker)


@pytest.mark.parametrize("whole", [True, False])
def test_an_oversized_head_is_431(broker: ThreadedBroker, whole: bool) -> None:
    with raw_socket(broker) as sock:
        sock.sendall(
            b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * 40000 + (b"\r\n\r\n" if whole else b"")
        )
        assert status_of(read_all(sock)) == 431


def test_a_connection_beyond_the_limit_takes_the_place_of_the_longest_idle(broker: ThreadedBroker) -> None:
    held = [raw_socket(broker) for _ in range(4)]
    try:
        for sock in held:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            sock.recv(65536)  # served: the connection counts
        with raw_socket(broker) as extra:
            extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            assert status_of(read_all(extra)) == 200
        assert read_all(held[0]) == b""  # the oldest idle one was closed quietly
    finally:
        for sock in held:
            sock.close()


def test_http_1_0_and_connection_close_end_the_connection(broker: ThreadedBroker) -> None:
    with raw_socket(broker) as sock:
        sock.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        assert status_of(read_all(sock)) == 200
    conn = connect(broker)
    try:
        conn.request("GET", "/healthz", headers={"connection": "close"})
        assert conn.getresponse().status == 200
    finally:
        conn.close()


def test_head_gets_no_body(broker: ThreadedBroker) -> None:
    with raw_socket(broker) as sock:
        sock.sendall(b"HEAD /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        reply = read_all(sock)
        assert status_of(reply) == 200  # RFC 9110 §9.3.2: GET's answer without its content
        assert reply.endswith(b"\r\n\r\n")


def test_expect_100_continue_is_answered_before_the_body(broker: ThreadedBroker) -> None:
    body = b'{"body": "after continue"}'
    with raw_socket(broker) as sock:
        head = (
            b"POST /api/queues/c/messages HTTP/1.1\r\nHost: localhost\r\nExpect: 100-continue\r\nConnection: close\r\n"
        )
        sock.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body))
        assert sock.recv(65536).startswith(b"HTTP/1.1 100 ")
        sock.sendall(body)
        assert status_of(read_all(sock)) == 201
    assert broker.queue("c").depth == 1
