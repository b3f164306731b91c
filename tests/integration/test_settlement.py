"""Outcomes, redelivery, competing consumers, lost consumers and pre-settled transfers (Part 3 §3.4)."""

from __future__ import annotations

import select
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from proton import Data, Delivery, Link, Message, Timeout
from proton.reactor import AtMostOnce, Container, LinkOption

from minibroker.testing.thread import ThreadedBroker
from tests.integration.helpers import (
    BLOCKING_TIMEOUT,
    QUIET_PERIOD,
    Scenario,
    blocking_connection,
    encode,
    queue_stats,
    receive_raw,
    run,
    section,
    send_messages,
    send_raw,
    wait_for,
)


# -- outcomes --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("consumer", ["same", "other"])
def test_released_message_is_redelivered_unchanged(broker: ThreadedBroker, consumer: str) -> None:
    send_messages(broker, "released", [Message(id="m1", body="payload", properties={"p": 1})])
    with blocking_connection(broker) as conn, blocking_connection(broker) as other_conn:
        first = conn.create_receiver("released")
        got = first.receive()
        assert (got.body, got.delivery_count) == ("payload", 0)
        first.release(delivered=False)  # released: not delivered, the count must not change
        wait_for(lambda: queue_stats(broker, "released") == (1, 0), "the release", conn=conn)

        second = first if consumer == "same" else other_conn.create_receiver("released")
        again: Any = second.receive()  # (proton's stubs type Message.properties as None)
        second.accept()
        wait_for(lambda: queue_stats(broker, "released") == (0, 0), "the accept", conn=second.connection)
    assert (again.id, again.body, again.properties) == ("m1", "payload", {"p": 1})
    assert again.delivery_count == 0


# Each outcome given to message A in turn, and the header delivery-count expected when A next arrives.
RELEASED = ("released", False)
MODIFIED_FAILED = ("modified", True)
MODIFIED = ("modified", False)
OUTCOMES = [RELEASED, MODIFIED_FAILED, MODIFIED_FAILED, MODIFIED, RELEASED, ("accepted", False)]
EXPECTED_COUNTS = [0, 0, 1, 2, 2, 2]


def _header_length(payload: bytes) -> int:
    return Data().decode(payload)  # bytes taken by the first section (proton always writes a header)


class Redelivery(Scenario):
    """A and B are queued. A gets each outcome in OUTCOMES; after each, one more credit is granted
    (once the broker took the outcome), so A must come back every time ahead of B."""

    def __init__(self, url: str, broker: ThreadedBroker) -> None:
        super().__init__(url, prefetch=0, raw_receive=True)
        self.broker = broker
        self.received: list[bytes] = []

    def setup(self, container: Container) -> None:
        container.create_receiver(self.connect(), "redelivery").flow(1)

    def on_delivery(self, event: Any) -> None:
        payload = receive_raw(event)
        if payload is None:
            return
        delivery = event.delivery
        self.received.append(payload)
        step = len(self.received) - 1
        if step < len(OUTCOMES):
            outcome, failed = OUTCOMES[step]
            if outcome == "released":
                delivery.update(Delivery.RELEASED)
            elif outcome == "modified":
                delivery.local.failed = failed
                delivery.update(Delivery.MODIFIED)
            else:
                delivery.update(Delivery.ACCEPTED)
        else:
            delivery.update(Delivery.ACCEPTED)
        delivery.settle()
        if step == len(OUTCOMES):
            self.when(lambda: queue_stats(self.broker, "redelivery") == (0, 0), self.finish)
        else:
            receiver = event.receiver
            self.when(lambda: queue_stats(self.broker, "redelivery")[1] == 0, lambda: receiver.flow(1))

    def describe(self) -> str:
        return f"received {len(self.received)} deliveries"


def test_released_and_modified_messages_come_back_first_with_the_right_delivery_count(
    broker: ThreadedBroker,
) -> None:
    a = Message(id="A", body="a", durable=True, priority=6, properties={"k": "v"})
    b = Message(id="B", body="b")
    send_messages(broker, "redelivery", [a, b])
    message_a, message_b = encode(a), encode(b)
    scenario = Redelivery(broker.url, broker)
    run(scenario)

    decoded: list[Any] = []  # (proton's stubs type Message.properties as None)
    for payload in scenario.received:
        message = Message()
        message.decode(payload)
        decoded.append(message)
    assert [m.id for m in decoded] == ["A"] * len(OUTCOMES) + ["B"]
    assert [m.delivery_count for m in decoded[:-1]] == EXPECTED_COUNTS
    assert decoded[-1].delivery_count == 0
    for message in decoded[:-1]:
        assert (message.durable, message.priority, message.properties, message.body) == (True, 6, {"k": "v"}, "a")
    # until a delivery failed, A is byte-identical; afterwards only its header changed
    assert scenario.received[0] == scenario.received[1] == message_a
    header = _header_length(message_a)
    for payload in scenario.received[2:-1]:
        assert payload[_header_length(payload) :] == message_a[header:]
    assert scenario.received[-1] == message_b


