"""DNS rebinding: a page on evil.example whose name is re-pointed at 127.0.0.1 is same-origin with the API for
the browser (its Origin equals the Host it sends), so neither CORS nor the Origin check stops it. A listener on a
loopback address answers only Host names that are loopback (RFC 9110 §15.5.20, 421 Misdirected Request)."""

from __future__ import annotations

import http.client
from collections.abc import Iterator

import pytest

from minibroker.testing.thread import ThreadedBroker
from tests.http.client import connect, http_broker


@pytest.fixture
def broker() -> Iterator[ThreadedBroker]:
    with http_broker() as running:
        yield running


def get(broker: ThreadedBroker, host: str) -> int:
    conn: http.client.HTTPConnection = connect(broker)
    try:
        conn.putrequest("GET", "/api/queues", skip_host=True)
        conn.putheader("Host", host)
        conn.endheaders()
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_a_foreign_host_name_is_misdirected(broker: ThreadedBroker) -> None:
    assert broker.http_url is not None
    port = broker.http_url.rstrip("/").rsplit(":", 1)[1]
    assert get(broker, f"evil.example:{port}") == 421
    assert get(broker, "evil.example") == 421
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}", f"LOCALHOST:{port}"):
        assert get(broker, host) == 200, host


def test_any_host_name_when_listening_beyond_loopback() -> None:
    with http_broker(http={"host": "0.0.0.0"}) as broker:
        assert get(broker, "broker.internal:8672") == 200
