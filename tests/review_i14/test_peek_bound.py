"""A peek at a queue of large messages answers a bounded page, not every message's base64 at once (which the
broker would build in its own event loop, stalling AMQP for everyone)."""

from __future__ import annotations

from proton import Message
from proton.utils import BlockingConnection

from minibroker.http.api import MAX_PEEK_BYTES
from tests.http.client import call, http_broker


def test_a_peek_of_large_messages_is_bounded_in_bytes() -> None:
    with http_broker() as broker:
        conn = BlockingConnection(broker.url.removeprefix("amqp://"), timeout=10)
        try:
            sender = conn.create_sender("big")
            for _ in range(12):
                sender.send(Message(body=b"x" * (1024 * 1024)))
        finally:
            conn.close()
        answer = call(broker, "GET", "/api/queues/big/messages?limit=1000")
        assert answer.status == 200
        assert 1 <= len(answer.json) < 12
        assert len(answer.body) < 2 * MAX_PEEK_BYTES
        assert call(broker, "GET", "/api/queues/big").json["depth"] == 12
