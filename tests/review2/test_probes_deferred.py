"""Probes: deferred relay nodes (README "Posting": "an anonymous-relay post under a transaction to an address
with no node creates the node only when the transaction commits").

``Coordinator._check`` checks the limits of a node the commit will create by counting the transaction's posts
per ``Deferred(namespace, name, kind)``. Two addresses that name the same node with different kinds
(``x`` and ``queue://x``: README "Compatibility", the prefix "is not part of the node's name") are counted
apart, so the commit puts more messages on the new node than its ``max_messages`` admits, while the same
posts outside a transaction, or to an existing node, are refused at the limit.

README "Limits and security": `max_messages` ... past it: `reject-publish` (`amqp:resource-limit-exceeded`);
README "Posting": a post the node cannot take is answered rejected and "then makes the commit fail with
`amqp:transaction:rollback`".
"""

from __future__ import annotations

import pytest
from trio.testing import MockClock

from minibroker.amqp.definitions import Accepted, Disposition, Rejected
from minibroker.broker.core import BrokerSettings
from minibroker.broker.policy import NodePolicy
from minibroker.testing import frames
from minibroker.testing.memory import MemoryBroker
from tests.broker import test_transactions_frames as frame_tests
from tests.broker.test_transactions_frames import client, to

mb = frame_tests.mb
settings = frame_tests.settings

ONE_MESSAGE = BrokerSettings(node_defaults=NodePolicy(max_messages=1))


@pytest.mark.parametrize("settings", [ONE_MESSAGE], ids=["max-messages-1"])
async def test_a_commit_does_not_overfill_a_node_it_creates(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    c = await client(mb)
    await c.coordinator()
    await c.sender(None, 1)  # the anonymous relay
    txn = await c.declare()
    answers = []
    for address in ("x", "queue://x"):  # one node, "x", named two ways
        delivery_id = await c.post(1, frames.message(address, to(address)), txn=txn)
        answer = await c.peer.expect(Disposition)
        assert answer.first == delivery_id
        answers.append(answer.state)
    outcome = await c.discharge(txn)
    queue = mb.queue("x")
    depth = queue.depth
    queue.purge()
    refused = any(isinstance(a, Rejected) or isinstance(getattr(a, "outcome", None), Rejected) for a in answers)
    assert depth <= 1, (
        f"node 'x' admits one message, yet the commit put {depth} on it (post answers {answers}, discharge {outcome})"
    )
    assert refused or outcome != Accepted()
