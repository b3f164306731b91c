"""A connection's exclusive queues go with it in the order they were declared, not in the order of their addresses
in memory: each takes its producers on other connections with it, and their detaches go out in that order."""

from __future__ import annotations

from tests.rabbit.helpers import peer, rabbit_world

QUEUES = [f"x{n}" for n in range(6)]  # declared (and attached to) in this order
ROUNDS = 12  # (a memory address order would differ from one round to another)


def _detached_when_the_owner_goes() -> list[str]:
    w = rabbit_world()
    owner, other = peer(w, "owner"), peer(w, "other")
    for name in QUEUES:
        w.broker.rabbit.declare_queue(owner.conn, name, exclusive=True)
    for name in QUEUES:
        other.attach_producer(name, name)
    seen = w.settle()[other]
    assert not seen.detached
    owner.close()
    return [name for name, _ in w.settle()[other].detached]


def test_exclusive_queues_go_with_their_connection_in_the_order_they_were_declared() -> None:
    for _ in range(ROUNDS):
        assert _detached_when_the_owner_goes() == QUEUES
