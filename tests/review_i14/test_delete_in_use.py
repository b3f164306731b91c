"""DELETE of a queue whose messages a consumer holds unsettled: the consumer's later settlement is harmless and
the broker goes on serving (AMQP and HTTP)."""

from __future__ import annotations

import contextlib

from proton import ConnectionException, Message
from proton.utils import BlockingConnection, LinkDetached

from tests.http.client import call, connect, http_broker


def test_delete_a_queue_with_acquired_messages() -> None:
    with http_broker() as broker:
        address = broker.url.removeprefix("amqp://")
        conn = BlockingConnection(address, timeout=5)
        try:
            conn.create_sender("held").send(Message(body="m"))
            receiver = conn.create_receiver("held")
            assert receiver.receive(timeout=5).body == "m"
            assert call(broker, "GET", "/api/queues/held").json["acquired"] == 1
            assert call(broker, "DELETE", "/api/queues/held").status == 200
            with contextlib.suppress(LinkDetached, ConnectionException):
                receiver.accept()
        finally:
            with contextlib.suppress(ConnectionException):
                conn.close()
        assert call(broker, "GET", "/api/queues/held").status == 404
        assert call(broker, "GET", "/api/stats").status == 200
        again = BlockingConnection(address, timeout=5)
        try:
            again.create_sender("held").send(Message(body="n"))
            assert again.create_receiver("held").receive(timeout=5).body == "n"
        finally:
            again.close()


def test_a_huge_content_length_is_refused() -> None:
    with http_broker() as broker:
        conn = connect(broker)
        try:
            conn.putrequest("POST", "/api/queues/q/messages")
            conn.putheader("Content-Length", "9" * 40)
            conn.endheaders()
            response = conn.getresponse()
            assert response.status in (400, 413)  # h11 reads at most 20 digits: "bad Content-Length"
        finally:
            conn.close()
