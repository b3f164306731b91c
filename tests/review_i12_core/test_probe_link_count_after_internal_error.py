"""Probe: ``max_links`` counting after an internal error (issue 12 items 1 and 15 together).

``Broker.fail`` replays the detach of every *consumer* whose ``LinkDetached`` was lost with the rest of the
failed batch, but not of producers or controllers: their links stay counted in ``Endpoints.links`` for ever (and
a producer stays in ``_producers``, so an auto-created node it was attached to is never idle). A few internal
errors and the broker refuses every attach with ``amqp:resource-limit-exceeded``.

Here a dynamic node is deleted while its connection has a consumer and two producers on it; the handler of
the consumer's detach fails once (a stand-in for any bug) after it has counted the link out, and the producers'
detaches, queued behind it, are lost. The replay then counts the consumer out a second time (one link too few)
while the two producers stay counted (two too many): with one producer the errors cancel out.
"""

from __future__ import annotations

from unittest import mock

from minibroker.broker.core import Broker, BrokerSettings
from minibroker.broker.endpoints import Endpoints
from tests.broker.txn_driver import World


def test_links_of_a_connection_closed_by_an_internal_error_are_not_counted() -> None:
    world = World(Broker(BrokerSettings()))
    owner = world.connect("owner")
    owner.attach_producer("dyn", None, dynamic=True)
    world.settle()
    address = owner.addresses["dyn"]
    # (on the owner's connection: only the connection that created a dynamic node may receive from it)
    owner.attach_consumer("c", address, presettled=False, default_outcome=None)
    owner.attach_producer("p1", address)
    owner.attach_producer("p2", address)
    world.settle()
    assert world.broker.endpoints.links == 4
    original = Endpoints._consumer_detached
    calls = 0

    def failing_once(self: Endpoints, consumer: object, *, closed: bool) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug")
        original(self, consumer, closed=closed)  # type: ignore[arg-type]

    with mock.patch.object(Endpoints, "_consumer_detached", failing_once):
        owner.detach("dyn")  # the dynamic node goes: the consumer and the producers on it are detached
        world.settle()
    assert world.broker.internal_errors == 1
    if owner.alive:
        owner.close()
        world.settle()
    assert world.broker.endpoints.links == 0, f"{world.broker.endpoints.links} links still counted, none attached"
