"""A transaction whose staged work lost its node to the management API (DELETE of the queue, a reset) must not
commit successfully (Part 4 §4.4.1: the coordinator fails the discharge when the work cannot be done)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from minibroker.amqp.definitions import (
    Accepted,
    AmqpValue,
    Close,
    Detach,
    Discharge,
    Disposition,
)
from minibroker.testing import frames
from minibroker.testing.peer import ScriptedPeer
from minibroker.testing.thread import ThreadedBroker
from tests.http.client import call, http_broker, open_transaction


@pytest.fixture
def broker() -> Iterator[ThreadedBroker]:
    with http_broker() as running:
        yield running


@pytest.mark.parametrize("change", ["delete", "reset"])
def test_commit_after_the_staging_queue_was_removed_is_not_a_success(broker: ThreadedBroker, change: str) -> None:
    host, port = broker.url.removeprefix("amqp://").rsplit(":", 1)
    with ScriptedPeer.connect(host, int(port)) as peer:
        txn_id = open_transaction(peer)
        if change == "delete":
            assert call(broker, "DELETE", "/api/queues/staging").status == 200
        else:
            assert call(broker, "POST", "/api/reset").status == 200
        if change == "reset":  # a reset closes the namespace's connections: their transactions roll back
            peer.expect(Close)
            assert call(broker, "GET", "/api/queues/staging").status == 404
            return
        peer.transfer(0, 2, frames.message(AmqpValue(Discharge(txn_id=txn_id, fail=False))))
        answer = None
        for _ in range(5):
            performative = peer.receive().performative
            if isinstance(performative, Disposition) and performative.first == 2:
                answer = performative
                break
            if isinstance(performative, Detach) and performative.handle == 0:
                break  # the coordinator link itself detached: not a success either
        assert not (answer is not None and isinstance(answer.state, Accepted)), "the commit was accepted"
    # whatever the broker decided, the message must not have come to life in a queue the operator removed
    queue = call(broker, "GET", "/api/queues/staging")
    assert queue.status == 404 or queue.json["depth"] == 0


def _counters(broker: ThreadedBroker) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = call(broker, "GET", "/metrics").body.decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        if family.type == "counter"
        for sample in family.samples
    }


def test_broker_wide_counters_never_decrease_across_a_reset(broker: ThreadedBroker) -> None:
    host, port = broker.url.removeprefix("amqp://").rsplit(":", 1)
    with ScriptedPeer.connect(host, int(port)) as peer:
        open_transaction(peer)
        before = _counters(broker)
        assert call(broker, "POST", "/api/reset").status == 200
        peer.expect(Close)
    broker.wait_for(lambda: not broker.transactions)
    after = _counters(broker)
    for key, value in before.items():
        if not any(label == "namespace" for label, _ in key[1]):  # broker-wide: one series for the process
            assert after[key] >= value, key
