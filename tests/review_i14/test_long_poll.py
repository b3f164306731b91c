"""Long-polls whose clients went away must not hold the HTTP listener's connection slots until their timeout."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from minibroker.testing.thread import ThreadedBroker
from tests.http.client import call, http_broker, wait_until_polled


@pytest.fixture
def broker() -> Iterator[ThreadedBroker]:
    with http_broker(http={"request_timeout": 2.0, "max_connections": 3}) as running:
        yield running


def test_abandoned_waits_free_their_connections(broker: ThreadedBroker) -> None:
    assert broker.http_url is not None
    parts = urlsplit(broker.http_url)
    polls = [socket.create_connection((parts.hostname, parts.port), timeout=5) for _ in range(3)]
    try:
        for sock in polls:
            sock.sendall(b"GET /api/wait?queue=q&depth=5&timeout=300 HTTP/1.1\r\nHost: localhost\r\n\r\n")
        wait_until_polled(broker, 3)  # every slot is held by a waiting long-poll
    finally:
        for sock in polls:
            sock.close()
    deadline = time.monotonic() + 5
    while True:  # each slot is freed as soon as its client is seen gone: well within the 300 s wait
        try:
            if call(broker, "GET", "/healthz").status == 200:
                break
        except (ConnectionError, OSError):
            pass
        assert time.monotonic() < deadline, "the abandoned long-polls still hold every connection slot"
        time.sleep(0.1)


def test_a_wait_answers_a_client_that_pipelined_another_request(broker: ThreadedBroker) -> None:
    assert broker.http_url is not None
    parts = urlsplit(broker.http_url)
    with socket.create_connection((parts.hostname, parts.port), timeout=5) as sock:
        sock.sendall(
            b"GET /api/wait?queue=q&depth=1&timeout=0.5 HTTP/1.1\r\nHost: localhost\r\n\r\n"
            b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 408")
    assert reply.count(b"HTTP/1.1 200") == 1
