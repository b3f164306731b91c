"""Load and soak test of minibroker: many connections, a million messages through one queue, connection churn,
attacks on the limits.

    python bench/soak.py [--scale 1.0] [--json PATH] [--only connections,throughput,churn,attacks]

Four scenarios, each against a fresh broker process, each bounded in time (``--time-limit`` seconds,
scaled), everything on 127.0.0.1:

* **connections** (python-qpid-proton, one ``Container`` for every connection): 200 connections at once,
  each sending 500 messages at-least-once (the broker accepts each) to its own queue and receiving the
  500 messages its neighbour sent (prefetch, auto-accept). Every message carries ``"sender:seq"`` as its
  message-id and ``seq`` as its body: a loss, a duplicate or a reordering is counted per queue.
* **throughput** (the raw-socket client below): 1,000,000 messages through one queue, one producer
  connection and one consumer connection driven by one selector loop. The producer sends unsettled
  (the broker accepts each), the consumer takes them unsettled and accepts them in ranged dispositions.
  The producer stays at most 2,000 messages ahead of the consumer, so the queue depth is bounded and the
  broker's RSS must stay flat. The run pauses twice with its connections open, once the queue is empty
  and every message settled: after warm-up and after the last message. Warm-up is the first 10 % of the
  messages, but at least 100,000 (at most half) when the run is shorter: the broker's RSS climbs over
  roughly the first 100,000 messages while its allocator reaches its working size, then levels off.
  "Flat" means the RSS at the second pause is within 10 % of the RSS at the first; the broker's
  allocated memory blocks (after a garbage collection) at the two pauses show whether anything is kept
  per message. Each message's body carries its sequence number: losses and duplicates are counted
  exactly.
* **churn** (the raw-socket client, a few threads): 10,000 connect/disconnect cycles of five kinds in
  turn (clean open/close; SASL ANONYMOUS then open/close; a sender and a receiver that move one message
  through a shared queue and accept it; a receiver with credit dropped without close; a TCP connection
  dropped during the protocol header). Afterwards the broker must hold no connection, no extra trio task
  and no extra socket, its shared queue must be empty, and its RSS should be back near the start.

Why a raw-socket client for the large scenarios: python-qpid-proton's Python layer costs tens of
microseconds per message on top of the broker's own cost (see bench/roundtrip.py), so it, not the
broker, would set the pace. The raw client sends pre-encoded transfer frames (a template with the
delivery-id, tag and sequence patched in) and decodes what the broker sends with ``minibroker.amqp``.

The broker is started by this script as ``python bench/soak.py --serve-broker``: ``minibroker.serve``
exactly as ``python -m minibroker`` runs it, plus a line protocol on stdin ("stats", "stats gc") that
answers with its connection count, trio task count, queue depths and allocated memory blocks, so leaks
can be read from the broker itself ("trim" runs ``malloc_trim``: what RSS remains after it is in use,
or held by Python's allocator, not free heap). RSS, peak RSS (VmHWM), CPU time and open file descriptors
are read from /proc/PID of that process. Each scenario ends by reading the broker's RSS once its
connections are closed, and again after "trim".

Throughput on a loaded machine says little; the broker's CPU time per message (from /proc) says more.

The functions ``run_connections``, ``run_throughput`` and ``run_churn`` are also used by
tests/integration/test_load.py at reduced size.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import os
import selectors
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import trio

from minibroker.amqp import codec
from minibroker.amqp.definitions import (
    Accepted,
    AmqpValue,
    Attach,
    Begin,
    Close,
    Disposition,
    Flow,
    SaslMechanisms,
    SaslOutcome,
    Transfer,
)
from minibroker.amqp.framing import AMQP_FRAME, AMQP_HEADER, FRAME_HEADER, SASL_FRAME, SASL_HEADER
from minibroker.amqp.types import UInt
from minibroker.testing import frames

HOST = "127.0.0.1"
ROOT = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")
IO_TIMEOUT = 10.0  # seconds any single wait on the broker may take before the run counts as hung


# -- the broker's process, as /proc shows it -------------------------------------------------------------
def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    return 0


def rss_kib(pid: int) -> int:
    """Resident set size of ``pid`` in KiB (VmRSS)."""
    return _status_kib(pid, "VmRSS:")


def peak_rss_kib(pid: int) -> int:
    """Peak resident set size of ``pid`` in KiB (VmHWM)."""
    return _status_kib(pid, "VmHWM:")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time ``pid`` has used."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14 and 15 of stat)


def open_fds(pid: int) -> tuple[int, int]:
    """(open file descriptors, of which sockets) of ``pid``."""
    total = sockets = 0
    for entry in os.scandir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(entry.path)
        except OSError:
            continue  # closed meanwhile
        total += 1
        sockets += target.startswith("socket:")
    return total, sockets


# -- what the broker says about itself --------------------------------------------------------------------
def count_tasks(task: Any) -> int:
    """``task`` and every task below it in trio's task tree."""
    return 1 + sum(count_tasks(child) for nursery in task.child_nurseries for child in nursery.child_tasks)


def task_names(task: Any) -> list[str]:
    """Names of ``task`` and every task below it."""
    names = [str(task.name)]
    for nursery in task.child_nurseries:
        for child in nursery.child_tasks:
            names += task_names(child)
    return names


def broker_stats(running: Any, *, collect: bool = False) -> dict[str, Any]:
    """Connections, trio tasks, queues and allocated blocks of a running broker (call it in its trio thread).

    ``running`` is the ``RunningBroker``; with ``collect`` a garbage collection runs first, so that
    ``allocated_blocks`` counts what is really held.
    """
    if collect:
        gc.collect()
    broker = running.broker
    server = getattr(running, "_server", None)
    root = trio.lowlevel.current_root_task()
    return {
        "connections": len(broker.connections),
        "connection_tasks": len(server.tasks) if server is not None else -1,
        "trio_tasks": count_tasks(root),
        "trio_task_names": sorted(task_names(root)) if collect else [],
        "queues": {name: {"ready": q.depth, "acquired": q.acquired} for name, q in broker.queues.items()},
        "allocated_blocks": sys.getallocatedblocks(),
    }


class Probe(Protocol):
    """Where figures about the broker come from: its process, and the broker itself."""

    pid: int

    def stats(self, *, collect: bool = False) -> dict[str, Any]: ...


