"""Ordering, large messages and link flow control (credit, drain) with real proton clients."""

from __future__ import annotations

import re
from typing import Any

import pytest
from proton import Connection, Delivery, Message, Timeout
from proton.reactor import Container
from proton.utils import BlockingConnection

from minibroker.testing.thread import ThreadedBroker, run_in_thread
from tests.integration.helpers import (
    BLOCKING_TIMEOUT,
    QUIET_PERIOD,
    Scenario,
    as_bytes,
    blocking_connection,
    encode,
    queue_depth,
    queue_stats,
    run,
    send_messages,
    wait_for,
)

COUNT = 1000


class FifoOrder(Scenario):
    """Send COUNT numbered messages to one queue and receive them, either after all are stored or
    while they are still being sent."""

    timeout = 30.0  # well under a second normally; leave room for a loaded machine

    def __init__(self, url: str, broker: ThreadedBroker, *, receive_while_sending: bool) -> None:
        super().__init__(url)
        self.broker = broker
        self.receive_while_sending = receive_while_sending
        self.sent = 0
        self.accepted = 0
        self.received: list[int] = []
        self.conn: Connection | None = None

    def setup(self, container: Container) -> None:
        self.conn = conn = self.connect()
        container.create_sender(conn, "fifo")
        if self.receive_while_sending:
            container.create_receiver(conn, "fifo")

    def on_sendable(self, event: Any) -> None:
        while self.sent < COUNT and event.sender.credit:
            event.sender.send(Message(body=self.sent, properties={"seq": self.sent}))
            self.sent += 1

    def on_accepted(self, event: Any) -> None:
        self.accepted += 1
        if self.accepted == COUNT and not self.receive_while_sending:
            assert queue_depth(self.broker, "fifo") == COUNT
            assert self.container is not None
            assert self.conn is not None
            self.container.create_receiver(self.conn, "fifo")

    def on_message(self, event: Any) -> None:
        assert event.message.properties == {"seq": event.message.body}
        self.received.append(event.message.body)
        if len(self.received) == COUNT:
            self.finish()

    def describe(self) -> str:
        return f"sent {self.sent}, accepted {self.accepted}, received {len(self.received)}"


@pytest.mark.parametrize("receive_while_sending", [False, True], ids=["stored-first", "concurrent"])
def test_thousand_messages_keep_fifo_order(broker: ThreadedBroker, receive_while_sending: bool) -> None:
    scenario = FifoOrder(broker.url, broker, receive_while_sending=receive_while_sending)
    run(scenario)
    assert scenario.received == list(range(COUNT))
    assert queue_stats(broker, "fifo") == (0, 0)


