"""soak's throughput scenario: many messages through one queue, one producer and one consumer connection
(``bench.raw.RawClient``) driven by one selector loop, every message checked, the broker's memory
watched (see ``run_throughput``)."""

from __future__ import annotations

import selectors
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.measures import cpu_seconds, rss_kib
from bench.raw import IO_TIMEOUT, BrokerClosed, RawClient
from bench.soak_figures import MessageFigures, Probe, RssSampler, record_broker_after
from minibroker.amqp import codec
from minibroker.amqp.definitions import Accepted, AmqpValue, Disposition, Transfer
from minibroker.amqp.types import UInt
from minibroker.testing import frames
from minibroker.testing.client import Delivery, Frame, Link, parse_frames

HANDLE = 0
"""The handle of each side's one link (on channel 0)."""


def _link(conn: RawClient) -> Link:
    """``conn``'s one link, as the client core keeps it."""
    return conn.conn.session(0).links[HANDLE]


@dataclass(kw_only=True)
class ThroughputResult(MessageFigures):
    """Figures of one throughput run."""

    messages: int
    size: int
    malformed: int = 0
    error: str | None = None
    client_cpu_us_per_message: float = 0.0
    max_depth_allowed: int = 0
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    allocated_blocks_growth: int = 0

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
    """The sending side: transfers patched into one pre-encoded template, as many as the link's credit, the
    session window and the in-flight cap allow (the client core books each one)."""

    def __init__(self, conn: RawClient, total: int, size: int) -> None:
        self.conn = conn
        self.total = total
        self.size = size
        self.sent = 0
        self.accepted = 0
        self.rejected: list[Any] = []
        # the transfer frame of one message; delivery-id, delivery-tag and the sequence body are patched in
        probe_id, probe_tag = 0x5AA5F00D, b"\xa5\x5a" * 4
        transfer = Transfer(
            handle=UInt(HANDLE),
            delivery_id=UInt(probe_id),
            delivery_tag=probe_tag,
            message_format=UInt(0),
            settled=False,
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
        data, transfer = self._message(0x01020304, 77)
        (parsed,) = parse_frames(bytes(data))
        assert parsed.performative == transfer, (parsed.performative, transfer)
        body = codec.decode_all(parsed.payload)[-1]
        assert isinstance(body, AmqpValue), body
        assert body.value[:8] == struct.pack(">Q", 77), body

    def _message(self, delivery_id: int, seq: int) -> tuple[bytearray, Transfer]:
        """The template patched for message ``seq`` as delivery ``delivery_id``, and the transfer it carries."""
        frame = self.frame
        tag = struct.pack(">Q", seq)
        delivery_id &= 0xFFFFFFFF
        struct.pack_into(">I", frame, self.id_at, delivery_id)
        frame[self.tag_at : self.tag_at + 8] = tag
        struct.pack_into(">Q", frame, self.seq_at, seq)
        return frame, Transfer(
            handle=HANDLE, delivery_id=delivery_id, delivery_tag=tag, message_format=0, settled=False
        )

    def fill(self, received: int, window: int, limit: int) -> None:
        """Queue what may go now: at most ``window`` ahead of the ``received`` count, never past ``limit``."""
        window_left = self.conn.conn.session(0).remote_incoming_window
        budget = min(_link(self.conn).credit, window_left, limit - self.sent, received + window - self.sent)
        if budget <= 0:
            return
        make = self._message
        send = self.conn.conn.send_encoded
        seq = self.sent
        for _ in range(budget):
            send(*make(seq, seq))  # one link on a fresh session: the delivery-id is the sequence number
            seq += 1
        self.sent = seq

    def on_frame(self, frame: Frame) -> None:
        """The broker's outcomes of our transfers (its flows are the core's to book)."""
        disposition = frame.performative
        if isinstance(disposition, Disposition):
            first = disposition.first or 0
            last = first if disposition.last is None else disposition.last
            if isinstance(disposition.state, Accepted):
                self.accepted += last - first + 1
            else:
                self.rejected.append(disposition.state)


class _Consumer:
    """The receiving side: checks each sequence number, accepts in ranges, keeps credit topped up."""

    def __init__(self, conn: RawClient, total: int, size: int, credit: int) -> None:
        self.conn = conn
        self.total = total
        self.size = size
        self.credit_target = credit
        self.received = 0
        self.seen = bytearray(total)
        self.duplicates = 0
        self.out_of_order = 0
        self.malformed = 0
        self.expected = 0
        self.message_size = len(frames.message(AmqpValue(b"\x00" * size)))

    def grant(self) -> None:
        """Queue a flow that sets the link's credit to its target again (session fields from the core)."""
        self.conn.send(self.conn.conn.flow(HANDLE, self.credit_target, outgoing_window=0))

    def on_delivery(self, delivery: Delivery) -> None:
        """A whole message: its sequence number checked (accepted later, with the others of the batch)."""
        self.received += 1
        payload = delivery.payload
        if len(payload) != self.message_size or delivery.frames != 1:
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

    def after_batch(self) -> None:
        """Accept what arrived, in ranges; grant credit again once half of it is used."""
        self.conn.accept_unsettled()
        if _link(self.conn).credit <= self.credit_target // 2 and self.received < self.total:
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
    prod_conn = RawClient(host, port)
    cons_conn = RawClient(host, port)
    producer = _Producer(prod_conn, messages, size)
    consumer = _Consumer(cons_conn, messages, size, credit)
    try:
        prod_conn.open("soak-producer")
        cons_conn.open("soak-consumer", begin=frames.begin(incoming_window=8192))
        cons_conn.attach(frames.attach_receiver(queue, handle=HANDLE))
        consumer.grant()
        cons_conn.flush()
        sender = prod_conn.attach(frames.attach_sender(queue, handle=HANDLE))
        prod_conn.wait(lambda: sender.credit > 0)
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
    violations = prod_conn.conn.violations + cons_conn.conn.violations
    if violations and result.error is None:
        result.error = f"the broker broke the protocol: {violations[:3]}"
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
        record_broker_after(result, probe, sampler, cpu_before)
        result.broker_cpu_us_per_message = round(1e6 * result.broker_cpu_s / max(1, result.received), 1)
        if len(result.checkpoints) == 2:
            warm, end = result.checkpoints
            result.rss["rss_after_warmup_kib"] = warm["rss_kib"]
            result.rss["rss_end_kib"] = end["rss_kib"]
            result.rss["rss_growth_after_warmup_pct"] = round(
                100.0 * (end["rss_kib"] - warm["rss_kib"]) / warm["rss_kib"], 2
            )
            result.allocated_blocks_growth = end["allocated_blocks"] - warm["allocated_blocks"]
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
        self.masks: dict[RawClient, int] = {}

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
                    self._flush()
                    while any(conn.out for conn in self.conns):
                        self._receive(0.01)
                        self._flush()
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
                for frame in conn.receive():
                    delivery = frame.delivery
                    if delivery is not None and delivery.complete:
                        consumer.on_delivery(delivery)
            else:
                for frame in conn.receive():
                    producer.on_frame(frame)
