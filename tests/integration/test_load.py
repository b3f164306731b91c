"""Load and soak at reduced size: ``bench.soak``'s three scenarios, small enough for CI (< 45 s together).

* many connections at once (python-qpid-proton): nothing lost, nothing duplicated, FIFO per queue;
* many messages through one queue (``bench.raw``'s raw-socket client, broker in its own process so its RSS
  is its own): nothing lost or duplicated, memory flat once warmed up;
* connect/disconnect churn (raw sockets, broker in this process's thread): no connection, trio task,
  socket or file descriptor left behind, the shared queue back to empty.

The full-size figures come from ``python -m bench.soak``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from bench.broker_process import HOST, BrokerProcess
from bench.introspect import broker_stats
from bench.measures import open_fds
from bench.soak_churn import run_churn
from bench.soak_connections import run_connections
from bench.soak_throughput import run_throughput
from minibroker.testing.thread import ThreadedBroker

pytestmark = pytest.mark.slow


class ThreadProbe:
    """An in-thread broker as ``bench.soak_figures.Probe``: this process's /proc figures, the broker's own stats."""

    def __init__(self, broker: ThreadedBroker) -> None:
        self.broker = broker
        self.pid = os.getpid()
        # the listener's accept task starts a moment after run_in_thread returns: count tasks once it has
        counts = [self.stats()["trio_tasks"]]
        while len(counts) < 3 or len(set(counts[-3:])) > 1:
            time.sleep(0.02)
            counts.append(self.stats()["trio_tasks"])

    def stats(self, *, collect: bool = False) -> dict[str, Any]:
        return self.broker.call(lambda running: broker_stats(running, collect=collect))


def _figures(result: Any) -> dict[str, Any]:
    """What an assertion message shows of a result (not the long sample lists)."""
    return {k: v for k, v in vars(result).items() if k not in ("rss_samples", "broker_before", "broker_after")}


@pytest.mark.timeout(60)
def test_fifty_connections_each_send_and_receive_a_hundred_without_loss_or_duplicate(broker: ThreadedBroker) -> None:
    result = run_connections(broker.url, 50, 100, prefetch=50, time_limit=40.0, probe=ThreadProbe(broker))

    assert result.opened == 50, _figures(result)
    assert result.ok, _figures(result)
    assert (result.received, result.accepted, result.lost, result.duplicates) == (5000, 5000, 0, 0)
    assert result.out_of_order == 0  # one producer per queue: first in, first out
    after = result.broker_after
    assert after["connections"] == 0
    assert after["connection_tasks"] == 0
    assert after["trio_tasks"] == result.broker_before["trio_tasks"]
    assert all(q == {"ready": 0, "acquired": 0} for q in after["queues"].values()), after["queues"]


@pytest.mark.timeout(90)
def test_fifty_thousand_messages_through_one_queue_in_flat_memory() -> None:
    messages = 50_000
    with BrokerProcess(introspect=True) as broker:
        # paused twice with the queue empty and the connections open: after 25,000 messages and at the end
        result = run_throughput(HOST, broker.port, messages, warmup=0.5, time_limit=60.0, probe=broker)
        assert broker.stop() == 0

    assert result.ok, _figures(result)
    assert (result.received, result.accepted, result.lost, result.duplicates, result.malformed) == (
        messages, messages, 0, 0, 0,
    )  # fmt: skip
    assert result.out_of_order == 0
    warm, end = result.checkpoints
    assert (warm["messages"], end["messages"]) == (25_000, 50_000)
    assert warm["connections"] == end["connections"] == 2
    # The second 25,000 messages leave nothing allocated behind while the connections stay open (a message,
    # delivery or frame kept per message would be 25,000 memory blocks or more; the noise is up to ~5,000) ...
    assert result.allocated_blocks_growth < 10_000, result.checkpoints
    # ... nor once they are closed.
    after = result.broker_after
    assert after["connections"] == 0
    assert after["queues"]["soak.throughput"] == {"ready": 0, "acquired": 0}
    blocks = after["allocated_blocks"] - result.broker_before["allocated_blocks"]
    assert blocks < 10_000, f"{blocks} more memory blocks allocated after the run than before"
    # The broker's RSS, warmed up, grows by less than 250 bytes per message (it levels off after ~100,000
    # messages; a run this small is still in its noisy first part, hence no 10 % bound as at full size).
    growth = (end["rss_kib"] - warm["rss_kib"]) * 1024 / (end["messages"] - warm["messages"])
    assert growth < 250, f"RSS grew by {growth:.0f} bytes per message after warm-up: {result.checkpoints}"


@pytest.mark.timeout(60)
def test_five_hundred_connect_disconnect_cycles_leave_nothing_behind(broker: ThreadedBroker) -> None:
    probe = ThreadProbe(broker)
    fds_before = open_fds(os.getpid())

    result = run_churn(HOST, broker.port, 500, workers=4, time_limit=40.0, probe=probe)

    assert result.failures == 0, result.first_failures
    assert not result.timed_out, _figures(result)
    after = result.broker_after
    assert broker.connections == []
    assert after["connections"] == 0
    assert after["connection_tasks"] == 0
    assert after["trio_tasks"] == result.broker_before["trio_tasks"], (
        result.broker_before["trio_task_names"], after["trio_task_names"],
    )  # fmt: skip
    assert after["queues"].get("soak.churn", {"ready": 0, "acquired": 0}) == {"ready": 0, "acquired": 0}
    fds_after = open_fds(os.getpid())
    assert abs(fds_after[0] - fds_before[0]) <= 5, (fds_before, fds_after)
    assert fds_after[1] <= fds_before[1], f"sockets left open: {fds_before} -> {fds_after}"
