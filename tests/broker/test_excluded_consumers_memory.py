"""Probe: ``modified(undeliverable-here)`` records the *Consumer* in ``message.excluded`` and nothing ever takes
it out. A Consumer holds its link and its ``ServerConnection`` (engine, buffers, sessions), so every client
that refuses a message this way and goes away stays in memory as long as the message does (issue 12 item 17,
"small leaks"; README "loses no message ... keeps serving everyone else" under memory bounds)."""

from __future__ import annotations

import gc
import tracemalloc

from minibroker.amqp.definitions import Modified
from minibroker.broker.core import Broker, BrokerSettings
from tests.broker.txn_driver import World, payload


def test_clients_that_refused_a_message_and_left_are_not_kept() -> None:
    world = World(Broker(BrokerSettings()))
    producer = world.connect("producer")
    producer.attach_producer("p", "q")
    world.settle()
    producer.transfer("p", payload("hot"), settled=True)
    world.settle()

    def refuse_and_leave(i: int) -> None:
        peer = world.connect(f"c{i}")
        peer.attach_consumer("c", "q", presettled=False, default_outcome=None)
        peer.flow("c", 1)
        (started,) = world.settle()[peer].started
        peer.dispose(started.delivery_id, Modified(undeliverable_here=True), settled=True)
        peer.close()
        world.settle()
        world.broker.take_dirty()  # what the I/O layer does after each batch (the test driver never does)

    for i in range(20):
        refuse_and_leave(i)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(20, 220):
            refuse_and_leave(i)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    (message,) = world.broker.queues["q"].ready
    assert grown < 200 * 500, (
        f"{grown} bytes ({grown // 200} per departed client) kept; excluded={len(message.excluded or ())}"
    )
