"""A queue's acquiring consumers take turns (round-robin); one that leaves does not cost the next in line its turn."""

from __future__ import annotations

from minibroker.broker.core import Broker
from minibroker.broker.policy import NodePolicy
from minibroker.broker.settings import BrokerSettings
from tests.broker.txn_driver import World, payload


def _takers(leaving: str, sends: int = 4) -> list[str]:
    """Consumers a, b, c, d with credit; two messages go to a and b; ``leaving`` detaches; who takes the next
    ``sends``."""
    world = World(Broker(BrokerSettings(queues={"q": NodePolicy()})))
    peer = world.connect("app")
    peer.attach_producer("p", "q")
    for name in "abcd":
        peer.attach_consumer(name, "q", presettled=True, default_outcome=None)
        peer.flow(name, 10)
    world.settle()
    for n in range(2):
        peer.transfer("p", payload(f"m{n}"), settled=True)
    assert [c.link for c in world.settle()[peer].completed] == ["a", "b"]
    peer.detach(leaving)
    world.settle()
    for n in range(sends):
        peer.transfer("p", payload(f"after{n}"), settled=True)
    return [c.link for c in world.settle()[peer].completed]


def test_a_consumer_that_had_its_turn_leaving_does_not_skip_the_next() -> None:
    assert _takers("a") == ["c", "d", "b", "c"]


def test_the_consumer_whose_turn_it_is_leaving_passes_the_turn_on() -> None:
    assert _takers("c") == ["d", "a", "b", "d"]


def test_a_consumer_after_the_turn_leaving_changes_nothing_before_it() -> None:
    assert _takers("d") == ["c", "a", "b", "c"]
