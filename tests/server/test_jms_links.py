"""What Qpid JMS asks of a broker, frame by frame: the capabilities of the open, and the links it makes.

Qpid JMS (``AmqpConnectionProperties``) refuses ``createSharedConsumer`` unless the broker's open offers
``SHARED-SUBS``, and a producer with a delivery delay unless it offers ``DELAYED_DELIVERY``. These tests send
exactly what Qpid JMS sends (``AmqpConsumerBuilder``, ``AmqpSubscriptionTracker``, ``AmqpConnectionSession``,
``AmqpJmsMessageFacade``) and check that the broker does what the capabilities promise: shared subscriptions whose
links are named ``sub``, ``sub|2`` (a client id) or ``sub|global``, ``sub|global2`` (none), shared non-durable ones
named ``sub|volatile1`` / ``sub|global-volatile1``, unsubscribing by a null-source attach, and delivery times in
the ``x-opt-delivery-time`` annotation (a long, milliseconds since the epoch).
"""

from __future__ import annotations

import time

import pytest

from minibroker.amqp.definitions import (
    Accepted,
    Detach,
    Disposition,
    Flow,
    Header,
    MessageAnnotations,
    Modified,
    Source,
    Target,
    Transfer,
)
from minibroker.amqp.types import Long, Symbol, UInt
from minibroker.broker.views import view_message
from minibroker.testing import frames
from minibroker.testing.peer import ScriptedPeer
from minibroker.testing.thread import ThreadedBroker

HOST = "127.0.0.1"
OUTCOMES = [Symbol(f"amqp:{o}:list") for o in ("accepted", "rejected", "released", "modified")]
UNSETTLED_STATE, NONE = UInt(2), UInt(0)  # terminus-durability
TOPIC = Symbol("topic")


def jms_peer(broker: ThreadedBroker, container_id: str) -> ScriptedPeer:
    peer = ScriptedPeer.connect(HOST, broker.port)
    peer.open(container_id=container_id)
    peer.begin()
    return peer


def subscriber_source(topic: str, *, durable: bool, global_: bool) -> Source:
    """The source ``AmqpConsumerBuilder.configureSource`` makes for a shared subscriber."""
    capabilities = [TOPIC, Symbol("shared")] + ([Symbol("global")] if global_ else [])
    return Source(
        address=topic,
        durable=UNSETTLED_STATE if durable else NONE,
        expiry_policy=Symbol("never" if durable else "link-detach"),
        distribution_mode=Symbol("copy") if durable else None,
        capabilities=capabilities,
        outcomes=OUTCOMES,
        default_outcome=Modified(delivery_failed=True),
    )


def subscribe(peer: ScriptedPeer, handle: int, link_name: str, source: Source, credit: int = 10) -> None:
    reply = peer.attach_receiver(source.address, handle, link_name, source=source, target=Target())
    assert reply.source is not None, f"{link_name}: refused"
    peer.flow(handle=handle, link_credit=credit)


def publish(broker: ThreadedBroker, topic: str, bodies: list[str]) -> None:
    """Send ``bodies`` to ``topic`` on a connection of their own."""
    with jms_peer(broker, "publisher") as peer:
        peer.attach_sender(topic, 0, "producer", target=Target(address=topic, capabilities=[TOPIC]))
        peer.expect(Flow)
        for n, body in enumerate(bodies):
            peer.transfer(0, n, frames.message(body))
            assert isinstance(peer.expect(Disposition).state, Accepted)
        peer.close()


def take(peers: list[ScriptedPeer], count: int) -> dict[tuple[int, int], list[str]]:
    """Read ``count`` transfers from ``peers`` (accepting each); their bodies by (peer index, handle)."""
    got: dict[tuple[int, int], list[str]] = {}
    taken = 0
    deadline = time.monotonic() + 5.0
    while taken < count:
        assert time.monotonic() < deadline, f"only {taken} of {count} messages arrived: {got}"
        for index, peer in enumerate(peers):
            peer.timeout = 0.05
            try:
                item = peer.receive()
            except AssertionError:
                continue
            finally:
                peer.timeout = 5.0
            if not isinstance(item.performative, Transfer):
                continue
            body = view_message(item.payload).body
            got.setdefault((index, int(item.performative.handle)), []).append(body)
            peer.disposition(item.performative.delivery_id, state=Accepted())
            taken += 1
    return got


