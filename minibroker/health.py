"""``minibroker check``: is a broker answering AMQP at this URL? (Docker HEALTHCHECK, CI wait step)

It connects, does SASL ANONYMOUS when the broker asks for SASL, sends ``open`` and waits for the broker's
``open``: exit 0 when it arrives within the time limit (one second by default), 1 otherwise. It needs no
client library: the frames come from our own codec.
"""

from __future__ import annotations

import argparse
import socket
import sys
import time
from collections.abc import Sequence
from urllib.parse import urlsplit

from minibroker.amqp import codec
from minibroker.amqp.definitions import Close, Open, SaslInit, SaslMechanisms, SaslOutcome
from minibroker.amqp.framing import AMQP_HEADER, FRAME_HEADER, SASL_FRAME, SASL_HEADER, encode_frame
from minibroker.amqp.types import DecodeError, Symbol

DEFAULT_URL = "amqp://127.0.0.1:5672"


class NotHealthy(Exception):
    """The broker did not answer as an AMQP 1.0 broker should."""


class _Reader:
    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.buf = b""

    def take(self, n: int) -> bytes:
        while len(self.buf) < n:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise NotHealthy("no answer in time")
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                raise NotHealthy("no answer in time") from None
            if not chunk:
                raise NotHealthy("the connection was closed")
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def performative(self) -> object:
        while True:
            size, doff, _type, _channel = FRAME_HEADER.unpack(self.take(8))
            if size < 8 or doff < 2:
                raise NotHealthy("malformed frame")
            body = self.take(size - 8)[doff * 4 - 8 :]
            if body:  # skip heartbeats
                try:
                    return codec.decode(body)[0]
                except DecodeError as exc:
                    raise NotHealthy(f"undecodable frame: {exc}") from None


def check(url: str = DEFAULT_URL, timeout: float = 1.0) -> None:
    """Raise ``NotHealthy`` unless the broker at ``url`` answers ``open`` within ``timeout`` seconds."""
    parts = urlsplit(url if "://" in url else f"amqp://{url}")
    host = parts.hostname or "127.0.0.1"
    port = parts.port or 5672
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            reader = _Reader(sock, deadline)
            sock.sendall(SASL_HEADER)
            header = reader.take(8)
            if header == SASL_HEADER:
                if not isinstance(reader.performative(), SaslMechanisms):
                    raise NotHealthy("expected sasl-mechanisms")
                sock.sendall(encode_frame(0, SaslInit(mechanism=Symbol("ANONYMOUS")), frame_type=SASL_FRAME))
                outcome = reader.performative()
                if not isinstance(outcome, SaslOutcome) or outcome.code != 0:
                    raise NotHealthy("SASL ANONYMOUS was refused")
                sock.sendall(AMQP_HEADER)
                header = reader.take(8)
            if header != AMQP_HEADER:
                raise NotHealthy(f"unexpected protocol header {header!r}")
            sock.sendall(encode_frame(0, Open(container_id="minibroker-check", hostname=host)))
            if not isinstance(reader.performative(), Open):
                raise NotHealthy("expected open")
            sock.sendall(encode_frame(0, Close()))
    except OSError as exc:
        raise NotHealthy(f"cannot connect to {host}:{port}: {exc}") from None


def main(argv: Sequence[str]) -> int:
    """``minibroker check [--url URL] [--timeout SECONDS]``: 0 if healthy, 1 if not."""
    parser = argparse.ArgumentParser(prog="minibroker check", description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=DEFAULT_URL, help=f"broker to check (default {DEFAULT_URL})")
    parser.add_argument("--timeout", type=float, default=1.0, help="seconds to wait (default 1)")
    args = parser.parse_args(argv)
    try:
        check(args.url, args.timeout)
    except NotHealthy as exc:
        print(f"minibroker check: {args.url}: not healthy: {exc}", file=sys.stderr)
        return 1
    print(f"minibroker check: {args.url}: ok")
    return 0
