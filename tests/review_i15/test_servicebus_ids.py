"""Review of issue 15: servicebus's 53-octet txn-ids (longer than the 32 the rest of the broker was written for)
where a broker over sockets shows or keeps transactions: the HTTP API's /api/transactions and /metrics, and a
durable commit journaled in a data dir and recovered."""

from __future__ import annotations

from pathlib import Path

from minibroker.amqp.definitions import (
    Accepted,
    AmqpValue,
    Coordinator,
    Declare,
    Discharge,
    Disposition,
    Flow,
    Header,
    Source,
    TransactionalState,
)
from minibroker.amqp.types import Symbol
from minibroker.testing import frames
from minibroker.testing.peer import ScriptedPeer
from tests.http.client import call, http_broker


def test_servicebus_ids_in_the_api_metrics_and_a_durable_commit(tmp_path: Path) -> None:
    """A servicebus broker with a data dir: a 53-octet id is listed by /api/transactions (hex), /metrics answers,
    a durable post committed under it is journaled and survives a restart, and no internal error is counted."""
    data_dir = str(tmp_path / "data")
    with http_broker(data_dir=data_dir, broker={"personality": "servicebus"}) as broker:
        host, port = broker.url.removeprefix("amqp://").rsplit(":", 1)
        with ScriptedPeer.connect(host, int(port)) as peer:
            peer.open()
            peer.begin()
            target = Coordinator(capabilities=[Symbol("amqp:local-transactions")])
            peer.attach_sender(None, 0, name="txn", source=Source(), target=target)
            peer.expect(Flow)
            peer.transfer(0, 0, frames.message(AmqpValue(Declare())))
            txn_id: bytes = peer.expect(Disposition).state.txn_id
            assert len(txn_id) == 53
            peer.attach_sender("jobs", 1, name="p")
            peer.expect(Flow)
            durable = frames.message("kept", Header(durable=True))
            peer.transfer(1, 1, durable, state=TransactionalState(txn_id=txn_id))
            assert isinstance(peer.expect(Disposition).state, Accepted)
            (listed,) = call(broker, "GET", "/api/transactions").json
            assert listed["id"] == txn_id.hex()
            assert call(broker, "GET", "/metrics").status == 200
            peer.transfer(0, 2, frames.message(AmqpValue(Discharge(txn_id=txn_id, fail=False))))
            assert isinstance(peer.expect(Disposition).state, Accepted)
        assert broker.call(lambda running: running.broker.internal_errors) == 0
    with http_broker(data_dir=data_dir, broker={"personality": "servicebus"}) as broker:
        kept = call(broker, "GET", "/api/queues/jobs/messages").json
        assert [m["body"] for m in kept] == ["kept"]
