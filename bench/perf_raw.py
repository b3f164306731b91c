"""perf's scenarios with ``bench.raw.RawClient``: pre-encoded frames pipelined up to the broker's credit, so
the client costs a few µs per message and the broker is the bottleneck.

The raw transaction scenarios (``raw_txn``, ``raw_txn_accept``) write the very octets python-qpid-proton writes
for a transaction (``bench.proton_wire``), in the same pieces (a declare; then the posts and the discharge, or the
accepts and the discharge, in one write), so the broker does the work it does for proton's ``txn_*`` scenarios
while the client, a few µs per frame instead of proton's hundreds, does not take the machine from it (issue 19:
the broker's CPU measured "with a client that is not the bottleneck")."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from functools import partial
from typing import Any

from bench import proton_wire
from bench.measures import percentile
from bench.perf_scenarios import ENCODED, ClientOptions, Meter
from bench.raw import BrokerClosed, Encoded, RawClient, encode_transfer, runs
from minibroker.amqp import codec
from minibroker.amqp.definitions import Accepted, AmqpValue, Coordinator, Declare, Declared, Discharge, Disposition
from minibroker.amqp.framing import AMQP_FRAME, FRAME_HEADER
from minibroker.amqp.types import Symbol, UInt
from minibroker.testing import frames
from minibroker.testing.client import Frame, Link

WINDOW = 1 << 20
"""Our session's incoming and outgoing windows."""


class PerfClient(RawClient):
    """A ``RawClient`` with one session (channel 0) that times and tallies the broker's dispositions of the
    deliveries it sent: settled ids, how many accepted, the txn-id of each declare, send -> outcome latencies."""

    def __init__(self, url: str) -> None:
        host, _, port = url.rpartition(":")
        super().__init__(host or "127.0.0.1", int(port))
        self.sent_at: dict[int, float] = {}
        self.latencies_ms: list[float] = []
        self.settled_ids: set[int] = set()
        self.accepted = 0
        self.declared: dict[int, Any] = {}
        """Delivery id of a declare -> its txn-id."""
        self.open(
            f"bench-raw-{os.getpid()}",
            sasl="ANONYMOUS",
            begin=frames.begin(incoming_window=WINDOW, outgoing_window=WINDOW),
            max_frame_size=UInt(65536),
        )

    def close(self) -> None:
        """Close (the broker's close awaited) without failing the scenario: its figures are taken already."""
        with contextlib.suppress(OSError, BrokerClosed):
            super().close()

    def on_streamed(self, batch: Sequence[Encoded]) -> None:
        now = time.perf_counter()
        sent_at = self.sent_at
        for item in batch:
            sent_at[int(item.transfer.delivery_id or 0)] = now

    def on_frame(self, frame: Frame) -> None:
        disposition = frame.performative
        if not isinstance(disposition, Disposition) or not disposition.role:
            return  # (the broker as sender settling what it sent us: another sequence of delivery ids)
        first = int(disposition.first or 0)
        last = first if disposition.last is None else int(disposition.last)
        now = time.perf_counter()
        accepted = isinstance(disposition.state, Accepted)
        if isinstance(disposition.state, Declared):
            self.declared[first] = disposition.state.txn_id
        for delivery_id in range(first, last + 1):
            sent = self.sent_at.pop(delivery_id, None)
            if sent is not None:
                self.latencies_ms.append((now - sent) * 1000)
            if disposition.settled:
                self.settled_ids.add(delivery_id)
            if accepted:
                self.accepted += 1

    def attach_sender(self, address: str | None, name: str, **fields: Any) -> Link:
        """A sender link, once the broker granted it credit."""
        link = self.attach(frames.attach_sender(address, len(self.conn.session(0).links), name, **fields))
        self.wait(lambda: link.credit > 0)
        return link

    def attach_receiver(self, address: str, name: str, credit: int) -> Link:
        """A receiver link (unsettled deliveries, settled first by us), ``credit`` granted."""
        handle = len(self.conn.session(0).links)
        link = self.attach(
            frames.attach_receiver(address, handle, name, snd_settle_mode=UInt(0), rcv_settle_mode=UInt(0))
        )
        self.grant(link, credit)
        self.flush()
        return link

    def grant(self, link: Link, credit: int) -> None:
        """Queue a flow granting ``link`` ``credit``, the session fields as the core knows them."""
        self.send(self.conn.flow(link.handle, credit, outgoing_window=WINDOW))

    def transfer(self, link: Link, payload: bytes, *, settled: bool, offset: int = 0) -> Encoded:
        """A pre-encoded transfer on ``link`` with the delivery id ``offset`` past the session's next one."""
        return encode_transfer(link.handle, self.conn.next_delivery_id() + offset, payload, settled=settled)


