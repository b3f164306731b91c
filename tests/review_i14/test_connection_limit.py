"""The HTTP connection limit must not lock a real client out: idle connections (no byte of a request yet) give
way to a new one, oldest first; when every connection is busy, the new one gets a clear 503."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from minibroker.testing.thread import ThreadedBroker
from tests.http.client import call, http_broker


@pytest.fixture
def broker() -> Iterator[ThreadedBroker]:
    with http_broker(http={"request_timeout": 30.0, "max_connections": 3}) as running:
        yield running


def open_socket(broker: ThreadedBroker) -> socket.socket:
    assert broker.http_url is not None
    parts = urlsplit(broker.http_url)
    return socket.create_connection((parts.hostname, parts.port), timeout=5)


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


def test_idle_connections_give_way_to_a_real_client(broker: ThreadedBroker) -> None:
    idle = [open_socket(broker) for _ in range(3)]
    try:
        idle[0].sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert idle[0].recv(65536).startswith(b"HTTP/1.1 200")  # served, then idle between requests
        for _ in range(3):  # well before the 30 s request time-out
            assert call(broker, "GET", "/healthz").status == 200
    finally:
        for sock in idle:
            sock.close()


def test_when_every_connection_is_busy_a_new_one_gets_503(broker: ThreadedBroker) -> None:
    busy = [open_socket(broker) for _ in range(3)]
    try:
        for sock in busy:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")  # a head that never ends (slowloris)
        time.sleep(0.3)  # the broker has read them: these connections are busy, not idle
        with open_socket(broker) as extra:
            extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            reply = read_all(extra)
        assert reply.startswith(b"HTTP/1.1 503"), reply
        assert b"retry-after" in reply.lower()
    finally:
        for sock in busy:
            sock.close()
