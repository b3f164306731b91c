"""Probes: what a selector consumer's ``Scan`` keeps (issue 12, item 2 against items 5 and 14).

``Queue._came_in`` pushes every message that becomes ready behind a scan's cursor (a higher priority, a
release, a scheduled message falling due) onto *each* open scan's ``behind`` heap, and a scan sheds it only
when its consumer looks again (it needs credit for that) or when the heap passes ``2 * ready + 64``.

1. Consumed messages stay alive: an idle selector consumer's heap holds messages that another consumer has
   since accepted, up to 64 of them with an empty queue, whatever their size (``max_message_size`` is 100 MiB
   by default). README/issue item 14: "A consumed message must be freed at once."
2. Memory per message grows with the number of idle selector consumers: each ready message behind the cursors
   costs one heap entry (a tuple, a key, a counter int: ~100 bytes) per idle scan. 200 idle consumers turn
   20k messages of 38 bytes into ~390 MiB (issue 12 item 5 asked to remove exactly this kind of amplification).
"""

from __future__ import annotations

import gc
import tracemalloc
from typing import Any

from minibroker.amqp.definitions import ApplicationProperties, Header
from minibroker.amqp.types import Described, Symbol, UByte
from minibroker.broker.core import Broker, BrokerSettings
from minibroker.broker.selector import SELECTOR_DESCRIPTORS
from minibroker.handles import CoreView
from minibroker.testing import frames
from tests.broker.txn_driver import World

SELECTOR = next(d for d in SELECTOR_DESCRIPTORS if isinstance(d, str))


def _send_big(peer: Any, link: str, data: bytes, chunk: int = 60_000) -> None:
    """One message in frames of at most ``chunk`` bytes (settled)."""
    parts = [data[i : i + chunk] for i in range(0, len(data), chunk)]
    peer.begin_transfer(link, parts[0], settled=True)
    for part in parts[1:-1]:
        peer.send(frames.transfer(peer.handle(link), None, more=True), part)
    peer.end_transfer(link, parts[-1])


def _red_only() -> dict[Any, Any]:
    return {Symbol("s"): Described(SELECTOR, "color = 'red'")}


def _idle_selector_consumers(world: World, peer: Any, count: int) -> None:
    """``count`` consumers with a selector, each of which took one red message and has no credit left (their
    scans' cursors at priority 4)."""
    for _ in range(count):
        peer.transfer("p", frames.message("<<r>>", ApplicationProperties({"color": "red"})), settled=True)
    world.settle()
    for i in range(count):
        peer.attach_consumer(f"idle{i}", "q", presettled=True, default_outcome=None, source_filter=_red_only())
        peer.flow(f"idle{i}", 1)
    world.settle()
    assert CoreView(world.broker).queue("q").depth == 0


def test_consumed_messages_are_not_kept_by_an_idle_selector_consumer() -> None:
    world = World(Broker(BrokerSettings()))
    peer = world.connect("app")
    peer.attach_producer("p", "q")
    world.settle()
    _idle_selector_consumers(world, peer, 1)
    peer.attach_consumer("worker", "q", presettled=True, default_outcome=None)
    world.settle()
    big = frames.message(
        "<<big>>" + "x" * 1_000_000, Header(priority=UByte(9)), ApplicationProperties({"color": "blue"})
    )
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(60):
            _send_big(peer, "p", big)
            peer.flow("worker", 1)  # taken at once, settled: consumed
            seen = world.settle()[peer]
            assert not seen.closed
            assert [c.name for c in seen.completed] == ["big"], seen
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    queue = world.broker.queues["q"]
    assert (queue.depth, queue.acquired) == (0, 0)
    kept = sum(len(scan.behind) for scan in queue.scans)
    assert grown < 5_000_000, f"{grown / 2**20:.0f} MiB kept after 60 consumed 1 MB messages ({kept} in scans)"


def test_memory_per_message_does_not_grow_with_idle_selector_consumers() -> None:
    grown = {}
    for count in (1, 100):
        world = World(Broker(BrokerSettings()))
        peer = world.connect("app")
        peer.attach_producer("p", "q")
        world.settle()
        _idle_selector_consumers(world, peer, count)
        urgent = frames.message("<<b>>", Header(priority=UByte(9)), ApplicationProperties({"color": "blue"}))
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i in range(2000):
                peer.transfer("p", urgent, settled=True)
                if i % 200 == 0:
                    world.settle()
            world.settle()
            grown[count] = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
    assert grown[100] < 3 * grown[1], (
        f"2000 ready messages: {grown[1]} bytes with 1 idle selector consumer, {grown[100]} with 100"
    )