def raw_send(opts: ClientOptions, *, presettled: bool) -> dict[str, Any]:
    """Pre-settled (the last transfer unsettled, as a barrier) or confirmed sends over one link."""
    client = PerfClient(opts.url)
    link = client.attach_sender(opts.address, "bench-raw-sender", snd_settle_mode=UInt(2))
    payload = ENCODED
    count = opts.count
    encoded = [client.transfer(link, payload, settled=presettled and i < count - 1, offset=i) for i in range(count)]
    meter = Meter(opts.pid)
    meter.start()
    deadline = time.perf_counter() + opts.time_limit
    sent = client.stream(link, encoded, lambda: time.perf_counter() > deadline)
    if sent < count and presettled:  # time limit: one more, unsettled, as the barrier
        sent += client.stream(link, [client.transfer(link, payload, settled=False)])
    last = int(encoded[0].transfer.delivery_id or 0) + sent - 1
    if presettled:
        client.wait(lambda: last in client.settled_ids, timeout=60)
    else:
        client.wait(lambda: client.accepted >= sent, timeout=60)
        meter.latencies_ms = client.latencies_ms
    result = meter.stop(sent, timed_out=sent < count)
    client.close()
    return result


def raw_consume(opts: ClientOptions, *, credit: int = 1000, batch: int = 100) -> dict[str, Any]:
    """Consume ``count`` messages, accepting (settled) in ranges of up to ``batch`` delivery ids,
    keeping ``credit`` outstanding; then a sync message on a second link as the barrier."""
    client = PerfClient(opts.url)
    sync = client.attach_sender(opts.sync_address, "bench-raw-sync", snd_settle_mode=UInt(2))
    meter = Meter(opts.pid)
    meter.start()
    link = client.attach_receiver(opts.address, "bench-raw-receiver", min(credit, opts.count))
    deadline = time.perf_counter() + opts.time_limit
    received = 0
    target = opts.count
    while received < target:
        client.pump(0.5)
        accepted = client.accept_unsettled(limit=batch)
        if not accepted:
            if time.perf_counter() > deadline:
                break
            continue
        received += accepted
        if time.perf_counter() > deadline:
            target = received
        remaining = target - received
        if remaining > 0:
            client.grant(link, min(credit, remaining))
        client.flush()
    barrier = client.transfer(sync, ENCODED, settled=False)
    client.stream(sync, [barrier])
    client.wait(lambda: barrier.transfer.delivery_id in client.settled_ids, timeout=60)
    result = meter.stop(received, timed_out=received < opts.count)
    client.close()
    return result


def raw_txn_roundtrip(opts: ClientOptions) -> dict[str, Any]:
    """Empty transactions on a coordinator link: declare, wait for declared, discharge, wait for accepted;
    one after the other. Latency: declare sent -> discharge settled (two round trips)."""
    client = PerfClient(opts.url)
    coordinator = Coordinator(capabilities=[Symbol("amqp:local-transactions")])
    link = client.attach_sender(None, "bench-raw-coordinator", target=coordinator)
    declared = client.declared
    declare = frames.message(AmqpValue(Declare()))
    meter = Meter(opts.pid)
    declare_ms: list[float] = []
    discharge_ms: list[float] = []
    meter.start()
    deadline = time.perf_counter() + opts.time_limit
    done = 0
    while done < opts.count and time.perf_counter() < deadline:
        first = client.conn.next_delivery_id()
        t0 = time.perf_counter()
        client.stream(link, [client.transfer(link, declare, settled=False)])
        client.wait(partial(dict.__contains__, declared, first))
        t1 = time.perf_counter()
        second = client.conn.next_delivery_id()
        discharge = frames.message(AmqpValue(Discharge(txn_id=declared.pop(first), fail=False)))
        client.stream(link, [client.transfer(link, discharge, settled=False)])
        client.wait(partial(set.__contains__, client.settled_ids, second))
        t2 = time.perf_counter()
        declare_ms.append((t1 - t0) * 1000)
        discharge_ms.append((t2 - t1) * 1000)
        meter.latencies_ms.append((t2 - t0) * 1000)
        done += 1
    result = meter.stop(done, timed_out=done < opts.count, declare_p50_ms=percentile(declare_ms, 0.5),
                        discharge_p50_ms=percentile(discharge_ms, 0.5))  # fmt: skip
    client.close()
    return result


