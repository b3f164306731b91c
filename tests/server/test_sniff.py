"""One port, two protocols: the first octets of a connection decide who serves it (``server/sniff.py``)."""

from __future__ import annotations

import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minibroker.amqp.framing import AMQP_HEADER, SASL_HEADER
from minibroker.amqp091.frames import HeaderKind, read_protocol_header
from minibroker.server.sniff import Protocol, protocol_of
from minibroker.testing.thread import ThreadedBroker

AMQP_091_HEADER = b"AMQP\x00\x00\x09\x01"
TLS_HEADER = b"AMQP\x02\x01\x00\x00"


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        (b"", None),
        (b"A", None),
        (b"AMQP", None),
        (b"AMQP\x00", None),
        (b"AMQP\x01", None),
        (AMQP_HEADER[:6], Protocol.AMQP_1_0),
        (SASL_HEADER[:5], Protocol.AMQP_1_0),
        (TLS_HEADER[:5], Protocol.AMQP_1_0),
        (AMQP_091_HEADER[:6], Protocol.AMQP_0_9_1),
        (AMQP_091_HEADER, Protocol.AMQP_0_9_1),
        (b"AMQP\x01\x01\x00\x09", Protocol.AMQP_0_9_1),  # the 0-9 form RabbitMQ serves as 0-9-1
        (b"AMQP\x00\x00\x08\x00", Protocol.AMQP_0_9_1),  # 0-8: the 0-9-1 engine answers its header and closes
        (b"GET / HTTP/1.1\r\n", Protocol.AMQP_1_0),  # garbage: the 1.0 engine answers as before
        (b"\x16\x03\x01", Protocol.AMQP_1_0),  # a TLS hello on the plain port
        (b"AMQX", Protocol.AMQP_1_0),
    ],
)
def test_protocol_of(prefix: bytes, expected: Protocol | None) -> None:
    assert protocol_of(prefix) is expected


@given(st.binary(min_size=6, max_size=16))
def test_six_octets_always_decide_and_agree_with_the_header_verdict(data: bytes) -> None:
    """Whatever the 0-9-1 reading of a header serves as 0-9-1 reaches the 0-9-1 side; AMQP 1.0 never does."""
    decided = protocol_of(data)
    assert decided is not None
    assert all(protocol_of(data[:n]) in (None, decided) for n in range(len(data)))  # never changes its mind
    if len(data) >= 8 and read_protocol_header(data[:8]).kind is HeaderKind.AMQP_0_9_1:
        assert decided is Protocol.AMQP_0_9_1
    if len(data) >= 8 and read_protocol_header(data[:8]).kind is HeaderKind.AMQP_1_0:
        assert decided is Protocol.AMQP_1_0


def test_a_header_sent_one_octet_at_a_time_is_served(minibroker_proc: ThreadedBroker) -> None:
    """The octets read to decide reach the engine unread (``PrefixedStream``): an AMQP 1.0 client that writes
    its header an octet at a time gets the answer it always got."""
    with socket.create_connection(("127.0.0.1", minibroker_proc.port), timeout=5.0) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for octet in SASL_HEADER:
            sock.sendall(bytes([octet]))
        received = b""
        while len(received) < len(SASL_HEADER):
            chunk = sock.recv(64)
            assert chunk, "closed before answering"
            received += chunk
        assert received[:8] == SASL_HEADER
