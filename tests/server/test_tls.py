"""The amqps listener (``[tls]``) with certificates made at test time by trustme.

A python-qpid-proton client that trusts the test CA sends and receives over TLS; with client
certificates required, a client without one is refused and a client with one logs in with SASL EXTERNAL
as its certificate's common name (and its permissions apply), provided that name is a configured user or
``auth.external_any`` is set; a plain AMQP client on the TLS port fails cleanly; the command line prints
both listening lines, and a missing certificate file is exit code 2.

Proton checks the server's name only against DNS names, not IP addresses, so clients connect to
127.0.0.1 with ``virtual_host="localhost"``, a name the server certificate carries.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme
from proton import ConnectionException, Delivery, Message, SSLDomain
from proton.utils import BlockingConnection, LinkDetached

from minibroker.amqp.errors import Condition
from minibroker.amqp.framing import AMQP_HEADER
from minibroker.testing.thread import ThreadedBroker, run_in_thread
from tests.integration.helpers import blocking_connection

HOST = "127.0.0.1"
TIMEOUT = 5.0
CLIENT_CN = "client-7"
STRANGER_CN = "stranger-3"
"""A name the CA signed a certificate for, but not a configured user."""


@dataclass(frozen=True)
class Pki:
    """PEM files of a test CA, a server certificate for 127.0.0.1/localhost and a client certificate."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    stranger_key: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("client.example", common_name=CLIENT_CN)
    stranger = ca.issue_cert("stranger.example", common_name=STRANGER_CN)
    names = ("ca.pem", "server.pem", "server.key", "client.pem", "client.key", "stranger.pem", "stranger.key")
    files = Pki(*(directory / name for name in names))
    ca.cert_pem.write_to_path(str(files.ca))
    for i, blob in enumerate(server.cert_chain_pems):
        blob.write_to_path(str(files.server_cert), append=i > 0)
    server.private_key_pem.write_to_path(str(files.server_key))
    for i, blob in enumerate(client.cert_chain_pems):
        blob.write_to_path(str(files.client_cert), append=i > 0)
    client.private_key_pem.write_to_path(str(files.client_key))
    for i, blob in enumerate(stranger.cert_chain_pems):
        blob.write_to_path(str(files.stranger_cert), append=i > 0)
    stranger.private_key_pem.write_to_path(str(files.stranger_key))
    return files


def tls_config(pki: Pki, **tls: Any) -> dict[str, Any]:
    section = {"enabled": True, "port": 0, "cert_file": str(pki.server_cert), "key_file": str(pki.server_key)}
    return {"server": {"port": 0}, "tls": {**section, **tls}}


@pytest.fixture
def tls_broker(pki: Pki) -> Iterator[ThreadedBroker]:
    with run_in_thread(tls_config(pki)) as running:
        yield running


@pytest.fixture
def mutual_tls_broker(pki: Pki) -> Iterator[ThreadedBroker]:
    """Client certificates required; users configured (so ANONYMOUS is refused); CLIENT_CN a user with no
    password (certificate only), restricted."""
    config = tls_config(pki, client_auth="required", ca_file=str(pki.ca))
    config["auth"] = {
        "users": {"alice": "secret", CLIENT_CN: ""},
        "permissions": {CLIENT_CN: {"send": ["certified.*"], "receive": ["certified.*"]}},
        "failure_delay": 0,
    }
    with run_in_thread(config) as running:
        yield running


def client_domain(pki: Pki, *, certificate: bool = False, stranger: bool = False) -> SSLDomain:
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(pki.ca))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
    if certificate:
        domain.set_credentials(str(pki.client_cert), str(pki.client_key), None)
    if stranger:
        domain.set_credentials(str(pki.stranger_cert), str(pki.stranger_key), None)
    return domain


def connect_tls(broker: ThreadedBroker, domain: SSLDomain, **options: Any) -> BlockingConnection:
    url = broker.tls_url
    assert url is not None
    assert url.startswith("amqps://127.0.0.1:")
    return BlockingConnection(url, timeout=TIMEOUT, ssl_domain=domain, virtual_host="localhost", **options)


def tls_port(broker: ThreadedBroker) -> int:
    url = broker.tls_url
    assert url is not None
    return int(url.rsplit(":", 1)[1])


