"""Settlement modes (Part 2 §2.8.2 snd-settle-mode, §2.8.3 rcv-settle-mode) on both kinds of link.

Every combination a client may ask for is attached with python-qpid-proton, on a link the client sends on
(the broker receives) and on one it receives on (the broker sends). The broker echoes the modes in its
attach and honours them: settled means no disposition is awaited, unsettled means an outcome is given,
mixed lets the sender choose per delivery (the broker, as sender, chooses unsettled: at-least-once), and
rcv-settle-mode second means the receiver settles only after the sender has.
"""

from __future__ import annotations

import pytest
from proton import Delivery, Link, Message
from proton.reactor import AtLeastOnce, AtMostOnce, LinkOption
from proton.utils import BlockingConnection

from minibroker.broker.core import Broker
from minibroker.testing.thread import ThreadedBroker
from tests.integration.helpers import queue_stats, wait_for
from tests.integration.proton_options import SettleModes, close, connection, read_broker, take

SND_MODES = {"settled": Link.SND_SETTLED, "unsettled": Link.SND_UNSETTLED, "mixed": Link.SND_MIXED}
RCV_MODES = {"first": Link.RCV_FIRST, "second": Link.RCV_SECOND}
COUNT = 4


def unsettled_in_broker(broker: ThreadedBroker) -> tuple[int, int]:
    """(incoming, outgoing) deliveries the broker's sessions still hold unsettled."""

    def read(core: Broker) -> tuple[int, int]:
        sessions = [s for conn in core.connections for s in conn.sessions.values()]
        return sum(len(s.incoming_unsettled) for s in sessions), sum(len(s.outgoing_unsettled) for s in sessions)

    return read_broker(broker, read)


def fill(conn: BlockingConnection, address: str, count: int) -> None:
    sender = conn.create_sender(address, name=f"fill-{address}")
    for i in range(count):
        sender.send(Message(body=i))
    close(sender)


@pytest.mark.parametrize("rcv", RCV_MODES)
@pytest.mark.parametrize("snd", SND_MODES)
def test_client_sender(broker: ThreadedBroker, snd: str, rcv: str) -> None:
    """The client sends, the broker receives: presettled transfers get no disposition; unsettled ones are
    accepted, and settled by the broker at once (first) or only after the client settled (second)."""
    with connection(broker) as conn:
        sender = conn.create_sender("settle-in", options=SettleModes(SND_MODES[snd], RCV_MODES[rcv]))
        link = sender.link
        assert (link.remote_snd_settle_mode, link.remote_rcv_settle_mode) == (SND_MODES[snd], RCV_MODES[rcv])

        presettled = {"settled": [True] * COUNT, "unsettled": [False] * COUNT, "mixed": [True, False] * (COUNT // 2)}
        awaited: list[Delivery] = []
        for i, settle_now in enumerate(presettled[snd]):
            delivery = link.send(Message(body=i))  # proton settles it itself in mode settled
            assert isinstance(delivery, Delivery)
            if settle_now and snd == "mixed":
                delivery.settle()  # before its transfer is written: it goes out settled
            if not settle_now:
                awaited.append(delivery)
        wait_for(lambda: queue_stats(broker, "settle-in") == (COUNT, 0), "every message to arrive", conn=conn)
        conn.wait(lambda: all(d.remote_state for d in awaited), msg="the broker's outcomes", timeout=5)
        for delivery in awaited:
            assert delivery.remote_state == Delivery.ACCEPTED
            assert delivery.settled == (rcv == "first")  # second: the broker waits for us to settle first
        held = len(awaited) if rcv == "second" else 0
        assert unsettled_in_broker(broker) == (held, 0)
        for delivery in awaited:
            delivery.settle()
        wait_for(lambda: unsettled_in_broker(broker) == (0, 0), "the broker to forget the deliveries", conn=conn)
        assert take(conn.create_receiver("settle-in", name="check"), COUNT) == list(range(COUNT))


@pytest.mark.parametrize("rcv", RCV_MODES)
@pytest.mark.parametrize("snd", SND_MODES)
def test_client_receiver(broker: ThreadedBroker, snd: str, rcv: str) -> None:
    """The broker sends, the client receives: in mode settled the broker presettles and forgets each message;
    otherwise it waits for the outcome, and in mode second settles once the client's disposition came."""
    with connection(broker) as conn:
        fill(conn, "settle-out", COUNT)
        receiver = conn.create_receiver("settle-out", credit=COUNT, options=SettleModes(SND_MODES[snd], RCV_MODES[rcv]))
        link = receiver.link
        assert (link.remote_snd_settle_mode, link.remote_rcv_settle_mode) == (SND_MODES[snd], RCV_MODES[rcv])
        fetcher = receiver.fetcher
        assert fetcher is not None
        conn.wait(lambda: fetcher.has_message == COUNT, msg="every message", timeout=5)
        messages = [m for m, _ in fetcher.incoming]
        deliveries = [d for _, d in fetcher.incoming]
        assert [m.body for m in messages] == list(range(COUNT))

        if snd == "settled":
            assert all(d.settled for d in deliveries)  # presettled: at most once
            assert queue_stats(broker, "settle-out") == (0, 0)
            assert unsettled_in_broker(broker) == (0, 0)
            for delivery in deliveries:
                delivery.settle()
            return
        # unsettled, and mixed (the sender's choice: the broker sends unsettled, at least once)
        assert not any(d.settled for d in deliveries)
        assert queue_stats(broker, "settle-out") == (0, COUNT)
        for delivery in deliveries:
            delivery.update(Delivery.ACCEPTED)
            if rcv == "first":
                delivery.settle()
        if rcv == "second":
            conn.wait(lambda: all(d.settled for d in deliveries), msg="the broker to settle", timeout=5)
            assert all(d.remote_state == Delivery.ACCEPTED for d in deliveries)
            for delivery in deliveries:
                delivery.settle()
        wait_for(lambda: queue_stats(broker, "settle-out") == (0, 0), "the outcomes to retire the messages", conn=conn)
        assert unsettled_in_broker(broker) == (0, 0)


@pytest.mark.parametrize(
    ("option", "presettled"), [pytest.param(AtMostOnce(), True, id="AtMostOnce"), (AtLeastOnce(), False)]
)
def test_proton_reliability_options(broker: ThreadedBroker, option: LinkOption, presettled: bool) -> None:
    """proton's own AtMostOnce / AtLeastOnce options, on both kinds of link."""
    with connection(broker) as conn:
        sender = conn.create_sender("reliability", options=option)
        expected = Link.SND_SETTLED if presettled else Link.SND_UNSETTLED
        assert (sender.link.remote_snd_settle_mode, sender.link.remote_rcv_settle_mode) == (expected, Link.RCV_FIRST)
        delivery = sender.send(Message(body="one"))
        if not presettled:
            assert delivery.remote_state == Delivery.ACCEPTED
        wait_for(lambda: queue_stats(broker, "reliability") == (1, 0), "the message", conn=conn)

        receiver = conn.create_receiver("reliability", options=option)
        assert receiver.link.remote_snd_settle_mode == expected
        assert receiver.receive().body == "one"
        if not presettled:
            assert queue_stats(broker, "reliability") == (0, 1)
            receiver.accept()
        wait_for(lambda: queue_stats(broker, "reliability") == (0, 0), "the message to be consumed", conn=conn)
