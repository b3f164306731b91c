"""``minibroker check``: is a broker answering AMQP at this URL? (Docker HEALTHCHECK, CI wait step)

It connects, does SASL when the broker asks for it, sends ``open`` and waits for the broker's ``open``: exit 0
when it arrives within the time limit (one second by default), 1 otherwise, 2 for a usage error. SASL is PLAIN
when credentials are given (in the URL, ``amqp://USER:PASSWORD@HOST:PORT``, percent-encoded; with
``--user``/``--password``; or in ``MINIBROKER_CHECK_USER``/``MINIBROKER_CHECK_PASSWORD``), else ANONYMOUS.
``amqps://`` is checked over TLS (default port 5671), verifying the broker's certificate against the system's
CAs or ``--ca-file``, or not at all with ``--insecure``; nothing is ever sent in clear text to an ``amqps`` URL.
Credentials are never printed: the URL is shown with everything before its last ``@`` masked. It needs no
client library: it speaks through the test kit's sans-IO client core (``minibroker.testing.client``).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import ssl
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

from minibroker.amqp.definitions import Close, Open, SaslMechanisms, SaslOutcome
from minibroker.amqp.framing import AMQP_HEADER, SASL_FRAME, SASL_HEADER
from minibroker.testing import frames
from minibroker.testing.client import ClientConnection, Ended, ProtocolError, ProtocolHeader
from minibroker.testing.peer import read_event

DEFAULT_URL = "amqp://127.0.0.1:5672"
PORTS = {"amqp": 5672, "amqps": 5671}
"""The schemes the check speaks, and their default ports."""
USER_ENV = "MINIBROKER_CHECK_USER"
PASSWORD_ENV = "MINIBROKER_CHECK_PASSWORD"


class NotHealthy(Exception):
    """The broker did not answer as an AMQP 1.0 broker should."""


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")


def _split_scheme(url: str) -> tuple[str, str]:
    """``url``'s scheme ("" when it has none) and the rest after ``://``."""
    scheme, sep, rest = url.partition("://")
    return (scheme, rest) if sep and _SCHEME.fullmatch(scheme) else ("", url)


def masked(url: str) -> str:
    """``url`` as it may be printed: everything before its last ``@`` (user and password) replaced by ``***``.

    The last ``@`` of the whole URL, not of the authority as a parser finds it: a password typed unencoded may
    hold ``/``, ``?`` or ``#``, which would end the authority early and leave part of it visible.
    """
    scheme, rest = _split_scheme(url)
    if "@" in rest:
        rest = "***@" + rest.rpartition("@")[2]
    return f"{scheme}://{rest}" if scheme else rest


def _parse(url: str) -> tuple[str, str, int, str | None, str | None]:
    """Scheme, host, port, user and password (percent-decoded; None where absent) of ``url``.

    Raises ``NotHealthy`` (never quoting the URL's user or password) when it is not an ``amqp`` or ``amqps``
    URL, or when its user or password holds a ``/``, ``?`` or ``#`` that is not percent-encoded.
    """
    scheme, rest = _split_scheme(url)
    scheme = scheme.lower() or "amqp"
    if scheme not in PORTS:
        raise NotHealthy(f"unsupported scheme {scheme}:// (amqp:// or amqps://)")
    try:
        parts = urlsplit(f"{scheme}://{rest}")
        if "@" in parts.path + parts.query + parts.fragment:
            raise NotHealthy(
                "not a valid URL: a user or password in it must be percent-encoded (/ as %2F, ? as %3F, # as %23)"
            )
        host = parts.hostname or "127.0.0.1"
        port = parts.port or PORTS[scheme]
        user, password = parts.username, parts.password
    except ValueError:
        raise NotHealthy("not a valid URL") from None
    return (
        scheme,
        host,
        port,
        (None if user is None else unquote(user)),
        (None if password is None else unquote(password)),
    )


def _credentials(url: str) -> tuple[str | None, str | None]:
    """The user and password in ``url``, percent-decoded (None where absent or where the URL does not parse)."""
    try:
        _scheme, _host, _port, user, password = _parse(url)
    except NotHealthy:
        return None, None
    return user, password


def _connect(scheme: str, host: str, port: int, timeout: float, tls: ssl.SSLContext | None) -> socket.socket:
    """A connected socket: for ``amqps``, with its TLS handshake done (so nothing goes out unencrypted)."""
    sock = socket.create_connection((host, port), timeout=timeout)
    if scheme != "amqps":
        return sock
    try:
        return (tls or ssl.create_default_context()).wrap_socket(sock, server_hostname=host)
    except BaseException:
        sock.close()
        raise


