"""Which sender attach makes a plain name an event hub (issue 17 item 10 loose ends): one with an Event Hubs
producer's marks (``servicebus/eventhubs.py`` ``names_a_producer``: the desired capability
``com.microsoft:georeplication`` of the .NET Event Hubs client, or ``com.microsoft:timeout`` as a long, as
azure-eventhub's pyamqp sends it), not one with the .NET Service Bus clients' uint ``com.microsoft:timeout``, and
never an existing queue or topic. Frame level, with the broker core in memory."""

from __future__ import annotations

from typing import Any

import pytest

from minibroker.amqp.definitions import Target
from minibroker.amqp.types import Long, Symbol, UInt
from minibroker.testing import frames
from tests.broker.txn_driver import Peer, World
from tests.personalities.harness import peer, world

pytestmark = pytest.mark.timeout(30)
TIMEOUT = {Symbol("com.microsoft:timeout"): UInt(60000)}  # the .NET clients' (milliseconds)
PYTHON_PRODUCER = {Symbol("com.microsoft:timeout"): Long(60)}  # azure-eventhub's (seconds, a long)
GEOREPLICATION = [Symbol("com.microsoft:georeplication")]


def _send_attach(w: World, p: Peer, link: str, address: str, **fields: Any) -> None:
    p.send(frames.attach_sender(address, p.new_handle(link), link, target=Target(address=address), **fields))
    w.settle()


def _hubs(w: World) -> set[str]:
    return set(w.broker.endpoints.event_hubs.of(w.broker.nodes.default.name))


def _queues(w: World) -> set[str]:
    return set(w.broker.nodes.default.queues)


def test_a_service_bus_sender_with_a_timeout_makes_a_queue() -> None:
    """A .NET Service Bus-style sender (``com.microsoft:timeout`` in its properties, no desired capability) to a
    fresh name: the name becomes a queue, not an event hub."""
    w = world("servicebus")
    p = peer(w)
    _send_attach(w, p, "s", "orders", properties=TIMEOUT)
    assert "orders" in _queues(w)
    assert "orders" not in _hubs(w)


def test_an_event_hubs_producer_makes_a_hub() -> None:
    """A sender asking for ``com.microsoft:georeplication`` (as the Event Hubs producers do) to a fresh name:
    an event hub; the same attach to an existing queue leaves the queue a queue."""
    w = world("servicebus")
    p = peer(w)
    _send_attach(w, p, "h", "telemetry", properties=TIMEOUT, desired_capabilities=GEOREPLICATION)
    assert "telemetry" in _hubs(w)
    assert "telemetry" not in _queues(w)
    _send_attach(w, p, "q", "orders")
    _send_attach(w, p, "h2", "orders", properties=TIMEOUT, desired_capabilities=GEOREPLICATION)
    assert "orders" in _queues(w)
    assert "orders" not in _hubs(w)


def test_a_python_event_hubs_producer_makes_a_hub() -> None:
    """azure-eventhub's producer attach (``com.microsoft:timeout`` as a long, no desired capability) to a fresh
    name: an event hub; to an existing topic: the topic stays."""
    w = world("servicebus")
    p = peer(w)
    _send_attach(w, p, "h", "metrics", properties=PYTHON_PRODUCER)
    assert "metrics" in _hubs(w)
    p.attach_consumer("c", "news/Subscriptions/all", presettled=False, default_outcome=None)
    w.settle()
    _send_attach(w, p, "h2", "news", properties=PYTHON_PRODUCER)
    assert "news" in w.broker.nodes.default.topics
    assert "news" not in _hubs(w)


def test_hubs_are_per_namespace_and_a_reset_drops_them() -> None:
    """A hub made in one namespace is not seen from another (a plain sender there to the same name makes a
    queue), and resetting its namespace drops it."""
    w = world("servicebus")
    one, two = w.broker.nodes.namespace("ns-one"), w.broker.nodes.namespace("ns-two")
    first, second = peer(w, "a", hostname="ns-one"), peer(w, "b", hostname="ns-two")
    _send_attach(w, first, "h", "telemetry", properties=PYTHON_PRODUCER)
    _send_attach(w, second, "s", "telemetry")
    assert "telemetry" in two.queues
    assert "telemetry" not in one.queues
    w.broker.reset(one)
    w.settle()
    again = peer(w, "c", hostname="ns-one")
    _send_attach(w, again, "s", "telemetry")
    assert "telemetry" in one.queues  # the hub went with the reset: a plain sender makes a queue
