"""A durable message posted through the management API is journaled like an AMQP post: it survives a restart;
a non-durable one does not."""

from __future__ import annotations

from pathlib import Path

from tests.http.client import call, http_broker


def test_a_durable_post_survives_a_restart(tmp_path: Path) -> None:
    data_dir = str(tmp_path / "data")
    with http_broker(data_dir=data_dir) as broker:
        durable = {"body": "kept", "header": {"durable": True}}
        assert call(broker, "POST", "/api/queues/jobs/messages", durable).status == 201
        assert call(broker, "POST", "/api/queues/jobs/messages", {"body": "lost"}).status == 201
        assert broker.queue("jobs").depth == 2
    with http_broker(data_dir=data_dir) as broker:
        kept = call(broker, "GET", "/api/queues/jobs/messages").json
        assert [m["body"] for m in kept] == ["kept"]
        assert kept[0]["header"]["durable"] is True