# -- large messages ------------------------------------------------------------------------------------
BIG = bytes(range(251)) * (5 * 1024 * 1024 // 251 + 1)  # a little over 5 MiB, no repeating 2^k pattern


def _transfer_frames(trace: str, direction: str) -> int:
    return len(re.findall(rf"^\[\d+\]:\d+ {direction} @transfer\(20\)", trace, flags=re.MULTILINE))


def test_five_mebibyte_message_travels_in_many_frames_both_ways(capfd: pytest.CaptureFixture[str]) -> None:
    with run_in_thread({"server": {"port": 0}, "trace_frames": True}) as broker:
        # the client announces a 16 KiB max-frame-size, so the broker must split what it sends
        conn = BlockingConnection(broker.url, timeout=BLOCKING_TIMEOUT, max_frame_size=16384)
        try:
            conn.create_sender("big").send(Message(body=BIG, inferred=True, subject="big"))
            receiver = conn.create_receiver("big")
            got = receiver.receive()
            receiver.accept()
        finally:
            conn.close()
        trace = capfd.readouterr().err
    assert got.subject == "big"
    assert len(as_bytes(got.body)) == len(BIG)
    assert as_bytes(got.body) == BIG
    # in: at most 64 KiB frames (the broker's max-frame-size); out: at most 16 KiB frames
    assert _transfer_frames(trace, "<-") >= len(BIG) // 65536
    assert _transfer_frames(trace, "->") >= len(BIG) // 16384


def test_five_mebibyte_message_with_default_frame_sizes(broker: ThreadedBroker) -> None:
    with blocking_connection(broker) as conn:
        conn.create_sender("big").send(Message(body=BIG, inferred=True))
        assert queue_depth(broker, "big") == 1
        receiver = conn.create_receiver("big")
        got = receiver.receive()
        receiver.accept()
    assert as_bytes(got.body) == BIG
    assert queue_stats(broker, "big") == (0, 0)


class SmallSessionWindow(Scenario):
    """A session whose incoming capacity holds two frames: the broker must stop at the session's
    incoming-window and resume on each session flow (§2.5.6). Partial deliveries are read as they
    come, which is what lets proton reopen the window."""

    def __init__(self, url: str, expected: int) -> None:
        super().__init__(url, raw_receive=True)
        self.expected = expected
        self.received: list[bytes] = []
        self.partial = bytearray()

    def setup(self, container: Container) -> None:
        session = self.connect().session()
        session.incoming_capacity = 65536  # with proton's 32 KiB frames: an incoming-window of 2
        session.open()
        receiver = session.receiver("small-window")
        receiver.source.address = "small-window"
        receiver.open()
        receiver.flow(self.expected)

    def on_delivery(self, event: Any) -> None:
        delivery = event.delivery
        self.partial += event.link.recv(delivery.pending) or b""
        if delivery.partial:
            return
        self.received.append(bytes(self.partial))
        self.partial.clear()
        delivery.update(Delivery.ACCEPTED)
        delivery.settle()
        if len(self.received) == self.expected:
            self.finish()

    def describe(self) -> str:
        return f"received {len(self.received)} of {self.expected}, {len(self.partial)} bytes of the next"


def test_large_messages_through_a_small_session_window(broker: ThreadedBroker) -> None:
    large = Message(body=BIG[: 2 * 1024 * 1024], inferred=True)
    messages = [large, *(Message(body=i) for i in range(50)), large]
    send_messages(broker, "small-window", messages)
    scenario = SmallSessionWindow(broker.url, len(messages))
    run(scenario)
    assert scenario.received == [encode(m) for m in messages]
    assert queue_stats(broker, "small-window") == (0, 0)


# -- credit and drain -----------------------------------------------------------------------------------
class CreditAndDrain(Scenario):
    """With 5 messages stored: no credit gets nothing; flow(3) gets exactly 3; drain(10) gets the other 2
    and ends with credit 0; a drain on the now empty queue completes at once with credit 0."""

    def __init__(self, url: str, broker: ThreadedBroker) -> None:
        super().__init__(url, prefetch=0)  # no automatic credit: this scenario grants it by hand
        self.broker = broker
        self.received: list[int] = []
        self.stage = "attach"
        self.drained: list[int] = []

    def setup(self, container: Container) -> None:
        container.create_receiver(self.connect(), "credit")

    def on_link_opened(self, event: Any) -> None:
        self.stage = "no-credit"
        receiver = event.receiver
        assert receiver.credit == 0

        def check_nothing_came() -> None:
            assert self.received == []
            assert queue_stats(self.broker, "credit") == (5, 0)
            self.stage = "flow-3"
            receiver.flow(3)

        self.after(QUIET_PERIOD, check_nothing_came)

    def on_message(self, event: Any) -> None:
        receiver = event.receiver
        self.received.append(event.message.body)
        if self.stage == "flow-3" and len(self.received) == 3:

            def check_three_only() -> None:
                assert self.received == [0, 1, 2]
                assert receiver.credit == 0
                assert queue_stats(self.broker, "credit") == (2, 0)  # 3 accepted (auto_accept), 2 left
                self.stage = "drain"
                receiver.drain(10)

            self.after(QUIET_PERIOD, check_three_only)

    def on_link_flow(self, event: Any) -> None:
        receiver = event.link
        if receiver.draining() or receiver.credit:
            return
        if self.stage == "drain":
            # the broker sent what it had, then used up the rest of the credit (§2.6.7)
            assert self.received == [0, 1, 2, 3, 4]
            self.drained.append(receiver.drained())
            self.stage = "drain-empty"
            receiver.drain(4)
        elif self.stage == "drain-empty":
            assert self.received == [0, 1, 2, 3, 4]
            self.drained.append(receiver.drained())
            self.stage = "done"
            self.finish()

    def describe(self) -> str:
        return f"stage {self.stage}, received {self.received}, drained {self.drained}"


def test_credit_and_drain(broker: ThreadedBroker) -> None:
    send_messages(broker, "credit", [Message(body=i) for i in range(5)])
    scenario = CreditAndDrain(broker.url, broker)
    run(scenario)
    assert scenario.drained == [8, 4]
    assert queue_stats(broker, "credit") == (0, 0)


def test_blocking_receiver_credit_and_drain(broker: ThreadedBroker) -> None:
    send_messages(broker, "blocking-credit", [Message(body=i) for i in range(4)])
    with blocking_connection(broker) as conn:
        receiver = conn.create_receiver("blocking-credit", credit=0)
        fetcher = receiver.fetcher
        assert fetcher is not None
        with pytest.raises(Timeout):
            conn.wait(lambda: fetcher.has_message > 0, timeout=QUIET_PERIOD)
        assert queue_depth(broker, "blocking-credit") == 4

        receiver.flow(3)
        conn.wait(lambda: fetcher.has_message == 3)
        assert receiver.credit == 0
        assert queue_stats(broker, "blocking-credit") == (1, 3)

        receiver.drain(5)
        conn.wait(lambda: not receiver.draining() and receiver.credit == 0, msg="drain completes")
        assert fetcher.has_message == 4
        assert receiver.drained() == 4
        for expected in range(4):
            assert receiver.receive().body == expected
            receiver.accept()
        wait_for(lambda: queue_stats(broker, "blocking-credit") == (0, 0), "4 accepted", conn=conn)

        # nothing left: the drain completes at once. (BlockingReceiver.receive() with no credit left
        # grants one, so the credit drained is what remained plus the 3 added here.)
        outstanding = receiver.credit
        receiver.drain(3)
        conn.wait(lambda: not receiver.draining() and receiver.credit == 0, msg="empty drain completes")
        assert receiver.drained() == outstanding + 3
        assert fetcher.has_message == 0
