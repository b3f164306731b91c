"""Probe: an expired message met during a selector consumer's scan is forwarded before the chosen one is taken.

``Dispatcher._first_for`` expires the messages it met (``_expire`` -> ``_forward`` -> ``post`` ->
``dispatch_all``) *before* it returns the message it chose, which the caller then acquires and sends. When the
expiry address is the queue itself, the nested dispatch runs while the outer one still holds its choice: the
consumer's credit is spent on the forwarded copy, then the outer dispatch sends without credit (or acquires a
message the nested round already took: ``ValueError`` from the ready list). The code before issue 12 expired
after sending.
"""

from __future__ import annotations

from typing import Any

from minibroker.amqp.definitions import Header
from minibroker.amqp.types import Described, Symbol, UInt
from minibroker.broker.core import Broker, BrokerSettings
from minibroker.broker.policy import NodePolicy
from minibroker.broker.selector import SELECTOR_DESCRIPTORS
from minibroker.handles import CoreView
from minibroker.testing import frames
from tests.broker.txn_driver import World

SELECTOR = next(d for d in SELECTOR_DESCRIPTORS if isinstance(d, str))


def _selector(text: str) -> dict[Any, Any]:
    return {Symbol("selector"): Described(SELECTOR, text)}


def test_expiry_into_the_same_queue_during_a_selector_scan() -> None:
    world = World(Broker(BrokerSettings(queues={"q": NodePolicy(expiry_address="q")})))
    peer = world.connect("app")
    peer.attach_producer("p", "q")
    peer.attach_consumer("c", "q", presettled=False, default_outcome=None, source_filter=_selector("TRUE"))
    world.settle()
    peer.transfer("p", frames.message("<<m1>>", Header(ttl=UInt(1000))), settled=True)
    peer.transfer("p", frames.message("<<m2>>"), settled=True)
    world.settle()
    world.now = 5.0  # m1's ttl has passed; its timer has not run yet (a busy loop, a batch of frames)
    peer.flow("c", 1)
    seen = world.settle()[peer]
    assert not seen.closed, "the connection was closed"
    assert not seen.violations, seen.violations
    assert len(seen.completed) == 1, f"one credit, {[c.name for c in seen.completed]} delivered"


def test_the_message_chosen_during_the_reentrant_expiry_is_not_lost() -> None:
    """Whatever the broker does with the connection, m2 (never delivered whole to anyone) must stay available."""
    world = World(Broker(BrokerSettings(queues={"q": NodePolicy(expiry_address="q")})))
    peer = world.connect("app")
    peer.attach_producer("p", "q")
    peer.attach_consumer("c", "q", presettled=False, default_outcome=None, source_filter=_selector("TRUE"))
    world.settle()
    peer.transfer("p", frames.message("<<m1>>", Header(ttl=UInt(1000))), settled=True)
    peer.transfer("p", frames.message("<<m2>>"), settled=True)
    world.settle()
    world.now = 5.0
    peer.flow("c", 1)
    world.settle()
    if peer.alive:
        peer.close()
        world.settle()
    other = world.connect("other")
    other.attach_consumer("c", "q", presettled=True, default_outcome=None)
    other.flow("c", 10)
    names = [c.name for c in world.settle()[other].completed]
    queue = CoreView(world.broker).queue("q").stats()
    assert sorted(names) == ["m1", "m2"], f"received {names}; queue {queue!r}"
