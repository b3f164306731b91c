"""What ``@azure/service-bus`` (the JavaScript SDK, 7.9) puts on the wire, frame by frame against the
``servicebus`` personality (the in-memory driver): the shapes in which it differs from the Python SDK."""

from __future__ import annotations

from typing import Any

import pytest

from minibroker.amqp import codec
from minibroker.amqp.definitions import AmqpValue, ApplicationProperties, Modified, Properties, Target
from minibroker.amqp.types import Int
from minibroker.testing import frames
from tests.broker.txn_driver import Peer, World
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


def _js_request(node_reply_to: str, operation: str, body: dict[str, Any]) -> bytes:
    """A ``$management`` request as the JS SDK sends it (``ManagementClient._makeManagementRequest``: a string
    message-id from ``generate_uuid``, reply-to the answer link's generated target address)."""
    return (
        codec.encode(Properties(message_id="c2d4f6a8-0000-4000-8000-000000000001", reply_to=node_reply_to))
        + codec.encode(ApplicationProperties({"operation": operation}))
        + codec.encode(AmqpValue(body))
    )


def _peek(w: World, p: Peer, entity: str) -> None:
    """Attach ``entity``'s ``$management`` pair as the JS SDK does and peek once; the answer must be 204."""
    node = f"amqps://127.0.0.1:5671/{entity}/$management"
    p.attach_producer(f"{entity}-req", node)
    p.send(
        frames.attach_receiver(node, p.new_handle(f"{entity}-resp"), f"{entity}-resp", target=Target(address=entity))
    )
    w.settle()
    p.flow(f"{entity}-resp", 1)
    p.transfer(f"{entity}-req", _js_request(entity, "com.microsoft:peek-message", {"message-count": Int(1)}))
    (answer,) = [c for c in w.settle()[p].completed if c.link == f"{entity}-resp"]
    _properties, pos = codec.decode(answer.payload)
    application, _ = codec.decode(answer.payload, pos)
    assert isinstance(application, ApplicationProperties)
    assert application.value["status-code"] == 204


def test_peek_on_subscriptions_makes_a_topic() -> None:
    """Peeking ``t/Subscriptions/s`` before anything exists (the JS SDK attaches its receiver link only on the
    first receive) makes ``t`` a topic with subscription ``s``, as a receiver's attach would; it used to make
    ``t`` a queue, so two subscriptions then competed for one queue's messages instead of each getting a copy."""
    w = world("servicebus")
    p = peer(w)
    _peek(w, p, "t/Subscriptions/one")
    _peek(w, p, "t/Subscriptions/two")
    seed(w, p, "t", "m")
    for name in ("one", "two"):
        p.attach_consumer(
            name, f"amqps://127.0.0.1:5671/t/Subscriptions/{name}", presettled=False, default_outcome=None
        )
        p.flow(name, 2)
        assert [c.name for c in w.settle()[p].completed] == ["m"], name


@pytest.mark.parametrize(
    "entity",
    [
        "t/Subscriptions/s/$DeadLetterQueue",  # a sub-queue before its topic exists
        "t/Subscriptions/s\x00",
        "t/Subscriptions/" + "s" * 10_000,
        "t/Subscriptions/s/$DeadLetterQueue/more",
    ],
)
def test_peek_odd_subscription_paths_is_204(entity: str) -> None:
    """Odd subscription paths on ``$management`` are answered (204: nothing there), the connection stays up."""
    w = world("servicebus")
    p = peer(w)
    _peek(w, p, entity)
    assert not p.observed.violations
    assert not p.observed.closed


def test_cbs_put_token_as_js_sends_it() -> None:
    """``$cbs`` put-token as ``@azure/core-amqp`` ``CbsClient.negotiateClaim`` sends it: a string message-id,
    ``reply-to`` the answer link's ``cbs-<uuid>`` target, ``to`` set, no ``expiration``; answered 202 with the
    correlation-id that string (``requestResponseLink.js`` reads ``status-code``)."""
    w = world("servicebus")
    p = peer(w)
    reply_to = "cbs-4f1e0e4c-0000-4000-8000-000000000002"
    p.attach_producer("cbs-req", "$cbs")
    p.send(frames.attach_receiver("$cbs", p.new_handle("cbs-resp"), "cbs-resp", target=Target(address=reply_to)))
    w.settle()
    p.flow("cbs-resp", 1)
    message_id = "9d3c7b1a-0000-4000-8000-000000000003"
    request = (
        codec.encode(Properties(message_id=message_id, reply_to=reply_to, to="sb://127.0.0.1/"))
        + codec.encode(
            ApplicationProperties(
                {"operation": "put-token", "name": "sb://127.0.0.1/orders", "type": "servicebus.windows.net:sastoken"}
            )
        )
        + codec.encode(AmqpValue("SharedAccessSignature sr=x&sig=y&se=1&skn=RootManageSharedAccessKey"))
    )
    p.transfer("cbs-req", request)
    (answer,) = [c for c in w.settle()[p].completed if c.link == "cbs-resp"]
    properties, pos = codec.decode(answer.payload)
    application, _ = codec.decode(answer.payload, pos)
    assert isinstance(properties, Properties)
    assert isinstance(application, ApplicationProperties)
    assert properties.correlation_id == message_id
    assert application.value["status-code"] == 202