class ModifyHeaderless(Scenario):
    """A message without a header section gets one when modified(delivery-failed) bumps its count."""

    def __init__(self, url: str, payload: bytes) -> None:
        super().__init__(url, raw_receive=True)
        self.payload = payload
        self.received: list[bytes] = []

    def setup(self, container: Container) -> None:
        conn = self.connect()
        container.create_sender(conn, "headerless")
        container.create_receiver(conn, "headerless")

    def on_sendable(self, event: Any) -> None:
        if not event.sender.unsettled and not self.received:
            send_raw(event.sender, self.payload)

    def on_delivery(self, event: Any) -> None:
        if event.link.is_sender:
            return
        payload = receive_raw(event)
        if payload is None:
            return
        self.received.append(payload)
        if len(self.received) == 1:
            event.delivery.local.failed = True
            event.delivery.update(Delivery.MODIFIED)
        else:
            event.delivery.update(Delivery.ACCEPTED)
            self.finish()
        event.delivery.settle()


def test_modified_message_without_header_gets_one(broker: ThreadedBroker) -> None:
    body = section(0x77, "no header")  # an amqp-value section alone: no header, no properties
    scenario = ModifyHeaderless(broker.url, body)
    run(scenario)
    assert scenario.received[0] == body
    again = Message()
    again.decode(scenario.received[1])
    assert again.delivery_count == 1
    assert again.body == "no header"
    assert scenario.received[1].endswith(body)


def test_rejected_message_is_gone(broker: ThreadedBroker) -> None:
    send_messages(broker, "rejected", [Message(body="bad"), Message(body="good")])
    with blocking_connection(broker) as conn:
        receiver = conn.create_receiver("rejected")
        assert receiver.receive().body == "bad"
        receiver.reject()
        assert receiver.receive().body == "good"
        receiver.accept()
        wait_for(lambda: queue_stats(broker, "rejected") == (0, 0), "both retired", conn=conn)
        with pytest.raises(Timeout):
            receiver.receive(timeout=QUIET_PERIOD)


class ReceiverSettlesSecond(LinkOption):
    """rcv-settle-mode second (§2.8.3): the receiver settles only after the sender has."""

    def apply(self, link: Link) -> None:
        link.rcv_settle_mode = Link.RCV_SECOND


class SettleSecondBothWays(Scenario):
    """A producer and a consumer both asking for rcv-settle-mode second. The broker, as receiver,
    answers accepted without settling and leaves settlement to the producer; as sender, it settles
    once the consumer's (unsettled) accepted disposition arrives."""

    total = 5

    def __init__(self, url: str) -> None:
        super().__init__(url, auto_accept=False)
        self.sent = 0
        self.accepted_unsettled = 0
        self.received: list[int] = []
        self.settled_by_broker = 0

    def setup(self, container: Container) -> None:
        conn = self.connect()
        container.create_sender(conn, "second", options=ReceiverSettlesSecond())
        container.create_receiver(conn, "second", options=ReceiverSettlesSecond())

    def on_link_opened(self, event: Any) -> None:
        assert event.link.remote_rcv_settle_mode == Link.RCV_SECOND

    def on_sendable(self, event: Any) -> None:
        while self.sent < self.total and event.sender.credit:
            event.sender.send(Message(body=self.sent))
            self.sent += 1

    def on_accepted(self, event: Any) -> None:
        # the broker's outcome arrives unsettled; auto_settle then settles it from our side
        assert not event.delivery.settled
        self.accepted_unsettled += 1

    def on_message(self, event: Any) -> None:
        self.received.append(event.message.body)
        event.delivery.update(Delivery.ACCEPTED)  # not settled: the broker settles first

    def on_settled(self, event: Any) -> None:
        if event.link.is_receiver:
            self.settled_by_broker += 1
            event.delivery.settle()
            if self.settled_by_broker == self.total:
                self.finish()

    def describe(self) -> str:
        return f"accepted {self.accepted_unsettled}, received {self.received}, settled {self.settled_by_broker}"


def test_receiver_settles_second_both_ways(broker: ThreadedBroker) -> None:
    scenario = SettleSecondBothWays(broker.url)
    run(scenario)
    assert scenario.accepted_unsettled == SettleSecondBothWays.total
    assert scenario.received == list(range(SettleSecondBothWays.total))
    assert queue_stats(broker, "second") == (0, 0)


