"""soak's churn scenario: connect/disconnect cycles of five kinds from a few threads (``bench.raw``), then
what the broker has left behind (see ``run_churn``)."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.measures import cpu_seconds, open_fds
from bench.raw import IO_TIMEOUT, RawClient
from bench.soak_figures import BrokerFigures, Probe, RssSampler, record_broker_after
from minibroker.amqp.definitions import Accepted, Attach, Flow, Transfer
from minibroker.amqp.framing import AMQP_HEADER
from minibroker.testing import frames

CHURN_KINDS = ("clean", "sasl", "messaging", "abrupt", "half-open")


def churn_cycle(host: str, port: int, index: int, queue: str) -> None:
    """One connect/disconnect cycle of kind ``CHURN_KINDS[index % 5]``; raises if the broker misbehaves."""
    kind = CHURN_KINDS[index % len(CHURN_KINDS)]
    conn = RawClient(host, port)
    try:
        if kind == "half-open":
            if index % 2:
                conn.conn.send_header(AMQP_HEADER[:5])  # part of a protocol header, then gone
                conn.flush()
            return
        if kind in ("clean", "sasl"):
            conn.open(f"churn-{index}", sasl="ANONYMOUS" if kind == "sasl" else None)
            conn.close()
            return
        conn.open(f"churn-{index}")
        if kind == "abrupt":
            # a receiver with credit may take messages of the queue; dropping the socket must release them
            conn.send(frames.attach_receiver(queue, handle=0))
            conn.send(conn.conn.flow(0, 5))
            conn.expect(Attach)
            if index % 2:
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST
            return
        # messaging: one message in through a sender, one out through a receiver, accepted
        conn.send(frames.attach_sender(queue, handle=0))
        conn.send(frames.attach_receiver(queue, handle=1))
        conn.expect(Flow)  # the broker's credit for our sender
        conn.send(frames.transfer(0, 0, settled=True), payload=frames.message(f"churn {index}"))
        conn.send(conn.conn.flow(1, 1))
        transfer = conn.expect(Transfer)
        conn.send(frames.disposition(transfer.delivery_id, state=Accepted()))
        conn.close()
    finally:
        conn.sock.close()


@dataclass(kw_only=True)
class ChurnResult(BrokerFigures):
    """Figures of one churn run."""

    cycles: int
    workers: int
    completed: int = 0
    failures: int = 0
    first_failures: list[str] = field(default_factory=list)
    cycles_per_s: float = 0.0
    fds_before: tuple[int, int] = (0, 0)
    fds_after: tuple[int, int] = (0, 0)

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
        record_broker_after(result, probe, sampler, cpu_before)
        result.fds_after = open_fds(probe.pid)
    return result