def test_open_offers_what_qpid_jms_checks(broker: ThreadedBroker) -> None:
    with ScriptedPeer.connect(HOST, broker.port) as peer:
        offered = set(peer.open().offered_capabilities or [])
        assert {"ANONYMOUS-RELAY", "SHARED-SUBS", "DELAYED_DELIVERY"} <= offered
        # Qpid JMS also desires sole-connection-for-container: one connection per client id, which the broker does
        # not enforce, so it is not offered
        assert "sole-connection-for-container" not in offered
        peer.close()


@pytest.mark.parametrize("client_id", [True, False], ids=["client-id", "no-client-id"])
def test_shared_durable_subscription_named_as_qpid_jms_names_its_links(broker: ThreadedBroker, client_id: bool) -> None:
    # AmqpSubscriptionTracker: "sub", "sub|2" with a client id; "sub|global", "sub|global2" without (and then the
    # links may come from connections of different container ids)
    names = ["orders", "orders|2"] if client_id else ["orders|global", "orders|global2"]
    containers = ["client-1", "client-1"] if client_id else ["jms-a", "jms-b"]
    source = subscriber_source("prices", durable=True, global_=not client_id)
    first, second = (jms_peer(broker, c) for c in containers)
    with first, second:
        subscribe(first, 0, names[0], source)
        subscribe(second, 0, names[1], source)
        publish(broker, "prices", [f"m{n}" for n in range(6)])
        got = take([first, second], 6)
        assert sorted(b for bodies in got.values() for b in bodies) == [f"m{n}" for n in range(6)]
        assert len(got) == 2, f"one subscription split between both links: {got}"
        # JMS closes a durable subscriber with closed=false: the subscription keeps collecting
        for peer in (first, second):
            peer.send(Detach(handle=UInt(0), closed=False))
            peer.expect(Detach)
        publish(broker, "prices", ["while-away"])
        subscribe(second, 1, names[0], source)
        assert list(take([second], 1).values()) == [["while-away"]]
        second.send(Detach(handle=UInt(1), closed=False))
        second.expect(Detach)
        # unsubscribe (AmqpConnectionSession.unsubscribe): the first link name, a null source, and without a client
        # id the desired capabilities shared and global; then a detach with closed=true deletes it
        desired = None if client_id else [Symbol("shared"), Symbol("global")]
        reply = first.attach_receiver(None, 2, names[0], source=None, target=Target(), desired_capabilities=desired)
        assert reply.source is not None, "the subscription to remove was not found"
        first.send(Detach(handle=UInt(2), closed=True))
        first.expect(Detach)
        reply = first.attach_receiver(None, 3, names[0], source=None, target=Target(), desired_capabilities=desired)
        assert reply.source is None  # gone: a second unsubscribe finds nothing
        first.expect(Detach)
        first.close()
        second.close()


def test_shared_volatile_and_durable_subscriptions_of_one_name_are_separate(broker: ThreadedBroker) -> None:
    # JMS 2.0: durable subscriptions and shared non-durable ones may have the same name; they are unrelated
    with jms_peer(broker, "client-2") as peer:
        subscribe(peer, 0, "audit", subscriber_source("events", durable=True, global_=False))
        subscribe(peer, 1, "audit|volatile1", subscriber_source("events", durable=False, global_=False))
        subscribe(peer, 2, "audit|volatile2", subscriber_source("events", durable=False, global_=False))
        publish(broker, "events", ["e0", "e1", "e2", "e3"])
        got = take([peer], 8)
        assert got[(0, 0)] == ["e0", "e1", "e2", "e3"]  # the durable one has every message
        volatile = got.get((0, 1), []) + got.get((0, 2), [])
        assert sorted(volatile) == ["e0", "e1", "e2", "e3"]  # the shared non-durable one too, split
        assert got.get((0, 1))
        assert got.get((0, 2))
        peer.close()


def test_delivery_time_annotation_as_qpid_jms_sends_it(broker: ThreadedBroker) -> None:
    # AmqpJmsMessageFacade.setDeliveryTime: x-opt-delivery-time, a long of epoch milliseconds
    now_ms = int(time.time() * 1000)
    with jms_peer(broker, "client-3") as peer:
        peer.attach_sender("delayed", 0)
        peer.expect(Flow)
        for n, at in enumerate([now_ms + 3_600_000, now_ms - 1000]):
            annotations = MessageAnnotations({Symbol("x-opt-delivery-time"): Long(at)})
            peer.transfer(0, n, frames.message(f"at {at}", Header(durable=False), annotations))
            assert isinstance(peer.expect(Disposition).state, Accepted)
        peer.close()
    (ready,) = broker.queue("delayed").peek()  # the one due in an hour waits
    assert ready.body == f"at {now_ms - 1000}"