# -- competing consumers ----------------------------------------------------------------------------------
class CompetingConsumers(Scenario):
    """Two consumers on separate connections share one queue; a third connection sends once both are up."""

    total = 200

    def __init__(self, url: str) -> None:
        super().__init__(url, prefetch=10)
        self.got: dict[str, list[int]] = {"c1": [], "c2": []}
        self.opened: set[str] = set()
        self.sent = 0

    def setup(self, container: Container) -> None:
        for name in self.got:
            container.create_receiver(self.connect(), "shared", name=name)

    def on_link_opened(self, event: Any) -> None:
        if event.link.is_receiver:
            self.opened.add(event.link.name)
            if self.opened == set(self.got):
                assert self.container is not None
                self.container.create_sender(self.connect(), "shared")

    def on_sendable(self, event: Any) -> None:
        while self.sent < self.total and event.sender.credit:
            event.sender.send(Message(body=self.sent))
            self.sent += 1

    def on_message(self, event: Any) -> None:
        self.got[event.link.name].append(event.message.body)
        if sum(len(bodies) for bodies in self.got.values()) == self.total:
            self.finish()

    def describe(self) -> str:
        return f"sent {self.sent}, received {[len(b) for b in self.got.values()]}"


def test_competing_consumers_each_message_delivered_once(broker: ThreadedBroker) -> None:
    scenario = CompetingConsumers(broker.url)
    run(scenario)
    first, second = scenario.got["c1"], scenario.got["c2"]
    assert sorted(first + second) == list(range(scenario.total))
    assert not set(first) & set(second)
    assert first, "both consumers should get a share"
    assert second, "both consumers should get a share"
    assert first == sorted(first)  # each consumer sees the queue's order
    assert second == sorted(second)
    assert queue_stats(broker, "shared") == (0, 0)


# -- consumers that go away -----------------------------------------------------------------------------
def test_unsettled_messages_return_when_the_receiver_link_closes(broker: ThreadedBroker) -> None:
    send_messages(broker, "detach", [Message(body=i) for i in range(4)])
    with blocking_connection(broker) as conn:
        receiver = conn.create_receiver("detach", credit=4)
        fetcher = receiver.fetcher
        assert fetcher is not None
        conn.wait(lambda: fetcher.has_message == 4, msg="4 messages")
        assert receiver.receive().body == 0
        receiver.accept()
        assert queue_stats(broker, "detach")[0] == 0
        receiver.close()  # type: ignore[no-untyped-call]  # returns once the broker answered the detach
        assert queue_stats(broker, "detach") == (3, 0)

        again = conn.create_receiver("detach", credit=10)
        returned = []
        for _ in range(3):
            returned.append(again.receive())
            again.accept()
        assert [m.body for m in returned] == [1, 2, 3]
        # proton's source names no default outcome, so the broker's default, released, applies
        assert [m.delivery_count for m in returned] == [0, 0, 0]
        wait_for(lambda: queue_stats(broker, "detach") == (0, 0), "all accepted", conn=conn)


class LoseConsumer(Scenario):
    """Of 5 queued messages receive 4, accept the first, leave 3 unsettled, then lose the consumer as
    ``how`` says; done when the broker holds the 3 as ready again."""

    def __init__(self, url: str, broker: ThreadedBroker, how: str) -> None:
        super().__init__(url, prefetch=0, auto_accept=False)
        self.broker = broker
        self.how = how
        self.received: list[int] = []

    def setup(self, container: Container) -> None:
        conn = self.connect()
        session = conn.session()
        session.open()
        receiver = session.receiver("losing")
        receiver.source.address = "lost"
        receiver.open()
        receiver.flow(4)

    def on_message(self, event: Any) -> None:
        self.received.append(event.message.body)
        if len(self.received) == 1:
            event.delivery.update(Delivery.ACCEPTED)
            event.delivery.settle()
        if len(self.received) < 4:
            return
        # the accept has reached the broker: 1 message ready (never sent), 3 acquired by us
        self.when(lambda: queue_stats(self.broker, "lost") == (1, 3), lambda: self.lose(event))

    def lose(self, event: Any) -> None:
        if self.how == "link-close":
            event.receiver.close()
        elif self.how == "link-detach":
            event.receiver.detach()
        elif self.how == "session-end":
            event.session.close()
        else:
            self.finish()  # connection close: the run ends once it is closed
            return
        self.when(lambda: queue_stats(self.broker, "lost") == (4, 0), self.finish)

    def describe(self) -> str:
        return f"received {self.received}"


