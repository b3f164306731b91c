"""``proton`` against ``minibroker``: each quirk of Qpid Proton's example broker (python/examples/broker.py) as it
shows on the wire (personality.py).

Every test runs one steps function under both personalities and asserts both answers, so it fails if the
quirk were not implemented (the personality would answer as ``minibroker`` does).
"""

from __future__ import annotations

from typing import Any

from minibroker.amqp.definitions import Accepted, Coordinator, Error, Modified, Rejected, Source, TransactionalState
from minibroker.amqp.errors import Condition
from minibroker.amqp.types import Symbol
from minibroker.broker.personality import TXN_CAPABILITIES, get
from minibroker.testing import frames
from tests.broker.txn_driver import ACCEPTED_LIST, BrokerView, Peer, QueueCensus, World, census
from tests.personalities.harness import (
    check_flow_txn_id_ignored,
    declare,
    discharge,
    peer,
    post,
    ready,
    world,
)

UNKNOWN = b"nope"


def _txn_peer(w: World, container_id: str = "client", hostname: str | None = None) -> Peer:
    """A peer holding controller ``ctl`` (errors as rejected) and producer ``p`` to queue ``q``."""
    p = peer(w, container_id, hostname)
    p.attach_controller("ctl")
    p.attach_producer("p", "q")
    w.settle()
    return p


def test_txn_ids_are_valid_on_every_connection_of_the_namespace() -> None:
    """The example broker keeps one broker-wide map of transactions (Broker._declare_txn, on_message), so another
    connection may post under a txn-id (here: one of the same namespace, never another namespace's);
    minibroker knows a txn-id only on the connection that declared it (amqp:transaction:unknown-id)."""

    def steps(name: str) -> tuple[Any, Any, Any, list[Any]]:
        w = world(name)
        w.broker.namespace("other", get(name))
        owner = _txn_peer(w, "owner")
        neighbour = _txn_peer(w, "neighbour")
        stranger = _txn_peer(w, "stranger", hostname="other")
        txn_id = declare(w, owner)
        from_neighbour, _ = post(w, neighbour, "p", "m", txn_id)
        from_stranger, _ = post(w, stranger, "p", "s", txn_id)
        committed, _ = discharge(w, owner, txn_id)
        return txn_id, from_neighbour, from_stranger, [committed, *ready(w)]

    def unknown(state: Any) -> bool:
        return isinstance(state, Rejected) and state.error.condition == Condition.UNKNOWN_TXN_ID

    _, from_neighbour, from_stranger, after = steps("minibroker")
    assert unknown(from_neighbour)
    assert unknown(from_stranger)
    assert after == [Accepted()]

    txn_id, from_neighbour, from_stranger, after = steps("proton")
    assert from_neighbour == TransactionalState(txn_id=txn_id, outcome=Accepted())
    assert unknown(from_stranger)
    assert after == [Accepted(), "m"]


def test_coordinator_reply_echoes_the_controllers_target() -> None:
    """The example broker answers a coordinator attach with the controller's own target (on_link_opening), so the
    capabilities come back as sent; minibroker answers with the three it provides."""

    def capabilities(name: str) -> Any:
        w = world(name)
        p = peer(w)
        target = Coordinator(capabilities=[Symbol("x-test")])
        p.send(frames.attach_sender(None, p.new_handle("ctl"), "ctl", target=target))
        reply = w.settle()[p].attached["ctl"].target
        assert isinstance(reply, Coordinator)
        return reply.capabilities

    assert capabilities("minibroker") == list(TXN_CAPABILITIES)
    assert capabilities("proton") == ["x-test"]


def _expired(name: str, *, fail: bool) -> tuple[int, Any, list[str | None]]:
    """Declare and post (time-out 10 s), wait 20 s, then discharge with ``fail``: open transactions before the
    discharge, its answer, and what ``q`` holds."""
    w = world(name, transaction_timeout=10)
    p = _txn_peer(w)
    txn_id = declare(w, p)
    post(w, p, "p", "m", txn_id)
    w.advance(20)
    still_open = len(w.broker.transactions)
    answer, _ = discharge(w, p, txn_id, fail=fail)
    return still_open, answer, ready(w)


def test_time_out_is_lazy() -> None:
    """The example broker notices a time-out only at the commit (_discharge_txn): the transaction is still listed
    after its time, the commit is rejected with amqp:transaction:timeout and a rollback is accepted; minibroker
    rolls it back when the time is up."""
    for name, listed in (("minibroker", 0), ("proton", 1)):
        still_open, answer, messages = _expired(name, fail=False)
        assert (still_open, messages) == (listed, [])
        assert isinstance(answer, Rejected)
        assert answer.error.condition == Condition.TRANSACTION_TIMEOUT
        assert _expired(name, fail=True) == (listed, Accepted(), [])


def test_errors_always_travel_as_rejected() -> None:
    """The example broker sends every declare or discharge error as rejected (_coordinator_message), even to a
    controller whose source offers only amqp:accepted:list; minibroker then detaches the link with it (§4.3)."""

    def steps(name: str) -> tuple[Any, list[tuple[str, Error | None]]]:
        w = world(name)
        p = peer(w)
        target = Coordinator(capabilities=[Symbol("amqp:local-transactions")])
        source = Source(outcomes=[ACCEPTED_LIST])
        p.send(frames.attach_sender(None, p.new_handle("ctl"), "ctl", target=target, source=source))
        w.settle()
        delivery_id = p.discharge("ctl", UNKNOWN, fail=False)
        seen = w.settle()[p]
        return seen.answers.get(delivery_id), seen.detached

    answer, detached = steps("minibroker")
    assert answer is None
    assert [(link, e.condition if e else None) for link, e in detached] == [("ctl", Condition.UNKNOWN_TXN_ID)]

    answer, detached = steps("proton")
    assert answer is not None
    assert isinstance(answer[0], Rejected)
    assert answer[0].error.condition == Condition.UNKNOWN_TXN_ID
    assert detached == []


def test_redelivery_limit_is_five() -> None:
    """The example broker drops a message given modified(delivery-failed) when its delivery-count is already 5: it
    checks before counting (_modify_delivery, --redelivery-limit 5), so the 6th failure drops it; minibroker
    redelivers it, its delivery-count header counting the failures."""

    def steps(name: str) -> tuple[list[int], QueueCensus]:
        w = world(name)
        p = _txn_peer(w)
        post(w, p, "p", "m")
        p.attach_consumer("c", "q", presettled=False, default_outcome=None)
        p.flow("c", 10)
        counts = []
        for _ in range(7):
            seen = w.settle()[p].completed
            if not seen:
                break
            counts.append(seen[0].delivery_count)
            p.dispose(seen[0].delivery_id, Modified(delivery_failed=True), settled=True)
        return counts, census(BrokerView(w))["q"]

    assert steps("minibroker") == ([0, 1, 2, 3, 4, 5, 6], QueueCensus((), acquired=1, staged=0))  # sent again, held
    assert steps("proton") == ([0, 1, 2, 3, 4, 5], QueueCensus((), acquired=0, staged=0))  # gone


def test_flow_txn_id_is_ignored() -> None:
    """The example broker never reads a flow's properties (on_sendable just dispatches the queue): what it sends
    carries no transactional-state and a rollback leaves it with the consumer; minibroker acquires under the
    transaction (§4.4.3) and the rollback releases the message back to the queue."""
    check_flow_txn_id_ignored("proton")
