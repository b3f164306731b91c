"""Output back-pressure: a peer that does not read cannot make the broker hoard output for it.

A raw-socket consumer grants 10,000 credit and stops reading while a producer posts 20,000 messages of
1 KiB. The broker must go on serving other connections, the output it queues for the stalled consumer must
stay near the engine's 1 MiB threshold, the messages must stay in the queue rather than in buffers, and the
process must not grow much beyond what the queue itself holds. When the consumer reads again it gets
everything, in order. A peer that sends frames needing answers without reading them is not read either,
and a consumer that stalls and falls silent is dropped at the idle time-out, its messages delivered again.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path
from typing import TypeVar

import pytest
from proton import Delivery, Message

from minibroker.amqp.definitions import Accepted, Close, Data, Flow, Transfer
from minibroker.server.app import RunningBroker
from minibroker.testing import frames
from minibroker.testing.peer import ScriptedPeer
from minibroker.testing.thread import ThreadedBroker, run_in_thread
from tests.integration.helpers import blocking_connection

HOST = "127.0.0.1"
COUNT = 20_000
CREDIT = 10_000
BODY_SIZE = 1024
BATCH = 500
CONSUMER = "stalled-consumer"
MiB = 1 << 20
T = TypeVar("T")


@pytest.fixture
def broker() -> Iterator[ThreadedBroker]:
    with run_in_thread({"server": {"port": 0}}) as running:
        yield running


def rss() -> int:
    """Resident set size of this process (the broker runs in one of its threads), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def poll(broker: ThreadedBroker, read: Callable[[RunningBroker], T], done: Callable[[T], bool], what: str) -> T:
    """Read broker state (in its thread) until ``done`` holds; fail naming ``what`` after 20 s."""
    deadline = time.monotonic() + 20.0
    while True:
        value = broker.call(read)
        if done(value):
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}; last seen {value!r}"
        time.sleep(0.02)


def broker_end(port: int, client: socket.socket) -> int:
    """The socket inode of the broker's end of ``client``'s connection to ``port`` (the OS's view, /proc/net/tcp;
    the broker runs in this process). Call it once the broker has accepted the connection (inode 0 before)."""
    local = client.getsockname()[1]
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        ours, theirs, inode = fields[1], fields[2], int(fields[9])
        if int(ours.split(":")[1], 16) == port and int(theirs.split(":")[1], 16) == local and inode:
            return inode
    raise AssertionError(f"no accepted broker end of 127.0.0.1:{local} -> {port} in /proc/net/tcp")


def open_sockets() -> set[int]:
    """Inodes of the sockets this process (and so the broker) holds open: the OS's view, /proc/self/fd."""
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[len("socket:[") : -1]))
    return inodes


def wait_closed(inode: int, what: str) -> None:
    """Wait until the broker has closed its socket ``inode``; fail naming ``what`` after 20 s."""
    deadline = time.monotonic() + 20.0
    while inode in open_sockets():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def output_of(running: RunningBroker, container_id: str) -> int:
    """Bytes the engine of connection ``container_id`` has queued and not yet handed to its socket."""
    (engine,) = [
        c
        for c in running.broker.connections
        if c.remote_open is not None and c.remote_open.container_id == container_id
    ]
    return engine.output_size


def consumer_output(running: RunningBroker) -> int:
    return output_of(running, CONSUMER)


def queue_counts(running: RunningBroker) -> tuple[int, int]:
    stats = running.queue("bp").stats()
    return (stats.depth, stats.acquired)


