"""Whatever bytes a client sends, the HTTP listener answers with one HTTP response or closes, and goes on serving
(and the broker goes on serving AMQP)."""

from __future__ import annotations

import logging
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.http.client import call, http_broker
from tests.http.test_bounds import amqp_round_trip, raw_socket, read_all

REQUEST_LINES = [
    b"GET /api/queues HTTP/1.1\r\n",
    b"POST /api/queues/f/messages HTTP/1.1\r\n",
    b"DELETE /api/connections/1 HTTP/1.1\r\n",
    b"GET /healthz HTTP/1.0\r\n",
]
HEADERS = [
    b"Host: x\r\n",
    b"Content-Length: 5\r\n",
    b"Content-Length: -1\r\n",
    b"Transfer-Encoding: chunked\r\n",
    b"Authorization: Basic Og==\r\n",
    b"\r\n",
    b"{}",
    b"5\r\nhello\r\n0\r\n\r\n",
]
pieces = st.one_of(st.sampled_from(REQUEST_LINES), st.sampled_from(HEADERS), st.binary(max_size=40))


def test_any_bytes_get_an_answer_or_a_close(caplog: pytest.LogCaptureFixture) -> None:
    with http_broker(http={"request_timeout": 0.5}) as broker:

        @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
        @given(st.lists(pieces, max_size=8))
        def exchange(parts: list[bytes]) -> None:
            with raw_socket(broker) as sock:
                sock.sendall(b"".join(parts))
                sock.shutdown(socket.SHUT_WR)
                reply = read_all(sock)
            if reply:
                assert reply.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")), reply[:80]
                assert 100 <= int(reply.split(b" ", 2)[1]) < 600

        exchange()
        assert call(broker, "GET", "/healthz").status == 200
        amqp_round_trip(broker)
    assert not [r for r in caplog.records if r.name.startswith("minibroker") and r.levelno >= logging.ERROR]
