"""The AMQP 0-9-1 gateway of the real server against clients that misbehave at the socket: a publisher or a consumer
that does not read (what the gateway buffers stays bounded, measured on the broker's own objects), a socket dropped
mid-content, channels churned by the hundred, a silent client past its heartbeat, logins, vhosts and TLS."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from proton import Message
from proton.utils import BlockingConnection

from minibroker.amqp091 import definitions as d
from minibroker.amqp091.codec import encode_table
from minibroker.amqp091.frames import HEARTBEAT_BYTES, PROTOCOL_HEADER, MethodFrame, encode_content
from minibroker.gateway091.connection import Gateway
from minibroker.server.app import RunningBroker
from minibroker.testing.thread import ThreadedBroker, run_in_thread
from tests.amqp091.peer import SocketPeer

pytestmark = pytest.mark.timeout(60)

BOUND = 4 << 20
"""What a gateway may hold buffered for one client that does not read (its hold point is 1 MiB; room for a read's
worth of work past it)."""


def gateways(broker: ThreadedBroker) -> list[Gateway]:
    def find(running: RunningBroker) -> list[Gateway]:
        return [task.wire for task in running._server.tasks if isinstance(task.wire, Gateway)]

    return broker.call(find)


def buffered(broker: ThreadedBroker) -> int:
    """Bytes the broker's gateways hold for their clients or the broker: 0-9-1 output not yet written, the inner
    connection's output not yet taken, the in-process client's frames not yet handed over or waiting for credit."""

    def measure(running: RunningBroker) -> int:
        total = 0
        for task in running._server.tasks:
            wire = task.wire
            if isinstance(wire, Gateway):
                client = wire.client
                held = sum(len(f) for s in client._sessions.values() for w in s.waiting for f in w.frames)
                total += wire.engine.output_size + wire.inner.output_size + len(client._out) + held
        return total

    return broker.call(measure)


def small_buffer_socket(broker: ThreadedBroker) -> socket.socket:
    """A client socket that takes little from the network for itself (so the broker's side fills up)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect((broker.host, broker.port))
    return sock


def publishes(queue: str, bodies: Iterator[bytes], channel: int = 1) -> bytes:
    return b"".join(
        encode_content(channel, d.BasicPublish(routing_key=queue), d.BasicProperties(), body, 131072) for body in bodies
    )


# -- clients that do not read -------------------------------------------------------------------------------------
@pytest.mark.parametrize("mandatory", [False, True], ids=["confirms", "returns"])
def test_a_publisher_that_does_not_read(minibroker: ThreadedBroker, mandatory: bool) -> None:
    """12 MiB (three times ``BOUND``) published by a client that reads nothing: in confirm mode (small acks), or
    mandatory to no queue (each publish comes back whole as a basic.return). The gateway's buffers stay bounded all
    along (once they are full the broker stops reading the client, as RabbitMQ's TCP back-pressure does), and once
    the client reads, every publish is answered."""
    body = b"x" * 4096
    batches = (12 << 20) // (len(body) * 500)
    total = batches * 500
    key = "nowhere" if mandatory else "q"
    with SocketPeer(minibroker.host, minibroker.port, sock=small_buffer_socket(minibroker), timeout=20) as peer:
        peer.handshake()
        peer.channel(1)
        peer.call(1, d.QueueDeclare(queue="q"), d.QueueDeclareOk)
        peer.call(1, d.ConfirmSelect(), d.ConfirmSelectOk)
        batch = b"".join(
            encode_content(1, d.BasicPublish(routing_key=key, mandatory=mandatory), d.BasicProperties(), body, 131072)
            for _ in range(500)
        )
        errors: list[BaseException] = []

        def write() -> None:
            try:
                for _ in range(batches):
                    peer.send(batch)
            except BaseException as exc:
                errors.append(exc)

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        peak = 0
        deadline = time.monotonic() + 5  # (with returns to read the writer blocks: the broker stopped reading)
        while writer.is_alive() and time.monotonic() < deadline:
            peak = max(peak, buffered(minibroker))
            writer.join(0.05)
        assert peak < BOUND
        seen = returned = 0
        while seen < total:
            frame = peer.frame(timeout=20)
            assert isinstance(frame, MethodFrame), frame
            if isinstance(frame.method, d.BasicReturn):
                assert peer.frame().body_size == len(body)  # type: ignore[union-attr]
                assert len(peer.frame().payload) == len(body)  # type: ignore[union-attr]
                returned += 1
                continue
            ack = frame.method
            assert isinstance(ack, d.BasicAck), frame
            assert ack.delivery_tag > seen
            assert ack.multiple or ack.delivery_tag == seen + 1
            seen = ack.delivery_tag
        writer.join(20)
        assert not errors
        assert (seen, returned) == (total, total if mandatory else 0)
        expected = 0 if mandatory else total
        assert peer.call(1, d.QueueDeclare(queue="q", passive=True), d.QueueDeclareOk).message_count == expected


def test_a_consumer_that_does_not_read_is_held_back_then_served(minibroker: ThreadedBroker) -> None:
    """8 MiB of messages (twice ``BOUND``) and a no-ack consumer that reads nothing: the broker stops sending (the
    gateway's buffers bounded, the queue keeps the rest), and every message arrives, in order, once the client
    reads."""
    total = 8000
    padding = b"x" * 1018
    with SocketPeer(minibroker.host, minibroker.port, timeout=60) as producer:
        producer.handshake()
        producer.channel(1)
        producer.call(1, d.QueueDeclare(queue="q"), d.QueueDeclareOk)
        producer.send(publishes("q", (b"%06d" % n + padding for n in range(total))))
        assert producer.call(1, d.QueueDeclare(queue="q", passive=True), d.QueueDeclareOk).message_count == total
    with SocketPeer(minibroker.host, minibroker.port, sock=small_buffer_socket(minibroker), timeout=30) as peer:
        peer.handshake()
        peer.channel(1)
        peer.call(1, d.BasicConsume(queue="q", consumer_tag="c", no_ack=True), d.BasicConsumeOk)
        # the broker fills what it may, then stops: the queue keeps the rest
        minibroker.wait_for(lambda: buffered(minibroker) > 0)
        stalls = 0
        last = -1
        deadline = time.monotonic() + 10
        while stalls < 5 and time.monotonic() < deadline:
            depth = minibroker.queue("q").stats().ready
            stalls = stalls + 1 if depth == last else 0
            last = depth
            assert buffered(minibroker) < BOUND
            time.sleep(0.1)
        assert stalls == 5
        assert 0 < last < total
        for n in range(total):
            deliver, _, body = peer.content(1, d.BasicDeliver)
            assert (body, deliver.delivery_tag) == (b"%06d" % n + padding, n + 1)
    assert minibroker.queue("q").stats().ready == 0


def test_a_connection_dropped_mid_content_loses_nothing_confirmed(minibroker: ThreadedBroker) -> None:
    with SocketPeer(minibroker.host, minibroker.port) as peer:
        peer.handshake()
        peer.channel(1)
        peer.call(1, d.QueueDeclare(queue="q", durable=True), d.QueueDeclareOk)
        peer.call(1, d.ConfirmSelect(), d.ConfirmSelectOk)
        for n in range(10):
            peer.publish(1, b"m%d" % n, routing_key="q", properties=d.BasicProperties(delivery_mode=2))
        seen = 0
        while seen < 10:
            seen = peer.expect(1, d.BasicAck).delivery_tag
        whole = encode_content(1, d.BasicPublish(routing_key="q"), d.BasicProperties(), b"y" * 10000, 131072)
        peer.send(whole[: len(whole) - 5000])  # method, header and half the body
    minibroker.wait_for(lambda: not gateways(minibroker))
    stats = minibroker.queue("q").stats()
    assert (stats.ready, stats.acquired) == (10, 0)
    with SocketPeer(minibroker.host, minibroker.port) as peer:
        peer.handshake()
        peer.channel(1)
        for n in range(10):
            peer.method(1, d.BasicGet(queue="q", no_ack=True))
            assert peer.content(1, d.BasicGetOk)[2] == b"m%d" % n
        peer.call(1, d.BasicGet(queue="q"), d.BasicGetEmpty)


def test_channels_opened_and_closed_by_the_hundred_leave_nothing_behind(minibroker: ThreadedBroker) -> None:
    with SocketPeer(minibroker.host, minibroker.port) as peer:
        peer.handshake()
        peer.channel(1)
        peer.call(1, d.QueueDeclare(queue="q"), d.QueueDeclareOk)
        peer.call(1, d.QueueDeclare(queue="idle"), d.QueueDeclareOk)
        for _ in range(3):
            for number in range(2, 202):
                peer.channel(number)
                peer.publish(number, b"m", routing_key="q")
                peer.method(number, d.BasicGet(queue="q"))
                peer.content(number, d.BasicGetOk)  # unacked: back to the queue when the channel closes
                peer.call(number, d.BasicConsume(queue="idle", consumer_tag="c"), d.BasicConsumeOk)
                if number % 3 == 0:  # (at most 100 transactions per connection, as for an AMQP 1.0 client)
                    peer.call(number, d.TxSelect(), d.TxSelectOk)
                    peer.publish(number, b"never", routing_key="q")  # rolled back by the close
            for number in range(2, 202):
                peer.method(number, d.ChannelClose(200, "bye", 0, 0))
                while True:
                    frame = peer.frame()
                    if getattr(frame, "method", None) == d.ChannelCloseOk() and frame.channel == number:
                        break
            (info,) = minibroker.connections
            minibroker.wait_for(lambda: minibroker.connections[0].sessions == 1)
            (info,) = minibroker.connections
            assert (info.sessions, info.links) == (1, 0)  # channel 1 alone, which never used a link
            stats = minibroker.queue("q").stats()
            assert (stats.acquired, stats.consumers) == (0, 0)
            assert minibroker.queue("idle").stats().consumers == 0
            assert minibroker.transactions == []
        assert peer.call(1, d.QueueDeclare(queue="q", passive=True), d.QueueDeclareOk).message_count == 600


# -- heartbeats ---------------------------------------------------------------------------------------------------
def test_a_silent_client_is_dropped_after_two_heartbeats(minibroker: ThreadedBroker) -> None:
    """A client that asked for heartbeats every second and then says nothing is dropped after two silent intervals
    (the spec's "two heartbeat periods"; RabbitMQ closes the socket); clients without heartbeats, 0-9-1 or AMQP 1.0,
    stay."""
    proton_client = BlockingConnection(minibroker.url, timeout=10)
    try:
        with (
            SocketPeer(minibroker.host, minibroker.port) as quiet,
            SocketPeer(minibroker.host, minibroker.port) as calm,
        ):
            assert quiet.handshake(heartbeat=1).heartbeat == 60
            calm.handshake(heartbeat=0)
            calm.channel(1)
            started = time.monotonic()
            with pytest.raises(EOFError):
                quiet.wait_for_frames(timeout=5)
            elapsed = time.monotonic() - started
            assert 1.5 <= elapsed <= 3.5
            calm.call(1, d.QueueDeclare(queue="q"), d.QueueDeclareOk)
            proton_client.create_sender("q").send(Message(body="m"))
            assert calm.call(1, d.QueueDeclare(queue="q", passive=True), d.QueueDeclareOk).message_count == 1
            assert len(minibroker.connections) == 2
    finally:
        proton_client.close()


def test_a_client_sending_heartbeats_stays(minibroker: ThreadedBroker) -> None:
    with SocketPeer(minibroker.host, minibroker.port) as peer:
        peer.handshake(heartbeat=1)
        peer.channel(1)
        for _ in range(8):
            peer.send(HEARTBEAT_BYTES)
            with pytest.raises(TimeoutError):
                peer.frame(timeout=0.5)  # (the broker's own heartbeats are skipped)
        peer.call(1, d.QueueDeclare(queue="q"), d.QueueDeclareOk)


# -- logins, vhosts, TLS ------------------------------------------------------------------------------------------
DELAY = 0.3


@pytest.fixture
def secured() -> Iterator[ThreadedBroker]:
    with run_in_thread(
        {"server": {"port": 0}, "auth": {"failure_delay": DELAY, "users": {"alice": "secret"}}}
    ) as running:
        yield running


def test_a_wrong_password_is_403_after_the_failure_delay(secured: ThreadedBroker) -> None:
    with SocketPeer(secured.host, secured.port) as peer:
        peer.send(PROTOCOL_HEADER)
        peer.expect(0, d.ConnectionStart)
        started = time.monotonic()
        peer.method(0, d.ConnectionStartOk({}, "PLAIN", b"\0alice\0wrong", "en_US"))
        close = peer.expect(0, d.ConnectionClose)
        assert time.monotonic() - started >= DELAY * 0.9
        assert (close.reply_code, close.class_id, close.method_id) == (403, 0, 0)
        assert close.reply_text.startswith("ACCESS_REFUSED - ")
        peer.method(0, d.ConnectionCloseOk())
        peer.wait_eof()
    with SocketPeer(secured.host, secured.port) as peer:
        peer.handshake("alice", "secret")
        peer.channel(1)
        peer.call(1, d.QueueDeclare(queue="q"), d.QueueDeclareOk)


def test_an_unknown_user_is_403(secured: ThreadedBroker) -> None:
    with SocketPeer(secured.host, secured.port) as peer:
        peer.send(PROTOCOL_HEADER)
        peer.expect(0, d.ConnectionStart)
        peer.method(
            0, d.ConnectionStartOk({}, "AMQPLAIN", encode_table({"LOGIN": "mallory", "PASSWORD": "x"})[4:], "en_US")
        )
        assert peer.expect(0, d.ConnectionClose).reply_code == 403


def test_the_vhost_is_a_namespace(minibroker: ThreadedBroker) -> None:
    other = minibroker.create_namespace()
    with SocketPeer(minibroker.host, minibroker.port) as peer:
        peer.handshake(vhost=other.namespace_name)
        peer.channel(1)
        peer.call(1, d.QueueDeclare(queue="there"), d.QueueDeclareOk)
        peer.publish(1, b"m", routing_key="there")
        assert peer.call(1, d.QueueDeclare(queue="there", passive=True), d.QueueDeclareOk).message_count == 1
    assert other.queue("there").stats().ready == 1
    assert not minibroker.queue("there").exists
    other.drop_namespace()


def test_an_unknown_vhost_is_530(minibroker: ThreadedBroker) -> None:
    with SocketPeer(minibroker.host, minibroker.port) as peer:
        peer.send(PROTOCOL_HEADER)
        peer.expect(0, d.ConnectionStart)
        peer.method(0, d.ConnectionStartOk({}, "PLAIN", b"\0guest\0guest", "en_US"))
        tune = peer.expect(0, d.ConnectionTune)
        peer.method(0, d.ConnectionTuneOk(tune.channel_max, tune.frame_max, 0))
        peer.method(0, d.ConnectionOpen("nowhere"))
        peer.closed(530, "NOT_ALLOWED - vhost nowhere not found", 10, 40)  # (rabbit_reader names the method)


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    folder = tmp_path_factory.mktemp("pki091")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    ca_file, cert_file, key_file = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    ca.cert_pem.write_to_path(str(ca_file))
    for i, blob in enumerate(server.cert_chain_pems):
        blob.write_to_path(str(cert_file), append=i > 0)
    server.private_key_pem.write_to_path(str(key_file))
    return ca_file, cert_file, key_file


def test_a_0_9_1_client_over_tls(tls_files: tuple[Path, Path, Path]) -> None:
    ca_file, cert_file, key_file = tls_files
    config: dict[str, Any] = {
        "server": {"port": 0},
        "tls": {"enabled": True, "port": 0, "cert_file": str(cert_file), "key_file": str(key_file)},
    }
    with run_in_thread(config) as broker:
        url = broker.tls_url
        assert url is not None
        port = int(url.rsplit(":", 1)[1])
        context = ssl.create_default_context(cafile=str(ca_file))
        raw = socket.create_connection((broker.host, port), timeout=5)
        with SocketPeer(broker.host, port, sock=context.wrap_socket(raw, server_hostname="localhost")) as peer:
            peer.handshake()
            peer.channel(1)
            peer.call(1, d.QueueDeclare(queue="q"), d.QueueDeclareOk)
            peer.publish(1, b"secret", routing_key="q")
            peer.method(1, d.BasicGet(queue="q", no_ack=True))
            assert peer.content(1, d.BasicGetOk)[2] == b"secret"
