"""Broker CPU per message, throughput, latency, start-up and memory of an AMQP 1.0 broker.

    python bench/perf.py [--runs 3] [--count N] [--url HOST:PORT [--pid PID]] [--json out.json]
                         [--scenarios a,b,...] [--profile DIR]

Without ``--url`` each run starts minibroker as a subprocess (``python -m minibroker --port 0 --log-level
warning``). With ``--url`` it drives any AMQP 1.0 broker; broker CPU and RSS then need ``--pid`` (the
broker's process id, read from /proc) and are otherwise reported as n/a.

Every scenario runs in its own client process (``python bench/perf.py --client NAME ...``), so the
client's CPU (``resource.getrusage`` of that process) is measured apart from the broker's. The client
itself reads the broker's CPU (user+sys of the whole process, /proc/PID/stat) when its traffic starts
(links attached, credit granted) and when the broker has demonstrably handled all of it (the last
``accepted``, or a synchronous round trip after pre-settled traffic), so connection set-up and tear-down
are outside the figure. Scenarios (256-byte bodies, one queue each):

proton clients (python-qpid-proton's event-driven Container; the client is usually the bottleneck):
  send_presettled    pre-settled transfers; the last one unsettled, its ``accepted`` ends the scenario
  recv_presettled    a receiver attached with snd-settle-mode settled drains what send_presettled queued
  send_confirmed     unsettled transfers, each ``accepted`` by the broker (latency: send -> accepted)
  consume_accept     a receiver accepts each message explicitly (drains what send_confirmed queued)
  send_20_conns      20 connections, each sending count/20 unsettled messages at once
  txn_1              declare, send 1 message, commit (figures per transaction; latency declare->committed)
  txn_roundtrip      empty transactions: declare, then discharge (latency declare->declared + commit->committed)
  txn_10, txn_100    10 / 100 messages per transaction
  txn_accept_100     100 messages accepted per transaction (drains what txn_100 queued), as proton's tx_recv
raw clients (pre-encoded frames from minibroker.amqp and minibroker.testing.frames over a plain socket,
pipelined up to the broker's credit; the client costs a few µs per message, so the broker is the limit):
  raw_send_presettled, raw_send_confirmed, raw_consume_accept (accepts in ranges of up to 100)
memory: a fresh broker's RSS idle, then with 100,000 256-byte messages queued (filled by the raw sender).

Each run starts fresh brokers (one for the memory figures, one for the scenarios); the summary gives the
median and the min-max spread over the runs. ``--profile DIR`` additionally records the broker with
py-spy (``pip install py-spy``) during send_presettled and consume_accept (and their raw versions) and
prints the top 15 functions by own time.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import resource
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from proton import Message
from proton.handlers import MessagingHandler, TransactionHandler
from proton.reactor import AtMostOnce, Container

from minibroker.amqp import codec, fastpath
from minibroker.amqp.definitions import (
    Accepted,
    AmqpValue,
    Attach,
    Begin,
    Close,
    Coordinator,
    Declare,
    Declared,
    Detach,
    Discharge,
    Disposition,
    Flow,
    Open,
    SaslMechanisms,
    SaslOutcome,
    Transfer,
)
from minibroker.amqp.framing import FRAME_HEADER
from minibroker.amqp.types import Symbol, UInt
from minibroker.health import NotHealthy, check
from minibroker.testing import frames

BODY_SIZE = 256
BODY = b"x" * BODY_SIZE
# The raw clients send exactly the bytes python-qpid-proton sends for Message(body=BODY): an empty header
# section, an empty properties section and an amqp-value binary body (272 bytes).
ENCODED = Message(body=BODY).encode()
MEMORY_MESSAGES = 100_000
SERIAL = 2**32

# --------------------------------------------------------------------------------------------------
# measuring


def proc_cpu_s(pid: int | None) -> float | None:
    """user+sys CPU seconds of process ``pid`` (all its threads), or None without a pid."""
    if pid is None:
        return None
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss_kib(pid: int | None) -> int | None:
    """VmRSS of process ``pid`` in KiB, or None."""
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


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
            self.b0 = proc_cpu_s(self.pid)
            self.c0 = self_cpu_s()
            self.t0 = time.perf_counter()

    def stop(self, count: int, **extra: Any) -> dict[str, Any]:
        if self.result is None:
            elapsed = time.perf_counter() - self.t0
            client = self_cpu_s() - self.c0
            b1 = proc_cpu_s(self.pid)
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
    url: str
    address: str
    count: int
    time_limit: float
    pid: int | None
    sync_address: str


# --------------------------------------------------------------------------------------------------
# proton clients


class _Timer:
    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback

    def on_timer_task(self, event: Any) -> None:
        self.callback()


class ProtonBench(MessagingHandler):
    """Common parts: the meter, the time limit, a message to send and closing everything at the end."""

    def __init__(self, opts: ClientOptions, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.opts = opts
        self.meter = Meter(opts.pid)
        self.timed_out = False
        self.message = Message(body=BODY)
        self.connections: list[Any] = []
        self.error: str | None = None

    def connect(self, container: Any) -> Any:
        conn = container.connect(self.opts.url, reconnect=False)
        self.connections.append(conn)
        return conn

    def on_start(self, event: Any) -> None:
        self.container = event.container
        self.timer = event.container.schedule(self.opts.time_limit, _Timer(self.on_time_limit))
        self.setup(event.container)

    def setup(self, container: Any) -> None:
        raise NotImplementedError

    def on_time_limit(self) -> None:
        self.timed_out = True
        self.container.schedule(30.0, _Timer(self.give_up))

    def give_up(self) -> None:
        if self.meter.result is None:
            self.error = "no completion 30 s after the time limit"
            self.container.stop()

    def finish(self, count: int, **extra: Any) -> None:
        self.meter.stop(count, timed_out=self.timed_out, **extra)
        self.timer.cancel()
        for conn in self.connections:
            conn.close()
        self.container.stop()

    def on_transport_error(self, event: Any) -> None:
        self.error = f"transport error: {event.transport.condition}"
        event.container.stop()

    def on_connection_error(self, event: Any) -> None:
        self.error = f"connection error: {event.connection.remote_condition}"
        event.container.stop()

    def on_link_error(self, event: Any) -> None:
        self.error = f"link error: {event.link.remote_condition}"
        event.container.stop()

    def on_rejected(self, event: Any) -> None:
        self.error = f"rejected: {event.delivery.remote.condition}"
        event.container.stop()


class SendPresettled(ProtonBench):
    """Pre-settled sends; the last one unsettled, so its ``accepted`` proves the broker took them all."""

    def setup(self, container: Any) -> None:
        self.target = self.opts.count
        self.sent = 0
        self.sender = container.create_sender(self.connect(container), self.opts.address)

    def on_time_limit(self) -> None:
        super().on_time_limit()
        self.target = min(self.target, self.sent + 1)

    def on_sendable(self, event: Any) -> None:
        self.meter.start()
        sender = self.sender
        while sender.credit and self.sent < self.target:
            delivery = sender.send(self.message)
            self.sent += 1
            if self.sent < self.target:
                delivery.settle()

    def on_accepted(self, event: Any) -> None:
        if self.sent == self.target:
            self.finish(self.sent)


class RecvPresettled(ProtonBench):
    """A receiver with snd-settle-mode settled: the broker sends every message pre-settled."""

    def __init__(self, opts: ClientOptions) -> None:
        super().__init__(opts, prefetch=1000)
        self.received = 0

    def setup(self, container: Any) -> None:
        container.create_receiver(self.connect(container), self.opts.address, options=AtMostOnce())

    def on_link_opened(self, event: Any) -> None:
        self.meter.start()

    def on_time_limit(self) -> None:
        super().on_time_limit()
        self.finish(self.received)

    def on_message(self, event: Any) -> None:
        self.received += 1
        if self.received >= self.opts.count:
            self.finish(self.received)


class SyncMixin:
    """A second sender on the same connection: one unsettled message to ``sync_address``, whose
    ``accepted`` shows the broker has handled every frame sent before it on that connection."""

    sync_sender: Any = None
    sync_delivery: Any = None

    def open_sync(self, container: Any, conn: Any, address: str) -> None:
        self.sync_sender = container.create_sender(conn, address, name="bench-sync")

    def send_sync(self, message: Any) -> None:
        self.sync_delivery = self.sync_sender.send(message)


class SendConfirmed(ProtonBench):
    """Unsettled sends, every one ``accepted``; latency from send() to on_accepted."""

    def setup(self, container: Any) -> None:
        self.target = self.opts.count
        self.sent = self.accepted = 0
        self.sent_at: dict[Any, float] = {}
        self.sender = container.create_sender(self.connect(container), self.opts.address)

    def on_time_limit(self) -> None:
        super().on_time_limit()
        self.target = min(self.target, self.sent)
        self.check_done()

    def on_sendable(self, event: Any) -> None:
        self.meter.start()
        sender = self.sender
        while sender.credit and self.sent < self.target:
            delivery = sender.send(self.message)
            self.sent_at[delivery.tag] = time.perf_counter()
            self.sent += 1

    def on_accepted(self, event: Any) -> None:
        self.accepted += 1
        sent = self.sent_at.pop(event.delivery.tag, None)
        if sent is not None:
            self.meter.latencies_ms.append((time.perf_counter() - sent) * 1000)
        self.check_done()

    def check_done(self) -> None:
        if self.accepted >= self.target and self.meter.started:
            self.finish(self.accepted)


class ConsumeAccept(ProtonBench, SyncMixin):
    """A receiver that accepts each message explicitly; then a sync round trip on the same connection."""

    def __init__(self, opts: ClientOptions) -> None:
        super().__init__(opts, prefetch=1000, auto_accept=False)
        self.received = 0
        self.ready = 0

    def setup(self, container: Any) -> None:
        conn = self.connect(container)
        self.open_sync(container, conn, self.opts.sync_address)
        container.create_receiver(conn, self.opts.address)

    def on_link_opened(self, event: Any) -> None:
        self.ready += 1
        if self.ready == 2:
            self.meter.start()

    def on_time_limit(self) -> None:
        super().on_time_limit()
        if self.sync_delivery is None:
            self.send_sync(self.message)

    def on_message(self, event: Any) -> None:
        self.accept(event.delivery)
        self.received += 1
        if self.received == self.opts.count:
            self.send_sync(self.message)

    def on_accepted(self, event: Any) -> None:
        if event.delivery == self.sync_delivery:
            self.finish(self.received)


class SendManyConnections(ProtonBench):
    """``connections`` connections, each sending count/connections unsettled messages, all at once."""

    CONNECTIONS = 20

    def setup(self, container: Any) -> None:
        n = self.CONNECTIONS
        self.per = max(1, self.opts.count // n)
        self.senders = [container.create_sender(self.connect(container), self.opts.address) for _ in range(n)]
        self.sent = dict.fromkeys(self.senders, 0)
        self.target = dict.fromkeys(self.senders, self.per)
        self.ready: set[Any] = set()
        self.accepted = 0

    def on_time_limit(self) -> None:
        super().on_time_limit()
        self.target = dict(self.sent)
        self.check_done()

    def on_sendable(self, event: Any) -> None:
        self.ready.add(event.sender)
        if len(self.ready) < len(self.senders):
            return
        if not self.meter.started:
            self.meter.start()
            for sender in self.senders:
                self.pump(sender)
        else:
            self.pump(event.sender)

    def pump(self, sender: Any) -> None:
        while sender.credit and self.sent[sender] < self.target[sender]:
            sender.send(self.message)
            self.sent[sender] += 1

    def on_accepted(self, event: Any) -> None:
        self.accepted += 1
        self.check_done()

    def check_done(self) -> None:
        if self.meter.started and self.accepted >= sum(self.target.values()):
            self.finish(self.accepted, connections=len(self.senders))


class TxnSend(ProtonBench, TransactionHandler):
    """Transactions of ``per`` messages each (proton's ``Transaction.send``), one after the other;
    latency from declare_transaction() to on_transaction_committed."""

    def __init__(self, opts: ClientOptions, per: int) -> None:
        super().__init__(opts)
        self.per = per
        self.committed = 0
        self.in_txn = 0
        self.transaction: Any = None
        self.declared_at = 0.0

    def setup(self, container: Any) -> None:
        self.conn = self.connect(container)
        self.sender = container.create_sender(self.conn, self.opts.address)

    def on_sendable(self, event: Any) -> None:
        if event.sender == self.sender and not self.meter.started:
            self.meter.start()
            self.declare()
        self.pump()

    def declare(self) -> None:
        self.declared_at = time.perf_counter()
        self.container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event: Any) -> None:
        self.transaction = event.transaction
        self.in_txn = 0
        self.pump()

    def pump(self) -> None:
        txn = self.transaction
        while txn is not None and self.sender.credit and self.in_txn < self.per:
            txn.send(self.sender, self.message)
            self.in_txn += 1
        if txn is not None and self.in_txn == self.per:
            self.transaction = None
            txn.commit()

    def on_transaction_committed(self, event: Any) -> None:
        self.meter.latencies_ms.append((time.perf_counter() - self.declared_at) * 1000)
        self.committed += 1
        if self.committed * self.per >= self.opts.count or self.timed_out:
            self.finish(self.committed * self.per, transactions=self.committed)
        else:
            self.declare()

    def on_transaction_commit_failed(self, event: Any) -> None:
        self.error = "commit failed"
        self.container.stop()

    def on_transaction_declare_failed(self, event: Any) -> None:
        self.error = "declare failed"
        self.container.stop()


class TxnRoundTrip(TxnSend):
    """Empty transactions: declare, and as soon as it is declared, commit; ``count`` of them."""

    def __init__(self, opts: ClientOptions) -> None:
        super().__init__(opts, per=0)
        self.declare_ms: list[float] = []
        self.discharge_ms: list[float] = []

    def on_transaction_declared(self, event: Any) -> None:
        now = time.perf_counter()
        self.declare_ms.append((now - self.declared_at) * 1000)
        self.commit_at = now
        event.transaction.commit()

    def pump(self) -> None:
        pass

    def on_transaction_committed(self, event: Any) -> None:
        now = time.perf_counter()
        self.discharge_ms.append((now - self.commit_at) * 1000)
        self.meter.latencies_ms.append((now - self.declared_at) * 1000)
        self.committed += 1
        if self.committed >= self.opts.count or self.timed_out:
            self.finish(
                self.committed,
                declare_p50_ms=percentile(self.declare_ms, 0.5),
                discharge_p50_ms=percentile(self.discharge_ms, 0.5),
            )
        else:
            self.declare()


class TxnAccept(ProtonBench, TransactionHandler):
    """As proton's tx_recv example: declare, flow ``per`` credit, accept each message in the
    transaction (settled before discharge), commit after ``per``, declare the next."""

    def __init__(self, opts: ClientOptions, per: int) -> None:
        super().__init__(opts, prefetch=0, auto_accept=False)
        self.per = per
        self.committed = 0
        self.in_txn = 0
        self.transaction: Any = None

    def setup(self, container: Any) -> None:
        self.conn = self.connect(container)
        self.receiver = container.create_receiver(self.conn, self.opts.address)

    def on_link_opened(self, event: Any) -> None:
        if event.receiver == self.receiver:
            self.meter.start()
            self.declare()

    def declare(self) -> None:
        self.declared_at = time.perf_counter()
        self.container.declare_transaction(self.conn, handler=self, settle_before_discharge=True)

    def on_transaction_declared(self, event: Any) -> None:
        self.transaction = event.transaction
        self.in_txn = 0
        self.receiver.flow(min(self.per, self.opts.count - self.committed * self.per))

    def on_message(self, event: Any) -> None:
        txn = self.transaction
        txn.accept(event.delivery)
        self.in_txn += 1
        if self.in_txn == self.per or self.committed * self.per + self.in_txn >= self.opts.count:
            self.transaction = None
            self.last_batch = self.in_txn
            txn.commit()

    def on_transaction_committed(self, event: Any) -> None:
        self.meter.latencies_ms.append((time.perf_counter() - self.declared_at) * 1000)
        self.committed += 1
        done = (self.committed - 1) * self.per + self.last_batch
        if done >= self.opts.count or self.timed_out:
            self.finish(done, transactions=self.committed)
        else:
            self.declare()

    def on_transaction_commit_failed(self, event: Any) -> None:
        self.error = "commit failed"
        self.container.stop()


def run_proton(handler: ProtonBench) -> dict[str, Any]:
    Container(handler).run()
    if handler.error:
        raise RuntimeError(handler.error)
    if handler.meter.result is None:
        raise RuntimeError("the scenario did not complete")
    return handler.meter.result


# --------------------------------------------------------------------------------------------------
# raw clients: pre-encoded frames over a socket


@dataclass
class RawLink:
    handle: int
    name: str
    sender: bool
    credit: int = 0  # sender: transfers we may still send
    delivery_count: int = 0
    attached: bool = False


@dataclass
class RawSession:
    next_outgoing_id: int = 0
    remote_window: int = 0
    next_incoming_id: int = 0
    sent_at: dict[int, float] = field(default_factory=dict)
    settled_ids: set[int] = field(default_factory=set)
    accepted: int = 0
    received_ids: list[int] = field(default_factory=list)
    declared: dict[int, Any] = field(default_factory=dict)  # delivery id of a declare -> txn-id


class RawClient:
    """One connection, one session, links by handle; frames encoded by minibroker's own codec."""

    WINDOW = 1 << 20

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        host, _, port = url.rpartition(":")
        self.sock = socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.timeout = timeout
        self.session = RawSession()
        self.links: dict[int, RawLink] = {}
        self.by_name: dict[str, RawLink] = {}
        self.remote_handles: dict[int, RawLink] = {}
        self._handshake()

    # -- I/O --------------------------------------------------------------------------------------
    def _fill(self, timeout: float) -> None:
        ready, _, _ = select.select([self.sock], [], [], timeout)
        if not ready:
            return
        self.sock.setblocking(False)
        try:
            while True:
                try:
                    chunk = self.sock.recv(1 << 20)
                except BlockingIOError:
                    break
                if not chunk:
                    raise ConnectionError("the broker closed the connection")
                self.buf += chunk
                if len(chunk) < (1 << 20):
                    break
        finally:
            self.sock.settimeout(self.timeout)

    def _take(self, n: int) -> bytes:
        deadline = time.monotonic() + self.timeout
        while len(self.buf) < n:
            if time.monotonic() > deadline:
                raise TimeoutError("no answer from the broker")
            self._fill(0.5)
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def _frames(self) -> Iterator[tuple[int, Any, bytes]]:
        buf = self.buf
        pos = 0
        try:
            while len(buf) - pos >= 8:
                size, doff, frame_type, _channel = FRAME_HEADER.unpack_from(buf, pos)
                if len(buf) - pos < size:
                    break
                body = bytes(buf[pos + doff * 4 : pos + size])
                pos += size
                if not body:
                    continue
                prefix = body[:3]
                performative: Any
                if prefix == fastpath.TRANSFER_PREFIX:
                    performative, end = fastpath.decode_transfer(body)
                elif prefix == fastpath.DISPOSITION_PREFIX:
                    performative, end = fastpath.decode_disposition(body)
                else:
                    performative, end = codec.decode(body)
                yield frame_type, performative, body[end:]
        finally:
            del buf[:pos]

    def pump(self, timeout: float) -> None:
        """Read what has arrived (waiting up to ``timeout`` for something) and handle every frame."""
        self._fill(timeout)
        for _type, performative, payload in self._frames():
            self._handle(performative, payload)

    def _handle(self, performative: Any, payload: bytes) -> None:
        session = self.session
        if isinstance(performative, Transfer):
            session.next_incoming_id = (session.next_incoming_id + 1) % SERIAL
            link = self.remote_handles[performative.handle or 0]
            link.delivery_count += 1
            if performative.delivery_id is not None:
                session.received_ids.append(performative.delivery_id)
        elif isinstance(performative, Disposition):
            first = performative.first or 0
            last = first if performative.last is None else performative.last
            now = time.perf_counter()
            accepted = isinstance(performative.state, Accepted)
            if isinstance(performative.state, Declared):
                session.declared[first] = performative.state.txn_id
            for delivery_id in range(first, last + 1):
                sent = session.sent_at.pop(delivery_id, None)
                if sent is not None:
                    self.latencies_ms.append((now - sent) * 1000)
                if performative.settled:
                    session.settled_ids.add(delivery_id)
                if accepted:
                    session.accepted += 1
        elif isinstance(performative, Flow):
            next_incoming = performative.next_incoming_id or 0
            session.remote_window = next_incoming + (performative.incoming_window or 0) - session.next_outgoing_id
            if performative.handle is not None:
                link = self.remote_handles[performative.handle]
                if link.sender:
                    link.credit = (performative.delivery_count or 0) + (performative.link_credit or 0)
                    link.credit -= link.delivery_count
        elif isinstance(performative, Attach):
            link = self.by_name[performative.name or ""]
            link.attached = True
            if not link.sender and performative.initial_delivery_count is not None:
                link.delivery_count = performative.initial_delivery_count
            self.remote_handles[performative.handle or 0] = link
        elif isinstance(performative, Begin):
            session.remote_window = performative.incoming_window or 0
            session.next_incoming_id = performative.next_outgoing_id or 0
            self.begun = True
        elif isinstance(performative, Detach | Close):
            raise ConnectionError(f"the broker sent {performative!r}")

    latencies_ms: list[float]

    def wait(self, condition: Callable[[], bool], timeout: float | None = None) -> None:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError("the broker did not answer in time")
            self.pump(0.2)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    # -- set-up -----------------------------------------------------------------------------------
    def _handshake(self) -> None:
        self.latencies_ms = []
        self.begun = False
        self.send(frames.SASL_HEADER)
        header = self._take(8)
        if header == frames.SASL_HEADER:
            if not isinstance(self._next_sasl(), SaslMechanisms):
                raise ConnectionError("expected sasl-mechanisms")
            self.send(frames.sasl_frame(frames.sasl_anonymous()))
            outcome = self._next_sasl()
            if not isinstance(outcome, SaslOutcome) or outcome.code != 0:
                raise ConnectionError("SASL ANONYMOUS was refused")
            self.send(frames.AMQP_HEADER)
            header = self._take(8)
        if header != frames.AMQP_HEADER:
            raise ConnectionError(f"unexpected protocol header {header!r}")
        self.send(
            frames.frame(0, Open(container_id=f"bench-raw-{os.getpid()}", max_frame_size=UInt(65536)))
            + frames.frame(0, frames.begin(incoming_window=self.WINDOW, outgoing_window=self.WINDOW))
        )
        self.wait(lambda: self.begun)

    def _next_sasl(self) -> Any:
        """The next SASL frame's performative (read one frame at a time: AMQP bytes may follow)."""
        size, doff, _type, _channel = FRAME_HEADER.unpack(self._take(8))
        body = self._take(size - 8)[doff * 4 - 8 :]
        return codec.decode(body)[0]

    def attach_sender(self, address: str, name: str) -> RawLink:
        link = self._new_link(name, sender=True)
        self.send(frames.frame(0, frames.attach_sender(address, link.handle, name, snd_settle_mode=UInt(2))))
        self.wait(lambda: link.attached and link.credit > 0)
        return link

    def attach_receiver(self, address: str, name: str, credit: int) -> RawLink:
        link = self._new_link(name, sender=False)
        self.send(
            frames.frame(
                0,
                frames.attach_receiver(address, link.handle, name, snd_settle_mode=UInt(0), rcv_settle_mode=UInt(0)),
            )
        )
        self.wait(lambda: link.attached)
        self.flow(link, credit)
        return link

    def _new_link(self, name: str, *, sender: bool) -> RawLink:
        link = RawLink(len(self.links), name, sender)
        self.links[link.handle] = link
        self.by_name[name] = link
        return link

    def flow(self, link: RawLink, credit: int) -> None:
        session = self.session
        self.send(
            frames.frame(
                0,
                frames.flow(
                    next_incoming_id=session.next_incoming_id,
                    incoming_window=self.WINDOW,
                    next_outgoing_id=session.next_outgoing_id,
                    outgoing_window=self.WINDOW,
                    handle=link.handle,
                    delivery_count=link.delivery_count,
                    link_credit=credit,
                ),
            )
        )

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.send(frames.frame(0, Close()))
            self.sock.close()

    # -- traffic ----------------------------------------------------------------------------------
    def transfer_frame(self, link: RawLink, delivery_id: int, payload: bytes, *, settled: bool) -> bytes:
        tag = delivery_id.to_bytes(4, "big")
        performative = fastpath.encode_transfer(link.handle, delivery_id, tag, 0, settled, False)
        return FRAME_HEADER.pack(8 + len(performative) + len(payload), 2, 0, 0) + performative + payload

    def stream(self, link: RawLink, encoded: list[bytes], first_id: int, stop: Callable[[], bool]) -> int:
        """Send the pre-encoded transfers (delivery ids ``first_id``...) as fast as credit and the
        session window allow; returns how many were sent (fewer when ``stop()`` said so)."""
        session = self.session
        sent = 0
        total = len(encoded)
        while sent < total:
            n = min(link.credit, session.remote_window, total - sent)
            if n > 0:
                now = time.perf_counter()
                self.send(b"".join(encoded[sent : sent + n]))
                for delivery_id in range(first_id + sent, first_id + sent + n):
                    session.sent_at[delivery_id] = now
                sent += n
                link.credit -= n
                link.delivery_count += n
                session.next_outgoing_id += n
                session.remote_window -= n
                if stop():
                    break
            self.pump(0.0 if n > 0 else 0.5)
        return sent


def raw_send(opts: ClientOptions, *, presettled: bool) -> dict[str, Any]:
    """Pre-settled (the last transfer unsettled, as a barrier) or confirmed sends over one link."""
    client = RawClient(opts.url)
    link = client.attach_sender(opts.address, "bench-raw-sender")
    session = client.session
    first = session.next_outgoing_id
    payload = ENCODED
    count = opts.count
    encoded = [
        client.transfer_frame(link, first + i, payload, settled=presettled and i < count - 1) for i in range(count)
    ]
    meter = Meter(opts.pid)
    meter.start()
    deadline = time.perf_counter() + opts.time_limit
    sent = client.stream(link, encoded, first, lambda: time.perf_counter() > deadline)
    if sent < count and presettled:  # time limit: one more, unsettled, as the barrier
        barrier = client.transfer_frame(link, first + sent, payload, settled=False)
        sent += client.stream(link, [barrier], first + sent, lambda: False)
    last = first + sent - 1
    if presettled:
        client.wait(lambda: last in session.settled_ids, timeout=60)
    else:
        client.wait(lambda: session.accepted >= sent, timeout=60)
        meter.latencies_ms = client.latencies_ms
    result = meter.stop(sent, timed_out=sent < count)
    client.close()
    return result


def raw_consume(opts: ClientOptions, *, credit: int = 1000, batch: int = 100) -> dict[str, Any]:
    """Consume ``count`` messages, accepting (settled) in ranges of up to ``batch`` delivery ids,
    keeping ``credit`` outstanding; then a sync message on a second link as the barrier."""
    client = RawClient(opts.url)
    session = client.session
    sync = client.attach_sender(opts.sync_address, "bench-raw-sync")
    meter = Meter(opts.pid)
    meter.start()
    link = client.attach_receiver(opts.address, "bench-raw-receiver", min(credit, opts.count))
    deadline = time.perf_counter() + opts.time_limit
    received = 0
    target = opts.count
    while received < target:
        client.pump(0.5)
        ids = session.received_ids
        if not ids:
            if time.perf_counter() > deadline:
                break
            continue
        received += len(ids)
        out = []
        for start in range(0, len(ids), batch):
            chunk = ids[start : start + batch]
            out.append(frames.frame(0, frames.disposition(chunk[0], chunk[-1], state=Accepted())))
        ids.clear()
        if time.perf_counter() > deadline:
            target = received
        remaining = target - received
        client.send(b"".join(out))
        if remaining > 0:
            client.flow(link, min(credit, remaining))
    sync_id = session.next_outgoing_id
    client.stream(sync, [client.transfer_frame(sync, sync_id, ENCODED, settled=False)],
                  sync_id, lambda: False)  # fmt: skip
    client.wait(lambda: sync_id in session.settled_ids, timeout=60)
    result = meter.stop(received, timed_out=received < opts.count)
    client.close()
    return result


def raw_txn_roundtrip(opts: ClientOptions) -> dict[str, Any]:
    """Empty transactions on a coordinator link: declare, wait for declared, discharge, wait for accepted;
    one after the other. Latency: declare sent -> discharge settled (two round trips)."""
    client = RawClient(opts.url)
    name = "bench-raw-coordinator"
    link = client._new_link(name, sender=True)
    coordinator = Coordinator(capabilities=[Symbol("amqp:local-transactions")])
    attach = frames.attach_sender(None, link.handle, name, target=coordinator)
    client.send(frames.frame(0, attach))
    client.wait(lambda: link.attached and link.credit > 0)
    session = client.session
    declared = session.declared
    declare = frames.message(AmqpValue(Declare()))
    meter = Meter(opts.pid)
    declare_ms: list[float] = []
    discharge_ms: list[float] = []
    meter.start()
    deadline = time.perf_counter() + opts.time_limit
    done = 0
    while done < opts.count and time.perf_counter() < deadline:
        first = session.next_outgoing_id
        t0 = time.perf_counter()
        client.stream(link, [client.transfer_frame(link, first, declare, settled=False)], first, lambda: False)
        client.wait(partial(dict.__contains__, declared, first))
        t1 = time.perf_counter()
        second = session.next_outgoing_id
        discharge = frames.message(AmqpValue(Discharge(txn_id=declared.pop(first), fail=False)))
        client.stream(link, [client.transfer_frame(link, second, discharge, settled=False)], second, lambda: False)
        client.wait(partial(set.__contains__, session.settled_ids, second))
        t2 = time.perf_counter()
        declare_ms.append((t1 - t0) * 1000)
        discharge_ms.append((t2 - t1) * 1000)
        meter.latencies_ms.append((t2 - t0) * 1000)
        done += 1
    result = meter.stop(done, timed_out=done < opts.count, declare_p50_ms=percentile(declare_ms, 0.5),
                        discharge_p50_ms=percentile(discharge_ms, 0.5))  # fmt: skip
    client.close()
    return result


# --------------------------------------------------------------------------------------------------
# scenarios


@dataclass(frozen=True)
class Scenario:
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
]  # fmt: skip
BY_NAME = {s.name: s for s in SCENARIOS}