class TxnClient(PerfClient):
    """A ``PerfClient`` with a coordinator link that declares and discharges as python-qpid-proton does."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        coordinator = Coordinator(capabilities=[Symbol("amqp:local-transactions")])
        self.controller = self.attach_sender(None, "bench-raw-coordinator", target=coordinator)

    def declare(self) -> bytes:
        """Declare a transaction; its txn-id, once the broker answered."""
        first = self.conn.next_delivery_id()
        self.stream(self.controller, [self.transfer(self.controller, proton_wire.declare(), settled=False)])
        self.wait(partial(dict.__contains__, self.declared, first))
        txn_id: bytes = self.declared.pop(first)
        return txn_id

    def discharge(self, txn_id: bytes) -> None:
        """Write what is queued and the discharge (commit) of ``txn_id`` in one write; wait for its outcome, which
        must be ``accepted``."""
        delivery_id = self.conn.next_delivery_id()
        accepted = self.accepted
        self.stream(self.controller, [self.transfer(self.controller, proton_wire.discharge(txn_id), settled=False)])
        self.wait(partial(set.__contains__, self.settled_ids, delivery_id))
        if self.accepted == accepted:
            raise RuntimeError("commit failed: the discharge was not accepted")

    def queue_frame(self, body: bytes) -> None:
        """Queue a frame whose body is encoded already (written by the next flush), booked as what it carries."""
        performative, _ = codec.decode(body)
        self.conn.send_encoded(FRAME_HEADER.pack(8 + len(body), 2, AMQP_FRAME, 0) + body, performative)


def raw_txn(opts: ClientOptions, per: int) -> dict[str, Any]:
    """Transactions of ``per`` messages each, one after the other, as python-qpid-proton's ``Transaction.send``
    runs them: declare and wait for the txn-id, then the ``per`` unsettled transactional posts and the discharge
    in one write, then wait for every answer. Latency: declare sent -> commit accepted."""
    with contextlib.closing(TxnClient(opts.url)) as client:  # (closed also when a commit fails)
        return _raw_txn(client, opts, per)


def _raw_txn(client: TxnClient, opts: ClientOptions, per: int) -> dict[str, Any]:
    link = client.attach_sender(opts.address, "bench-raw-txn-sender")
    settled = client.settled_ids
    transactions = max(1, opts.count // per)
    meter = Meter(opts.pid)
    meter.start()
    deadline = time.perf_counter() + opts.time_limit
    done = 0
    while done < transactions and time.perf_counter() < deadline:
        started = time.perf_counter()
        txn_id = client.declare()
        client.wait(lambda: link.credit >= per)
        first = client.conn.next_delivery_id()
        for delivery_id in range(first, first + per):
            client.queue_frame(proton_wire.txn_post(link.handle, delivery_id, txn_id, ENCODED))
        client.discharge(txn_id)
        if not settled.issuperset(range(first, first + per)):  # (each post is answered before the commit is)
            raise RuntimeError("a transactional post was not answered before its transaction's commit")
        meter.latencies_ms.append((time.perf_counter() - started) * 1000)
        done += 1
    return meter.stop(done * per, timed_out=done < transactions, transactions=done)


def raw_txn_accept(opts: ClientOptions, per: int) -> dict[str, Any]:
    """As python-qpid-proton's tx_recv: declare, grant ``per`` credit, accept each delivery in the transaction
    (a disposition each, unsettled), and with the last accept the discharge in one write; once committed, settle
    them in one ranged disposition; then a synchronous message on a second link as the barrier."""
    with contextlib.closing(TxnClient(opts.url)) as client:
        return _raw_txn_accept(client, opts, per)


def _raw_txn_accept(client: TxnClient, opts: ClientOptions, per: int) -> dict[str, Any]:
    sync = client.attach_sender(opts.sync_address, "bench-raw-sync", snd_settle_mode=UInt(2))
    link = client.attach_receiver(opts.address, "bench-raw-txn-receiver", 0)
    unsettled = client.conn.session(0).unsettled
    meter = Meter(opts.pid)
    meter.start()
    deadline = time.perf_counter() + opts.time_limit
    received = transactions = 0
    while received < opts.count and time.perf_counter() < deadline:
        started = time.perf_counter()
        txn_id = client.declare()
        want = min(per, opts.count - received)
        client.grant(link, want)
        client.wait(lambda want=want: len(unsettled) >= want)
        ids = list(unsettled)
        for delivery_id in ids:
            client.queue_frame(proton_wire.txn_accept(delivery_id, txn_id))
        client.discharge(txn_id)
        for first, last in runs(ids):
            client.send(frames.disposition(first, last if last != first else None))
        meter.latencies_ms.append((time.perf_counter() - started) * 1000)
        received += len(ids)
        transactions += 1
    barrier = client.transfer(sync, ENCODED, settled=False)
    client.stream(sync, [barrier])
    client.wait(lambda: barrier.transfer.delivery_id in client.settled_ids, timeout=60)
    return meter.stop(received, timed_out=received < opts.count, transactions=transactions)
