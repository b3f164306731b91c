"""perf's scenarios with ``bench.raw.RawClient``: pre-encoded frames pipelined up to the broker's credit, so
the client costs a few µs per message and the broker is the bottleneck."""

from __future__ import annotations

import time
from functools import partial
from typing import Any

from bench.measures import percentile
from bench.perf_scenarios import ENCODED, ClientOptions, Meter
from bench.raw import RawClient
from minibroker.amqp.definitions import Accepted, AmqpValue, Declare, Discharge
from minibroker.testing import frames


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
    link = client.attach_coordinator("bench-raw-coordinator")
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
