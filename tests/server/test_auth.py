"""Authentication and authorisation against the real server (DESIGN §2, ``[auth]``).

SASL PLAIN is checked against configured users (plain and hashed passwords); a failed login is answered
only after ``failure_delay`` while other connections are served; ANONYMOUS and SASL-less peers are refused
when the configuration says so; per-user permissions refuse attaches, relayed messages and transactions
with ``amqp:unauthorized-access``; credentials never reach traces or logs; ``minibroker hash-password``
makes hashes the configuration accepts. Every socket wait is bounded by the peer's or client's timeout.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from proton import ConnectionException, Delivery, Endpoint, Message
from proton.utils import BlockingConnection, LinkDetached

from minibroker import cli
from minibroker.amqp.definitions import Attach, Detach, Flow, Open, SaslMechanisms, SaslOutcome, Source
from minibroker.amqp.errors import Condition
from minibroker.amqp.framing import AMQP_HEADER, SASL_FRAME, SASL_HEADER
from minibroker.amqp.types import Symbol, UInt
from minibroker.auth import check_password, hash_password
from minibroker.config import Config, ConfigError
from minibroker.testing import frames
from minibroker.testing.peer import ScriptedPeer
from minibroker.testing.thread import ThreadedBroker, run_in_thread

HOST = "127.0.0.1"
DELAY = 0.3
"""``auth.failure_delay`` of the brokers here: long enough to measure, short enough to keep tests fast."""
TIMEOUT = 5.0
BOB_PASSWORD = "hunter2"
BOB_HASH = hash_password(BOB_PASSWORD, iterations=1000)  # cheap to check; the default count costs ~0.3 s

AUTH: dict[str, Any] = {
    "failure_delay": DELAY,
    "users": {"alice": "secret", "bob": BOB_HASH},
    "permissions": {
        # bob has no entry: he may do everything
        "alice": {"send": ["orders", "orders.*"], "receive": ["replies.*"], "transactions": False},
    },
}


@pytest.fixture
def secured() -> Iterator[ThreadedBroker]:
    """Users alice (plain password, restricted) and bob (hashed password, unrestricted)."""
    with run_in_thread({"server": {"port": 0}, "auth": AUTH, "topics": {"prices": {}}}) as running:
        yield running


def condition(performative: Any) -> str | None:
    return None if performative.error is None else str(performative.error.condition)


def login(broker: ThreadedBroker, user: str, password: str) -> BlockingConnection:
    return BlockingConnection(broker.url, timeout=TIMEOUT, user=user, password=password)


def start_sasl(peer: ScriptedPeer) -> list[str]:
    """SASL header exchange; the mechanisms the broker offers."""
    peer.send_header(SASL_HEADER)
    assert peer.expect_header() == SASL_HEADER
    return [str(m) for m in peer.expect_sasl(SaslMechanisms).sasl_server_mechanisms or []]


# -- SASL PLAIN ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("user", "password"), [("alice", "secret"), ("bob", BOB_PASSWORD)], ids=["plain", "hashed"])
def test_plain_login_with_configured_user(secured: ThreadedBroker, user: str, password: str) -> None:
    with ScriptedPeer.connect(HOST, secured.port) as peer:
        assert start_sasl(peer) == ["PLAIN"]  # no ANONYMOUS once users are configured
        peer.send(frames.sasl_plain(user, password), frame_type=SASL_FRAME)
        assert peer.expect_sasl(SaslOutcome).code == 0
        peer.send_header(AMQP_HEADER)
        assert peer.expect_header() == AMQP_HEADER
        peer.send(frames.open_())
        peer.expect(Open)
        assert [c.user for c in secured.connections] == [user]
        peer.close()


@pytest.mark.parametrize(
    ("user", "password"),
    [("alice", "wrong"), ("bob", "secret"), ("mallory", "secret")],
    ids=["wrong-password", "wrong-password-hashed", "unknown-user"],
)
def test_failed_login_is_answered_after_the_delay_while_others_are_served(
    secured: ThreadedBroker, user: str, password: str
) -> None:
    with ScriptedPeer.connect(HOST, secured.port) as guesser:
        start_sasl(guesser)
        started = time.monotonic()
        guesser.send(frames.sasl_plain(user, password), frame_type=SASL_FRAME)
        # while the guesser waits for its answer, another client logs in and works
        with ScriptedPeer.connect(HOST, secured.port) as other:
            other.open(sasl=("PLAIN", "alice", "secret"))
            other.begin()
            other.attach_sender("orders", handle=0)
            assert other.expect(Flow).link_credit
            served = time.monotonic() - started
            other.close()
        outcome = guesser.expect_sasl(SaslOutcome)
        answered = time.monotonic() - started
        assert outcome.code == 1  # §5.3.3.6 auth
        assert served < DELAY <= answered < DELAY + 2.0
        guesser.expect_closed()


def test_anonymous_refused_when_users_are_configured(secured: ThreadedBroker) -> None:
    with ScriptedPeer.connect(HOST, secured.port) as peer:
        started = time.monotonic()
        assert peer.authenticate("ANONYMOUS").code == 1
        assert time.monotonic() - started >= DELAY  # a refused mechanism is a failed login too
        peer.expect_closed()


def test_anonymous_false_without_users_refuses_anonymous() -> None:
    config = {"server": {"port": 0}, "auth": {"anonymous": False, "failure_delay": 0}}
    with run_in_thread(config) as running:
        with ScriptedPeer.connect(HOST, running.port) as peer:
            assert start_sasl(peer) == ["PLAIN"]
            peer.send(frames.sasl_anonymous(), frame_type=SASL_FRAME)
            assert peer.expect_sasl(SaslOutcome).code == 1
            peer.expect_closed()
        with ScriptedPeer.connect(HOST, running.port) as peer:
            peer.open(sasl=("PLAIN", "anyone", "anything"))  # without users, PLAIN takes any credentials
            peer.close()


@pytest.mark.parametrize(
    "config",
    [
        pytest.param({"users": {"alice": "secret"}}, id="users-configured"),
        pytest.param({"anonymous": False}, id="anonymous-false"),
    ],
)
def test_a_peer_that_skips_sasl_is_refused(config: dict[str, Any]) -> None:
    with run_in_thread({"server": {"port": 0}, "auth": config}) as running:
        with ScriptedPeer.connect(HOST, running.port) as peer:
            peer.send_header(AMQP_HEADER)
            assert peer.expect_header() == SASL_HEADER  # the layer we require, then the socket closes
            peer.expect_closed()
        assert running.connections == []


# -- permissions, through python-qpid-proton ---------------------------------------------------------------
@pytest.mark.parametrize("address", ["orders", "orders.eu"])
def test_send_allowed_by_pattern(secured: ThreadedBroker, address: str) -> None:
    conn = login(secured, "alice", "secret")
    try:
        delivery = conn.create_sender(address).send(Message(body="allowed"))
        assert delivery.remote_state == Delivery.ACCEPTED
    finally:
        conn.close()
    assert secured.queue(address).depth == 1


@pytest.mark.parametrize("address", ["payments", "ordersX", "replies.x"])
def test_send_denied_by_pattern(secured: ThreadedBroker, address: str) -> None:
    conn = login(secured, "alice", "secret")
    try:
        with pytest.raises(LinkDetached) as refused:
            conn.create_sender(address)
        assert refused.value.condition == Condition.UNAUTHORIZED_ACCESS
        # the connection survives its refused link
        assert conn.create_sender("orders").send(Message(body="x")).remote_state == Delivery.ACCEPTED
    finally:
        conn.close()
    assert not secured.queue(address).exists


def test_receive_allowed_and_denied_by_pattern(secured: ThreadedBroker) -> None:
    bob = login(secured, "bob", BOB_PASSWORD)
    try:
        bob.create_sender("replies.alice").send(Message(body="for alice"))
        bob.create_sender("orders").send(Message(body="not for alice"))
    finally:
        bob.close()
    conn = login(secured, "alice", "secret")
    try:
        receiver = conn.create_receiver("replies.alice")
        assert receiver.receive(timeout=TIMEOUT).body == "for alice"
        receiver.accept()
        with pytest.raises(LinkDetached) as refused:
            conn.create_receiver("orders")
        assert refused.value.condition == Condition.UNAUTHORIZED_ACCESS
    finally:
        conn.close()
    assert secured.queue("orders").depth == 1


def test_unrestricted_user_may_do_everything(secured: ThreadedBroker) -> None:
    conn = login(secured, "bob", BOB_PASSWORD)
    try:
        conn.create_sender("payments").send(Message(body="b"))
        receiver = conn.create_receiver("payments")
        assert receiver.receive(timeout=TIMEOUT).body == "b"
        receiver.accept()
    finally:
        conn.close()


def test_transactions_denied(secured: ThreadedBroker) -> None:
    conn = login(secured, "alice", "secret")
    try:
        controller = conn.container.declare_transaction(conn.conn).txn_ctrl
        conn.wait(lambda: bool(controller.state & Endpoint.REMOTE_CLOSED), msg="the coordinator attach refused")
        assert controller.remote_condition.name == Condition.UNAUTHORIZED_ACCESS
    finally:
        conn.close()
    assert secured.transactions == []


def test_anonymous_relay_checks_each_message(secured: ThreadedBroker) -> None:
    conn = login(secured, "alice", "secret")
    try:
        relay = conn.create_sender(None)  # the anonymous relay: the attach itself names no node
        allowed = relay.send(Message(address="orders.relayed", body="ok"), error_states=[])
        denied = relay.send(Message(address="payments", body="no"), error_states=[])
        assert allowed.remote_state == Delivery.ACCEPTED
        assert denied.remote_state == Delivery.REJECTED
        assert denied.remote.condition.name == Condition.UNAUTHORIZED_ACCESS
        # the relay link stays usable after a refused message
        again = relay.send(Message(address="orders", body="still ok"), error_states=[])
        assert again.remote_state == Delivery.ACCEPTED
    finally:
        conn.close()
    assert secured.queue("orders.relayed").depth == 1
    assert not secured.queue("payments").exists


def test_resuming_a_durable_subscription_checks_receive_permission(secured: ThreadedBroker) -> None:
    # bob subscribes durably to the topic, shared and global: the subscription is found by link name alone
    subscription = Source(
        address="prices",
        durable=UInt(2),
        expiry_policy=Symbol("never"),
        capabilities=[Symbol("topic"), Symbol("shared"), Symbol("global")],
    )
    with ScriptedPeer.connect(HOST, secured.port) as bob:
        bob.open(sasl=("PLAIN", "bob", BOB_PASSWORD))
        bob.begin()
        assert bob.attach_receiver("prices", handle=0, name="audit", source=subscription).source is not None
        bob.send(Detach(handle=UInt(0), closed=False))  # detached, not closed: the subscription lives on
        bob.expect(Detach)
        bob.close()
    with ScriptedPeer.connect(HOST, secured.port) as alice:
        alice.open(sasl=("PLAIN", "alice", "secret"))
        alice.begin()
        # a null source resumes a subscription by name; alice may not receive from "prices"
        reply = alice.attach_receiver(None, handle=0, name="audit", source=None)
        assert isinstance(reply, Attach)
        assert reply.source is None
        assert condition(alice.expect(Detach)) == Condition.UNAUTHORIZED_ACCESS
        alice.close()


# -- credentials stay secret ---------------------------------------------------------------------------------
def test_credentials_never_appear_in_traces_or_logs(tmp_path: Path) -> None:
    password, wrong = "s3cret-Pw-7f2a", "guess-Pw-91c4"
    config = tmp_path / "auth.toml"
    config.write_text(f'[auth]\nfailure_delay = 0.0\n[auth.users]\nalice = "{password}"\n')
    command = [
        sys.executable, "-m", "minibroker", "--config", str(config), "--port", "0",
        "--trace-frames", "--log-level", "debug",
    ]  # fmt: skip
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            match = re.match(r"minibroker listening on amqp://127\.0\.0\.1:(\d+)$", line.strip())
            assert match, f"unexpected first line {line!r}"
            url = f"amqp://127.0.0.1:{match.group(1)}"
            conn = BlockingConnection(url, timeout=TIMEOUT, user="alice", password=password)
            conn.create_sender("orders").send(Message(body="traced"))
            conn.close()
            with pytest.raises(ConnectionException, match="Authentication failed"):
                BlockingConnection(url, timeout=TIMEOUT, user="alice", password=wrong)
            proc.terminate()
            assert proc.wait(10) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        assert proc.stderr is not None
        stderr = proc.stderr.read()
    assert "@sasl-init" in stderr  # the trace did run through SASL
    assert "@open(16)" in stderr
    assert "DEBUG" in stderr or "INFO" in stderr
    for secret in (password, wrong):
        assert secret not in stderr
        assert secret.encode().hex() not in stderr
        assert repr(secret.encode())[2:-1] not in stderr


# -- hashed passwords in the configuration -------------------------------------------------------------------
def test_hash_password_cli_reads_stdin_and_the_config_accepts_the_hash() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "minibroker", "hash-password"], input="correct horse\n",
        capture_output=True, text=True, timeout=30, check=False, env={**os.environ},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    hashed = result.stdout.strip()
    assert re.fullmatch(r"pbkdf2_sha256\$\d+\$[0-9a-f]+\$[0-9a-f]{64}", hashed)
    assert "correct horse" not in result.stdout
    config = Config.from_dict({"auth": {"users": {"carol": hashed}}})
    assert config.auth.users["carol"] == hashed
    assert check_password(hashed, "correct horse")
    assert not check_password(hashed, "correct horse ")


def test_hash_password_refuses_an_empty_password(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n"))
    assert cli.main(["hash-password"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "empty password" in captured.err


@pytest.mark.parametrize(
    "bad",
    ["pbkdf2_sha256$", "pbkdf2_sha256$many$abcd$" + "00" * 32, "pbkdf2_sha256$1000$zz$" + "00" * 32,
     "pbkdf2_sha256$1000$abcd$00"],
)  # fmt: skip
def test_bad_hash_in_config_is_a_config_error_naming_the_user(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ConfigError, match=r"auth\.users\.mallory"):
        Config.from_dict({"auth": {"users": {"mallory": bad}}})
    path = tmp_path / "bad.toml"
    path.write_text(f'[auth.users]\nmallory = "{bad}"\n')
    with pytest.raises(ConfigError, match=rf"{re.escape(str(path))}: auth\.users\.mallory"):
        Config.load(path)
