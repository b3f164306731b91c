"""In-doubt transactions (issue 16 §4) through the management API and the Python handles: ``GET
/api/transactions`` shows them, ``POST /api/transactions/{id}/commit|rollback`` resolves them, ``/api/stats`` and
``/metrics`` count them; the same through ``ThreadedBroker`` and ``RemoteBroker``. A real broker in a thread with
``[transactions] orphaned = "hold"``; the producer is the scripted peer, whose socket is dropped."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import minibroker
from minibroker.testing.peer import ScriptedPeer
from minibroker.testing.thread import ThreadedBroker
from tests.http.client import call, http_broker, open_transaction


@pytest.fixture
def broker() -> Iterator[ThreadedBroker]:
    with http_broker(transactions={"orphaned": "hold"}) as running:
        yield running


def in_doubt(broker: ThreadedBroker) -> bytes:
    """A transaction that posted one message to ``staging``, its connection dropped: its id, once in doubt."""
    host, port = broker.url.removeprefix("amqp://").rsplit(":", 1)
    with ScriptedPeer.connect(host, int(port)) as peer:
        txn_id = open_transaction(peer)
    broker.wait_for(lambda: [t.state for t in broker.transactions] == ["in-doubt"])
    return txn_id


def test_an_in_doubt_transaction_is_listed_and_committed(broker: ThreadedBroker) -> None:
    txn_id = in_doubt(broker)
    (listed,) = call(broker, "GET", "/api/transactions").json
    assert (listed["id"], listed["state"], listed["posts"]) == (txn_id.hex(), "in-doubt", 1)
    assert call(broker, "GET", "/api/stats").json["transactions"]["in_doubt"] == 1
    assert broker.queue("staging").depth == 0
    answer = call(broker, "POST", f"/api/transactions/{txn_id.hex()}/commit")
    assert (answer.status, answer.json) == (200, {"id": txn_id.hex(), "state": "committed"})
    assert broker.queue("staging").depth == 1
    assert call(broker, "GET", "/api/transactions").json == []
    again = call(broker, "POST", f"/api/transactions/{txn_id.hex()}/commit")
    assert again.status == 404
    assert "is in doubt" in again.json["error"]


def test_an_in_doubt_transaction_is_rolled_back(broker: ThreadedBroker) -> None:
    txn_id = in_doubt(broker)
    answer = call(broker, "POST", f"/api/transactions/{txn_id.hex()}/rollback")
    assert (answer.status, answer.json["state"]) == (200, "rolled-back")
    assert broker.queue("staging").stats().staged == 0
    assert broker.queue("staging").depth == 0


@pytest.mark.parametrize(("txn", "status"), [("zz", 400), ("", 404), ("00ff", 404)])
def test_bad_or_unknown_ids(broker: ThreadedBroker, txn: str, status: int) -> None:
    assert call(broker, "POST", f"/api/transactions/{txn}/commit").status == status


def test_metrics_count_in_doubt_and_abandoned(broker: ThreadedBroker) -> None:
    in_doubt(broker)
    page = call(broker, "GET", "/metrics").body.decode()
    assert "minibroker_transactions_in_doubt_total 1" in page
    assert 'minibroker_transactions_total{outcome="abandoned"} 0' in page
    assert 'minibroker_transactions_open{namespace="default"} 1' in page


def test_python_handles_embedded_and_remote(broker: ThreadedBroker) -> None:
    first = in_doubt(broker)
    assert broker.resolve_transaction(first) == "committed"
    second = in_doubt(broker)
    assert broker.http_url is not None
    remote = minibroker.connect(broker.http_url)
    assert [(t.txn_id, t.state) for t in remote.transactions] == [(second, "in-doubt")]
    assert remote.resolve_transaction(second, commit=False) == "rolled-back"
    with pytest.raises(LookupError, match="is in doubt"):
        remote.resolve_transaction(second)
    assert broker.queue("staging").depth == 1
    assert remote.txn_stats.in_doubt == 2