def stalled_consumer(port: int) -> ScriptedPeer:
    """Open, attach a receiver on "bp" and grant CREDIT; then the test stops reading its socket."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)  # a small window: the broker blocks soon
    sock.settimeout(5.0)
    sock.connect((HOST, port))
    peer = ScriptedPeer(sock, timeout=5.0)
    peer.open(container_id=CONSUMER)
    peer.begin(incoming_window=10 * COUNT)  # the session window is not what holds the broker back here
    peer.attach_receiver("bp", handle=0)
    peer.flow(handle=0, link_credit=CREDIT, incoming_window=10 * COUNT)
    return peer


def payload(i: int) -> bytes:
    """Message ``i``: a data section of BODY_SIZE bytes, the last four of which are ``i``."""
    return frames.message(Data(b"x" * (BODY_SIZE - 4) + i.to_bytes(4, "big")))


def produce(port: int, between_batches: Callable[[], None] | None = None, count: int = COUNT) -> None:
    """Post ``count`` pre-settled messages of BODY_SIZE bytes, in batches, without reading the answers."""
    with ScriptedPeer.connect(HOST, port) as producer:
        producer.open(container_id="producer")
        producer.begin()
        producer.attach_sender("bp", handle=0)
        producer.expect(Flow)
        # the broker tops the link's credit up as it goes, so a steady stream never runs out
        for start in range(0, count, BATCH):
            batch = b"".join(
                frames.frame(0, frames.transfer(0, i, settled=True), payload(i)) for i in range(start, start + BATCH)
            )
            producer.send_raw(batch)
            if between_batches is not None:
                between_batches()
        producer.send(Close())
        while not isinstance(producer.receive().performative, Close):
            pass  # the flows topping up credit, then the broker's close
        producer.expect_closed()


def test_stalled_consumer_does_not_make_the_broker_hoard(broker: ThreadedBroker) -> None:
    consumer = stalled_consumer(broker.port)
    try:
        baseline = rss()
        produce(broker.port)
        depth, acquired = poll(broker, queue_counts, lambda c: c[0] + c[1] == COUNT, "every message to arrive")

        # the broker stopped dispatching: most messages wait in the queue, not in buffers
        assert depth >= COUNT // 2, (depth, acquired)
        assert broker.call(consumer_output) < 2 * MiB
        time.sleep(0.2)
        assert broker.call(queue_counts) == (depth, acquired), "delivery went on to a consumer that reads nothing"
        growth = rss() - baseline
        assert growth < 50 * MiB, f"RSS grew by {growth / MiB:.1f} MiB"

        # other connections are served meanwhile
        started = time.monotonic()
        with blocking_connection(broker) as other:
            assert other.create_sender("other").send(Message(body="hi")).remote_state == Delivery.ACCEPTED
            receiver = other.create_receiver("other")
            assert receiver.receive(timeout=5).body == "hi"
            receiver.accept()
        assert time.monotonic() - started < 3.0

        # the consumer reads again and gets everything, in order
        for i in range(COUNT):
            if i == CREDIT:
                consumer.flow(handle=0, link_credit=COUNT - CREDIT, incoming_window=10 * COUNT)
            item = consumer.expect_frame(Transfer)
            assert item.performative.delivery_id == i
            assert item.payload == payload(i)
        consumer.disposition(0, COUNT - 1, state=Accepted())
        poll(broker, queue_counts, lambda c: c == (0, 0), "the queue to empty")
        consumer.close()
    finally:
        consumer.close_socket()


def test_peer_that_does_not_read_is_not_read_either(broker: ThreadedBroker) -> None:
    """Frames that need an answer (here flows with echo) from a peer that reads nothing: the broker stops
    reading it once the answers pile up, instead of buffering them without end."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.settimeout(5.0)
    sock.connect((HOST, broker.port))
    flooder = ScriptedPeer(sock, timeout=5.0)
    try:
        flooder.open(container_id="flooder")
        end = broker_end(broker.port, sock)  # (accepted by now: the broker answered the open)
        flooder.begin()
        chunk = frames.frame(0, frames.flow(echo=True)) * 1000  # 32 kB in, as much out
        sock.settimeout(0.5)
        sent = 0
        with suppress(TimeoutError):  # the broker stopped reading us
            while sent < 32 * MiB:
                sock.sendall(chunk)
                sent += len(chunk)
        time.sleep(0.3)
        queued = broker.call(lambda running: output_of(running, "flooder"))
        assert queued < 2 * MiB, (
            f"{queued / MiB:.1f} MiB queued for a peer that reads nothing ({sent / MiB:.1f} MiB in)"
        )
        # the others are served meanwhile
        with blocking_connection(broker) as other:
            assert other.create_sender("other").send(Message(body="hi")).remote_state == Delivery.ACCEPTED
    finally:
        flooder.close_socket()
    wait_closed(end, "the flooder's connection to end")


def test_stalled_consumer_is_dropped_after_the_idle_timeout() -> None:
    """A consumer that neither reads nor sends is closed at our idle time-out, and its socket dropped after
    a short grace even though it never reads our close: its messages and its connection slot come back."""
    with run_in_thread({"server": {"port": 0, "idle_timeout": 0.6}}) as broker:
        consumer = stalled_consumer(broker.port)
        end = broker_end(broker.port, consumer.sock)
        try:
            acquired = []

            def keep_alive() -> None:  # alive, but not reading
                consumer.send_raw(frames.heartbeat())
                acquired.append(broker.call(queue_counts)[1])

            produce(broker.port, keep_alive, count=COUNT // 2)
            assert max(acquired) > 0
            # now silent as well: closed at the idle time-out although it cannot even read our close
            poll(broker, queue_counts, lambda c: c == (COUNT // 2, 0), "the unsettled messages to return")
            wait_closed(end, "the connection to end")  # its socket, although it cannot even read our close
        finally:
            consumer.close_socket()
        with blocking_connection(broker) as conn:  # what it held is delivered again, the first message first
            receiver = conn.create_receiver("bp", credit=1)
            assert bytes(receiver.receive(timeout=5).body)[-4:] == (0).to_bytes(4, "big")
            receiver.accept()
