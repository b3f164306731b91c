"""What ``@azure/service-bus`` (the JavaScript SDK, 7.9) puts on the wire, frame by frame against the
``servicebus`` personality (the in-memory driver): the shapes in which it differs from the Python SDK."""

from __future__ import annotations

import pytest

from minibroker.amqp.definitions import Modified
from tests.personalities.harness import peer, ready, receive, seed, world

pytestmark = pytest.mark.timeout(30)

JS_ABANDON = Modified(undeliverable_here=False)
"""``abandonMessage`` as the JS SDK settles it (``dist/index.js`` ``settleMessage``: ``delivery.modified({
undeliverable_here: false})``): no delivery-failed, unlike the Python SDK's ``delivery_failed=True``."""


def test_js_abandon_counts_a_delivery() -> None:
    """servicebus: an abandon without delivery-failed redelivers the message with delivery-count + 1 (Service Bus
    counts every lock given back); minibroker keeps §3.4.5's reading: no delivery-failed, no count."""
    for name, expected in (("servicebus", 1), ("minibroker", 0)):
        w = world(name)
        p = peer(w)
        seed(w, p, "q", "m")
        (first,) = receive(w, p, "c", "q")
        p.dispose(first.delivery_id, JS_ABANDON, settled=True)
        p.flow("c", 1)
        (again,) = w.settle()[p].completed
        assert again.name == "m"
        assert again.delivery_count == expected, name


def test_js_abandons_reach_max_delivery_count() -> None:
    """servicebus: ten abandons as the JS SDK sends them dead-letter the message (MaxDeliveryCount 10)."""
    w = world("servicebus")
    p = peer(w)
    seed(w, p, "q", "m")
    p.attach_consumer("c", "q", presettled=False, default_outcome=None)
    counts = []
    for _ in range(10):
        p.flow("c", 1)
        (delivery,) = w.settle()[p].completed
        counts.append(delivery.delivery_count)
        p.dispose(delivery.delivery_id, JS_ABANDON, settled=True)
    w.settle()
    assert counts == list(range(10))
    assert ready(w, "q") == []
    assert ready(w, "q/$DeadLetterQueue") == ["m"]
