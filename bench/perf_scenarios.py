"""perf's scenario table, what each client process is handed (``ClientOptions``) and what it measures
(``Meter``), and ``spawn_client``, which runs one scenario in a client process of its own (``bench.perf_client``).

256-byte bodies; every message is what python-qpid-proton encodes for ``Message(body=BODY)``: an empty
header section, an empty properties section and an amqp-value binary (272 bytes). The raw clients send
exactly these bytes (``ENCODED``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

from proton import Message

from bench import ROOT
from bench.measures import cpu_seconds_or_none, percentile, self_cpu_seconds

BODY_SIZE = 256
BODY = b"x" * BODY_SIZE
ENCODED = Message(body=BODY).encode()
MEMORY_MESSAGES = 100_000


class Meter:
    """Marks the start and end of a scenario's traffic: wall time, client CPU, broker CPU."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.started = False
        self.t0 = self.c0 = 0.0
        self.b0: float | None = None
        self.latencies_ms: list[float] = []
        self.result: dict[str, Any] | None = None

    def start(self) -> None:
        if not self.started:
            self.started = True
            self.b0 = cpu_seconds_or_none(self.pid)
            self.c0 = self_cpu_seconds()
            self.t0 = time.perf_counter()

    def stop(self, count: int, **extra: Any) -> dict[str, Any]:
        if self.result is None:
            elapsed = time.perf_counter() - self.t0
            client = self_cpu_seconds() - self.c0
            b1 = cpu_seconds_or_none(self.pid)
            broker = None if self.b0 is None or b1 is None else b1 - self.b0
            result: dict[str, Any] = {
                "count": count,
                "elapsed_s": elapsed,
                "client_cpu_s": client,
                "broker_cpu_s": broker,
            }
            if self.latencies_ms:
                result["latency_p50_ms"] = percentile(self.latencies_ms, 0.5)
                result["latency_p99_ms"] = percentile(self.latencies_ms, 0.99)
            result.update(extra)
            self.result = result
        return self.result


@dataclass
class ClientOptions:
    """What a client process is told: the broker, the queue, how many messages, for how long at most, the
    broker's pid (for its CPU time), and the queue of the synchronous message that ends some scenarios."""

    url: str
    address: str
    count: int
    time_limit: float
    pid: int | None
    sync_address: str


@dataclass(frozen=True)
class Scenario:
    """One row of perf's table: what its client does, on which queue, with how many messages, and the
    reference brokers' figures for it (broker CPU µs per message)."""

    name: str
    title: str
    address: str
    unit: str = "msg"  # what the figures are per: msg or txn
    scale: float = 1.0  # count = scale * --count
    drains: str | None = None  # consumes what this earlier scenario left
    latency: bool = False
    raw: bool = False
    reference: tuple[float | None, float | None, float | None] = (None, None, None)  # AMQ, RabbitMQ, proton


SCENARIOS = [
    Scenario("send_presettled", "pre-settled send", "bench.presettled", reference=(12.3, 56, 182)),
    Scenario("recv_presettled", "pre-settled receive", "bench.presettled", drains="send_presettled",
             reference=(40.6, 66.6, 107)),
    Scenario("send_confirmed", "unsettled send, accepted", "bench.confirmed", latency=True,
             reference=(23.1, 85.5, 191)),
    Scenario("consume_accept", "consume, explicit accept", "bench.confirmed", drains="send_confirmed",
             reference=(36.3, 72.8, 115)),
    Scenario("send_20_conns", "20 connections sending", "bench.many", latency=False, reference=(20.7, 73, 142)),
    Scenario("txn_1", "txn: declare, send 1, commit", "bench.txn1", unit="txn", scale=0.1, latency=True,
             reference=(230, None, None)),
    Scenario("txn_roundtrip", "txn: declare + discharge (empty)", "bench.txnrt", unit="txn", scale=0.1,
             latency=True),
    Scenario("txn_10", "txn: 10 messages per txn", "bench.txn10", scale=0.5, reference=(32, None, None)),
    Scenario("txn_100", "txn: 100 messages per txn", "bench.txn100", reference=(16, None, None)),
    Scenario("txn_accept_100", "txn: accept 100 per txn", "bench.txn100", drains="txn_100",
             reference=(21.5, None, None)),
    Scenario("raw_send_presettled", "raw: pre-settled send", "bench.raw", raw=True, scale=4.0,
             reference=(12.3, 56, 182)),
    Scenario("raw_send_confirmed", "raw: unsettled send, accepted", "bench.raw", raw=True, scale=4.0,
             latency=True, reference=(23.1, 85.5, 191)),
    Scenario("raw_consume_accept", "raw: consume, accept", "bench.raw", raw=True,
             drains="raw_send_presettled+raw_send_confirmed", reference=(36.3, 72.8, 115)),
    Scenario("raw_txn_roundtrip", "raw: declare + discharge (empty)", "bench.rawtxn", unit="txn", raw=True,
             scale=0.1, latency=True),
    Scenario("raw_txn_1", "raw: txn, declare, send 1, commit", "bench.rawtxn1", unit="txn", raw=True, scale=0.1,
             latency=True, reference=(230, None, None)),
    Scenario("raw_txn_10", "raw: txn, 10 messages per txn", "bench.rawtxn10", raw=True, scale=0.5, latency=True,
             reference=(32, None, None)),
    Scenario("raw_txn_100", "raw: txn, 100 messages per txn", "bench.rawtxn100", raw=True, latency=True,
             reference=(16, None, None)),
    Scenario("raw_txn_accept_100", "raw: txn, accept 100 per txn", "bench.rawtxn100", raw=True, latency=True,
             drains="raw_txn_100", reference=(21.5, None, None)),
]  # fmt: skip
BY_NAME = {s.name: s for s in SCENARIOS}


def spawn_client(name: str, opts: ClientOptions) -> dict[str, Any]:
    """Run ``name`` in a fresh client process; its figures, or {"error": ...}."""
    cmd = [
        sys.executable, "-m", "bench.perf_client", name, "--url", opts.url, "--address", opts.address,
        "--sync-address", opts.sync_address, "--count", str(opts.count), "--time-limit", str(opts.time_limit),
    ]  # fmt: skip
    if opts.pid is not None:
        cmd += ["--pid", str(opts.pid)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=opts.time_limit + 90, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": "client timed out"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"client exit {done.returncode}: {tail}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result
