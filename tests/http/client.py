"""A blocking HTTP client for the tests: the stdlib's ``http.client`` against a broker's management API."""

from __future__ import annotations

import base64
import http.client
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from minibroker.amqp.definitions import AmqpValue, Coordinator, Declare, Disposition, Flow, Source, TransactionalState
from minibroker.amqp.types import Symbol
from minibroker.testing import frames
from minibroker.testing.peer import ScriptedPeer
from minibroker.testing.thread import ThreadedBroker, run_in_thread

CONFIG: dict[str, Any] = {"server": {"port": 0}, "http": {"port": 0}}


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


@contextmanager
def http_broker(**sections: Any) -> Iterator[ThreadedBroker]:
    """A broker in a thread with its HTTP listener on a free port (``sections`` added to the config)."""
    config = {**CONFIG, **sections}
    config["http"] = {**CONFIG["http"], **sections.get("http", {})}
    with run_in_thread(config) as broker:
        yield broker


def connect(broker: ThreadedBroker, timeout: float = 10.0) -> http.client.HTTPConnection:
    assert broker.http_url is not None
    parts = urlsplit(broker.http_url)
    assert parts.hostname is not None
    assert parts.port is not None
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)


def call(
    broker: ThreadedBroker | http.client.HTTPConnection,
    method: str,
    path: str,
    body: Any = None,
    *,
    raw: bytes | None = None,
    auth: tuple[str, str] | None = None,
) -> Answer:
    """One request (a JSON ``body``, or ``raw`` bytes), on a new connection unless one is given."""
    conn = broker if isinstance(broker, http.client.HTTPConnection) else connect(broker)
    headers = {}
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    if data is not None:
        headers["content-type"] = "application/json"
    if auth is not None:
        headers["authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    try:
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        return Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        if conn is not broker:
            conn.close()


def wait_until_polled(broker: ThreadedBroker, count: int = 1, timeout: float = 10.0) -> None:
    """Return once ``count`` long-polls (``GET /api/wait``) wait in the broker; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while broker.call(lambda running: running.waiting) < count:
        assert time.monotonic() < deadline, f"fewer than {count} long-polls began within {timeout} s"
        time.sleep(0.01)


def open_transaction(peer: ScriptedPeer, container_id: str = "test-peer") -> bytes:
    """Open (as ``container_id``), begin, declare a transaction and stage one post to ``staging`` under it; its id."""
    peer.open(container_id=container_id)
    peer.begin()
    peer.attach_sender(
        None, 0, name="txn", source=Source(), target=Coordinator(capabilities=[Symbol("amqp:local-transactions")])
    )
    peer.expect(Flow)
    peer.transfer(0, 0, frames.message(AmqpValue(Declare())))
    txn_id: bytes = peer.expect(Disposition).state.txn_id
    peer.attach_sender("staging", 1, name="p")
    peer.expect(Flow)
    peer.transfer(1, 1, frames.message("staged"), state=TransactionalState(txn_id=txn_id))
    peer.expect(Disposition)
    return txn_id
