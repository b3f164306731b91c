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

from minibroker.amqp.definitions import Declared, TransactionalState
from minibroker.broker.core import Broker, BrokerSettings
from minibroker.broker.personality import get
from minibroker.broker.transactions import counter_ids
from tests.broker.txn_driver import BrokerView, Peer, World, census, payload


def world(personality: str, **settings: Any) -> World:
    """A broker core whose default personality is ``personality`` (``settings``: other ``BrokerSettings``)."""
    return World(Broker(BrokerSettings(personality=get(personality), **settings), txn_ids=counter_ids(b"\x01" * 8)))


def peer(w: World, container_id: str = "client", hostname: str | None = None) -> Peer:
    """A connected peer (open and begin answered); ``hostname``: the namespace its open names."""
    p = w.connect(container_id, hostname=hostname)
    w.settle()
    return p


def declare(w: World, p: Peer, controller: str = "ctl") -> bytes:
    """Declare a transaction on ``controller`` (attached already); its txn-id, from the ``declared`` answer."""
    delivery_id = p.declare(controller)
    state, _ = w.settle()[p].answers[delivery_id]
    assert isinstance(state, Declared), state
    return bytes(state.txn_id)


def post(w: World, p: Peer, link: str, name: str, txn_id: bytes | None = None) -> tuple[Any, bool]:
    """Send message ``name`` on ``link`` (in transaction ``txn_id`` if given); the broker's (state, settled)."""
    state = TransactionalState(txn_id=txn_id) if txn_id is not None else None
    delivery_id = p.transfer(link, payload(name), state=state)
    return w.settle()[p].answers[delivery_id]


def discharge(w: World, p: Peer, txn_id: bytes, *, fail: bool = False, controller: str = "ctl") -> tuple[Any, bool]:
    """Discharge ``txn_id``; the broker's (state, settled) answer, or (None, False) if it did not answer."""
    delivery_id = p.discharge(controller, txn_id, fail=fail)
    return w.settle()[p].answers.get(delivery_id, (None, False))


def ready(w: World, queue: str = "q") -> list[str | None]:
    """The names of the messages ready on ``queue`` of the default namespace (through the inspection API)."""
    found = census(BrokerView(w)).get(queue)
    return [name for name, _ in found.ready] if found is not None else []
