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
from bench.raw import BrokerClosed, Encoded, RawClient, encode_transfer
from minibroker.amqp import fastpath
from minibroker.amqp.definitions import (
    Accepted,
    AmqpValue,
    Coordinator,
    Declare,
    Declared,
    Discharge,
    Disposition,
    TransactionalState,
)
from minibroker.amqp.framing import AMQP_FRAME, FRAME_HEADER
from minibroker.amqp.types import Symbol, UInt
from minibroker.testing import frames
from minibroker.testing.client import Frame, Link

WINDOW = 1 << 20
"""Our session's incoming and outgoing windows."""


class PerfClient(RawClient):
    """A ``RawClient`` with one session (channel 0) that times and tallies the broker's dispositions of the
    deliveries it sent: settled ids, how many accepted, the txn-id of each declare, send -> outcome latencies."""

    window = WINDOW
    """Our session's incoming and outgoing windows."""

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
            begin=frames.begin(incoming_window=self.window, outgoing_window=self.window),
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
        self.send(self.conn.flow(link.handle, credit, outgoing_window=self.window))

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


_PENDING = object()
"""``TxnClient.outcomes``' value for a delivery the broker has not settled yet."""


class TxnClient(PerfClient):
    """A ``PerfClient`` that writes what python-qpid-proton writes for a transaction (``bench.proton_wire``):
    proton's session windows and delivery-tags, its coordinator attached after the link the transactions use
    (proton attaches it at the first declare), declares and discharges as ``Transaction`` sends them; each
    delivery it sent is remembered with the state the broker settled it with (``outcomes``)."""

    window = proton_wire.WINDOW

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.controller: Link | None = None
        self.tags: dict[int, int] = {}
        """Handle -> the last delivery-tag proton's ``Link.delivery_tag`` gave (counted from 1)."""
        self.outcomes: dict[int, Any] = {}
        """Delivery id of a transfer we sent -> the state the broker settled it with (``_PENDING`` until then)."""

    def on_frame(self, frame: Frame) -> None:
        super().on_frame(frame)
        disposition = frame.performative
        if isinstance(disposition, Disposition) and disposition.role and disposition.settled:
            first = int(disposition.first or 0)
            last = first if disposition.last is None else int(disposition.last)
            outcomes = self.outcomes  # (the deliveries in flight: a transaction's)
            for delivery_id in [d for d, state in outcomes.items() if state is _PENDING and first <= d <= last]:
                outcomes[delivery_id] = disposition.state

    def tag(self, link: Link) -> bytes:
        """``link``'s next delivery-tag as proton gives it: "1", "2", ... per link."""
        self.tags[link.handle] = self.tags.get(link.handle, 0) + 1
        return str(self.tags[link.handle]).encode()

    def attach_controller(self) -> None:
        """Attach the coordinator link (``controller``), as proton does at the first declare."""
        coordinator = Coordinator(capabilities=[Symbol("amqp:local-transactions")])
        self.controller = self.attach_sender(None, "bench-raw-coordinator", target=coordinator)

    def post(self, link: Link, payload: bytes, txn_id: bytes | None = None) -> int:
        """Queue a transfer of ``payload`` on ``link`` (in ``txn_id``'s transaction when given); its delivery id."""
        delivery_id = self.conn.next_delivery_id()
        tag = self.tag(link)
        if txn_id is None:
            self.queue_frame(proton_wire.transfer(link.handle, delivery_id, tag, payload))
        else:
            self.queue_frame(proton_wire.txn_post(link.handle, delivery_id, txn_id, payload, tag=tag))
        self.outcomes[delivery_id] = _PENDING
        return delivery_id

    def settle_state(self, delivery_id: int) -> Any:
        """Write what is queued, wait until the broker settled ``delivery_id``; the state it settled it with."""
        self.wait(lambda: self.outcomes[delivery_id] is not _PENDING)
        return self.outcomes.pop(delivery_id)

    def declare(self) -> bytes:
        """Declare a transaction; its txn-id, once the broker answered."""
        assert self.controller is not None
        state = self.settle_state(self.post(self.controller, proton_wire.declare()))
        if not isinstance(state, Declared):
            raise RuntimeError(f"declare failed: {state!r}")
        txn_id: bytes = state.txn_id
        return txn_id

    def discharge(self, txn_id: bytes) -> None:
        """Write what is queued and the discharge (commit) of ``txn_id`` in one write; wait for its outcome, which
        must be ``accepted``."""
        assert self.controller is not None
        state = self.settle_state(self.post(self.controller, proton_wire.discharge(txn_id)))
        if not isinstance(state, Accepted):
            raise RuntimeError(f"commit failed: the discharge was answered {state!r}")

    def queue_frame(self, body: bytes) -> None:
        """Queue a frame whose body is encoded already (written by the next flush), booked as what it carries."""
        performative, _ = fastpath.decode_performative(body)
        self.conn.send_encoded(FRAME_HEADER.pack(8 + len(body), 2, AMQP_FRAME, 0) + body, performative)

    def flow(self, link: Link, credit: int) -> None:
        """Queue proton's ``Receiver.flow(credit)``."""
        session = self.conn.session(0)
        body = proton_wire.flow(
            session.next_incoming_id, session.next_outgoing_id, link.handle, link.delivery_count, credit
        )
        self.queue_frame(body)