async def _serve_broker(config: dict[str, Any]) -> None:
    import minibroker

    async with minibroker.serve({**config, "server": {**config.get("server", {}), "port": 0}}) as running:
        print(f"minibroker listening on {running.url}", flush=True)
        commands = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
        pending = b""
        while True:
            data = await commands.receive_some()
            if not data:
                return
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                words = line.split()
                if words[:1] == [b"stats"]:
                    stats = broker_stats(running, collect=words[1:] == [b"gc"])
                    print(json.dumps(stats), flush=True)
                elif words[:1] == [b"trim"]:
                    # give the heap's free memory back to the system: what RSS is left is really in use
                    gc.collect()
                    ctypes.CDLL("libc.so.6").malloc_trim(0)
                    print(json.dumps({"rss_kib": rss_kib(os.getpid())}), flush=True)


def serve_broker(config: dict[str, Any]) -> None:
    """The broker process: ``minibroker.serve`` with ``config`` plus the stats line protocol on stdin; stdin's
    end stops it."""
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    trio.run(_serve_broker, config)


class BrokerProcess:
    """A broker in a process of its own (``--serve-broker``), with its /proc figures and its own stats."""

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--serve-broker", json.dumps(config or {})],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "listening on" not in line:
            self.proc.kill()
            raise RuntimeError(f"the broker did not start: {line!r}")
        self.url = line.split()[-1]
        self.port = int(self.url.rsplit(":", 1)[1])
        self.pid = self.proc.pid
        self._lock = threading.Lock()
        # serve() returns once the listener is bound; its accept task starts a moment later
        counts = [self.stats()["trio_tasks"]]
        while len(counts) < 3 or len(set(counts[-3:])) > 1:
            time.sleep(0.02)
            counts.append(self.stats()["trio_tasks"])

    def stats(self, *, collect: bool = False) -> dict[str, Any]:
        """The broker's own figures (``broker_stats``)."""
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        with self._lock:
            self.proc.stdin.write("stats gc\n" if collect else "stats\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the broker process ended (exit code {self.proc.poll()})")
        result: dict[str, Any] = json.loads(line)
        return result

    def trim(self) -> int:
        """Collect garbage and ``malloc_trim`` in the broker; its RSS after that, in KiB."""
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        with self._lock:
            self.proc.stdin.write("trim\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        kib: int = json.loads(line)["rss_kib"]
        return kib

    def stop(self) -> int | None:
        """Stop the broker (end of its stdin); return its exit code."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        return self.proc.returncode

    def __enter__(self) -> BrokerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class RssSampler:
    """RSS of the broker's process sampled along a run, against a progress count (messages, cycles).

    Figures: RSS before the run, after warm-up (the first sample at ``warmup_at``), at the end of the run
    (the last sample, taken while the run's connections are still open), after the run's connections
    closed, and the largest sample. Flatness compares the end of the run with the end of warm-up.
    """

    pid: int
    warmup_at: int
    started: float = field(default_factory=time.perf_counter)
    samples: list[tuple[int, float, int]] = field(default_factory=list)  # (progress, seconds, KiB)
    start_kib: int = 0
    warm_kib: int | None = None

    def __post_init__(self) -> None:
        self.start_kib = rss_kib(self.pid)

    def sample(self, progress: int) -> None:
        kib = rss_kib(self.pid)
        self.samples.append((progress, round(time.perf_counter() - self.started, 3), kib))
        if self.warm_kib is None and progress >= self.warmup_at:
            self.warm_kib = kib

    def summary(self, after_close_kib: int) -> dict[str, Any]:
        end = self.samples[-1][2] if self.samples else after_close_kib
        warm = self.warm_kib if self.warm_kib is not None else end
        peak = max([after_close_kib, self.start_kib, *(kib for _, _, kib in self.samples)])
        return {
            "rss_start_kib": self.start_kib,
            "rss_after_warmup_kib": warm,
            "rss_end_kib": end,
            "rss_after_close_kib": after_close_kib,
            "rss_peak_sampled_kib": peak,
            "rss_growth_after_warmup_pct": round(100.0 * (end - warm) / warm, 2) if warm else 0.0,
            "rss_after_close_vs_start_pct": round(100.0 * (after_close_kib - self.start_kib) / self.start_kib, 2),
        }


# -- a minimal raw-socket AMQP 1.0 client -----------------------------------------------------------------
_ACCEPTED = b"\x00\x53\x24\x45"  # accepted, as an empty list
_FAST_KINDS: dict[int, type] = {Transfer.DESCRIPTOR_CODE: Transfer, Disposition.DESCRIPTOR_CODE: Disposition}


def decode_performative(body: bytes) -> tuple[Any, int]:
    """``codec.decode(body)``, faster for what a throughput run receives most: transfers and dispositions.

    The fast path reads a list8 whose fields are nulls, booleans, uints, short binaries or ``accepted``
    (everything the broker puts in them here); anything else goes to the codec.
    """
    if body[:2] != b"\x00\x53" or body[3] != 0xC0 or body[2] not in _FAST_KINDS:
        return codec.decode(body)
    end = 5 + body[4]
    pos = 6
    values: list[Any] = []
    for _ in range(body[5]):
        code = body[pos]
        if code == 0x43:
            values.append(0)
            pos += 1
        elif code == 0x52:
            values.append(body[pos + 1])
            pos += 2
        elif code == 0x70:
            values.append(int.from_bytes(body[pos + 1 : pos + 5], "big"))
            pos += 5
        elif code == 0x40:
            values.append(None)
            pos += 1
        elif code == 0x41:
            values.append(True)
            pos += 1
        elif code == 0x42:
            values.append(False)
            pos += 1
        elif code == 0xA0:
            size = body[pos + 1]
            values.append(body[pos + 2 : pos + 2 + size])
            pos += 2 + size
        elif body[pos : pos + 4] == _ACCEPTED:
            values.append(Accepted())
            pos += 4
        else:
            return codec.decode(body)
    if pos != end:
        return codec.decode(body)
    return _FAST_KINDS[body[2]](*values), end


class BrokerClosed(Exception):
    """The broker closed the TCP connection."""


class RawConnection:
    """One client connection speaking frames built by ``minibroker.testing.frames``.

    Outgoing bytes collect in ``out``; ``flush`` writes what the socket takes (the socket is blocking during
    set-up, non-blocking in the selector loop). ``receive`` reads once and returns the whole frames that
    arrived, as (channel, performative, payload); a heartbeat is (channel, None, b"").
    """

    def __init__(self, host: str, port: int, *, timeout: float = IO_TIMEOUT) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.inbuf = bytearray()
        self.out = bytearray()
        self.backlog: list[tuple[int, Any, bytes]] = []  # frames parsed by ``expect`` and not taken yet
        self.eof = False

    # -- writing ------------------------------------------------------------------------------------
    def queue(self, channel: int, performative: Any, payload: bytes = b"", frame_type: int = AMQP_FRAME) -> None:
        self.out += frames.frame(channel, performative, payload, frame_type)

    def queue_header(self, header: bytes) -> None:
        self.out += header

    def flush(self) -> None:
        """Write as much of ``out`` as the socket takes now (all of it while the socket is blocking)."""
        if not self.out:
            return
        if self.sock.gettimeout() != 0.0:
            self.sock.sendall(self.out)
            self.out.clear()
            return
        try:
            sent = self.sock.send(self.out)
        except BlockingIOError:
            return
        del self.out[:sent]

    # -- reading ------------------------------------------------------------------------------------
    def receive(self) -> list[tuple[int, Any, bytes]]:
        """Read once (waiting up to the timeout while blocking) and return the frames now complete."""
        try:
            data = self.sock.recv(262144)
        except BlockingIOError:
            return []
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            raise BrokerClosed("the broker closed the connection")
        self.inbuf += data
        if self.backlog:
            backlog, self.backlog = self.backlog, []
            return backlog + self._parse()
        return self._parse()

    def _parse(self) -> list[tuple[int, Any, bytes]]:
        buf = self.inbuf
        pos = 0
        size_of = len(buf)
        result: list[tuple[int, Any, bytes]] = []
        unpack = FRAME_HEADER.unpack_from
        decode = decode_performative
        while size_of - pos >= 8:
            if buf[pos : pos + 4] == b"AMQP":  # a protocol header (no frame is that large)
                header = bytes(buf[pos : pos + 8])
                if header not in (AMQP_HEADER, SASL_HEADER):
                    raise ValueError(f"unexpected protocol header {header!r}")
                pos += 8
                continue
            size, doff, _type, channel = unpack(buf, pos)
            if size_of - pos < size:
                break
            if size == doff * 4:
                result.append((channel, None, b""))
            else:
                body = bytes(buf[pos + doff * 4 : pos + size])
                performative, end = decode(body)
                result.append((channel, performative, body[end:]))
            pos += size
        del buf[:pos]
        return result

    def expect(self, kind: type, *, seen: list[Any] | None = None) -> Any:
        """Block until a frame whose performative is a ``kind`` arrives; return it (others go to ``seen``)."""
        deadline = time.monotonic() + self.timeout
        while True:
            self.backlog += self._parse()
            while self.backlog:
                _channel, performative, _payload = self.backlog.pop(0)
                if isinstance(performative, kind):
                    return performative
                if seen is not None:
                    seen.append(performative)
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {kind.__name__} from the broker within {self.timeout} s")
            self.flush()
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(262144)
            except ConnectionResetError:
                data = b""
            if not data:
                self.eof = True
                raise BrokerClosed(f"the broker closed the connection while we waited for {kind.__name__}")
            self.inbuf += data

    def open(self, container_id: str, *, sasl: bool = False, begin: Begin | None = None) -> None:
        """Protocol header(s), (SASL ANONYMOUS,) open and one session on channel 0; wait for the answers."""
        if sasl:
            self.queue_header(SASL_HEADER)
            self.queue(0, frames.sasl_anonymous(), frame_type=SASL_FRAME)
        self.queue_header(AMQP_HEADER)
        self.queue(0, frames.open_(container_id))
        self.queue(0, begin if begin is not None else frames.begin())
        self.flush()
        if sasl:
            self.expect(SaslMechanisms)
            outcome = self.expect(SaslOutcome)
            if outcome.code != 0:
                raise RuntimeError(f"SASL refused: {outcome!r}")
        self.expect(Begin)

    def close(self) -> None:
        """AMQP close, wait for the broker's, then close the socket."""
        try:
            self.sock.settimeout(self.timeout)
            self.queue(0, Close())
            self.flush()
            self.expect(Close)
        finally:
            self.sock.close()


def _uint(value: int) -> UInt:
    return UInt(value & 0xFFFFFFFF)


@dataclass
class ThroughputResult:
    """Figures of one throughput run."""

    messages: int
    size: int
    sent: int = 0
    accepted: int = 0
    received: int = 0
    lost: int = 0
    duplicates: int = 0
    out_of_order: int = 0
    malformed: int = 0
    timed_out: bool = False
    error: str | None = None
    seconds: float = 0.0
    messages_per_s: float = 0.0
    broker_cpu_s: float = 0.0
    broker_cpu_us_per_message: float = 0.0
    client_cpu_us_per_message: float = 0.0
    max_depth_allowed: int = 0
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    allocated_blocks_growth: int = 0
    rss: dict[str, Any] = field(default_factory=dict)
    rss_samples: list[tuple[int, float, int]] = field(default_factory=list)
    broker_before: dict[str, Any] = field(default_factory=dict)
    broker_after: dict[str, Any] = field(default_factory=dict)
    peak_rss_kib: int = 0

    @property
    def ok(self) -> bool:
        return (
            not self.timed_out
            and self.error is None
            and self.lost == 0
            and self.duplicates == 0
            and self.malformed == 0
            and self.received == self.messages
            and self.accepted == self.messages
        )


class _Producer:
    """The sending side: pre-encoded transfers while credit, session window and the in-flight cap allow."""

    def __init__(self, conn: RawConnection, total: int, size: int) -> None:
        self.conn = conn
        self.total = total
        self.size = size
        self.sent = 0
        self.accepted = 0
        self.credit = 0
        self.remote_window = 0
        self.next_outgoing_id = 0
        self.rejected: list[Any] = []
        # the transfer frame of one message; delivery-id, delivery-tag and the sequence body are patched in
        probe_id, probe_tag = 0x5AA5F00D, b"\xa5\x5a" * 4
        transfer = Transfer(
            handle=UInt(0), delivery_id=UInt(probe_id), delivery_tag=probe_tag, message_format=UInt(0), settled=False
        )
        payload = frames.message(AmqpValue(b"\x00" * size))
        template = bytearray(frames.frame(0, transfer, payload))
        self.template = template
        self.id_at = template.index(struct.pack(">I", probe_id))
        self.tag_at = template.index(probe_tag)
        self.seq_at = len(template) - size
        self.frame = bytearray(template)
        self._check()

    def _check(self) -> None:
        """The patched template decodes as the transfer and message it stands for."""
        (parsed,) = frames.parse_frames(bytes(self._frame(0x01020304, 77)))
        transfer = parsed.performative
        assert isinstance(transfer, Transfer), transfer
        assert transfer.delivery_id == 0x01020304, transfer
        assert transfer.delivery_tag == struct.pack(">Q", 77), transfer
        body = codec.decode_all(parsed.payload)[-1]
        assert isinstance(body, AmqpValue), body
        assert body.value[:8] == struct.pack(">Q", 77), body
        # the fast decoder reads what the broker sends as the codec does
        samples = [
            transfer,
            Transfer(handle=UInt(3), delivery_id=UInt(7), delivery_tag=b"t", message_format=UInt(0), settled=True),
            frames.disposition(5, 9, state=Accepted()),
            frames.disposition(300, settled=False, state=Accepted()),
        ]
        for sample in samples:
            encoded = codec.encode(sample)
            assert decode_performative(encoded) == codec.decode(encoded), sample

    def _frame(self, delivery_id: int, seq: int) -> bytearray:
        frame = self.frame
        struct.pack_into(">I", frame, self.id_at, delivery_id & 0xFFFFFFFF)
        struct.pack_into(">Q", frame, self.tag_at, seq)
        struct.pack_into(">Q", frame, self.seq_at, seq)
        return frame

    def fill(self, received: int, window: int, limit: int) -> None:
        out = self.conn.out
        budget = min(self.credit, self.remote_window, limit - self.sent, received + window - self.sent)
        if budget <= 0:
            return
        make = self._frame
        seq = self.sent
        for _ in range(budget):
            out += make(seq, seq)  # one link on a fresh session: the delivery-id is the sequence number
            seq += 1
        self.sent = seq
        self.credit -= budget
        self.remote_window -= budget
        self.next_outgoing_id += budget

    def on_frame(self, performative: Any) -> None:
        if isinstance(performative, Disposition):
            first = performative.first or 0
            last = first if performative.last is None else performative.last
            if isinstance(performative.state, Accepted):
                self.accepted += last - first + 1
            else:
                self.rejected.append(performative.state)
        elif isinstance(performative, Flow):
            next_incoming = performative.next_incoming_id or 0
            self.remote_window = next_incoming + (performative.incoming_window or 0) - self.next_outgoing_id
            if performative.handle is not None:
                self.credit = (performative.delivery_count or 0) + (performative.link_credit or 0) - self.sent


class _Consumer:
    """The receiving side: checks each sequence number, accepts in ranges, keeps credit topped up."""

    def __init__(self, conn: RawConnection, total: int, size: int, credit: int) -> None:
        self.conn = conn
        self.total = total
        self.size = size
        self.credit_target = credit
        self.credit = 0
        self.received = 0
        self.seen = bytearray(total)
        self.duplicates = 0
        self.out_of_order = 0
        self.malformed = 0
        self.expected = 0
        self.first: int | None = None
        self.last = 0
        self.message_size = len(frames.message(AmqpValue(b"\x00" * size)))

    def grant(self) -> None:
        self.credit = self.credit_target
        self.conn.queue(
            0,
            Flow(
                next_incoming_id=_uint(self.received),
                incoming_window=UInt(8192),
                next_outgoing_id=UInt(0),
                outgoing_window=UInt(0),
                handle=UInt(0),
                delivery_count=_uint(self.received),
                link_credit=UInt(self.credit),
            ),
        )

    def on_transfer(self, transfer: Transfer, payload: bytes) -> None:
        self.received += 1
        self.credit -= 1
        delivery_id = transfer.delivery_id or 0
        if self.first is None:
            self.first = delivery_id
        elif delivery_id != self.last + 1:
            self.settle()
            self.first = delivery_id
        self.last = delivery_id
        if len(payload) != self.message_size or transfer.more:
            self.malformed += 1
            return
        at = self.message_size - self.size
        seq = int.from_bytes(payload[at : at + 8], "big")
        if seq >= self.total:
            self.malformed += 1
            return
        if self.seen[seq]:
            self.duplicates += 1
        self.seen[seq] = 1
        if seq != self.expected:
            self.out_of_order += 1
        self.expected = seq + 1

    def settle(self) -> None:
        """Accept everything received since the last call, in one disposition."""
        if self.first is None:
            return
        self.conn.queue(0, frames.disposition(self.first, self.last if self.last != self.first else None,
                                              state=Accepted()))  # fmt: skip
        self.first = None

    def after_batch(self) -> None:
        self.settle()
        if self.credit <= self.credit_target // 2 and self.received < self.total:
            self.grant()


def run_throughput(
    host: str,
    port: int,
    messages: int,
    *,
    size: int = 128,
    window: int = 2000,
    credit: int = 1000,
    warmup: float = 0.1,
    time_limit: float = 900.0,
    probe: Probe | None = None,
    queue: str = "soak.throughput",
    progress: Callable[[str], None] | None = None,
) -> ThroughputResult:
    """Send ``messages`` through one queue with one producer and one consumer connection; check every one.

    With a ``probe``, the run pauses twice, its connections open: after ``warmup`` (a fraction) of the
    messages and after the last one. Each time it waits until the queue is empty and every message is
    settled, then records the broker's RSS and (after a garbage collection) allocated memory blocks: the
    growth between the two is what the run left behind that is not bounded by the in-flight window.
    """
    result = ThroughputResult(messages=messages, size=size, max_depth_allowed=window)
    sampler = RssSampler(probe.pid, warmup_at=messages) if probe is not None else None
    if probe is not None:
        result.broker_before = probe.stats(collect=True)
    cpu_before = cpu_seconds(probe.pid) if probe is not None else 0.0
    prod_conn = RawConnection(host, port)
    cons_conn = RawConnection(host, port)
    producer = _Producer(prod_conn, messages, size)
    consumer = _Consumer(cons_conn, messages, size, credit)
    try:
        prod_conn.open("soak-producer")
        cons_conn.open("soak-consumer", begin=frames.begin(incoming_window=8192))
        prod_conn.queue(0, frames.attach_sender(queue, handle=0))
        cons_conn.queue(0, frames.attach_receiver(queue, handle=0))
        consumer.grant()
        cons_conn.flush()
        cons_conn.expect(Attach)
        seen: list[Any] = []
        prod_conn.expect(Attach, seen=seen)
        flow = prod_conn.expect(Flow, seen=seen)
        for performative in [*seen, flow]:
            producer.on_frame(performative)
        client_cpu = time.process_time()
        pump = _Pump(result, producer, consumer, window, sampler, progress)
        checkpoints = [max(1, int(messages * warmup)), messages] if probe is not None else []
        result.seconds = pump.run(time_limit, checkpoints, lambda: _checkpoint(probe, queue, consumer.received))
        client_cpu = time.process_time() - client_cpu
        result.client_cpu_us_per_message = round(1e6 * client_cpu / max(1, consumer.received), 1)
        for conn in (prod_conn, cons_conn):
            conn.sock.setblocking(True)
            conn.flush()
        cons_conn.close()
        prod_conn.close()
    except (BrokerClosed, TimeoutError, OSError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        prod_conn.sock.close()
        cons_conn.sock.close()
    unique = sum(consumer.seen)
    result.sent = producer.sent
    result.accepted = producer.accepted
    result.received = consumer.received
    result.duplicates = consumer.duplicates
    result.out_of_order = consumer.out_of_order
    result.malformed = consumer.malformed
    result.lost = producer.sent - unique  # sent, and never received
    result.messages_per_s = round(result.received / result.seconds) if result.seconds else 0.0
    if probe is not None and sampler is not None:
        result.broker_cpu_s = round(cpu_seconds(probe.pid) - cpu_before, 2)
        result.broker_cpu_us_per_message = round(1e6 * result.broker_cpu_s / max(1, result.received), 1)
        result.broker_after = settled_stats(probe, result.broker_before)
        result.rss = sampler.summary(rss_kib(probe.pid))
        if len(result.checkpoints) == 2:
            warm, end = result.checkpoints
            result.rss["rss_after_warmup_kib"] = warm["rss_kib"]
            result.rss["rss_end_kib"] = end["rss_kib"]
            result.rss["rss_growth_after_warmup_pct"] = round(
                100.0 * (end["rss_kib"] - warm["rss_kib"]) / warm["rss_kib"], 2
            )
            result.allocated_blocks_growth = end["allocated_blocks"] - warm["allocated_blocks"]
        result.rss_samples = sampler.samples
        result.peak_rss_kib = max(peak_rss_kib(probe.pid), result.rss["rss_peak_sampled_kib"])
    return result


def _checkpoint(probe: Probe | None, queue: str, received: int, timeout: float = IO_TIMEOUT) -> dict[str, Any]:
    """Once ``queue`` is empty and nothing is unsettled: the broker's RSS and stats (after a gc)."""
    assert probe is not None
    deadline = time.monotonic() + timeout
    while probe.stats()["queues"].get(queue) != {"ready": 0, "acquired": 0} and time.monotonic() < deadline:
        time.sleep(0.005)
    stats = probe.stats(collect=True)
    return {
        "messages": received,
        "rss_kib": rss_kib(probe.pid),
        "allocated_blocks": stats["allocated_blocks"],
        "queue": stats["queues"].get(queue),
        "connections": stats["connections"],
    }


class _Pump:
    """The selector loop of a throughput run."""

    def __init__(
        self,
        result: ThroughputResult,
        producer: _Producer,
        consumer: _Consumer,
        window: int,
        sampler: RssSampler | None,
        progress: Callable[[str], None] | None,
    ) -> None:
        self.result = result
        self.producer = producer
        self.consumer = consumer
        self.window = window
        self.sampler = sampler
        self.progress = progress
        self.conns = (producer.conn, consumer.conn)
        self.selector = selectors.DefaultSelector()
        self.masks: dict[RawConnection, int] = {}

    def run(self, time_limit: float, checkpoints: list[int], checkpoint: Callable[[], dict[str, Any]]) -> float:
        """Until every message is received and accepted (pausing at ``checkpoints``); the seconds it took,
        pauses not counted."""
        result, producer, consumer = self.result, self.producer, self.consumer
        messages = result.messages
        started = time.perf_counter()
        paused = 0.0
        deadline = started + time_limit
        next_report = started + 10.0
        sample_every = max(1, messages // 200)
        next_sample = sample_every
        pending = list(checkpoints)
        for conn in self.conns:
            conn.sock.setblocking(False)
            self.selector.register(conn.sock, selectors.EVENT_READ, conn)
            self.masks[conn] = selectors.EVENT_READ
        try:
            while consumer.received < messages or producer.accepted < messages:
                producer.fill(consumer.received, self.window, pending[0] if pending else messages)
                self._flush()
                now = time.perf_counter()
                if now > deadline:
                    result.timed_out = True
                    break
                self._receive(min(1.0, deadline - now))
                consumer.after_batch()
                if producer.rejected:
                    result.error = f"the broker refused messages: {producer.rejected[:3]!r}"
                    break
                if self.sampler is not None and consumer.received >= next_sample:
                    self.sampler.sample(consumer.received)
                    next_sample += sample_every
                if pending and min(consumer.received, producer.accepted) >= pending[0]:
                    pause = time.perf_counter()
                    while any(conn.out for conn in self.conns):
                        self._flush()
                        self._receive(0.01)
                    result.checkpoints.append(checkpoint())
                    pending.pop(0)
                    paused += time.perf_counter() - pause
                if self.progress is not None and now > next_report:
                    next_report = now + 10.0
                    rate = consumer.received / (now - started - paused)
                    self.progress(f"  throughput: {consumer.received:,} of {messages:,} received, {rate:,.0f} msg/s")
        finally:
            self.selector.close()
        return time.perf_counter() - started - paused

    def _flush(self) -> None:
        for conn in self.conns:
            conn.flush()
            mask = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.out else 0)
            if mask != self.masks[conn]:
                self.selector.modify(conn.sock, mask, conn)
                self.masks[conn] = mask

    def _receive(self, timeout: float) -> None:
        consumer, producer = self.consumer, self.producer
        for key, mask in self.selector.select(timeout=timeout):
            if not mask & selectors.EVENT_READ:
                continue
            conn = key.data
            if conn is consumer.conn:
                for _channel, performative, payload in conn.receive():
                    if isinstance(performative, Transfer):
                        consumer.on_transfer(performative, payload)
            else:
                for _channel, performative, _payload in conn.receive():
                    producer.on_frame(performative)


def settled_stats(probe: Probe, before: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """The broker's stats once every connection and its tasks are gone (or after ``timeout``), after a gc.

    A connection leaves ``broker.connections`` when its close is handled; its task ends a moment later,
    once its socket is flushed and closed: so wait for the trio task count to come back to ``before``'s.
    """
    deadline = time.monotonic() + timeout
    while True:
        stats = probe.stats()
        settled = not stats["connections"] and stats["connection_tasks"] <= 0
        if (settled and stats["trio_tasks"] <= before.get("trio_tasks", 0)) or time.monotonic() > deadline:
            return probe.stats(collect=True)
        time.sleep(0.02)


# -- connection churn ------------------------------------------------------------------------------------
CHURN_KINDS = ("clean", "sasl", "messaging", "abrupt", "half-open")


def churn_cycle(host: str, port: int, index: int, queue: str) -> None:
    """One connect/disconnect cycle of kind ``CHURN_KINDS[index % 5]``; raises if the broker misbehaves."""
    kind = CHURN_KINDS[index % len(CHURN_KINDS)]
    conn = RawConnection(host, port)
    try:
        if kind == "half-open":
            if index % 2:
                conn.sock.sendall(AMQP_HEADER[:5])  # part of a protocol header, then gone
            return
        if kind in ("clean", "sasl"):
            conn.open(f"churn-{index}", sasl=kind == "sasl")
            conn.close()
            return
        conn.open(f"churn-{index}")
        if kind == "abrupt":
            # a receiver with credit may take messages of the queue; dropping the socket must release them
            conn.queue(0, frames.attach_receiver(queue, handle=0))
            conn.queue(0, frames.flow(handle=0, delivery_count=0, link_credit=5))
            conn.flush()
            conn.expect(Attach)
            if index % 2:
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST
            return
        # messaging: one message in through a sender, one out through a receiver, accepted
        conn.queue(0, frames.attach_sender(queue, handle=0))
        conn.queue(0, frames.attach_receiver(queue, handle=1))
        conn.flush()
        conn.expect(Flow)  # the broker's credit for our sender
        conn.queue(0, frames.transfer(0, 0, settled=True), frames.message(f"churn {index}"))
        conn.queue(0, frames.flow(next_incoming_id=0, handle=1, delivery_count=0, link_credit=1))
        conn.flush()
        transfer = conn.expect(Transfer)
        conn.queue(0, frames.disposition(transfer.delivery_id, state=Accepted()))
        conn.close()
    finally:
        conn.sock.close()


@dataclass
class ChurnResult:
    """Figures of one churn run."""

    cycles: int
    workers: int
    completed: int = 0
    failures: int = 0
    first_failures: list[str] = field(default_factory=list)
    timed_out: bool = False
    seconds: float = 0.0
    cycles_per_s: float = 0.0
    broker_cpu_s: float = 0.0
    fds_before: tuple[int, int] = (0, 0)
    fds_after: tuple[int, int] = (0, 0)
    broker_before: dict[str, Any] = field(default_factory=dict)
    broker_after: dict[str, Any] = field(default_factory=dict)
    rss: dict[str, Any] = field(default_factory=dict)
    rss_samples: list[tuple[int, float, int]] = field(default_factory=list)
    peak_rss_kib: int = 0

    @property
    def ok(self) -> bool:
        before, after = self.broker_before, self.broker_after
        queue = after.get("queues", {}).get("soak.churn", {"ready": 0, "acquired": 0})
        return (
            not self.timed_out
            and self.failures == 0
            and after.get("connections") == 0
            and after.get("trio_tasks") == before.get("trio_tasks")
            and self.fds_after[1] <= self.fds_before[1]
            and queue == {"ready": 0, "acquired": 0}
        )


def run_churn(
    host: str,
    port: int,
    cycles: int,
    *,
    workers: int = 8,
    time_limit: float = 600.0,
    probe: Probe | None = None,
    queue: str = "soak.churn",
    progress: Callable[[str], None] | None = None,
) -> ChurnResult:
    """``cycles`` connect/disconnect cycles from ``workers`` threads; then the broker's leftovers."""
    result = ChurnResult(cycles=cycles, workers=workers)
    if probe is not None:
        result.broker_before = probe.stats(collect=True)
        result.fds_before = open_fds(probe.pid)
    cpu_before = cpu_seconds(probe.pid) if probe is not None else 0.0
    sampler = RssSampler(probe.pid, warmup_at=cycles // 10) if probe is not None else None
    counter = iter(range(cycles))
    lock = threading.Lock()
    started = time.perf_counter()
    deadline = started + time_limit
    sample_every = max(1, cycles // 100)

    def work() -> None:
        while time.perf_counter() < deadline:
            with lock:
                index = next(counter, None)
            if index is None:
                return
            try:
                churn_cycle(host, port, index, queue)
            except Exception as exc:
                with lock:
                    result.failures += 1
                    if len(result.first_failures) < 5:
                        result.first_failures.append(f"cycle {index} ({CHURN_KINDS[index % 5]}): {exc!r}")
            with lock:
                result.completed += 1
                done = result.completed
                if sampler is not None and done % sample_every == 0:
                    sampler.sample(done)
                if progress is not None and done % max(1, cycles // 10) == 0:
                    progress(f"  churn: {done:,} of {cycles:,} cycles")

    threads = [threading.Thread(target=work, name=f"churn-{i}", daemon=True) for i in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.perf_counter()) + IO_TIMEOUT * 2)
    result.seconds = time.perf_counter() - started
    result.timed_out = result.completed < cycles
    result.cycles_per_s = round(result.completed / result.seconds, 1) if result.seconds else 0.0
    if probe is not None and sampler is not None:
        result.broker_cpu_s = round(cpu_seconds(probe.pid) - cpu_before, 2)
        result.broker_after = settled_stats(probe, result.broker_before)
        result.fds_after = open_fds(probe.pid)
        result.rss = sampler.summary(rss_kib(probe.pid))
        result.rss_samples = sampler.samples
        result.peak_rss_kib = max(peak_rss_kib(probe.pid), result.rss["rss_peak_sampled_kib"])
    return result


# -- many connections at once, with python-qpid-proton ---------------------------------------------------
@dataclass
class ConnectionsResult:
    """Figures of one many-connections run."""

    connections: int
    messages_per_connection: int
    opened: int = 0
    sent: int = 0
    accepted: int = 0
    received: int = 0
    lost: int = 0
    duplicates: int = 0
    out_of_order: int = 0
    misrouted: int = 0
    errors: list[str] = field(default_factory=list)
    timed_out: bool = False
    seconds: float = 0.0
    messages_per_s: float = 0.0
    broker_cpu_s: float = 0.0
    broker_cpu_us_per_message: float = 0.0
    broker_before: dict[str, Any] = field(default_factory=dict)
    broker_after: dict[str, Any] = field(default_factory=dict)
    rss: dict[str, Any] = field(default_factory=dict)
    rss_samples: list[tuple[int, float, int]] = field(default_factory=list)
    peak_rss_kib: int = 0

    @property
    def ok(self) -> bool:
        total = self.connections * self.messages_per_connection
        return (
            not self.timed_out
            and not self.errors
            and self.lost == 0
            and self.duplicates == 0
            and self.misrouted == 0
            and self.received == total
            and self.accepted == total
        )


def run_connections(
    url: str,
    connections: int,
    messages: int,
    *,
    prefetch: int = 100,
    time_limit: float = 600.0,
    probe: Probe | None = None,
    progress: Callable[[str], None] | None = None,
) -> ConnectionsResult:
    """``connections`` proton connections at once; connection i sends ``messages`` to queue soak.i and
    receives the ``messages`` that connection i+1 sent to soak.(i+1)."""
    from proton import Message
    from proton.handlers import MessagingHandler
    from proton.reactor import Container, Handler

    result = ConnectionsResult(connections=connections, messages_per_connection=messages)
    total = connections * messages
    sampler = RssSampler(probe.pid, warmup_at=total // 10) if probe is not None else None
    if probe is not None:
        result.broker_before = probe.stats(collect=True)
    cpu_before = cpu_seconds(probe.pid) if probe is not None else 0.0
    sent = [0] * connections
    expected = [0] * connections  # next sequence number receiver i expects
    seen: list[set[int]] = [set() for _ in range(connections)]

    class Call(Handler):
        def __init__(self, callback: Callable[[], None]) -> None:
            super().__init__()
            self.callback = callback

        def on_timer_task(self, event: Any) -> None:
            self.callback()

    class Load(MessagingHandler):
        def __init__(self) -> None:
            super().__init__(prefetch=prefetch, auto_accept=True, auto_settle=True)
            self.container: Any = None
            self.conns: list[Any] = []
            self.tasks: list[Any] = []
            self.finished = False
            self.transports_closed = 0

        def on_start(self, event: Any) -> None:
            container = self.container = event.container
            for i in range(connections):
                conn = container.connect(url, reconnect=False)
                self.conns.append(conn)
                container.create_sender(conn, f"soak.{i}", name=f"s{i}")
                container.create_receiver(conn, f"soak.{(i + 1) % connections}", name=f"r{i}")
            self.tasks.append(container.schedule(time_limit, Call(self.time_out)))
            self.tasks.append(container.schedule(0.25, Call(self.sample)))

        def time_out(self) -> None:
            result.timed_out = True
            self.finish()

        def sample(self) -> None:
            if self.finished:
                return
            if sampler is not None:
                sampler.sample(result.received)
            self.tasks.append(self.container.schedule(0.25, Call(self.sample)))

        def on_connection_opened(self, event: Any) -> None:
            result.opened += 1

        def on_sendable(self, event: Any) -> None:
            i = int(event.link.name[1:])
            sender = event.sender
            while sender.credit and sent[i] < messages:
                sender.send(Message(id=f"{i}:{sent[i]}", body=sent[i]))
                sent[i] += 1
                result.sent += 1

        def on_accepted(self, event: Any) -> None:
            result.accepted += 1
            self.check_done()

        def on_rejected(self, event: Any) -> None:
            result.errors.append(f"rejected on {event.link.name}: {event.delivery.remote.condition}")
            self.finish()

        def on_released(self, event: Any) -> None:
            result.errors.append(f"released on {event.link.name}")
            self.finish()

        def on_message(self, event: Any) -> None:
            i = int(event.link.name[1:])
            result.received += 1
            origin, _, seq_text = str(event.message.id).partition(":")
            seq = int(seq_text)
            if int(origin) != (i + 1) % connections or event.message.body != seq:
                result.misrouted += 1
            elif seq in seen[i]:
                result.duplicates += 1
            else:
                seen[i].add(seq)
            if seq != expected[i]:
                result.out_of_order += 1
            expected[i] = seq + 1
            if progress is not None and result.received % max(1, total // 10) == 0:
                progress(f"  connections: {result.received:,} of {total:,} received")
            self.check_done()

        def check_done(self) -> None:
            if result.received >= total and result.accepted >= total:
                self.finish()

        def finish(self) -> None:
            if self.finished:
                return
            self.finished = True
            result.seconds = time.perf_counter() - started
            if sampler is not None:
                sampler.sample(result.received)  # the end of the run, connections still open
            for task in self.tasks:
                task.cancel()
            for conn in self.conns:
                conn.close()
            # the run ends when every transport is closed, or a few seconds later at most
            self.container.schedule(5.0, Call(self.container.stop))

        def on_transport_closed(self, event: Any) -> None:
            self.transports_closed += 1
            if not self.finished:
                result.errors.append(f"connection lost: {event.transport.condition}")
                self.finish()
            elif self.transports_closed >= len(self.conns):
                self.container.stop()

        def on_transport_error(self, event: Any) -> None:
            if not self.finished:
                result.errors.append(f"transport error: {event.transport.condition}")
                self.finish()

        def on_connection_error(self, event: Any) -> None:
            result.errors.append(f"connection error: {event.connection.remote_condition}")
            self.finish()

        def on_link_error(self, event: Any) -> None:
            result.errors.append(f"link error on {event.link.name}: {event.link.remote_condition}")
            self.finish()

    started = time.perf_counter()
    handler = Load()
    Container(handler).run()
    if not result.seconds:
        result.seconds = time.perf_counter() - started
    result.lost = total - sum(len(s) for s in seen)
    result.messages_per_s = round(result.received / result.seconds) if result.seconds else 0.0
    if probe is not None and sampler is not None:
        result.broker_cpu_s = round(cpu_seconds(probe.pid) - cpu_before, 2)
        result.broker_cpu_us_per_message = round(1e6 * result.broker_cpu_s / max(1, result.received), 1)
        result.broker_after = settled_stats(probe, result.broker_before)
        result.rss = sampler.summary(rss_kib(probe.pid))
        result.rss_samples = sampler.samples
        result.peak_rss_kib = max(peak_rss_kib(probe.pid), result.rss["rss_peak_sampled_kib"])
    return result


# -- the command -----------------------------------------------------------------------------------------
def _mib(kib: int) -> str:
    return f"{kib / 1024:.1f} MiB"


def _print_rss(rss: dict[str, Any], peak: int) -> None:
    print(
        f"  broker RSS: start {_mib(rss['rss_start_kib'])}, after warm-up {_mib(rss['rss_after_warmup_kib'])}, "
        f"end of run {_mib(rss['rss_end_kib'])} ({rss['rss_growth_after_warmup_pct']:+.1f} % vs after warm-up), "
        f"peak {_mib(peak)} (VmHWM)"
    )
    print(
        f"  broker RSS after the connections closed: {_mib(rss['rss_after_close_kib'])} "
        f"({rss['rss_after_close_vs_start_pct']:+.1f} % vs start), after malloc_trim "
        f"{_mib(rss['rss_after_close_trimmed_kib'])}"
    )


def _print_leftovers(before: dict[str, Any], after: dict[str, Any]) -> None:
    print(
        f"  broker after: {after.get('connections')} connections, {after.get('connection_tasks')} connection "
        f"tasks, trio tasks {before.get('trio_tasks')} -> {after.get('trio_tasks')}, allocated blocks "
        f"{before.get('allocated_blocks', 0):,} -> {after.get('allocated_blocks', 0):,}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every count by this (default 1.0)")
    parser.add_argument("--only", default="connections,throughput,churn,attacks", help="comma-separated scenarios")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON to PATH")
    parser.add_argument("--time-limit", type=float, default=900.0, help="seconds per scenario at scale 1")
    parser.add_argument("--size", type=int, default=128, help="body bytes of each throughput message")
    parser.add_argument("--workers", type=int, default=8, help="churn threads")
    parser.add_argument("--serve-broker", metavar="CONFIG_JSON", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_broker is not None:
        serve_broker(json.loads(args.serve_broker))
        return 0
    scale = args.scale
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    limit = max(60.0, args.time_limit * scale)
    figures: dict[str, Any] = {"scale": scale, "cpus": os.cpu_count(), "python": sys.version.split()[0]}
    all_ok = True

    def say(text: str) -> None:
        print(text, flush=True)

    if "connections" in only:
        conns, per = max(1, math.ceil(200 * scale)), max(1, math.ceil(500 * scale))
        say(f"connections: {conns} proton connections at once, each sending and receiving {per} messages")
        with BrokerProcess() as broker:
            res = run_connections(broker.url, conns, per, time_limit=limit, probe=broker, progress=say)
            res.rss["rss_after_close_trimmed_kib"] = broker.trim()
            code = broker.stop()
        all_ok &= res.ok and code == 0
        say(
            f"  {res.received:,} received of {conns * per:,} ({res.accepted:,} accepted) in {res.seconds:.1f} s: "
            f"{res.messages_per_s:,.0f} msg/s; broker CPU {res.broker_cpu_s} s "
            f"({res.broker_cpu_us_per_message} us per message)"
        )
        say(
            f"  lost {res.lost}, duplicates {res.duplicates}, misrouted {res.misrouted}, "
            f"out of order {res.out_of_order}, errors {res.errors[:3]}, timed out {res.timed_out}"
        )
        _print_rss(res.rss, res.peak_rss_kib)
        _print_leftovers(res.broker_before, res.broker_after)
        say(f"  {'OK' if res.ok else 'FAILED'}")
        figures["connections"] = {**asdict(res), "ok": res.ok, "broker_exit_code": code}

    if "throughput" in only:
        count = max(1000, math.ceil(1_000_000 * scale))
        warmup = max(0.1, min(0.5, 100_000 / count))
        say(f"throughput: {count:,} messages of {args.size} body bytes through one queue (raw-socket client)")
        with BrokerProcess() as broker:
            tres = run_throughput(
                HOST, broker.port, count, size=args.size, warmup=warmup, time_limit=limit, probe=broker,
                progress=say,
            )  # fmt: skip
            tres.rss["rss_after_close_trimmed_kib"] = broker.trim()
            code = broker.stop()
        all_ok &= tres.ok and code == 0
        say(
            f"  {tres.received:,} received, {tres.accepted:,} accepted in {tres.seconds:.1f} s: "
            f"{tres.messages_per_s:,.0f} msg/s; broker CPU {tres.broker_cpu_s} s "
            f"({tres.broker_cpu_us_per_message} us per message; client {tres.client_cpu_us_per_message} us)"
        )
        say(
            f"  lost {tres.lost}, duplicates {tres.duplicates}, out of order {tres.out_of_order}, "
            f"malformed {tres.malformed}, error {tres.error}, timed out {tres.timed_out}"
        )
        _print_rss(tres.rss, tres.peak_rss_kib)
        if len(tres.checkpoints) == 2:
            warm, end = tres.checkpoints
            say(
                f"  paused with the queue empty, connections open: after {warm['messages']:,} messages "
                f"{_mib(warm['rss_kib'])}, {warm['allocated_blocks']:,} allocated blocks; after "
                f"{end['messages']:,}: {_mib(end['rss_kib'])}, {end['allocated_blocks']:,} blocks "
                f"({tres.allocated_blocks_growth:+,})"
            )
        flat = abs(tres.rss.get("rss_growth_after_warmup_pct", 100.0)) <= 10.0
        say(f"  RSS flat within 10 % after warm-up: {'yes' if flat else 'NO'}")
        all_ok &= flat
        _print_leftovers(tres.broker_before, tres.broker_after)
        say(f"  {'OK' if tres.ok else 'FAILED'}")
        figures["throughput"] = {**asdict(tres), "ok": tres.ok, "rss_flat": flat, "broker_exit_code": code}

    if "churn" in only:
        cycles = max(10, math.ceil(10_000 * scale))
        say(f"churn: {cycles:,} connect/disconnect cycles from {args.workers} threads (raw-socket client)")
        with BrokerProcess() as broker:
            cres = run_churn(HOST, broker.port, cycles, workers=args.workers, time_limit=limit, probe=broker,
                             progress=say)  # fmt: skip
            cres.rss["rss_after_close_trimmed_kib"] = broker.trim()
            code = broker.stop()
        all_ok &= cres.ok and code == 0
        say(
            f"  {cres.completed:,} cycles in {cres.seconds:.1f} s: {cres.cycles_per_s:,.0f} cycles/s; "
            f"broker CPU {cres.broker_cpu_s} s; failures {cres.failures} {cres.first_failures}"
        )
        say(f"  broker fds (all, sockets): {cres.fds_before} before, {cres.fds_after} after")
        _print_rss(cres.rss, cres.peak_rss_kib)
        _print_leftovers(cres.broker_before, cres.broker_after)
        say(f"  queue soak.churn after: {cres.broker_after.get('queues', {}).get('soak.churn')}")
        say(f"  {'OK' if cres.ok else 'FAILED'}")
        figures["churn"] = {**asdict(cres), "ok": cres.ok, "broker_exit_code": code}

    if "attacks" in only:
        if str(ROOT) not in sys.path:  # run as a script: bench/ is on the path, the checkout is not
            sys.path.insert(0, str(ROOT))
        from bench.attacks import ATTACKS, run_attacks

        say(f"attacks: {len(ATTACKS)} attacks on the broker's limits, each with a bystander (bench/attacks.py)")
        results = run_attacks(list(ATTACKS), scale, say)
        all_ok &= all(res.ok for res in results)
        figures["attacks"] = [asdict(res) for res in results]

    figures["ok"] = all_ok
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    say("all OK" if all_ok else "FAILED")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