def run_client(name: str, opts: ClientOptions) -> dict[str, Any]:
    """In the client process: run one scenario and return its figures."""
    if name == "send_presettled":
        return run_proton(SendPresettled(opts))
    if name == "recv_presettled":
        return run_proton(RecvPresettled(opts))
    if name == "send_confirmed":
        return run_proton(SendConfirmed(opts))
    if name == "consume_accept":
        return run_proton(ConsumeAccept(opts))
    if name == "send_20_conns":
        return run_proton(SendManyConnections(opts))
    if name == "txn_1":
        return run_proton(TxnSend(opts, 1))
    if name == "txn_roundtrip":
        return run_proton(TxnRoundTrip(opts))
    if name == "txn_10":
        return run_proton(TxnSend(opts, 10))
    if name == "txn_100":
        return run_proton(TxnSend(opts, 100))
    if name == "txn_accept_100":
        return run_proton(TxnAccept(opts, 100))
    if name in ("raw_send_presettled", "raw_send_confirmed", "memory_fill"):
        return raw_send(opts, presettled=name != "raw_send_confirmed")
    if name in ("raw_consume_accept", "drain"):
        return raw_consume(opts)
    if name == "raw_txn_roundtrip":
        return raw_txn_roundtrip(opts)
    raise SystemExit(f"unknown scenario {name!r}")


