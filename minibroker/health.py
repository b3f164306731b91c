"""``minibroker check``: is a broker answering AMQP at this URL? (Docker HEALTHCHECK, CI wait step)

It connects, does SASL when the broker asks for it, sends ``open`` and waits for the broker's ``open``: exit 0
when it arrives within the time limit (one second by default), 1 otherwise. SASL is PLAIN when credentials are
given (in the URL, ``amqp://USER:PASSWORD@HOST:PORT``, percent-encoded; with ``--user``/``--password``; or in
``MINIBROKER_CHECK_USER``/``MINIBROKER_CHECK_PASSWORD``), else ANONYMOUS. Credentials are never printed: the
URL is shown with them masked. It needs no client library: the frames come from our own codec.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from urllib.parse import unquote, urlsplit

from minibroker.amqp import codec
from minibroker.amqp.definitions import Close, Open, SaslInit, SaslMechanisms, SaslOutcome
from minibroker.amqp.framing import AMQP_HEADER, FRAME_HEADER, SASL_FRAME, SASL_HEADER, encode_frame
from minibroker.amqp.types import DecodeError, Symbol

DEFAULT_URL = "amqp://127.0.0.1:5672"
USER_ENV = "MINIBROKER_CHECK_USER"
PASSWORD_ENV = "MINIBROKER_CHECK_PASSWORD"


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


def masked(url: str) -> str:
    """``url`` as it may be printed: any user and password replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = "***@" + authority.rpartition("@")[2]
    return f"{scheme}{sep}{authority}{slash}{path}"


def _credentials(url: str) -> tuple[str | None, str | None]:
    """The user and password in ``url``, percent-decoded (None where absent)."""
    try:
        parts = urlsplit(url if "://" in url else f"amqp://{url}")
        user, password = parts.username, parts.password
    except ValueError:
        return None, None
    return (None if user is None else unquote(user)), (None if password is None else unquote(password))


def check(
    url: str = DEFAULT_URL, timeout: float = 1.0, *, user: str | None = None, password: str | None = None
) -> None:
    """Raise ``NotHealthy`` unless the broker at ``url`` answers ``open`` within ``timeout`` seconds.

    With a user (here or in the URL), SASL is PLAIN with that user and password; else ANONYMOUS. The
    exception's message never holds the credentials.
    """
    try:
        parts = urlsplit(url if "://" in url else f"amqp://{url}")
        host = parts.hostname or "127.0.0.1"
        port = parts.port or 5672
    except ValueError:
        raise NotHealthy("not a valid URL") from None
    url_user, url_password = _credentials(url)
    user = url_user if user is None else user
    password = url_password if password is None else password
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            reader = _Reader(sock, deadline)
            sock.sendall(SASL_HEADER)
            header = reader.take(8)
            if header == SASL_HEADER:
                offered = reader.performative()
                if not isinstance(offered, SaslMechanisms):
                    raise NotHealthy("expected sasl-mechanisms")
                mechanism = "ANONYMOUS" if user is None else "PLAIN"
                if mechanism not in [str(m) for m in offered.sasl_server_mechanisms or ()]:
                    raise NotHealthy(f"the broker does not offer SASL {mechanism}")
                if user is None:
                    init = SaslInit(mechanism=Symbol("ANONYMOUS"))
                else:  # RFC 4616: authzid NUL authcid NUL passwd
                    response = b"\x00" + user.encode() + b"\x00" + (password or "").encode()
                    init = SaslInit(mechanism=Symbol("PLAIN"), initial_response=response)
                sock.sendall(encode_frame(0, init, frame_type=SASL_FRAME))
                outcome = reader.performative()
                if not isinstance(outcome, SaslOutcome) or outcome.code != 0:
                    refused = (
                        "SASL ANONYMOUS was refused"
                        if user is None
                        else "SASL PLAIN was refused (wrong user or password?)"
                    )
                    raise NotHealthy(refused)
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


def main(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> int:
    """``minibroker check [--url URL] [--user USER] [--password PASSWORD] [--timeout SECONDS]``: 0 if healthy,
    1 if not."""
    environ = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(prog="minibroker check", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--url", default=DEFAULT_URL, help=f"broker to check, amqp://[USER:PASSWORD@]HOST:PORT (default {DEFAULT_URL})"
    )
    parser.add_argument("--user", help=f"log in with SASL PLAIN as USER (or set {USER_ENV})")
    parser.add_argument(
        "--password", help=f"the password for --user (better: set {PASSWORD_ENV}, which other users cannot see)"
    )
    parser.add_argument("--timeout", type=float, default=1.0, help="seconds to wait (default 1)")
    args = parser.parse_args(argv)
    shown = masked(args.url)
    # each credential from the options, else the URL, else the environment
    url_user, url_password = _credentials(args.url)
    user = next((v for v in (args.user, url_user, environ.get(USER_ENV)) if v is not None), None)
    password = next((v for v in (args.password, url_password, environ.get(PASSWORD_ENV)) if v is not None), None)
    if password is not None and user is None:
        print(f"minibroker check: {shown}: a password needs a user (--user or {USER_ENV})", file=sys.stderr)
        return 2
    try:
        check(args.url, args.timeout, user=user, password=password)
    except NotHealthy as exc:
        print(f"minibroker check: {shown}: not healthy: {exc}", file=sys.stderr)
        return 1
    print(f"minibroker check: {shown}: ok")
    return 0
