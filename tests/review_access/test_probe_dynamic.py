"""Probes: dynamic nodes (issue 12 item 22; README "Limits and security", "Compatibility": "dynamic=true gets a
generated address, deleted with its link (request/reply)").

The generated address ``dynamic.<conn>.<n>`` is predictable and is never checked against existing nodes: a peer
that attaches to that address first (auto-create) owns a node of that name before the dynamic one is made.
"""

from __future__ import annotations

import trio
from trio.testing import MockClock

from minibroker.amqp.definitions import Attach, Detach, Flow, Source, Transfer
from minibroker.amqp.types import Symbol
from minibroker.broker.core import OFFERED_CAPABILITIES
from minibroker.engine.connection import ServerConnection
from minibroker.testing import frames
from minibroker.testing.memory import memory_broker


def numbered(conn_id: int) -> ServerConnection:
    """Engines numbered as the server numbers them (``serve`` gives each its connection id)."""
    return ServerConnection(conn_id=conn_id, offered_capabilities=list(OFFERED_CAPABILITIES))


async def test_a_dynamic_node_never_shares_its_address_with_an_existing_node(autojump_clock: MockClock) -> None:
    """An attacker pre-creates the queue ``dynamic.2.1`` (the name connection 2's first dynamic node gets); the
    victim, connection 2, asks for a dynamic topic as its reply address; a responder sends to the address the
    broker gave the victim. The reply must reach the victim, not the attacker's queue."""
    async with memory_broker(make_engine=numbered) as mb:
        attacker = await mb.connect()  # connection 1
        victim = await mb.connect()  # connection 2
        responder = await mb.connect()
        for peer in (attacker, victim, responder):
            await peer.open()
            await peer.begin()
        squatted = (await attacker.attach_receiver("dynamic.2.1", handle=0)).source is not None
        if squatted:
            await attacker.flow(0, 10)
        else:  # refused (no node may be made in the dynamic name space): its detach comes next
            await attacker.expect(Detach)
        source = Source(dynamic=True, capabilities=[Symbol("topic")])
        await victim.send(frames.attach_receiver(None, 0, source=source))
        reply_to = (await victim.expect(Attach)).source.address
        await victim.flow(0, 10)
        await responder.attach_sender(reply_to, handle=0)
        await responder.expect(Flow)
        await responder.transfer(0, 0, frames.message("reply"), settled=True)
        await mb.settle()
        stolen = []
        with trio.move_on_after(1):
            while True:  # whatever else the attacker gets, it must not be the reply
                frame = await attacker.receive()
                if isinstance(frame.performative, Transfer):
                    stolen.append(frame.performative)
        assert not stolen, f"the reply sent to {reply_to!r}, the victim's generated address, went to the attacker"
        assert isinstance(await victim.expect(Transfer), Transfer)
