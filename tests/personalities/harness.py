"""Running the same client steps under two personalities, to assert the difference on the wire.

``world(name)`` is a broker core with that personality (the broker's default) driven in memory by
``tests/broker/txn_driver.py``'s peers: no sockets, no trio, time moves only with ``World.advance``. A test
writes its steps once, as a function of a ``World``, runs it under ``minibroker`` and under the personality,
and compares what the peers saw (``World.settle()``)::

    def steps(w: World) -> Any: ...
    assert steps(world("minibroker")) == ...
    assert steps(world("artemis")) == ...
"""

from __future__ import annotations

from typing import Any

from minibroker.broker.core import Broker, BrokerSettings
from minibroker.broker.personality import get
from minibroker.broker.transactions import counter_ids
from tests.broker.txn_driver import Peer, World


def world(personality: str, **settings: Any) -> World:
    """A broker core whose default personality is ``personality`` (``settings``: other ``BrokerSettings``)."""
    return World(Broker(BrokerSettings(personality=get(personality), **settings), txn_ids=counter_ids(b"\x01" * 8)))


def peer(w: World, container_id: str = "client", hostname: str | None = None) -> Peer:
    """A connected peer (open and begin answered; ``hostname``: the open's, naming a namespace)."""
    p = w.connect(container_id, hostname=hostname)
    w.settle()
    return p