def spawn_client(name: str, opts: ClientOptions) -> dict[str, Any]:
    """Run ``name`` in a fresh client process; its figures, or {"error": ...}."""
    cmd = [
        sys.executable, __file__, "--client", name, "--url", opts.url, "--address", opts.address,
        "--sync-address", opts.sync_address, "--count", str(opts.count), "--time-limit", str(opts.time_limit),
    ]  # fmt: skip
    if opts.pid is not None:
        cmd += ["--pid", str(opts.pid)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=opts.time_limit + 90)
    except subprocess.TimeoutExpired:
        return {"error": "client timed out"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"client exit {done.returncode}: {tail}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


# --------------------------------------------------------------------------------------------------
# brokers


class Broker:
    """``python -m minibroker --port 0`` as a subprocess; ``startup_s`` is spawn to AMQP open answered."""

    def __init__(self) -> None:
        started = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "minibroker", "--port", "0", "--log-level", "warning"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        self.listening_s = time.perf_counter() - started
        match = re.search(r"amqp://(\S+)", line)
        if not match:
            self.stop()
            raise SystemExit(f"broker did not start: {line!r}")
        self.url = match.group(1)
        check(match.group(0), timeout=5)
        self.startup_s = time.perf_counter() - started
        self.pid = self.proc.pid
        self.startup_cpu_s = proc_cpu_s(self.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def settle_cpu(pid: int | None, quiet: float = 0.2, limit: float = 5.0) -> None:
    """Wait until the broker has used no CPU for ``quiet`` seconds (its back-log handled)."""
    if pid is None:
        time.sleep(quiet)
        return
    deadline = time.monotonic() + limit
    last = proc_cpu_s(pid)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = proc_cpu_s(pid)
        if now == last:
            return
        last = now


def memory_figures(url: str, pid: int | None, prefix: str, tag: str, time_limit: float) -> dict[str, Any]:
    """RSS idle, then with MEMORY_MESSAGES 256-byte messages queued (raw pre-settled sender)."""
    settle_cpu(pid, quiet=0.3)
    idle = proc_rss_kib(pid)
    opts = ClientOptions(url, f"{prefix}bench.memory.{tag}", MEMORY_MESSAGES, max(time_limit, 60), pid,
                         f"{prefix}bench.sync.{tag}")  # fmt: skip
    fill = spawn_client("memory_fill", opts)
    settle_cpu(pid, quiet=0.3)
    full = proc_rss_kib(pid)
    out: dict[str, Any] = {"fill": fill}
    if idle is not None:
        out["idle_rss_mib"] = idle / 1024
    if full is not None and idle is not None and "error" not in fill:
        out["queued_rss_mib"] = full / 1024
        out["bytes_per_queued_message"] = (full - idle) * 1024 / fill["count"]
    return out


# --------------------------------------------------------------------------------------------------
# the orchestrator


def one_run(
    args: argparse.Namespace, run: int, scenarios: list[Scenario], log: Callable[[str], None]
) -> dict[str, Any]:
    tag = f"{os.getpid()}.{run}"
    prefix = args.address_prefix
    out: dict[str, Any] = {"scenarios": {}}
    # 1. memory, on a broker of its own (also a start-up sample)
    broker = None if args.url else Broker()
    url = args.url or (broker.url if broker else "")
    pid = broker.pid if broker else args.pid
    try:
        if broker is not None:
            out["startup_s"] = [broker.startup_s]
            out["listening_s"] = [broker.listening_s]
            out["startup_cpu_s"] = [broker.startup_cpu_s]
        if not args.skip_memory and pid is not None:  # RSS needs the pid
            out["memory"] = memory_figures(url, pid, prefix, tag, args.time_limit)
            log(f"  memory: {json.dumps({k: v for k, v in out['memory'].items() if k != 'fill'})}")
            if args.url:  # leave a foreign broker as we found it
                spawn_client("drain", ClientOptions(url, f"{prefix}bench.memory.{tag}", MEMORY_MESSAGES,
                                                    120, None, f"{prefix}bench.sync.{tag}"))  # fmt: skip
    finally:
        if broker is not None:
            broker.stop()
    # 2. the scenarios, on a fresh broker
    broker = None if args.url else Broker()
    url = args.url or (broker.url if broker else "")
    pid = broker.pid if broker else args.pid
    if broker is not None:
        out["startup_s"].append(broker.startup_s)
        out["listening_s"].append(broker.listening_s)
        out["startup_cpu_s"].append(broker.startup_cpu_s)
    try:
        settle_cpu(pid)
        for scenario in scenarios:
            count = max(1, round(args.count * scenario.scale))
            if scenario.drains:
                done = [out["scenarios"].get(name, {}) for name in scenario.drains.split("+")]
                if any("error" in d or not d for d in done):
                    out["scenarios"][scenario.name] = {"error": f"needs {scenario.drains}"}
                    continue
                count = sum(d["count"] for d in done)
            opts = ClientOptions(url, f"{prefix}{scenario.address}.{tag}", count, args.time_limit, pid,
                                 f"{prefix}bench.sync.{tag}")  # fmt: skip
            result = spawn_client(scenario.name, opts)
            out["scenarios"][scenario.name] = result
            log(f"  {scenario.name}: {summarise_one(scenario, result)}")
            settle_cpu(pid)
    finally:
        if broker is not None:
            broker.stop()
    return out


def per_unit_us(result: dict[str, Any], key: str) -> float | None:
    value = result.get(key)
    if value is None or not result.get("count"):
        return None
    return float(value) / float(result["count"]) * 1e6


def summarise_one(scenario: Scenario, result: dict[str, Any]) -> str:
    if "error" in result:
        return f"ERROR {result['error']}"
    rate = result["count"] / result["elapsed_s"]
    broker = per_unit_us(result, "broker_cpu_s")
    client = per_unit_us(result, "client_cpu_s")
    text = f"{result['count']} {scenario.unit}s, {rate:.0f}/s, broker {_fmt(broker)} µs/{scenario.unit}, "
    text += f"client {_fmt(client)} µs/{scenario.unit}"
    if "latency_p50_ms" in result:
        text += f", p50 {result['latency_p50_ms']:.2f} ms, p99 {result['latency_p99_ms']:.2f} ms"
    return text


def _fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def aggregate(runs: list[dict[str, Any]], scenarios: list[Scenario]) -> dict[str, Any]:
    summary: dict[str, Any] = {"scenarios": {}}
    for scenario in scenarios:
        results = [r["scenarios"].get(scenario.name, {}) for r in runs]
        ok = [r for r in results if r and "error" not in r]
        figures: dict[str, Any] = {"unit": scenario.unit, "errors": [r["error"] for r in results if "error" in r]}
        metrics: dict[str, Callable[[dict[str, Any]], float | None]] = {
            "rate_per_s": lambda r: r["count"] / r["elapsed_s"],
            "broker_cpu_us": lambda r: per_unit_us(r, "broker_cpu_s"),
            "client_cpu_us": lambda r: per_unit_us(r, "client_cpu_s"),
            "latency_p50_ms": lambda r: r.get("latency_p50_ms"),
            "latency_p99_ms": lambda r: r.get("latency_p99_ms"),
            "count": lambda r: r["count"],
        }
        for key, get in metrics.items():
            values = [v for v in (get(r) for r in ok) if v is not None]
            figures[key] = spread(values)
        summary["scenarios"][scenario.name] = figures
    startup = [s for r in runs for s in r.get("startup_s", [])]
    summary["startup_s"] = spread(startup)
    summary["listening_s"] = spread([s for r in runs for s in r.get("listening_s", [])])
    summary["startup_cpu_s"] = spread([s for r in runs for s in r.get("startup_cpu_s", []) if s is not None])
    memory = [r["memory"] for r in runs if "memory" in r]
    for key in ("idle_rss_mib", "queued_rss_mib", "bytes_per_queued_message"):
        summary[key] = spread([m[key] for m in memory if key in m])
    return summary


REFERENCE_EXTRA = {
    "startup_s": (1.33, 7.8, 0.24),
    "idle_rss_mib": (103, 142, 25),
    "bytes_per_queued_message": (2400, 3000, 2400),
    "txn_roundtrip_p50_ms": (1.19, None, None),
    "txn_roundtrip_p99_ms": (2.41, None, None),
}


def _med(d: dict[str, Any] | None) -> float | None:
    return None if d is None else float(d["median"])


def _ms(d: dict[str, Any] | None, scale: float = 1.0, digits: int = 1) -> str:
    if d is None:
        return "n/a"
    return f"{d['median'] * scale:.{digits}f} [{d['min'] * scale:.{digits}f}-{d['max'] * scale:.{digits}f}]"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def report(summary: dict[str, Any], scenarios: list[Scenario]) -> list[str]:
    lines = [
        "figures: median [min-max] over the runs; broker/client CPU in µs per message (per transaction for txn_1 "
        "and txn_roundtrip); ratio columns: ours/ActiveMQ and proton-example/ours",
        f"{'scenario':22} {'msg/s':>20} {'broker µs':>20} {'client µs':>20} {'p50 ms':>8} {'p99 ms':>8}"
        f" {'AMQ':>6} {'Rabbit':>6} {'proton':>6} {'us/AMQ':>7} {'prot/us':>7}",
    ]
    for scenario in scenarios:
        f = summary["scenarios"][scenario.name]
        broker = _med(f["broker_cpu_us"])
        amq, rabbit, prot = scenario.reference
        ref = [_fmt(x, 1) if x is not None else "-" for x in (amq, rabbit, prot)]
        lines.append(
            f"{scenario.name:22} {_ms(f['rate_per_s'], digits=0):>20} {_ms(f['broker_cpu_us']):>20} "
            f"{_ms(f['client_cpu_us']):>20} {_fmt(_med(f['latency_p50_ms']), 2):>8} "
            f"{_fmt(_med(f['latency_p99_ms']), 2):>8} {ref[0]:>6} {ref[1]:>6} {ref[2]:>6} "
            f"{_ratio(broker, amq):>7} {_ratio(prot, broker):>7}" + (f"  errors: {f['errors']}" if f["errors"] else "")
        )
    lines.append(f"start-up to AMQP open answered: {_ms(summary['startup_s'], 1000)} ms "
                 f"(to the listening line: {_ms(summary['listening_s'], 1000)} ms; broker CPU used by then: "
                 f"{_ms(summary['startup_cpu_s'], 1000)} ms); "
                 f"ActiveMQ 1330, RabbitMQ 7800, proton example 240")  # fmt: skip
    lines.append(f"RSS idle: {_ms(summary['idle_rss_mib'])} MiB; with {MEMORY_MESSAGES} messages queued: "
                 f"{_ms(summary['queued_rss_mib'])} MiB; per queued 256-byte message: "
                 f"{_ms(summary['bytes_per_queued_message'], digits=0)} bytes "
                 f"(ActiveMQ 103 MiB / 2400, RabbitMQ 142 / 3000, proton example 25 / 2400)")  # fmt: skip
    return lines


def targets(summary: dict[str, Any]) -> list[str]:
    s = summary["scenarios"]

    def broker(name: str) -> float | None:
        return _med(s[name]["broker_cpu_us"]) if name in s else None

    checks: list[tuple[str, float | None, float, str]] = []
    for scenario in SCENARIOS:
        if scenario.name not in s or scenario.unit != "msg" or scenario.name.startswith("txn"):
            continue
        amq, _rabbit, prot = scenario.reference
        value = broker(scenario.name)
        if amq is not None:
            checks.append((f"{scenario.name}: broker CPU ≤ 2x ActiveMQ ({2 * amq:.1f} µs)", value, 2 * amq, "≤"))
        if prot is not None:
            checks.append((f"{scenario.name}: ≥ 4x cheaper than proton example ({prot / 4:.1f} µs)", value,
                           prot / 4, "≤"))  # fmt: skip
    for name, limit in (("txn_1", 230.0), ("txn_10", 32.0), ("txn_100", 16.0), ("txn_accept_100", 21.5)):
        if name in s:
            checks.append((f"{name}: broker CPU ≤ ActiveMQ ({limit} µs)", broker(name), limit, "≤"))
    for name, client in (("txn_roundtrip", "proton client"), ("raw_txn_roundtrip", "raw client")):
        if name in s:
            checks.append((f"declare+discharge p50 < 1 ms ({client})", _med(s[name]["latency_p50_ms"]), 1.0, "<"))
    startup = _med(summary["startup_s"])
    checks.append(("process ready < 0.3 s", startup, 0.3, "<"))
    checks.append(("idle RSS < 40 MiB", _med(summary["idle_rss_mib"]), 40.0, "<"))
    checks.append(("< 1 kB per queued 256-byte message", _med(summary["bytes_per_queued_message"]), 1000.0, "<"))
    lines = []
    for label, value, limit, op in checks:
        if value is None:
            status = "n/a"
        elif value <= limit if op == "≤" else value < limit:
            status = "MET"
        else:
            status = "MISSED"
        lines.append(f"  [{status:6}] {label}: {_fmt(value, 2)}")
    return lines


# --------------------------------------------------------------------------------------------------
# profiling with py-spy


def profile(args: argparse.Namespace, directory: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """Record the broker with py-spy during the profiled scenarios; top 15 functions by own time."""
    pyspy = shutil.which("py-spy")
    if pyspy is None:
        raise SystemExit("--profile needs py-spy (pip install py-spy)")
    directory.mkdir(parents=True, exist_ok=True)
    plan = [  # (scenario profiled, scenario that fills its queue first or None)
        ("send_presettled", None),
        ("consume_accept", "send_confirmed"),
        ("txn_1", None),
        ("raw_send_presettled", None),
        ("raw_consume_accept", "raw_send_confirmed"),
    ]
    profiles: dict[str, Any] = {}
    for name, fill in plan:
        broker = Broker()
        try:
            scenario = BY_NAME[name]
            count = max(1, round(args.profile_count * scenario.scale))
            address = f"{args.address_prefix}{scenario.address}.profile"
            sync = f"{args.address_prefix}bench.sync.profile"
            if fill:
                filled = spawn_client(fill, ClientOptions(broker.url, address, count, args.time_limit, None, sync))
                count = filled.get("count", count)
            settle_cpu(broker.pid)
            out = directory / f"{name}.txt"
            recorder = subprocess.Popen(
                [pyspy, "record", "--pid", str(broker.pid), "--format", "raw", "--function", "--rate", "500",
                 "--nonblocking", "--output", str(out)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            time.sleep(1.0)  # py-spy attaches
            result = spawn_client(name, ClientOptions(broker.url, address, count, args.time_limit, broker.pid, sync))
            recorder.send_signal(signal.SIGINT)
            recorder.wait(30)
            top, waiting = top_own(out)
            profiles[name] = {"result": result, "top_own": top, "epoll_wait_pct": waiting, "file": str(out)}
            log(f"profile {name}: {summarise_one(scenario, result)}")
        finally:
            broker.stop()
    return profiles


IDLE_LEAVES = ("EpollIOManager.get_events (",)  # trio's event loop waiting in epoll_wait


def top_own(path: Path, n: int = 15) -> tuple[list[dict[str, Any]], float]:
    """Top ``n`` functions by own samples (the leaf of each stack) in a py-spy raw (collapsed) file,
    with their inclusive share too, as percentages of the busy samples; and the share of all samples
    spent waiting in epoll (idle, left out of the percentages)."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    busy = idle = 0
    if not path.exists():
        return [], 0.0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames_ = stack.split(";")
        leaf = _short(frames_[-1])
        if leaf.startswith(IDLE_LEAVES):
            idle += count
            continue
        busy += count
        own[leaf] += count
        for name in {_short(f) for f in frames_}:
            total[name] += count
    rows = [
        {"function": name, "own_pct": 100 * c / busy, "total_pct": 100 * total[name] / busy, "samples": c}
        for name, c in own.most_common(n)
    ]
    return rows, 100 * idle / max(1, busy + idle)


def _short(frame: str) -> str:
    # py-spy --function frames look like "name (path/to/file.py)"
    match = re.match(r"(.*) \((.*)\)$", frame)
    if not match:
        return frame
    name, path = match.groups()
    for marker in ("minibroker/", "site-packages/", "lib/python3.11/"):
        if marker in path:
            path = path[path.rindex(marker) + (0 if marker == "minibroker/" else len(marker)) :]
            break
    return f"{name} ({path})"


# --------------------------------------------------------------------------------------------------


def source_state() -> dict[str, str]:
    """The commit measured, and a digest of uncommitted changes to minibroker/ (the figures' code)."""
    root = Path(__file__).resolve().parents[1]

    def git(*argv: str) -> str:
        try:
            return subprocess.run(["git", *argv], cwd=root, capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            return ""

    diff = git("diff", "HEAD", "--", "minibroker")
    return {
        "commit": git("rev-parse", "HEAD").strip(),
        "uncommitted_minibroker_diff_sha256": hashlib.sha256(diff.encode()).hexdigest() if diff else "",
        "uncommitted_files": " ".join(git("status", "--short", "--", "minibroker").split()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--count", type=int, default=5000,
                        help="messages per scenario (txn_1 and txn_roundtrip: a tenth of it, in transactions; "
                             "txn_10: half; raw sends: twice)")  # fmt: skip
    parser.add_argument("--url", help="an already running AMQP 1.0 broker, HOST:PORT (default: start minibroker)")
    parser.add_argument("--pid", type=int, help="with --url: the broker's process id, for its CPU and RSS")
    parser.add_argument("--address-prefix", default="", help="prepended to every queue address (RabbitMQ: /queue/)")
    parser.add_argument("--time-limit", type=float, default=30.0, help="seconds per scenario at most")
    parser.add_argument("--scenarios", help="comma-separated subset of: " + ", ".join(BY_NAME))
    parser.add_argument("--skip-memory", action="store_true", help="no RSS with 100,000 messages queued")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--profile", type=Path, metavar="DIR", help="also profile the broker with py-spy")
    parser.add_argument("--profile-count", type=int, default=20_000, help="messages per profiled scenario")
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--sync-address", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.client:
        opts = ClientOptions(args.url, args.address, args.count, args.time_limit, args.pid, args.sync_address)
        print(json.dumps(run_client(args.client, opts)), flush=True)
        return

    if args.url and args.url.startswith("amqp://"):
        args.url = args.url[len("amqp://") :]
    scenarios = SCENARIOS
    if args.scenarios:
        wanted = args.scenarios.split(",")
        unknown = [w for w in wanted if w not in BY_NAME]
        if unknown:
            parser.error(f"unknown scenarios: {unknown}")
        scenarios = [s for s in SCENARIOS if s.name in wanted]
    if args.url:
        try:
            check(args.url, timeout=5)
        except NotHealthy as exc:
            raise SystemExit(f"{args.url}: {exc}") from None

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    started = time.perf_counter()
    runs = []
    for run in range(args.runs):
        log(f"run {run + 1}/{args.runs}")
        runs.append(one_run(args, run, scenarios, log))
    summary = aggregate(runs, scenarios)
    if runs:  # --runs 0 --profile DIR: only the profiles
        print("\n".join(report(summary, scenarios)))
        print("targets:")
        print("\n".join(targets(summary)))
        print(f"({args.runs} runs in {time.perf_counter() - started:.0f} s)")
    profiles = None
    if args.profile:
        profiles = profile(args, args.profile, log)
        for name, data in profiles.items():
            busy = sum(row["samples"] for row in data["top_own"])
            print(f"\nbroker profile, {name}: {summarise_one(BY_NAME[name], data['result'])}")
            print(f"  py-spy, % of busy samples (own, and inclusive); {data['epoll_wait_pct']:.0f}% of all samples "
                  f"idle in epoll_wait, left out; top 15 hold {busy} samples")  # fmt: skip
            for row in data["top_own"]:
                print(f"  {row['own_pct']:5.1f}% own {row['total_pct']:5.1f}% total  {row['function']}")
    if args.json:
        document = {
            "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "source": source_state(),
            "summary": summary,
            "runs": runs,
            "profiles": profiles,
        }
        args.json.write_text(json.dumps(document, indent=2))


if __name__ == "__main__":
    main()
