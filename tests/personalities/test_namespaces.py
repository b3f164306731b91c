"""A personality per namespace: one broker core, its default namespace ``minibroker``, a namespace "art" with the
``artemis`` personality (``Broker.namespace(name, personality)``); a connection whose open names "art" as its
hostname meets Artemis's behaviour while a connection of the default namespace meets minibroker's, on the same
broker at the same time (minibroker/broker/namespace.py; Part 2 §2.7.1 open hostname)."""

from __future__ import annotations

from minibroker.amqp.definitions import Error, Rejected
from minibroker.amqp.types import Symbol
from minibroker.broker.personality import get
from tests.broker.txn_driver import Peer, World
from tests.personalities.harness import peer, world

UNKNOWN = b"\x09" * 4


def discharge_unknown(w: World, peers: list[Peer]) -> dict[str, Error]:
    """A controller on each peer commits a txn-id nobody declared, all before any answer is read: the error each
    discharge is rejected with, by container-id."""
    for p in peers:
        p.attach_controller("ctl")
    w.settle()
    deliveries = [(p, p.discharge("ctl", UNKNOWN, fail=False)) for p in peers]
    seen = w.settle()
    errors: dict[str, Error] = {}
    for p, delivery in deliveries:
        state, settled = seen[p].answers[delivery]
        assert settled
        assert isinstance(state, Rejected)
        errors[p.container_id] = state.error
    return errors


def test_each_namespace_answers_with_its_own_personality() -> None:
    """Two connections discharge the same unknown txn-id at the same time: the one in namespace "art" is rejected
    with Artemis's amqp:illegal-state 'AMQ119014: Transaction not found' (ProtonTransactionHandler.txError), the
    one in the default namespace with minibroker's amqp:transaction:unknown-id (part 4 §4.5.4)."""
    w = world("minibroker")
    w.broker.namespace("art", get("artemis"))
    default, art = peer(w, "default-client"), peer(w, "art-client", hostname="art")
    assert w.broker.namespace_of(art.conn).personality.name == "artemis"
    assert w.broker.namespace_of(default.conn).personality.name == "minibroker"
    errors = discharge_unknown(w, [default, art])
    assert errors["default-client"].condition == Symbol("amqp:transaction:unknown-id")
    assert errors["art-client"].condition == Symbol("amqp:illegal-state")
    assert errors["art-client"].description == "AMQ119014: Transaction not found: xid=\\x09\\x09\\x09\\x09"
