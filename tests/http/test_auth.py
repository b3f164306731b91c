"""With [auth.users]: every API call but the health probes needs HTTP Basic credentials of a configured user
(401), and POST and DELETE calls need ``manage`` (403) when the user has a permissions entry."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from minibroker.auth import hash_password
from minibroker.testing.thread import ThreadedBroker
from tests.http.client import call, connect, http_broker

CHALLENGE = 'Basic realm="minibroker"'


@pytest.fixture
def broker() -> Iterator[ThreadedBroker]:
    auth = {
        "failure_delay": 0.0,
        "users": {"admin": "s3cret", "viewer": "v1ew", "free": "fr33"},
        "permissions": {"admin": {"manage": True}, "viewer": {}},
    }
    with http_broker(auth=auth) as running:
        yield running


def test_health_probes_need_no_credentials(broker: ThreadedBroker) -> None:
    assert call(broker, "GET", "/healthz").status == 200
    assert call(broker, "GET", "/readyz").status == 200


@pytest.mark.parametrize(
    "auth",
    [None, ("admin", "wrong"), ("nobody", "s3cret"), ("admin", "")],
)
def test_missing_or_wrong_credentials_are_401(broker: ThreadedBroker, auth: tuple[str, str] | None) -> None:
    for method, path in (("GET", "/api/queues"), ("POST", "/api/reset"), ("GET", "/api/namespaces/default/stats")):
        answer = call(broker, method, path, auth=auth)
        assert answer.status == 401
        assert answer.headers["www-authenticate"] == CHALLENGE
        assert "error" in answer.json
    assert broker.queues == []  # the reset did not run


@pytest.mark.parametrize("header", ["Bearer abc", "Basic !!!", "Basic dXNlcg=="])
def test_unreadable_authorization_is_401(broker: ThreadedBroker, header: str) -> None:
    conn = connect(broker)
    try:
        conn.request("GET", "/api/queues", headers={"authorization": header})
        response = conn.getresponse()
        response.read()
        assert response.status == 401
    finally:
        conn.close()


def test_reading_needs_any_user_and_changing_needs_manage(broker: ThreadedBroker) -> None:
    for user in (("admin", "s3cret"), ("viewer", "v1ew"), ("free", "fr33")):
        assert call(broker, "GET", "/api/queues", auth=user).status == 200
    message = {"body": "x"}
    refused = call(broker, "POST", "/api/queues/q/messages", message, auth=("viewer", "v1ew"))
    assert refused.status == 403
    assert "manage" in refused.json["error"]
    assert call(broker, "DELETE", "/api/queues/q/messages", auth=("viewer", "v1ew")).status == 403
    assert broker.queue("q").depth == 0
    assert call(broker, "POST", "/api/queues/q/messages", message, auth=("admin", "s3cret")).status == 201
    # a user without a permissions entry may do everything, as over AMQP
    assert call(broker, "POST", "/api/queues/q/messages", message, auth=("free", "fr33")).status == 201
    assert broker.queue("q").depth == 2


def test_hashed_passwords_are_checked_and_never_logged(caplog: pytest.LogCaptureFixture) -> None:
    stored = hash_password("h4shed", iterations=1000)
    auth = {"failure_delay": 0.0, "users": {"ops": stored}}
    caplog.set_level(logging.DEBUG)
    with http_broker(auth=auth) as broker:
        assert call(broker, "GET", "/api/stats", auth=("ops", "h4shed")).status == 200
        assert call(broker, "GET", "/api/stats", auth=("ops", "wr0ng")).status == 401
    assert "h4shed" not in caplog.text
    assert "wr0ng" not in caplog.text
