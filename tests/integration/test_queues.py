"""Queues are separate nodes, created on attach, whose depth the test kit can read."""

from __future__ import annotations

from typing import Any

import pytest
from proton import Message, Timeout
from proton.reactor import Container

from minibroker.testing.thread import ThreadedBroker
from tests.integration.helpers import (
    QUIET_PERIOD,
    Scenario,
    blocking_connection,
    queue_depth,
    queue_stats,
    run,
    send_messages,
    wait_for,
)


def test_two_queues_do_not_mix(broker: ThreadedBroker) -> None:
    send_messages(broker, "apples", [Message(body=f"apple-{i}") for i in range(3)])
    send_messages(broker, "pears", [Message(body=f"pear-{i}") for i in range(5)])
    assert queue_depth(broker, "apples") == 3
    assert queue_depth(broker, "pears") == 5

    with blocking_connection(broker) as conn:
        apples = conn.create_receiver("apples", credit=10)
        got = []
        for _ in range(3):
            got.append(apples.receive().body)
            apples.accept()
        assert got == ["apple-0", "apple-1", "apple-2"]
        with pytest.raises(Timeout):
            apples.receive(timeout=QUIET_PERIOD)
        wait_for(lambda: queue_stats(broker, "apples") == (0, 0), "apples consumed", conn=conn)
        assert queue_stats(broker, "pears") == (5, 0)  # untouched by the apples consumer

        pears = conn.create_receiver("pears", credit=10)
        got = []
        for _ in range(5):
            got.append(pears.receive().body)
            pears.accept()
        assert got == [f"pear-{i}" for i in range(5)]
        wait_for(lambda: queue_stats(broker, "pears") == (0, 0), "pears consumed", conn=conn)


class Interleaved(Scenario):
    """One connection sends to two queues in an uneven interleaving (one to "left", then two to "right")
    and reads both back on two receivers of the same session."""

    counts = {"left": 40, "right": 80}

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.rounds = 0
        self.got: dict[str, list[str]] = {name: [] for name in self.counts}

    def setup(self, container: Container) -> None:
        conn = self.connect()
        self.senders = {name: container.create_sender(conn, name) for name in self.counts}
        for name in self.counts:
            container.create_receiver(conn, name, name=f"read-{name}")

    def on_sendable(self, event: Any) -> None:
        left, right = self.senders["left"], self.senders["right"]
        if left.credit < self.counts["left"] or right.credit < self.counts["right"]:
            return  # wait until both links have the broker's credit, then send everything
        while self.rounds < self.counts["left"]:
            left.send(Message(body=f"left-{self.rounds}"))
            for i in (2 * self.rounds, 2 * self.rounds + 1):
                right.send(Message(body=f"right-{i}"))
            self.rounds += 1

    def on_message(self, event: Any) -> None:
        queue = event.link.name.removeprefix("read-")
        self.got[queue].append(event.message.body)
        if all(len(self.got[name]) == count for name, count in self.counts.items()):
            self.finish()

    def describe(self) -> str:
        return f"sent {self.rounds} rounds, received {[len(b) for b in self.got.values()]}"


def test_interleaved_sends_to_two_queues_stay_apart(broker: ThreadedBroker) -> None:
    scenario = Interleaved(broker.url)
    run(scenario)
    for name, count in Interleaved.counts.items():
        assert scenario.got[name] == [f"{name}-{i}" for i in range(count)]
        assert queue_stats(broker, name) == (0, 0)
    totals = {name: broker.queue(name).stats().enqueued_total for name in broker.queues}
    assert totals == Interleaved.counts


def test_queue_is_created_on_attach_and_depth_tracks_it(broker: ThreadedBroker) -> None:
    queue = broker.queue("created-on-attach")
    assert not queue.exists
    with blocking_connection(broker) as conn:
        receiver = conn.create_receiver("created-on-attach", credit=0)
        assert queue.exists
        assert queue.depth == 0
        sender = conn.create_sender("created-on-attach")
        for i in range(7):
            sender.send(Message(body=i))
            assert queue_depth(broker, "created-on-attach") == i + 1
        receiver.flow(2)
        fetcher = receiver.fetcher
        assert fetcher is not None
        conn.wait(lambda: fetcher.has_message == 2, msg="2 messages")
        assert queue_stats(broker, "created-on-attach") == (5, 2)  # ready, acquired
