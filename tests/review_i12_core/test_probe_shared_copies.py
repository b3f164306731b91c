"""Probes: copies of one publish on a topic's subscriptions share one content (issue 12, item 5). What one copy
undergoes (modified with annotations, delivery-failed, dead-lettered, expired while acquired) must not show on
the others."""

from __future__ import annotations

from typing import Any

from minibroker.amqp import codec
from minibroker.amqp.definitions import Accepted, Header, MessageAnnotations, Modified, Rejected, Released
from minibroker.amqp.types import Symbol, UInt
from minibroker.broker.core import Broker, BrokerSettings
from minibroker.handles import CoreView
from minibroker.testing import frames
from minibroker.testing.client import Frame
from tests.broker.txn_driver import World


def _annotations(data: bytes) -> dict[Any, Any]:
    for section in codec.decode_all(data):
        if isinstance(section, MessageAnnotations):
            return dict(section.value)
    return {}


def _capture(peer: Any) -> list[tuple[str, bytes]]:
    """Whole payloads of what ``peer`` receives, by link, in order."""
    got: list[tuple[str, bytes]] = []
    original = peer.on_frame

    def on_frame(frame: Frame, replies: list[Any]) -> None:
        if frame.delivery is not None and frame.delivery.complete:
            got.append((frame.delivery.link, frame.delivery.payload))
        original(frame, replies)

    peer.on_frame = on_frame
    return got


def test_modified_annotations_stay_on_one_subscriptions_copy() -> None:
    world = World(Broker(BrokerSettings()))
    peer = world.connect("app")
    got = _capture(peer)
    for link in ("a", "b", "c"):
        peer.attach_consumer(link, "topic://t", presettled=False, default_outcome=None)
        peer.flow(link, 10)
    peer.attach_producer("p", "topic://t")
    world.settle()
    peer.transfer("p", frames.message("<<m>>", Header(ttl=UInt(100_000)), MessageAnnotations({Symbol("x-orig"): 1})))
    seen = world.settle()[peer]
    ids = {s.link: s.delivery_id for s in seen.started}
    assert sorted(ids) == ["a", "b", "c"]
    # a: modified with annotations and delivery-failed; b: released; c: keeps it
    peer.dispose(ids["a"], Modified(delivery_failed=True, message_annotations={Symbol("x-a"): "mine"}), settled=True)
    peer.dispose(ids["b"], Released(), settled=True)
    seen = world.settle()[peer]
    again = {s.link: s.delivery_id for s in seen.started}
    assert sorted(again) == ["a", "b"]
    by_link: dict[str, list[bytes]] = {}
    for link, data in got:
        by_link.setdefault(link, []).append(data)
    assert _annotations(by_link["a"][-1]) == {Symbol("x-orig"): 1, Symbol("x-a"): "mine"}
    assert _annotations(by_link["b"][-1]) == {Symbol("x-orig"): 1}
    assert [c.delivery_count for c in seen.completed if c.link == "b"] == [0]
    assert [c.delivery_count for c in seen.completed if c.link == "a"] == [1]
    # a rejects its copy: dead-lettered with reasons; b's and c's copies untouched
    peer.dispose(again["a"], Rejected(), settled=True)
    peer.dispose(again["b"], Modified(message_annotations={Symbol("x-b"): 2}), settled=True)
    seen = world.settle()[peer]
    (b_again,) = [s for s in seen.started if s.link == "b"]
    assert _annotations(got[-1][1]) == {Symbol("x-orig"): 1, Symbol("x-b"): 2}
    peer.dispose(b_again.delivery_id, Accepted(), settled=True)
    peer.dispose(ids["c"], Accepted(), settled=True)
    world.settle()
    view = CoreView(world.broker)
    dlqs = [view.queue(name) for name in view.queues if name.endswith("DLQ")]
    assert len(dlqs) == 1, view.queues
    assert dlqs[0].depth == 1
    dead = dlqs[0].peek()[0].annotations
    assert dead[Symbol("x-a")] == "mine"
    assert Symbol("x-b") not in dead
    for sub in view.topic("t").subscriptions():
        assert (sub.depth, sub.acquired) == (0, 0)


def test_one_copy_expires_while_another_is_acquired_and_a_third_consumed() -> None:
    world = World(
        Broker(
            BrokerSettings(
                node_defaults=__import__("minibroker.broker.policy", fromlist=["NodePolicy"]).NodePolicy(
                    expiry_address="expired"
                )
            )
        )
    )
    peer = world.connect("app")
    for link in ("a", "b", "c"):
        peer.attach_consumer(link, "topic://t", presettled=False, default_outcome=None)
    peer.attach_producer("p", "topic://t")
    world.settle()
    peer.flow("a", 1)
    peer.flow("c", 1)
    world.settle()
    peer.transfer("p", frames.message("<<m>>", Header(ttl=UInt(1000))), settled=True)
    seen = world.settle()[peer]
    ids = {s.link: s.delivery_id for s in seen.started}
    assert sorted(ids) == ["a", "c"]
    peer.dispose(ids["c"], Accepted(), settled=True)
    world.settle()
    world.advance(2.0)  # b's copy (ready) expires; a's is acquired
    world.settle()
    subs = {s.name.split("#")[0]: s for s in CoreView(world.broker).topic("t").subscriptions()}
    assert subs["b"].depth == 0
    expired = CoreView(world.broker).queue("expired")
    assert expired.exists
    assert expired.depth == 1
    peer.dispose(ids["a"], Released(), settled=True)  # comes back expired: goes to the expiry address too
    world.settle()
    assert expired.depth == 2
    peer.flow("b", 5)
    peer.flow("a", 5)
    assert not world.settle()[peer].started
    for sub in CoreView(world.broker).topic("t").subscriptions():
        assert (sub.depth, sub.acquired, sub.held_bytes) == (0, 0, 0), sub
    assert world.broker.dispatcher.timers.next_deadline() is None
