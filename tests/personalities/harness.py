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

from dataclasses import dataclass
from typing import Any

from minibroker.amqp.definitions import Accepted, Declared, Error, Rejected, Released, TransactionalState
from minibroker.broker.core import Broker, BrokerSettings
from minibroker.broker.personality import get
from minibroker.broker.policy import NodePolicy
from minibroker.broker.transactions import counter_ids
from tests.broker.txn_driver import (
    TXN_ID,
    BrokerView,
    Observed,
    Peer,
    QueueCensus,
    Started,
    World,
    census,
    payload,
)


def world(personality: str, **settings: Any) -> World:
    """A broker core whose default personality is ``personality`` (``settings``: other ``BrokerSettings``)."""
    return World(Broker(BrokerSettings(personality=get(personality), **settings), txn_ids=counter_ids(b"\x01" * 8)))


def peer(w: World, container_id: str = "client", hostname: str | None = None) -> Peer:
    """A connected peer (open and begin answered); ``hostname``: the namespace its open names."""
    p = w.connect(container_id, hostname=hostname)
    w.settle()
    return p


def declare(w: World, p: Peer, controller: str = "ctl") -> bytes:
    """Declare a transaction on ``controller`` (attached first if it is not yet); its txn-id."""
    if not p.attached(controller):
        p.attach_controller(controller)
    delivery_id = p.declare(controller)
    state, _ = w.settle()[p].answers[delivery_id]
    assert isinstance(state, Declared), state
    txn_id: bytes = state.txn_id
    return txn_id


def rejected_with(state: Any) -> tuple[str, str | None]:
    """The (condition, description) of a ``rejected`` answer."""
    assert isinstance(state, Rejected), state
    assert isinstance(state.error, Error), state
    return str(state.error.condition), state.error.description


def answer(w: World, p: Peer, delivery_id: int) -> tuple[Any, bool]:
    """The broker's (state, settled) answer to our delivery ``delivery_id`` (None, False: none came)."""
    return w.settle()[p].answers.get(delivery_id, (None, False))


def seed(w: World, p: Peer, address: str, *names: str) -> None:
    """Messages ``names`` posted outside any transaction to ``address``, each accepted."""
    link = f"seed-{address}"
    if not p.attached(link):
        p.attach_producer(link, address)
    for name in names:
        delivery_id = p.transfer(link, payload(name))
        assert isinstance(answer(w, p, delivery_id)[0], Accepted)


def receive(w: World, p: Peer, link: str, address: str, credit: int = 1) -> list[Started]:
    """Attach an unsettled consumer ``link`` to ``address`` and give it ``credit``; the deliveries that start."""
    p.attach_consumer(link, address, presettled=False, default_outcome=None)
    p.flow(link, credit)
    return w.settle()[p].started


# -- steps in which several personalities differ -----------------------------------------------------------------
FULL_Q: dict[str, Any] = {"queues": {"q": NodePolicy(max_messages=1)}}
"""Settings (for ``world``) whose queue ``q`` is full after one message."""
UNKNOWN_ID = b"nope\x01"
"""A txn-id no broker declared: printable octets and one that Java brokers print as ``\\x01``."""


def txn_ids(w: World, count: int = 2) -> list[bytes]:
    """The txn-ids of ``count`` transactions declared one after another on one connection."""
    p = peer(w)
    return [declare(w, p) for _ in range(count)]


def discharge_unknown(w: World) -> tuple[Any, bool]:
    """The answer to a commit of ``UNKNOWN_ID`` (the controller's source offers rejected)."""
    p = peer(w)
    p.attach_controller("ctl")
    return answer(w, p, p.discharge("ctl", UNKNOWN_ID, fail=False))


def failed_commit(w: World, cause: str) -> tuple[Any, bool]:
    """The answer to a commit of a post to queue ``q`` that cannot be applied: ``cause`` "refused" (the queue was
    full when the post came, the world's queue ``q`` has ``max_messages=1``) or "deleted" (the queue was deleted
    before the commit)."""
    p = peer(w)
    txn_id = declare(w, p)
    if cause == "refused":
        seed(w, p, "q", "m0")
    p.attach_producer("prod", "q")
    answer(w, p, p.transfer("prod", payload("m1"), state=TransactionalState(txn_id=txn_id)))
    if cause == "deleted":
        assert w.broker.delete_node(w.broker.default, "q")
    return answer(w, p, p.discharge("ctl", txn_id, fail=False))


@dataclass(frozen=True)
class Retirement:
    """What a consumer saw of a delivery it retired in a transaction (left unsettled), and of its commit."""

    at_retirement: Observed
    """What came straight after the transactional disposition."""
    at_commit: Observed
    """What came after the commit (which a second consumer with credit waits through)."""
    queue: QueueCensus
    """Queue ``q`` after the commit."""


def retire_in_txn(w: World, outcome: Any) -> Retirement:
    """A message of queue ``q`` taken by consumer ``c`` and given ``transactional-state(txn, outcome)`` unsettled,
    then the transaction committed while consumer ``c2`` waits with credit 1."""
    p = peer(w)
    txn_id = declare(w, p)
    seed(w, p, "q", "m1")
    (delivery,) = receive(w, p, "c", "q")
    p.dispose(delivery.delivery_id, TransactionalState(txn_id=txn_id, outcome=outcome), settled=False)
    at_retirement = w.settle()[p]
    assert receive(w, p, "c2", "q") == []
    p.discharge("ctl", txn_id, fail=False)
    at_commit = w.settle()[p]
    return Retirement(at_retirement, at_commit, census(BrokerView(w))["q"])


def acquire_in_txn(w: World) -> tuple[Started, Observed, QueueCensus]:
    """A consumer's flow naming a transaction (§4.4.3), then the transaction rolled back: the delivery as it
    started, what the rollback brought, and queue ``q`` after it."""
    p = peer(w)
    txn_id = declare(w, p)
    seed(w, p, "q", "m1")
    p.attach_consumer("c", "q", presettled=False, default_outcome=None)
    p.flow("c", 1, properties={TXN_ID: txn_id})
    (delivery,) = w.settle()[p].started
    p.discharge("ctl", txn_id, fail=True)
    return delivery, w.settle()[p], census(BrokerView(w))["q"]


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


def check_flow_txn_id_ignored(name: str) -> None:
    """Assert that personality ``name`` ignores a flow's txn-id where minibroker acquires under it (§4.4.3): under
    minibroker the transfer carries ``transactional-state(txn-id)`` and the rollback releases it back to the queue;
    under ``name`` it carries no state and the rollback leaves it acquired by the consumer."""
    delivery, rollback, queue = acquire_in_txn(world("minibroker"))
    assert isinstance(delivery.state, TransactionalState)
    assert len(delivery.state.txn_id) == 16
    assert rollback.settled_by_broker == [(0, Released())]
    assert (queue.ready, queue.acquired) == ((("m1", 0),), 0)

    delivery, rollback, queue = acquire_in_txn(world(name))
    assert delivery.state is None
    assert rollback.settled_by_broker == []
    assert (queue.ready, queue.acquired) == ((), 1)