@pytest.mark.parametrize("how", ["link-close", "link-detach", "session-end", "connection-close"])
def test_unsettled_messages_return_when_the_consumer_goes_away(broker: ThreadedBroker, how: str) -> None:
    send_messages(broker, "lost", [Message(body=i) for i in range(5)])
    run(LoseConsumer(broker.url, broker, how))
    wait_for(lambda: queue_stats(broker, "lost") == (4, 0), "3 returned + 1 never sent")
    with blocking_connection(broker) as conn:
        receiver = conn.create_receiver("lost", credit=10)
        returned = []
        for _ in range(4):
            returned.append(receiver.receive())
            receiver.accept()
        wait_for(lambda: queue_stats(broker, "lost") == (0, 0), "all accepted", conn=conn)
    assert [m.body for m in returned] == [1, 2, 3, 4]  # back in their places, ahead of message 4
    assert [m.delivery_count for m in returned] == [0, 0, 0, 0]


_DYING_CONSUMER = textwrap.dedent(
    """
    import sys, time
    from proton.utils import BlockingConnection

    conn = BlockingConnection(sys.argv[1], timeout=5)
    receiver = conn.create_receiver(sys.argv[2], credit=10)
    conn.wait(lambda: receiver.fetcher.has_message == int(sys.argv[3]), msg="messages")
    print("received", flush=True)
    time.sleep(60)  # never settles; killed by the test
    """
)


def test_unsettled_messages_return_when_the_connection_drops(broker: ThreadedBroker, tmp_path: Path) -> None:
    send_messages(broker, "dropped", [Message(body=i) for i in range(3)])
    script = tmp_path / "dying_consumer.py"
    script.write_text(_DYING_CONSUMER)
    proc = subprocess.Popen(
        [sys.executable, str(script), broker.url, "dropped", "3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], BLOCKING_TIMEOUT)
        line = proc.stdout.readline() if ready else ""
        held = queue_stats(broker, "dropped")
    finally:
        proc.kill()  # SIGKILL: the socket closes with no AMQP close frame
        _, err = proc.communicate(timeout=BLOCKING_TIMEOUT)
    assert line.strip() == "received", f"the consumer process failed: {err}"
    assert held == (0, 3)
    wait_for(lambda: queue_stats(broker, "dropped") == (3, 0), "the dropped consumer's messages to return")

    with blocking_connection(broker) as conn:
        receiver = conn.create_receiver("dropped", credit=10)
        returned = []
        for _ in range(3):
            returned.append(receiver.receive())
            receiver.accept()
        assert [m.body for m in returned] == [0, 1, 2]
        assert [m.delivery_count for m in returned] == [0, 0, 0]
        wait_for(lambda: queue_stats(broker, "dropped") == (0, 0), "all accepted", conn=conn)


# -- pre-settled ------------------------------------------------------------------------------------------
def test_presettled_send(broker: ThreadedBroker) -> None:
    with blocking_connection(broker) as conn:
        sender = conn.create_sender("presettled-in", options=AtMostOnce())
        assert sender.remote_snd_settle_mode == Link.SND_SETTLED
        deliveries = [sender.send(Message(body=i)) for i in range(10)]
        wait_for(lambda: queue_stats(broker, "presettled-in") == (10, 0), "10 stored", conn=conn)
        assert all(not d.remote_state for d in deliveries)  # nothing to answer for a settled transfer

        receiver = conn.create_receiver("presettled-in", credit=10)
        bodies = []
        for _ in range(10):
            bodies.append(receiver.receive().body)
            receiver.accept()
    assert bodies == list(range(10))


class PresettledBothWays(Scenario):
    """An at-most-once sender and an at-most-once receiver on the same queue."""

    total = 100

    def __init__(self, url: str) -> None:
        super().__init__(url, auto_accept=False)
        self.sent = 0
        self.received: list[int] = []
        self.acknowledged = 0

    def setup(self, container: Container) -> None:
        conn = self.connect()
        container.create_receiver(conn, "presettled", options=AtMostOnce())
        container.create_sender(conn, "presettled", options=AtMostOnce())

    def on_link_opened(self, event: Any) -> None:
        assert event.link.remote_snd_settle_mode == Link.SND_SETTLED

    def on_sendable(self, event: Any) -> None:
        while self.sent < self.total and event.sender.credit:
            event.sender.send(Message(body=self.sent))  # settled at once: the link is at-most-once
            self.sent += 1

    def on_settled(self, event: Any) -> None:
        self.acknowledged += 1

    def on_accepted(self, event: Any) -> None:
        self.acknowledged += 1

    def on_message(self, event: Any) -> None:
        assert event.delivery.settled, "the broker must send pre-settled on an at-most-once link"
        self.received.append(event.message.body)
        event.delivery.settle()
        if len(self.received) == self.total:
            self.finish()

    def describe(self) -> str:
        return f"sent {self.sent}, received {len(self.received)}"


def test_presettled_both_ways(broker: ThreadedBroker) -> None:
    scenario = PresettledBothWays(broker.url)
    run(scenario)
    assert scenario.received == list(range(PresettledBothWays.total))
    assert scenario.acknowledged == 0
    assert queue_stats(broker, "presettled") == (0, 0)  # nothing left acquired, awaiting an outcome