def tls_context(ca_file: str | None = None, *, insecure: bool = False) -> ssl.SSLContext:
    """The TLS settings for an ``amqps`` check: the broker's certificate verified (name included) against the
    system's CAs, or ``ca_file`` (a private CA) when given; not verified at all with ``insecure``."""
    context = ssl.create_default_context(cafile=ca_file)
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def check(
    url: str = DEFAULT_URL,
    timeout: float = 1.0,
    *,
    user: str | None = None,
    password: str | None = None,
    tls: ssl.SSLContext | None = None,
) -> None:
    """Raise ``NotHealthy`` unless the broker at ``url`` answers ``open`` within ``timeout`` seconds.

    With a user (here or in the URL), SASL is PLAIN with that user and password; else ANONYMOUS. An ``amqps``
    URL is checked over TLS with ``tls`` (default: ``tls_context()``, the system's CAs). The exception's message
    never holds the credentials.
    """
    scheme, host, port, url_user, url_password = _parse(url)
    user = url_user if user is None else user
    password = url_password if password is None else password
    deadline = time.monotonic() + timeout
    conn = ClientConnection()
    try:
        with _connect(scheme, host, port, timeout, tls) as sock:

            def answer() -> Any:
                """The broker's next protocol header (bytes) or performative (heartbeats skipped)."""
                while True:
                    sock.sendall(conn.data_to_send())
                    try:
                        event = read_event(conn, sock, deadline)
                    except TimeoutError:
                        raise NotHealthy("no answer in time") from None
                    except ProtocolError as exc:
                        raise NotHealthy(f"not AMQP: {exc}") from None
                    if isinstance(event, Ended):
                        raise NotHealthy("the connection was closed")
                    if isinstance(event, ProtocolHeader):
                        return event.data
                    if not event.is_heartbeat:
                        return event.performative

            conn.send_header(SASL_HEADER)
            header = answer()
            if header == SASL_HEADER:
                offered = answer()
                if not isinstance(offered, SaslMechanisms):
                    raise NotHealthy("expected sasl-mechanisms")
                mechanism = "ANONYMOUS" if user is None else "PLAIN"
                if mechanism not in [str(m) for m in offered.sasl_server_mechanisms or ()]:
                    raise NotHealthy(f"the broker does not offer SASL {mechanism}")
                init = frames.sasl_anonymous() if user is None else frames.sasl_plain(user, password or "")
                conn.send(init, frame_type=SASL_FRAME)
                outcome = answer()
                if not isinstance(outcome, SaslOutcome) or outcome.code != 0:
                    refused = (
                        "SASL ANONYMOUS was refused"
                        if user is None
                        else "SASL PLAIN was refused (wrong user or password?)"
                    )
                    raise NotHealthy(refused)
                conn.send_header(AMQP_HEADER)
                header = answer()
            if header != AMQP_HEADER:
                raise NotHealthy(f"unexpected protocol header {header!r}")
            conn.send(Open(container_id="minibroker-check", hostname=host))
            if not isinstance(answer(), Open):
                raise NotHealthy("expected open")
            conn.send(Close())
            sock.sendall(conn.data_to_send())
    except OSError as exc:
        raise NotHealthy(f"cannot connect to {host}:{port}: {exc}") from None


def main(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> int:
    """``minibroker check [--url URL] [--user USER] [--password PASSWORD] [--ca-file PATH] [--insecure]
    [--timeout SECONDS]``: 0 if healthy, 1 if not, 2 for a usage error."""
    environ = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(prog="minibroker check", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--url",
        default=DEFAULT_URL,
        help=f"broker to check, amqp[s]://[USER:PASSWORD@]HOST:PORT (default {DEFAULT_URL})",
    )
    parser.add_argument("--user", help=f"log in with SASL PLAIN as USER (or set {USER_ENV})")
    parser.add_argument(
        "--password", help=f"the password for --user (better: set {PASSWORD_ENV}, which other users cannot see)"
    )
    parser.add_argument(
        "--ca-file", metavar="PATH", help="amqps: trust the CA certificates in PATH (PEM) instead of the system's"
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="amqps: do not verify the broker's certificate (a self-signed test broker; anyone in between can "
        "read the credentials)",
    )
    parser.add_argument("--timeout", type=float, default=1.0, help="seconds to wait (default 1)")
    args = parser.parse_args(argv)
    shown = masked(args.url)
    try:
        scheme = _parse(args.url)[0]
    except NotHealthy as exc:
        print(f"minibroker check: {shown}: {exc}", file=sys.stderr)
        return 2
    if scheme != "amqps" and (args.ca_file is not None or args.insecure):
        print(f"minibroker check: {shown}: --ca-file and --insecure are for amqps:// URLs", file=sys.stderr)
        return 2
    # each credential from the options, else the URL, else the environment
    url_user, url_password = _credentials(args.url)
    user = next((v for v in (args.user, url_user, environ.get(USER_ENV)) if v is not None), None)
    password = next((v for v in (args.password, url_password, environ.get(PASSWORD_ENV)) if v is not None), None)
    if password is not None and user is None:
        print(f"minibroker check: {shown}: a password needs a user (--user or {USER_ENV})", file=sys.stderr)
        return 2
    try:
        tls = tls_context(args.ca_file, insecure=args.insecure) if scheme == "amqps" else None
    except OSError as exc:  # an unreadable or invalid --ca-file
        print(f"minibroker check: cannot use --ca-file {args.ca_file}: {exc}", file=sys.stderr)
        return 2
    try:
        check(args.url, args.timeout, user=user, password=password, tls=tls)
    except NotHealthy as exc:
        print(f"minibroker check: {shown}: not healthy: {exc}", file=sys.stderr)
        return 1
    print(f"minibroker check: {shown}: ok")
    return 0