def round_trip(conn: BlockingConnection, address: str, body: str) -> None:
    assert conn.create_sender(address).send(Message(body=body)).remote_state == Delivery.ACCEPTED
    receiver = conn.create_receiver(address)
    assert receiver.receive(timeout=TIMEOUT).body == body
    receiver.accept()


# -- amqps ---------------------------------------------------------------------------------------------------
def test_send_and_receive_over_tls(tls_broker: ThreadedBroker, pki: Pki) -> None:
    assert tls_broker.tls_url != tls_broker.url
    conn = connect_tls(tls_broker, client_domain(pki))
    try:
        round_trip(conn, "secure", "over tls")
        assert [c.user for c in tls_broker.connections] == [None]  # anonymous: no certificate was asked for
    finally:
        conn.close()
    with blocking_connection(tls_broker) as plain:  # the plain listener serves the same nodes
        assert plain.create_sender("secure").send(Message(body="plain")).remote_state == Delivery.ACCEPTED
    assert tls_broker.queue("secure").depth == 1


def test_client_that_does_not_trust_the_server_fails(tls_broker: ThreadedBroker, pki: Pki) -> None:
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(pki.client_cert))  # not the CA that signed the server's certificate
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER)
    with pytest.raises(ConnectionException, match="certificate verify failed"):
        connect_tls(tls_broker, domain)


# -- client certificates -------------------------------------------------------------------------------------
def test_required_client_certificate_refuses_a_client_without_one(mutual_tls_broker: ThreadedBroker, pki: Pki) -> None:
    with pytest.raises(ConnectionException, match="SSL Failure"):  # the TLS handshake fails
        connect_tls(mutual_tls_broker, client_domain(pki), user="alice", password="secret")
    assert mutual_tls_broker.connections == []
    # the broker carries on: a client with a certificate gets in
    conn = connect_tls(mutual_tls_broker, client_domain(pki, certificate=True))
    conn.close()


def test_client_certificate_logs_in_with_sasl_external(mutual_tls_broker: ThreadedBroker, pki: Pki) -> None:
    conn = connect_tls(mutual_tls_broker, client_domain(pki, certificate=True), allowed_mechs="EXTERNAL")
    try:
        assert [c.user for c in mutual_tls_broker.connections] == [CLIENT_CN]
        round_trip(conn, "certified.orders", "by certificate")
        with pytest.raises(LinkDetached) as refused:  # the certificate's user has its own permissions
            conn.create_sender("orders")
        assert refused.value.condition == Condition.UNAUTHORIZED_ACCESS
    finally:
        conn.close()


def test_external_refuses_a_certificate_whose_name_is_not_a_user(mutual_tls_broker: ThreadedBroker, pki: Pki) -> None:
    """Issue 12 item 23: any certificate the CA signed used to log in, with full rights. Now EXTERNAL is not
    offered to a common name that is not in [auth.users], and choosing it anyway fails."""
    with pytest.raises(ConnectionException, match="Authentication failed"):
        connect_tls(mutual_tls_broker, client_domain(pki, stranger=True), allowed_mechs="EXTERNAL")
    # (the client gives up on its own: the broker sees its socket close a moment later)
    mutual_tls_broker.wait_for(lambda: mutual_tls_broker.connections == [])
    # the same certificate may still log in with a password, as the password's user
    domain = client_domain(pki, stranger=True)
    conn = connect_tls(mutual_tls_broker, domain, user="alice", password="secret", allowed_mechs="PLAIN")
    try:
        assert [c.user for c in mutual_tls_broker.connections] == ["alice"]
    finally:
        conn.close()


def test_external_any_accepts_any_certificate_the_ca_signed(pki: Pki) -> None:
    config = tls_config(pki, client_auth="required", ca_file=str(pki.ca))
    config["auth"] = {"users": {"alice": "secret"}, "external_any": True, "failure_delay": 0}
    with run_in_thread(config) as running:
        conn = connect_tls(running, client_domain(pki, stranger=True), allowed_mechs="EXTERNAL")
        try:
            assert [c.user for c in running.connections] == [STRANGER_CN]
            round_trip(conn, "anything", "no permissions entry: everything allowed")
        finally:
            conn.close()


def test_certificate_and_password_together(mutual_tls_broker: ThreadedBroker, pki: Pki) -> None:
    """With a certificate, a client may still choose PLAIN: then the password decides who it is."""
    domain = client_domain(pki, certificate=True)
    conn = connect_tls(mutual_tls_broker, domain, user="alice", password="secret", allowed_mechs="PLAIN")
    try:
        assert [c.user for c in mutual_tls_broker.connections] == ["alice"]
        round_trip(conn, "orders", "by password")
    finally:
        conn.close()


