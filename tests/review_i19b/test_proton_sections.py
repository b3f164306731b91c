"""Probe of issue 19's arrival reading with python-qpid-proton's own encodings (an empty header list0 or a full one,
then its properties: list0 when empty, a list with absolute-expiry-time when given) against the real threaded
broker: Part 3 §3.2.1 (priority, ttl) and §3.2.4 (absolute-expiry-time): what has expired is not delivered, the
rest comes in priority then arrival order, each body intact."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from proton import Message, Timeout
from proton.utils import BlockingConnection

from minibroker.testing.thread import ThreadedBroker, run_in_thread

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def threaded() -> Iterator[ThreadedBroker]:
    with run_in_thread({"server": {"port": 0}}) as broker:
        yield broker


def test_proton_expiry_priority_and_plain_messages(threaded: ThreadedBroker) -> None:
    now = time.time()
    sent = [
        Message(body="plain"),
        Message(body="expired", expiry_time=now - 3600),
        Message(body="later", expiry_time=now + 3600),
        Message(body="urgent", priority=9),
        Message(body="ttl-gone", ttl=0.001),
        Message(body="ttl-kept", ttl=3600),
        Message(body="subject-only", subject="s"),  # properties stopping before absolute-expiry-time
    ]
    conn = BlockingConnection(threaded.url, timeout=10)
    try:
        sender = conn.create_sender("pq")
        for message in sent:
            sender.send(message)
        time.sleep(0.05)  # (real time: past the 1 ms ttl; nothing to wait on, the broker drops it when due)
        receiver = conn.create_receiver("pq", credit=10)
        got = []
        while True:
            try:
                message = receiver.receive(timeout=1)
            except Timeout:
                break
            got.append(message.body)
            receiver.accept()
    finally:
        conn.close()
    assert got == ["urgent", "plain", "later", "ttl-kept", "subject-only"]
