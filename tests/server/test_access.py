"""Access and authentication under attack (issue 12, items 3 and 18-22), against the real server.

Password hashing runs off the event loop and costs the same for unknown users; silent sockets cannot fill
``max_connections``; failed logins are limited per peer address and per user however many connections they
come on (password checks are counted, not just timed); ``minibroker check`` logs in with PLAIN and never
prints credentials; a config error never echoes a password; dynamic nodes obey permissions. Several peer
addresses are had from the loopback network (127.0.0.0/8), each socket bound to its own source address.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

import minibroker.auth
from minibroker.amqp.definitions import (
    Attach,
    Detach,
    Disposition,
    Flow,
    Open,
    SaslMechanisms,
    SaslOutcome,
    Source,
    Target,
)
from minibroker.amqp.errors import Condition
from minibroker.amqp.framing import AMQP_HEADER, SASL_FRAME, SASL_HEADER
from minibroker.amqp.types import Symbol
from minibroker.auth import hash_password
from minibroker.config import Config, ConfigError
from minibroker.testing import frames
from minibroker.testing.peer import ScriptedPeer
from minibroker.testing.thread import ThreadedBroker, run_in_thread

HOST = "127.0.0.1"
TIMEOUT = 5.0
NO_LIMITS = {"failure_delay": 0, "max_failures_per_address": 0, "max_failures_per_user": 0}


def connect(broker: ThreadedBroker, source: str = HOST, timeout: float = TIMEOUT) -> ScriptedPeer:
    """A TCP connection to the broker from ``source`` (any 127.x.y.z address is this machine)."""
    sock = socket.create_connection((HOST, broker.port), timeout=timeout, source_address=(source, 0))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return ScriptedPeer(sock, timeout)


def try_login(broker: ThreadedBroker, user: str, password: str, source: str = HOST) -> int:
    """One SASL PLAIN attempt; the sasl-outcome code (0 ok, 1 auth)."""
    with connect(broker, source, timeout=30.0) as peer:
        return int(peer.authenticate(("PLAIN", user, password)).code)


def timed_login(broker: ThreadedBroker, user: str, password: str) -> float:
    started = time.monotonic()
    assert try_login(broker, user, password) == 1
    return time.monotonic() - started


def open_as(broker: ThreadedBroker, user: str, password: str, source: str = HOST) -> ScriptedPeer:
    peer = connect(broker, source)
    peer.open(sasl=("PLAIN", user, password))
    return peer


@pytest.fixture
def count_checks(monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """Count the password checks the broker makes (every one goes through ``auth.check_password``)."""
    calls = [0]
    lock = threading.Lock()
    original = minibroker.auth.check_password

    def counting(stored: str, password: str) -> bool:
        with lock:
            calls[0] += 1
        return original(stored, password)

    monkeypatch.setattr(minibroker.auth, "check_password", counting)
    return lambda: calls[0]


# -- item 3: hashing off the event loop, the same cost for unknown users --------------------------------------
def test_bad_logins_with_hashed_passwords_do_not_stall_other_connections(count_checks: Callable[[], int]) -> None:
    """Four clients guess a hashed password (600k PBKDF2 rounds, ~0.25 s of CPU each) without pause; a bystander
    sending messages meanwhile keeps its round trips short. On the loop, each guess stalled everyone."""
    auth = {**NO_LIMITS, "users": {"alice": "plain", "bob": hash_password("right")}}
    with (
        run_in_thread({"server": {"port": 0}, "auth": auth}) as running,
        open_as(running, "alice", "plain") as bystander,
    ):
        bystander.begin()
        bystander.attach_sender("work", handle=0)
        bystander.expect(Flow)
        stop = threading.Event()

        def guess() -> int:
            guesses = 0
            while not stop.is_set():
                assert try_login(running, "bob", f"wrong-{guesses}") == 1
                guesses += 1
            return guesses

        with ThreadPoolExecutor(4) as pool:
            guessers = [pool.submit(guess) for _ in range(4)]
            deadline = time.monotonic() + 20.0
            while count_checks() < 2:  # the guesses are under way: hashes running in the worker threads
                assert time.monotonic() < deadline, "no password check started"
                time.sleep(0.005)
            round_trips = []
            started = time.monotonic()
            delivery = 0
            while time.monotonic() - started < 2.0:
                sent = time.monotonic()
                bystander.transfer(0, delivery, frames.message("ping"))
                bystander.expect(Disposition)
                round_trips.append(time.monotonic() - sent)
                delivery += 1
                time.sleep(0.005)
            stop.set()
            guesses = sum(g.result() for g in guessers)
        bystander.close()
    assert guesses >= 4  # the hashes did run meanwhile
    # a guess on the loop stalled every round trip that met it for the whole hash (>= 0.2 s here), and with four
    # guessers hashing back to back that is nearly every round trip; on two cores shared with four hashing threads
    # the scheduler alone may hold one back now and then, so the bound is on the 90th percentile, not the maximum
    slow = sorted(round_trips)[int(len(round_trips) * 0.9)]
    assert slow < 0.15, f"90th percentile round trip {slow:.3f} s (slowest {max(round_trips):.3f} s)"


def test_unknown_and_known_users_take_as_long_to_fail() -> None:
    """A failed login for a user that does not exist costs a hash too, so time does not tell who exists."""
    auth = {**NO_LIMITS, "users": {"bob": hash_password("right", iterations=200_000)}}
    with run_in_thread({"server": {"port": 0}, "auth": auth}) as running:
        timed_login(running, "bob", "warm-up")
        # alternated, and the fastest of each: load on a shared machine only ever adds time, to either side
        samples = [
            (timed_login(running, "bob", f"wrong-{i}"), timed_login(running, "mallory", f"wrong-{i}")) for i in range(5)
        ]
        known = min(k for k, _ in samples)
        unknown = min(u for _, u in samples)
        with open_as(running, "bob", "right") as peer:  # the right password still works
            peer.close()
    assert 0.6 * known < unknown < 1.6 * known, (known, unknown)


def test_plain_passwords_beside_hashed_ones_cost_a_hash_too() -> None:
    """With a hashed user configured, a plain-password user's check is padded to the costliest hash: a wrong
    password for it fails no faster than for an unknown user (time does not tell which plain users exist), and
    the right one still passes. With plain passwords only, nothing is hashed."""
    book = minibroker.auth.PasswordBook({"plain": "right", "hashed": hash_password("x", iterations=200_000)})

    def cost(user: str, password: str = "wrong") -> float:
        started = time.perf_counter()
        book.check(user, password)
        return time.perf_counter() - started

    samples = [(cost("plain"), cost("nobody")) for _ in range(5)]  # alternated: load only ever adds time
    plain = min(p for p, _ in samples)
    unknown = min(u for _, u in samples)
    assert plain > 0.7 * unknown, (plain, unknown)
    assert book.check("plain", "right")
    only_plain = minibroker.auth.PasswordBook({"plain": "right"})
    started = time.perf_counter()
    assert only_plain.check("plain", "right")
    assert not only_plain.check("nobody", "right")
    assert time.perf_counter() - started < 0.01


def test_the_failure_limiter_at_its_bound_still_counts_new_keys() -> None:
    """Once the limiter remembers ``max_keys`` keys, a new key's bucket is kept (the prune runs before it goes in,
    in batches), so its failures count like any other."""
    limiter = minibroker.auth.FailureLimiter(2, 60.0, max_keys=100)
    for i in range(100):
        assert limiter.take(f"filler-{i}", 0.0)
    assert limiter.take("new", 0.0)
    assert limiter.take("new", 0.0)
    assert not limiter.take("new", 0.0)  # its two tokens are used up: remembered, not forgotten at once
    assert len(limiter._buckets) <= 100


def test_a_login_waiting_for_a_hash_thread_past_the_handshake_time_is_dropped_not_refused(
    count_checks: Callable[[], int],
) -> None:
    """With one hash thread busy (~1 s) a second login waits; when its handshake time runs out first it is
    dropped as any stalled handshake is, without a misleading "wrong password" outcome."""
    users = {"bob": hash_password("right", iterations=2_500_000)}
    config = {"server": {"port": 0, "handshake_timeout": 0.4}, "auth": {**NO_LIMITS, "hash_threads": 1, "users": users}}
    with run_in_thread(config) as running, connect(running) as first, connect(running) as second:
        for peer in (first, second):
            peer.send_header(SASL_HEADER)
            assert peer.expect_header() == SASL_HEADER
            peer.expect_sasl(SaslMechanisms)
        first.send(frames.sasl_plain("bob", "wrong"), frame_type=SASL_FRAME)
        deadline = time.monotonic() + 20.0
        while not count_checks():  # the first check holds the one thread before the second login arrives
            assert time.monotonic() < deadline, "the first password check never started"
            time.sleep(0.005)
        second.send(frames.sasl_plain("bob", "right"), frame_type=SASL_FRAME)
        started = time.monotonic()
        second.expect_closed()
        assert time.monotonic() - started < 0.8  # at its handshake deadline (0.4 s), not after the first hash (~1 s)
        # the first one's hash did finish (past its own deadline: a running hash is not abandoned): its
        # password was wrong, and it is told so
        assert first.expect_sasl(SaslOutcome).code == 1
        first.expect_closed()


def test_a_user_with_an_empty_password_cannot_log_in_with_plain() -> None:
    """An empty password in [auth.users] means "certificate only" (SASL EXTERNAL): PLAIN never matches it."""
    auth = {**NO_LIMITS, "users": {"client-7": "", "alice": "secret"}}
    with run_in_thread({"server": {"port": 0}, "auth": auth}) as running:
        assert try_login(running, "client-7", "") == 1
        assert try_login(running, "alice", "secret") == 0


# -- item 18: silent sockets do not fill max_connections -----------------------------------------------------
def test_silent_sockets_cannot_lock_out_real_clients() -> None:
    """More silent sockets than ``max_connections``: they fill only the pending-handshake slots, the oldest of
    which makes way for each new socket, and every correct login afterwards succeeds."""
    server = {"port": 0, "max_connections": 20, "max_pending_handshakes": 16}
    config = {"server": server, "auth": {**NO_LIMITS, "users": {"alice": "secret"}}}
    with run_in_thread(config) as running:
        silent = [socket.create_connection((HOST, running.port), timeout=TIMEOUT) for _ in range(40)]
        try:
            for _ in range(5):
                with open_as(running, "alice", "secret") as peer:
                    peer.begin()
                    peer.attach_sender("orders", handle=0)
                    peer.expect(Flow)
                    peer.close()
            # the oldest silent sockets were closed to make room (nothing was sent to them)
            closed = 0
            for sock in silent[:20]:
                sock.settimeout(TIMEOUT)
                try:
                    closed += sock.recv(1) == b""
                except ConnectionResetError:
                    closed += 1
            assert closed == 20
            # open connections are still limited by max_connections: with 20 open, the next is refused
            peers = [open_as(running, "alice", "secret") for _ in range(20)]
            try:
                with connect(running) as extra:
                    extra.open(sasl=("PLAIN", "alice", "secret"))
                    close = extra.receive().performative
                    assert close.error.condition == Condition.RESOURCE_LIMIT_EXCEEDED
            finally:
                for peer in peers:
                    peer.close_socket()
        finally:
            for sock in silent:
                sock.close()


def test_connections_past_their_open_do_not_count_as_pending() -> None:
    """Open connections never make way for new sockets: only handshakes in progress are evicted."""
    config = {"server": {"port": 0, "max_pending_handshakes": 2}}
    with run_in_thread(config) as running:
        opened = []
        for _ in range(4):
            opened.append(connect(running))
            opened[-1].open(sasl="ANONYMOUS")
        silent = [socket.create_connection((HOST, running.port), timeout=TIMEOUT) for _ in range(4)]
        try:
            for peer in opened:  # all four still served
                peer.begin()
                peer.close()
        finally:
            for peer in opened:
                peer.close_socket()
            for sock in silent:
                sock.close()


# -- item 19: failed logins limited per address and per user -------------------------------------------------
def _guess_in_parallel(broker: ThreadedBroker, user: str, sources: list[str]) -> list[int]:
    with ThreadPoolExecutor(len(sources)) as pool:
        return list(pool.map(lambda i_src: try_login(broker, user, f"guess-{i_src[0]}", i_src[1]), enumerate(sources)))


def test_parallel_guesses_from_one_address_are_limited(count_checks: Callable[[], int]) -> None:
    """Thirty connections from one address guess at once: only ``max_failures_per_address`` passwords are
    checked; the rest are answered as failed unchecked. Another address still logs in."""
    auth = {
        "failure_delay": 0,
        "max_failures_per_address": 3,
        "max_failures_per_user": 100,
        "failure_window": 60,
        "users": {"alice": "secret"},
    }
    with run_in_thread({"server": {"port": 0}, "auth": auth}) as running:
        assert _guess_in_parallel(running, "alice", [HOST] * 30) == [1] * 30
        assert count_checks() <= 3
        # from the throttled address even the right password is refused, unchecked
        assert try_login(running, "alice", "secret") == 1
        assert count_checks() <= 3
        # from another address the right password works
        assert try_login(running, "alice", "secret", source="127.0.0.2") == 0
        assert count_checks() <= 4


def test_parallel_guesses_for_one_user_from_many_addresses_are_limited(count_checks: Callable[[], int]) -> None:
    """Twenty addresses guess one user's password at once: only ``max_failures_per_user`` are checked. While
    that user's allowance is used up the user cannot log in (the documented price); others can."""
    auth = {
        "failure_delay": 0,
        "max_failures_per_address": 100,
        "max_failures_per_user": 3,
        "failure_window": 60,
        "users": {"alice": "secret", "bob": "other"},
    }
    with run_in_thread({"server": {"port": 0}, "auth": auth}) as running:
        sources = [f"127.0.0.{10 + i}" for i in range(20)]
        assert _guess_in_parallel(running, "alice", sources) == [1] * 20
        assert count_checks() <= 3
        assert try_login(running, "alice", "secret", source="127.0.0.2") == 1
        assert try_login(running, "bob", "other", source="127.0.0.2") == 0