def raw_txn(opts: ClientOptions, per: int) -> dict[str, Any]:
    """Transactions of ``per`` messages each, one after the other, as python-qpid-proton's ``Transaction.send``
    runs them (``perf_proton.TxnSend``): declare and wait for the txn-id, then the ``per`` unsettled
    transactional posts and the discharge in one write (the posts as far as credit goes: the rest once the broker
    grants more), then wait for every answer: each post and the commit must be accepted. Latency: declare sent
    -> commit accepted."""
    with contextlib.closing(TxnClient(opts.url)) as client:  # (closed also when a commit fails)
        return _raw_txn(client, opts, per)


def _raw_txn(client: TxnClient, opts: ClientOptions, per: int) -> dict[str, Any]:
    link = client.attach_sender(opts.address, "bench-raw-txn-sender")
    client.attach_controller()
    transactions = max(1, opts.count // per)
    meter = Meter(opts.pid)
    meter.start()
    deadline = time.perf_counter() + opts.time_limit
    done = 0
    while done < transactions and time.perf_counter() < deadline:
        started = time.perf_counter()
        txn_id = client.declare()
        posts = []
        while len(posts) < per:
            client.wait(lambda: link.credit > 0)
            posts += [client.post(link, ENCODED, txn_id) for _ in range(min(link.credit, per - len(posts)))]
        client.discharge(txn_id)
        for delivery_id in posts:  # (each post is answered before the commit is)
            state = client.outcomes.pop(delivery_id)
            if not (isinstance(state, TransactionalState) and isinstance(state.outcome, Accepted)):
                raise RuntimeError(f"a transactional post was answered {state!r}, not accepted, before the commit")
        meter.latencies_ms.append((time.perf_counter() - started) * 1000)
        done += 1
    return meter.stop(done * per, timed_out=done < transactions, transactions=done)


def raw_txn_accept(opts: ClientOptions, per: int) -> dict[str, Any]:
    """As python-qpid-proton's ``perf_proton.TxnAccept`` (a transaction declared with settle_before_discharge):
    declare, flow ``per`` credit, then read as proton reads (``proton_wire.READ_SIZE`` at a time) and after each
    read accept (settled) in the transaction each delivery it completed, in one write; the last accepts and the
    discharge in one write; the next declare once the commit is accepted. The queue must hold what is asked."""
    with contextlib.closing(TxnClient(opts.url)) as client:
        return _raw_txn_accept(client, opts, per)


def _raw_txn_accept(client: TxnClient, opts: ClientOptions, per: int) -> dict[str, Any]:
    link = client.attach_receiver(opts.address, "bench-raw-txn-receiver", 0)
    client.attach_controller()
    unsettled = client.conn.session(0).unsettled
    reader = client.conn.reader
    meter = Meter(opts.pid)
    meter.start()
    deadline = time.perf_counter() + opts.time_limit
    received = transactions = 0
    while received < opts.count and time.perf_counter() < deadline:
        started = time.perf_counter()
        txn_id = client.declare()
        want = min(per, opts.count - received)
        client.flow(link, want)
        client.flush()
        taken = 0
        timeout = time.monotonic() + client.timeout
        while True:
            client.receive(0.2, size=max(1, proton_wire.READ_SIZE - len(reader)))
            for delivery_id in list(unsettled):  # (each accept settles it: gone from ``unsettled``)
                client.queue_frame(proton_wire.txn_accept(delivery_id, txn_id, settled=True))
                taken += 1
            if taken >= want:
                break
            if time.monotonic() > timeout:
                raise TimeoutError(f"{taken} of the {want} deliveries asked for came in {client.timeout} s")
            client.flush()
        client.discharge(txn_id)
        meter.latencies_ms.append((time.perf_counter() - started) * 1000)
        received += taken
        transactions += 1
    return meter.stop(received, timed_out=received < opts.count, transactions=transactions)
