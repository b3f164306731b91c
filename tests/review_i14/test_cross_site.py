"""A web page on another site must not change the broker through an operator's browser (CSRF): a cross-site
form POST needs no preflight, and browsers send cached Basic credentials with it (or none are needed)."""

from __future__ import annotations

import http.client
from collections.abc import Iterator

import pytest

from minibroker.testing.thread import ThreadedBroker
from tests.http.client import call, connect, http_broker


@pytest.fixture
def broker() -> Iterator[ThreadedBroker]:
    with http_broker() as running:
        yield running


def post(broker: ThreadedBroker, path: str, headers: dict[str, str], body: bytes = b"") -> int:
    conn: http.client.HTTPConnection = connect(broker)
    try:
        conn.request("POST", path, body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


@pytest.mark.parametrize("origin", ["http://evil.example", "null"])
def test_a_cross_site_form_post_is_refused(broker: ThreadedBroker, origin: str) -> None:
    call(broker, "POST", "/api/queues/keep/messages", {"body": "x"})
    headers = {"origin": origin, "content-type": "text/plain"}
    assert post(broker, "/api/reset", headers) == 403
    assert post(broker, "/api/queues/q/messages", headers, b'{"body": "forged"}') == 403
    assert call(broker, "GET", "/api/queues/keep").json["depth"] == 1
    assert call(broker, "GET", "/api/queues/q").status == 404


def test_the_console_itself_may_post(broker: ThreadedBroker) -> None:
    assert broker.http_url is not None
    host = broker.http_url.removeprefix("http://").rstrip("/")
    headers = {"origin": f"http://{host}", "content-type": "application/json"}
    assert post(broker, "/api/queues/q/messages", headers, b'{"body": "mine"}') == 201


def test_the_console_cannot_be_framed(broker: ThreadedBroker) -> None:
    answer = call(broker, "GET", "/")
    assert answer.headers.get("x-frame-options") == "DENY"
    assert "frame-ancestors 'none'" in answer.headers.get("content-security-policy", "")
