"""What one hostile or careless peer costs everyone else: the broker's limits under attack.

    python -m bench.soak --only attacks [--scale 1.0]

Each attack runs against a fresh broker process (``bench.broker_process.BrokerProcess``, with the
configuration the attack needs) while a *bystander* connection makes round trips (an unsettled transfer
and the broker's ``accepted``) to a queue of its own. For each attack the run reports the bystander's
round trips (median and worst, before and during the attack), the broker's CPU time and RSS growth, and
what the attacker got back; an attack is OK when the broker answered it as README "Limits and security"
says and the bystander was served throughout.

* **silent-sockets**: 1,000 sockets that never speak, then 50 correct PLAIN logins: all must succeed
  (only authenticated connections count toward ``max_connections``; pending handshakes have their own cap).
* **bad-logins**: 4 threads failing PLAIN logins for a user with a PBKDF2 hash: the bystander's worst round
  trip stays under 250 ms (hashing runs in worker threads; failures are limited per address and per user).
* **tiny-idle**: 50 connections announcing ``idle-time-out = 1 ms``: the broker's CPU stays low.
* **fan-out**: one connection with many subscriptions to a topic, then 200-byte publishes: memory and time
  per publish (one copy of the payload shared by the subscriptions).
* **endless-transfer**: a transfer that never ends (empty continuation frames) to a broker with a 1 MiB
  ``max_message_size``: the link is detached after a few thousand frames, before the broker's memory grows.
* **staged**: transactions staging 1 MiB posts until the broker-wide staged-bytes cap: posts past it are
  rejected, memory stays near the cap.
* **nodes**: attaches to ever new addresses until the node limit: refused with
  ``amqp:resource-limit-exceeded``.
* **selector**: a consumer whose selector is a 30 kB ``LIKE`` pattern, then messages with a 1 MB property:
  the bystander is not frozen.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

from bench.broker_process import HOST, BrokerProcess
from bench.measures import cpu_seconds, rss_kib
from bench.raw import IO_TIMEOUT, BrokerClosed, RawClient, Unexpected
from minibroker.amqp.definitions import (
    ApplicationProperties,
    Attach,
    Begin,
    Close,
    Declare,
    Detach,
    Disposition,
    Flow,
    Rejected,
    Source,
    TransactionalState,
)
from minibroker.amqp.framing import encode_frame
from minibroker.amqp.types import Described, Symbol, UInt
from minibroker.auth import hash_password
from minibroker.testing import frames

USER, PASSWORD = "alice", "right horse battery staple"
SELECTOR = Symbol("apache.org:selector-filter:string")
CHUNK = 60_000  # payload bytes per transfer frame: below the broker's default max-frame-size


def connect(port: int, name: str, *, user: str | None = None, password: str = "", **open_fields: Any) -> RawClient:
    """A connection with one session (channel 0), after SASL PLAIN when ``user`` is given (``PermissionError``
    when the broker refuses it)."""
    conn = RawClient(HOST, port)
    try:
        conn.open(name, sasl=None if user is None else ("PLAIN", user, password), **open_fields)
    except BaseException:
        conn.sock.close()
        raise
    return conn


def _send_confirmed(conn: RawClient, handle: int, delivery_id: int, body: bytes, **fields: Any) -> Any:
    """One unsettled transfer on ``handle``, in frames that fit the default max-frame-size; the broker's
    disposition for it (its state)."""
    chunks = [body[i : i + CHUNK] for i in range(0, len(body), CHUNK)] or [b""]
    for i, chunk in enumerate(chunks):
        more = i < len(chunks) - 1
        conn.send(frames.transfer(handle, delivery_id if i == 0 else None, more=more, **fields), payload=chunk)
    return conn.expect(Disposition).state


class Bystander(threading.Thread):
    """Round trips to a queue of its own, timed, until stopped; ``mark()`` splits before from during."""

    def __init__(self, port: int, **login: Any) -> None:
        super().__init__(daemon=True)
        self.conn = connect(port, "bystander", **login)
        self.conn.attach(frames.attach_sender("bystander", handle=0))
        self.conn.expect(Flow)
        self.times: list[float] = []
        self.split = 0
        self.error: str | None = None
        self._stopping = threading.Event()
        self.start()

    def run(self) -> None:
        body = frames.message("ping")
        delivery_id = 0
        try:
            while not self._stopping.is_set():
                began = time.perf_counter()
                _send_confirmed(self.conn, 0, delivery_id, body)
                self.times.append(time.perf_counter() - began)
                delivery_id += 1
                time.sleep(0.002)
        except Exception as exc:  # the figure says how the bystander failed
            self.error = f"{type(exc).__name__}: {exc}"

    def mark(self) -> None:
        time.sleep(0.3)
        self.split = len(self.times)

    def finish(self) -> dict[str, Any]:
        self._stopping.set()
        self.join(15)
        self.conn.sock.close()
        before, during = self.times[: self.split], self.times[self.split :]

        def summary(times: list[float]) -> dict[str, Any]:
            if not times:
                return {"round_trips": 0}
            return {
                "round_trips": len(times),
                "p50_ms": round(statistics.median(times) * 1000, 2),
                "max_ms": round(max(times) * 1000, 2),
            }

        return {"before": summary(before), "during": summary(during), "error": self.error}


@dataclass
class AttackResult:
    """Figures of one attack."""

    name: str
    ok: bool = False
    seconds: float = 0.0
    broker_cpu_s: float = 0.0
    rss_growth_kib: int = 0
    bystander: dict[str, Any] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)


@contextmanager
def _sockets() -> Iterator[list[Any]]:
    held: list[Any] = []
    try:
        yield held
    finally:
        for sock in held:
            sock.close()


def silent_sockets(broker: BrokerProcess, scale: float) -> tuple[bool, dict[str, Any]]:
    import socket

    silent, logins = max(300, int(1000 * scale)), 50
    with _sockets() as held:
        for _ in range(silent):
            held.append(socket.create_connection((HOST, broker.port)))
        time.sleep(0.2)
        succeeded = 0
        for i in range(logins):
            try:
                connect(broker.port, f"login-{i}", user=USER, password=PASSWORD).close()
                succeeded += 1
            except (PermissionError, BrokerClosed, TimeoutError, OSError):
                pass
    return succeeded == logins, {"silent_sockets": silent, "logins": logins, "succeeded": succeeded}


def bad_logins(broker: BrokerProcess, scale: float) -> tuple[bool, dict[str, Any]]:
    deadline = time.monotonic() + max(2.0, 5.0 * scale)
    attempts = [0]

    def guess() -> None:
        while time.monotonic() < deadline:
            try:
                connect(broker.port, "guesser", user=USER, password="wrong").close()
            except (PermissionError, BrokerClosed, TimeoutError, OSError):
                attempts[0] += 1

    threads = [threading.Thread(target=guess, daemon=True) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return attempts[0] > 0, {"failed_logins": attempts[0]}


def tiny_idle(broker: BrokerProcess, scale: float) -> tuple[bool, dict[str, Any]]:
    peers, window = 50, max(2.0, 3.0 * scale)
    conns: list[RawClient] = []
    refused = 0
    for i in range(peers):
        conn = RawClient(HOST, broker.port)
        try:
            conn.open(f"idle-{i}", idle_time_out=UInt(1))
        except (Unexpected, BrokerClosed):  # a close instead of the answering begin, or the socket closed
            refused += 1
        conns.append(conn)
    cpu_before = cpu_seconds(broker.pid)
    time.sleep(window)
    cpu = cpu_seconds(broker.pid) - cpu_before
    frames_received = 0
    for conn in conns:
        conn.sock.setblocking(False)
        with suppress(BrokerClosed):
            frames_received += len(conn.receive())
        conn.sock.close()
    share = cpu / window
    return share < 0.25, {
        "peers": peers,
        "refused_or_closed": refused,
        "frames_received_per_peer_per_s": round(frames_received / peers / window, 1),
        "broker_cpu_share": round(share, 3),
    }


def fan_out(broker: BrokerProcess, scale: float) -> tuple[bool, dict[str, Any]]:
    subscriptions, publishes = max(1000, int(20_000 * scale)), 20
    conn = connect(broker.port, "fan-out")
    per_session = 1000  # below the default links per session
    sessions = -(-subscriptions // per_session)
    for channel in range(1, sessions):
        conn.send(frames.begin(), channel)
    for _ in range(1, sessions):
        conn.expect(Begin)
    for i in range(subscriptions):
        channel, handle = divmod(i, per_session)
        conn.send(frames.attach_receiver("topic://fan", handle=handle, name=f"sub-{i}"), channel)
        if handle == per_session - 1:
            conn.flush()
    for _ in range(subscriptions):
        conn.expect(Attach)
    sender = connect(broker.port, "publisher")
    sender.attach(frames.attach_sender("topic://fan", handle=0))
    sender.expect(Flow)
    body = frames.message("x" * 200)
    rss_before = rss_kib(broker.pid)
    began = time.perf_counter()
    for i in range(publishes):
        _send_confirmed(sender, 0, i, body)
    seconds = time.perf_counter() - began
    per_publish_kib = (rss_kib(broker.pid) - rss_before) / publishes
    per_subscription_bytes = per_publish_kib * 1024 / subscriptions
    sender.sock.close()
    conn.sock.close()
    return per_subscription_bytes < 200, {
        "subscriptions": subscriptions,
        "ms_per_publish": round(seconds * 1000 / publishes, 1),
        "kib_per_publish": round(per_publish_kib, 1),
        "bytes_per_subscription_per_publish": round(per_subscription_bytes, 1),
    }


def endless_transfer(broker: BrokerProcess, scale: float) -> tuple[bool, dict[str, Any]]:
    conn = connect(broker.port, "endless")
    conn.attach(frames.attach_sender("endless", handle=0))
    conn.expect(Flow)
    conn.send(frames.transfer(0, 0, more=True), payload=b"\x00")
    continuation = frames.transfer(0, None, more=True)
    empty = encode_frame(0, continuation)
    sent = 0
    answer: Detach | Close | str | None = None
    conn.sock.setblocking(False)
    limit = max(20_000, int(4_000_000 * scale))
    while sent < limit and answer is None:
        for _ in range(1000):
            conn.conn.send_encoded(empty, continuation)
        sent += 1000
        conn.flush()
        while conn.out:
            conn.flush()
            try:
                for frame in conn.receive():
                    if isinstance(frame.performative, (Detach, Close)):
                        answer = frame.performative
            except BrokerClosed:
                answer = "connection closed"
                break
            if answer is not None:
                break
    if answer is None:  # all sent: the broker's answer may still be on its way
        conn.sock.setblocking(True)
        conn.sock.settimeout(IO_TIMEOUT)
        with suppress(BrokerClosed, TimeoutError):
            answer = conn.expect((Detach, Close))
    conn.sock.close()
    condition = getattr(getattr(answer, "error", None), "condition", None)
    return answer is not None, {"frames_sent_before_answer": sent, "answer": type(answer).__name__,
                                "condition": str(condition)}  # fmt: skip


def staged(broker: BrokerProcess, scale: float) -> tuple[bool, dict[str, Any]]:
    from minibroker.amqp.definitions import AmqpValue, Coordinator

    conn = connect(broker.port, "stager")
    conn.send(frames.attach_sender(None, handle=0, name="controller", target=Coordinator()))
    conn.send(frames.attach_sender("staged", handle=1))
    conn.expect(Flow)
    conn.expect(Flow)
    body = frames.message(b"x" * (1 << 20))
    delivery_id, accepted, rejected = 0, 0, 0
    posts_per_txn, cap_posts = 100, int(CAPS["staged_mib"] * 2)
    while accepted + rejected < cap_posts:
        conn.send(frames.transfer(0, delivery_id), payload=frames.message(AmqpValue(Declare())))
        delivery_id += 1
        txn_id = conn.expect(Disposition).state.txn_id
        for _ in range(posts_per_txn):
            outcome = _send_confirmed(conn, 1, delivery_id, body, state=TransactionalState(txn_id=txn_id)).outcome
            delivery_id += 1
            if isinstance(outcome, Rejected):
                rejected += 1
                break
            accepted += 1
    conn.sock.close()
    return accepted <= CAPS["staged_mib"] and rejected > 0, {"posts_accepted_mib": accepted, "rejected": rejected}


def nodes(broker: BrokerProcess, scale: float) -> tuple[bool, dict[str, Any]]:
    conn = connect(broker.port, "creator")
    created, refusal = 0, None
    for handle in range(CAPS["nodes"] * 2):
        conn.send(frames.attach_receiver(f"node.{handle}", handle=handle % 1000, name=f"n{handle}"))
        reply = conn.expect(Attach)
        if reply.source is None:
            refusal = conn.expect(Detach).error
            break
        created += 1
        conn.send(Detach(handle=UInt(handle % 1000), closed=True))
        conn.expect(Detach)
    conn.sock.close()
    condition = str(getattr(refusal, "condition", None))
    ok = refusal is not None and condition == "amqp:resource-limit-exceeded"
    return ok, {"created": created, "condition": condition}


def selector(broker: BrokerProcess, scale: float) -> tuple[bool, dict[str, Any]]:
    conn = connect(broker.port, "selecting")

    def consumer(handle: int, text: str) -> bool:
        """Attach a selector consumer with credit; whether the broker took the selector."""
        filter_set = {Symbol("jms-selector"): Described(SELECTOR, text)}
        source = Source(address="selected", filter=filter_set)
        conn.send(frames.attach_receiver("selected", handle=handle, name=f"sel-{handle}", source=source))
        conn.send(conn.conn.flow(handle, 100))
        return conn.expect(Attach).source is not None

    huge_taken = consumer(0, "big LIKE '%" + "a_" * 15_000 + "%b'")  # 30 kB: past the default limit
    taken = consumer(1, "big LIKE '%" + "a_" * 2_000 + "%b' OR color = 'none'")  # within it, never true
    conn.attach(frames.attach_sender("selected", handle=2))
    conn.expect(Flow)
    deep = max(2_000, int(50_000 * scale))
    filler = frames.message("x", ApplicationProperties({"big": "ab" * 1_000, "color": "red"}))
    for i in range(deep):
        conn.send(frames.transfer(2, i, settled=True), payload=filler)
        if i % 200 == 199:
            conn.flush()
    arrivals = 50
    began = time.perf_counter()
    for i in range(deep, deep + arrivals):
        _send_confirmed(conn, 2, i, filler)
    per_arrival_ms = (time.perf_counter() - began) * 1000 / arrivals
    conn.sock.close()
    return not huge_taken and taken, {
        "30kB_selector_refused": not huge_taken,
        "queue_depth": deep,
        "ms_per_arrival_with_non_matching_selector": round(per_arrival_ms, 2),
    }


CAPS = {"staged_mib": 64, "nodes": 500}
MANY = 10**6  # subscription limits lifted: the fan-out run measures the cost of a publish, not the limit

# the attacks whose whole point is the bystander's latency: its worst round trip during the attack must stay below
# this (a password hash on the event loop alone takes ~300 ms)
BYSTANDER_WORST_MS = {"bad-logins": 250.0}

ATTACKS: dict[str, tuple[Callable[[BrokerProcess, float], tuple[bool, dict[str, Any]]], dict[str, Any], bool]] = {
    # name: (attack, broker configuration, whether the bystander logs in as USER)
    "silent-sockets": (silent_sockets, {"auth": {"users": {USER: PASSWORD}}}, True),
    "bad-logins": (bad_logins, {"auth": {"users": {USER: hash_password(PASSWORD)}}}, True),
    "tiny-idle": (tiny_idle, {}, False),
    "fan-out": (
        fan_out,
        {"broker": {"max_subscriptions_per_topic": 10**6, "max_subscriptions_per_connection": 10**6}},
        False,
    ),
    "endless-transfer": (endless_transfer, {"server": {"max_message_size": 1 << 20}}, False),
    "staged": (staged, {"broker": {"max_total_staged_bytes": CAPS["staged_mib"] << 20}}, False),
    "nodes": (nodes, {"broker": {"max_nodes": CAPS["nodes"]}}, False),
    "selector": (selector, {}, False),
}


def run_attack(name: str, scale: float = 1.0) -> AttackResult:
    """Run attack ``name`` against a fresh broker with a bystander; its figures."""
    attack, config, login = ATTACKS[name]
    result = AttackResult(name)
    with ExitStack() as stack:
        broker = stack.enter_context(BrokerProcess(config=config))
        bystander = Bystander(broker.port, **({"user": USER, "password": PASSWORD} if login else {}))
        bystander.mark()
        rss_before, cpu_before, began = rss_kib(broker.pid), cpu_seconds(broker.pid), time.perf_counter()
        try:
            result.ok, result.detail = attack(broker, scale)
        except Exception as exc:  # an attack that breaks the client is a finding, reported
            result.detail = {"error": f"{type(exc).__name__}: {exc}"}
        result.seconds = round(time.perf_counter() - began, 2)
        result.broker_cpu_s = round(cpu_seconds(broker.pid) - cpu_before, 2)
        result.rss_growth_kib = rss_kib(broker.pid) - rss_before
        time.sleep(0.3)
        result.bystander = bystander.finish()
        during = result.bystander["during"]
        served = result.bystander["error"] is None and during.get("round_trips", 0) > 0
        bound = BYSTANDER_WORST_MS.get(name)
        in_time = bound is None or during.get("max_ms", 0.0) < bound
        result.ok = result.ok and served and in_time and broker.proc.poll() is None
    return result


def run_attacks(names: list[str], scale: float, say: Callable[[str], None]) -> list[AttackResult]:
    """Every attack in ``names``, each reported as it ends."""
    results = []
    for name in names:
        res = run_attack(name, scale)
        during = res.bystander.get("during", {})
        say(
            f"  {name}: {'OK' if res.ok else 'FAILED'} in {res.seconds} s, broker CPU {res.broker_cpu_s} s, "
            f"RSS {res.rss_growth_kib / 1024:+.1f} MiB; bystander p50 {during.get('p50_ms')} ms, worst "
            f"{during.get('max_ms')} ms; {res.detail}"
        )
        results.append(res)
    return results