# -- the TLS port spoken to in plain AMQP --------------------------------------------------------------------
def test_plain_amqp_on_the_tls_port_fails_cleanly(tls_broker: ThreadedBroker, pki: Pki) -> None:
    with socket.create_connection((HOST, tls_port(tls_broker)), timeout=TIMEOUT) as sock:
        sock.sendall(AMQP_HEADER)
        received = b""
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(4096)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
        else:
            pytest.fail("the broker kept a plain AMQP client on its TLS port")
    assert not received.startswith(b"AMQP")  # at most a TLS alert, never an AMQP answer
    assert tls_broker.connections == []
    # both listeners still serve
    with blocking_connection(tls_broker) as plain:
        round_trip(plain, "after-garbage", "plain")
    conn = connect_tls(tls_broker, client_domain(pki))
    try:
        round_trip(conn, "after-garbage", "tls")
    finally:
        conn.close()


def test_silent_client_on_the_tls_port_is_dropped_after_the_handshake_timeout(pki: Pki) -> None:
    config = tls_config(pki)
    config["server"]["handshake_timeout"] = 0.3
    with run_in_thread(config) as running:
        started = time.monotonic()
        with socket.create_connection((HOST, tls_port(running)), timeout=TIMEOUT) as s:
            assert s.recv(4096) == b""  # no TLS ClientHello: closed without a word
        assert 0.3 <= time.monotonic() - started < 3.0


# -- the command line ----------------------------------------------------------------------------------------
def test_cli_prints_both_listening_lines(tmp_path: Path, pki: Pki) -> None:
    config = tmp_path / "tls.toml"
    config.write_text(
        f'[tls]\nenabled = true\nport = 0\ncert_file = "{pki.server_cert}"\nkey_file = "{pki.server_key}"\n'
    )
    command = [sys.executable, "-m", "minibroker", "--config", str(config), "--port", "0"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            lines = [proc.stdout.readline().strip() for _ in range(2)]
            assert re.fullmatch(r"minibroker listening on amqp://127\.0\.0\.1:\d+", lines[0]), lines
            match = re.fullmatch(r"minibroker listening on amqps://127\.0\.0\.1:(\d+)", lines[1])
            assert match, lines
            url = f"amqps://127.0.0.1:{match.group(1)}"
            conn = BlockingConnection(url, timeout=TIMEOUT, ssl_domain=client_domain(pki), virtual_host="localhost")
            conn.close()
            proc.terminate()
            assert proc.wait(10) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        assert proc.stdout.read() == ""


def test_missing_certificate_file_exits_2(tmp_path: Path, pki: Pki) -> None:
    config = tmp_path / "tls.toml"
    missing = tmp_path / "nowhere.pem"
    config.write_text(f'[tls]\nenabled = true\ncert_file = "{missing}"\nkey_file = "{pki.server_key}"\n')
    result = subprocess.run(
        [sys.executable, "-m", "minibroker", "--config", str(config), "--port", "0"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "tls.cert_file" in result.stderr
    assert str(missing) in result.stderr
    assert result.stdout == ""


# -- minibroker check over amqps -----------------------------------------------------------------------------
def test_check_an_amqps_url_verifies_the_broker_certificate(tls_broker: ThreadedBroker, pki: Pki) -> None:
    """``minibroker check`` speaks TLS to an ``amqps`` URL: with the test CA (``--ca-file``) it is healthy; with the
    system's CAs the certificate is not trusted; ``--insecure`` skips the verification; ``--ca-file`` with an
    ``amqp`` URL is a usage error."""
    from minibroker import health

    url = f"amqps://127.0.0.1:{tls_port(tls_broker)}"
    assert health.main(["--url", url, "--ca-file", str(pki.ca), "--timeout", "5"], environ={}) == 0
    assert health.main(["--url", url, "--timeout", "5"], environ={}) == 1
    assert health.main(["--url", url, "--insecure", "--timeout", "5"], environ={}) == 0
    assert health.main(["--url", tls_broker.url, "--ca-file", str(pki.ca)], environ={}) == 2
    with pytest.raises(health.NotHealthy, match="certificate verify failed"):
        health.check(url, 5.0, tls=health.tls_context(str(pki.client_cert)))