def test_refused_attempts_wait_longer_and_longer_and_the_allowance_refills() -> None:
    auth = {
        "failure_delay": 0.05,
        "max_failures_per_address": 2,
        "max_failures_per_user": 100,
        "failure_window": 1.0,  # two failures per second
        "users": {"alice": "secret"},
    }
    with run_in_thread({"server": {"port": 0}, "auth": auth}) as running:
        for _ in range(2):
            timed_login(running, "alice", "wrong")
        waits = [timed_login(running, "alice", "wrong") for _ in range(3)]  # refused unchecked: 0.05, 0.1, 0.2
        assert waits[2] > waits[0] + 0.1, waits
        time.sleep(1.0)  # the allowance refills
        assert try_login(running, "alice", "secret") == 0


# -- item 20: minibroker check with credentials --------------------------------------------------------------
PASSWORD = "p@ss:w/rd-7f2a"


@pytest.fixture(scope="module")
def users_broker() -> Iterator[ThreadedBroker]:
    with run_in_thread({"server": {"port": 0}, "auth": {**NO_LIMITS, "users": {"alice": PASSWORD}}}) as running:
        yield running


def _check(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = subprocess.run(
        [sys.executable, "-m", "minibroker", "check", "--timeout", "5", *args],
        capture_output=True, text=True, timeout=30, check=False, env={**os.environ, **(env or {})},
    )  # fmt: skip
    return result.returncode, result.stdout + result.stderr


def _assert_no_secret(output: str) -> None:
    for shown in (PASSWORD, quote(PASSWORD, safe=""), "p@ss", "7f2a"):
        assert shown not in output, output


@pytest.mark.parametrize(
    ("how", "expected"),
    [("url", 0), ("options", 0), ("environment", 0), ("wrong-password", 1), ("anonymous", 1)],
)
def test_check_logs_in_with_plain_and_never_prints_credentials(
    users_broker: ThreadedBroker, how: str, expected: int
) -> None:
    port = users_broker.port
    url = f"amqp://alice:{quote(PASSWORD, safe='')}@127.0.0.1:{port}"
    args: list[str]
    env: dict[str, str] = {}
    if how == "url":
        args = ["--url", url]
    elif how == "options":
        args = ["--url", f"amqp://127.0.0.1:{port}", "--user", "alice", "--password", PASSWORD]
    elif how == "environment":
        args = ["--url", f"127.0.0.1:{port}"]
        env = {"MINIBROKER_CHECK_USER": "alice", "MINIBROKER_CHECK_PASSWORD": PASSWORD}
    elif how == "wrong-password":
        args = ["--url", url.replace(quote(PASSWORD, safe=""), quote(PASSWORD + "x", safe=""))]
    else:
        args = ["--url", f"amqp://127.0.0.1:{port}"]
    code, output = _check(*args, env=env)
    assert code == expected, output
    _assert_no_secret(output)
    if how == "url" or how == "wrong-password":
        assert f"amqp://***@127.0.0.1:{port}" in output
    if how == "wrong-password":
        assert "SASL PLAIN was refused" in output
    if how == "anonymous":
        assert "does not offer SASL ANONYMOUS" in output


# -- item 21: a config error never shows a password -----------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        ("[auth.users]\nalice = 74185296\n", "auth.users.alice", "expected a string"),
        ('[auth.users]\nalice = ["hunter2-74185296"]\n', "auth.users.alice", "expected a string"),
        ('[auth]\nusers = "hunter2-74185296"\n', "auth.users", "expected a table"),
    ],
)
def test_config_errors_never_show_a_password(tmp_path: Path, text: str, key: str, problem: str) -> None:
    path = tmp_path / "secret.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        Config.load(path)
    message = str(info.value)
    assert f"{key}: {problem}" in message
    assert "74185296" not in message
    assert "not shown" in message
    result = subprocess.run(
        [sys.executable, "-m", "minibroker", "--config", str(path)],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert key in result.stderr
    assert "74185296" not in result.stderr + result.stdout


def test_config_errors_still_show_other_values() -> None:
    with pytest.raises(ConfigError, match="got 'x'"):
        Config.from_dict({"server": {"port": "x"}})


# -- item 22: dynamic nodes obey permissions ------------------------------------------------------------------
DYNAMIC_AUTH: dict[str, Any] = {
    **NO_LIMITS,
    "users": {"alice": "secret", "carol": "secret", "bob": "secret"},
    "permissions": {
        "alice": {"send": ["orders", "orders.*"], "receive": ["replies.*"]},
        "carol": {"send": ["dynamic.*"], "receive": ["dynamic.*"]},
        # bob has no entry: he may do everything
    },
}


@pytest.fixture
def dynamic_broker() -> Iterator[ThreadedBroker]:
    with run_in_thread({"server": {"port": 0}, "auth": DYNAMIC_AUTH}) as running:
        yield running


def _attach_dynamic(peer: ScriptedPeer, sender: bool) -> tuple[Attach, Detach | None]:
    """Attach a dynamic target (we send) or a dynamic source (we receive); the broker's attach, and its
    detach if it refused."""
    dynamic_source = Source(dynamic=True, capabilities=[Symbol("temporary-queue")])
    if sender:
        reply = peer.attach_sender(None, handle=0, target=Target(dynamic=True))
    else:
        reply = peer.attach_receiver(None, handle=0, source=dynamic_source)
    terminus = reply.target if sender else reply.source
    if terminus is None:
        return reply, peer.expect(Detach)
    return reply, None


@pytest.mark.parametrize("sender", [False, True], ids=["dynamic-source", "dynamic-target"])
def test_dynamic_nodes_refused_without_permission(dynamic_broker: ThreadedBroker, sender: bool) -> None:
    with open_as(dynamic_broker, "alice", "secret") as peer:
        peer.begin()
        _reply, detach = _attach_dynamic(peer, sender)
        assert detach is not None
        assert detach.error is not None
        assert detach.error.condition == Condition.UNAUTHORIZED_ACCESS
        assert "dynamic." in str(detach.error.description)
        peer.close()
    assert not [q for q in dynamic_broker.queues if q.startswith("dynamic.")]


@pytest.mark.parametrize("user", ["carol", "bob"])
@pytest.mark.parametrize("sender", [False, True], ids=["dynamic-source", "dynamic-target"])
def test_dynamic_nodes_allowed_by_pattern_or_without_restrictions(
    dynamic_broker: ThreadedBroker, user: str, sender: bool
) -> None:
    with open_as(dynamic_broker, user, "secret") as peer:
        peer.begin()
        reply, detach = _attach_dynamic(peer, sender)
        assert detach is None
        terminus = reply.target if sender else reply.source
        assert str(terminus.address).startswith("dynamic.")
        if sender:
            peer.expect(Flow)  # credit for what we send to it
        peer.close()


def test_plain_pipelined_with_the_amqp_header_and_open() -> None:
    """A client that sends sasl-init, the AMQP header and open in one go (no waiting for the outcome) gets
    them all answered once its password has been checked in the worker thread."""
    with (
        run_in_thread({"server": {"port": 0}, "auth": {**NO_LIMITS, "users": {"alice": "secret"}}}) as running,
        connect(running) as peer,
    ):
        peer.send_raw(
            SASL_HEADER
            + frames.frame(0, frames.sasl_plain("alice", "secret"), frame_type=SASL_FRAME)
            + AMQP_HEADER
            + frames.frame(0, frames.open_())
        )
        assert peer.expect_header() == SASL_HEADER
        peer.expect_sasl(SaslMechanisms)
        assert peer.expect_sasl(SaslOutcome).code == 0
        assert peer.expect_header() == AMQP_HEADER
        peer.expect(Open)
        peer.close()
