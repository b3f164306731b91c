"""AMQP 0-9-1 beside AMQP 1.0 on one broker: publisher confirms against unsettled sends, channel transactions
against 1.0 transactions, consume with basic.ack against receive with accept.

    python -m bench.amqp091 [--count 5000] [--runs 3] [--url HOST:PORT [--pid PID]] [--json out.json]

Both clients are raw sockets with pre-encoded frames (``bench.raw091.Raw091Client``, ``bench.perf_raw.PerfClient``),
so the broker, one process (``--pid`` for its CPU time), is the bottleneck. Each run goes through every pair of
scenarios, the two protocols one after the other (their order swapped every run), so both share the machine's
noise; the table shows the medians over the runs and the ratio 0-9-1 / 1.0. 256-byte bodies; the 0-9-1 messages
go through the default exchange to a queue declared with queue.declare, the 1.0 ones to a queue the attach
creates. The consume pair drains what that run's sends and transactions left on each protocol's queue.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from bench.broker_process import BrokerProcess
from bench.perf_raw import PerfClient, raw_consume
from bench.perf_scenarios import BODY, ENCODED, ClientOptions, Meter
from bench.raw import Encoded
from bench.raw091 import ConfirmTally, Raw091Client
from minibroker.amqp import fastpath
from minibroker.amqp.definitions import AmqpValue, Coordinator, Declare, Discharge, TransactionalState
from minibroker.amqp.framing import AMQP_FRAME, FRAME_HEADER
from minibroker.amqp.types import Symbol, UInt
from minibroker.amqp091.definitions import (
    BasicAck,
    BasicCancel,
    BasicCancelOk,
    BasicConsume,
    BasicConsumeOk,
    BasicDeliver,
    BasicNack,
    BasicProperties,
    BasicPublish,
    BasicQos,
    BasicQosOk,
    ConfirmSelect,
    ConfirmSelectOk,
    QueueDeclare,
    QueueDeclareOk,
    TxCommit,
    TxCommitOk,
    TxSelect,
    TxSelectOk,
)
from minibroker.amqp091.frames import Frame, MethodFrame, encode_content, encode_method_frame
from minibroker.testing import frames

CHANNEL = 1
ACK_BATCH = 100  # consumers acknowledge (accept) in ranges of this many deliveries
PREFETCH = 1000  # basic.qos prefetch-count, the 1.0 receiver's credit


@dataclass(frozen=True)
class Pair:
    """One row of the table: a 0-9-1 scenario and its 1.0 counterpart, both ``(client options) -> figures``."""

    name: str
    title: str
    amqp091: Callable[[ClientOptions], dict[str, Any]]
    amqp10: Callable[[ClientOptions], dict[str, Any]]
    scale: float = 1.0  # messages = scale * --count


# -- AMQP 0-9-1 ------------------------------------------------------------------------------------------------
class Client091(Raw091Client):
    """Tallies what the broker answers on ``CHANNEL``: confirms (acks, nacks), commit-oks and deliveries."""

    def __init__(self, url: str) -> None:
        host, _, port = url.rpartition(":")
        super().__init__(host or "127.0.0.1", int(port))
        self.confirms = ConfirmTally()
        self.nacked = 0
        self.commits = 0
        self.delivered = 0
        self.last_tag = 0
        self.open_channel(CHANNEL)

    @property
    def confirmed(self) -> int:
        return self.confirms.count

    def on_frame(self, frame: Frame) -> None:
        if type(frame) is not MethodFrame:
            return
        method = frame.method
        if type(method) is BasicDeliver:
            self.delivered += 1
            self.last_tag = method.delivery_tag
        elif type(method) is BasicAck or type(method) is BasicNack:
            self.confirms.add(method.delivery_tag, multiple=method.multiple)
            self.nacked += type(method) is BasicNack
        elif type(method) is TxCommitOk:
            self.commits += 1

    def wait_commits(self, count: int) -> None:
        self.wait(lambda: self.commits >= count)

    def declare(self, queue: str) -> None:
        self.call(CHANNEL, QueueDeclare(queue=queue), QueueDeclareOk)

    def publish_frames(self, queue: str) -> bytes:
        """One pre-encoded publish (method, header and body frames) of ``BODY`` to ``queue``."""
        return encode_content(CHANNEL, BasicPublish(routing_key=queue), BasicProperties(), BODY, self.frame_max)


def confirm_091(window: int) -> Callable[[ClientOptions], dict[str, Any]]:
    def run(opts: ClientOptions) -> dict[str, Any]:
        """Publisher confirms with at most ``window`` publishes unconfirmed."""
        client = Client091(opts.url)
        client.declare(opts.address)
        client.call(CHANNEL, ConfirmSelect(), ConfirmSelectOk)
        publish = client.publish_frames(opts.address)
        meter = Meter(opts.pid)
        meter.start()
        deadline = time.perf_counter() + opts.time_limit
        sent = 0
        count = opts.count
        while client.confirmed < count:
            n = min(window - (sent - client.confirmed), count - sent)
            if n > 0 and time.perf_counter() < deadline:
                client.out += publish * n
                sent += n
            elif sent == client.confirmed:
                break  # the time limit
            else:
                client.pump(1.0)
        result = meter.stop(sent, timed_out=sent < count, nacked=client.nacked)
        client.close()
        return result

    return run


def tx_091(size: int) -> Callable[[ClientOptions], dict[str, Any]]:
    def run(opts: ClientOptions) -> dict[str, Any]:
        """``size`` publishes then tx.commit, one transaction after the other (the next one starts at once)."""
        client = Client091(opts.url)
        client.declare(opts.address)
        client.call(CHANNEL, TxSelect(), TxSelectOk)
        batch = client.publish_frames(opts.address) * size + encode_method_frame(CHANNEL, TxCommit())
        meter = Meter(opts.pid)
        meter.start()
        deadline = time.perf_counter() + opts.time_limit
        txns = max(1, opts.count // size)
        done = 0
        while done < txns and time.perf_counter() < deadline:
            client.out += batch
            client.wait_commits(done + 1)
            done += 1
        result = meter.stop(done * size, timed_out=done < txns, txns=done)
        client.close()
        return result

    return run


def consume_091(opts: ClientOptions) -> dict[str, Any]:
    """basic.consume with prefetch ``PREFETCH``, basic.ack multiple every ``ACK_BATCH`` deliveries; basic.cancel
    (answered after the acks before it) ends it."""
    client = Client091(opts.url)
    client.call(CHANNEL, BasicQos(prefetch_count=PREFETCH), BasicQosOk)
    meter = Meter(opts.pid)
    meter.start()
    consumer = client.call(CHANNEL, BasicConsume(queue=opts.address, consumer_tag="bench"), BasicConsumeOk)
    deadline = time.perf_counter() + opts.time_limit
    acked = 0
    while client.delivered < opts.count and time.perf_counter() < deadline:
        client.pump(1.0)
        if client.delivered - acked >= ACK_BATCH or client.delivered >= opts.count:
            client.send(CHANNEL, BasicAck(delivery_tag=client.last_tag, multiple=True))
            acked = client.delivered
    if client.delivered > acked:
        client.send(CHANNEL, BasicAck(delivery_tag=client.last_tag, multiple=True))
    client.call(CHANNEL, BasicCancel(consumer_tag=consumer.consumer_tag), BasicCancelOk)
    result = meter.stop(client.delivered, timed_out=client.delivered < opts.count)
    client.close()
    return result


# -- AMQP 1.0 -------------------------------------------------------------------------------------------------
def confirm_10(window: int) -> Callable[[ClientOptions], dict[str, Any]]:
    def run(opts: ClientOptions) -> dict[str, Any]:
        """Unsettled sends with at most ``window`` of them unsettled (and as the broker's credit allows)."""
        client = PerfClient(opts.url)
        link = client.attach_sender(opts.address, "bench-091-sender")
        count = opts.count
        encoded = [client.transfer(link, ENCODED, settled=False, offset=i) for i in range(count)]
        meter = Meter(opts.pid)
        meter.start()
        deadline = time.perf_counter() + opts.time_limit
        sent = 0
        while client.accepted < count:
            n = min(window - (sent - client.accepted), count - sent)
            if n > 0 and time.perf_counter() < deadline:
                sent += client.stream(link, encoded[sent : sent + n])
            elif sent == client.accepted:
                break  # the time limit
            else:  # (``stream`` may have read every outcome already)
                client.pump(1.0)
        result = meter.stop(sent, timed_out=sent < count)
        client.close()
        return result

    return run


def txn_transfer(link_handle: int, delivery_id: int, txn_id: Any) -> Encoded:
    """An unsettled transfer of ``ENCODED`` in transaction ``txn_id`` (§4.4.2: its state is transactional)."""
    tag = delivery_id.to_bytes(4, "big")
    state = TransactionalState(txn_id=txn_id)
    performative = fastpath.encode_transfer(link_handle, delivery_id, tag, 0, False, False, state)
    data = FRAME_HEADER.pack(8 + len(performative) + len(ENCODED), 2, AMQP_FRAME, 0) + performative + ENCODED
    return Encoded(data, fastpath.decode_transfer(performative)[0])


def tx_10(size: int) -> Callable[[ClientOptions], dict[str, Any]]:
    def run(opts: ClientOptions) -> dict[str, Any]:
        """Declare, ``size`` transactional transfers, discharge: the declare and the discharge awaited."""
        client = PerfClient(opts.url)
        coordinator = Coordinator(capabilities=[Symbol("amqp:local-transactions")])
        control = client.attach_sender(None, "bench-091-coordinator", target=coordinator)
        link = client.attach_sender(opts.address, "bench-091-txn-sender", snd_settle_mode=UInt(0))
        declare = frames.message(AmqpValue(Declare()))
        meter = Meter(opts.pid)
        meter.start()
        deadline = time.perf_counter() + opts.time_limit
        txns = max(1, opts.count // size)
        done = 0
        while done < txns and time.perf_counter() < deadline:
            first = client.conn.next_delivery_id()
            client.stream(control, [client.transfer(control, declare, settled=False)])
            client.wait(partial(dict.__contains__, client.declared, first))
            txn_id = client.declared.pop(first)
            start = client.conn.next_delivery_id()
            client.stream(link, [txn_transfer(link.handle, start + i, txn_id) for i in range(size)])
            last = client.conn.next_delivery_id()
            discharge = frames.message(AmqpValue(Discharge(txn_id=txn_id, fail=False)))
            client.stream(control, [client.transfer(control, discharge, settled=False)])
            client.wait(partial(set.__contains__, client.settled_ids, last))
            done += 1
        result = meter.stop(done * size, timed_out=done < txns, txns=done)
        client.close()
        return result

    return run


# -- the runs ---------------------------------------------------------------------------------------------------
PAIRS = [
    Pair("confirm_100", "confirms, window 100 / unsettled, window 100", confirm_091(100), confirm_10(100)),
    Pair("confirm_1000", "confirms, window 1000 / unsettled, window 1000", confirm_091(1000), confirm_10(1000)),
    Pair("tx_1", "tx: 1 publish per commit / 1.0 txn of 1", tx_091(1), tx_10(1), scale=0.1),
    Pair("tx_10", "tx: 10 publishes per commit / 1.0 txn of 10", tx_091(10), tx_10(10), scale=0.5),
    Pair("tx_100", "tx: 100 publishes per commit / 1.0 txn of 100", tx_091(100), tx_10(100)),
    Pair("consume", "consume, basic.ack / receive, accept", consume_091, raw_consume),
]
CONSUME = "consume"
PROTOCOLS = ("amqp091", "amqp10")


def run_once(url: str, pid: int | None, count: int, time_limit: float, run: int) -> dict[str, dict[str, Any]]:
    """Every pair once, on queues of their own per protocol (``bench.amqp091.<pid>.<run>.<protocol>``); the
    consume pair drains what the others left there. ``{pair: {protocol: figures}}``."""
    queues = {p: f"bench.amqp091.{os.getpid()}.{run}.{p}" for p in PROTOCOLS}
    left = dict.fromkeys(PROTOCOLS, 0)
    order = PROTOCOLS if run % 2 == 0 else PROTOCOLS[::-1]
    results: dict[str, dict[str, Any]] = {}
    for pair in PAIRS:
        results[pair.name] = {}
        for protocol in order:
            n = left[protocol] if pair.name == CONSUME else max(1, int(count * pair.scale))
            opts = ClientOptions(url, queues[protocol], n, time_limit, pid, sync_address=queues[protocol] + ".sync")
            try:
                figures = getattr(pair, protocol)(opts)
            except Exception as exc:  # reported in the table, the others go on
                figures = {"error": f"{type(exc).__name__}: {exc}"}
            results[pair.name][protocol] = figures
            if pair.name != CONSUME:
                left[protocol] += figures.get("count", 0)
            else:
                figures["expected"] = n
    return results


def rate(figures: dict[str, Any]) -> float | None:
    if "error" in figures or not figures.get("count") or not figures.get("elapsed_s"):
        return None
    return float(figures["count"] / figures["elapsed_s"])


def broker_us(figures: dict[str, Any]) -> float | None:
    if "error" in figures or not figures.get("count") or figures.get("broker_cpu_s") is None:
        return None
    return float(figures["broker_cpu_s"] / figures["count"] * 1e6)


def median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarize(runs: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, float | None]]:
    """Per pair, the medians over the runs of each protocol's msg/s and broker µs per message, and the ratios
    0-9-1 / 1.0 of those medians."""
    summary: dict[str, dict[str, float | None]] = {}
    for pair in PAIRS:
        row: dict[str, float | None] = {}
        for protocol in PROTOCOLS:
            row[f"{protocol}_msg_s"] = median([rate(r[pair.name][protocol]) for r in runs])
            row[f"{protocol}_broker_us"] = median([broker_us(r[pair.name][protocol]) for r in runs])
        for figure in ("msg_s", "broker_us"):
            a, b = row[f"amqp091_{figure}"], row[f"amqp10_{figure}"]
            row[f"ratio_{figure}"] = a / b if a is not None and b else None
        summary[pair.name] = row
    return summary


def table(summary: dict[str, dict[str, float | None]]) -> str:
    def cell(value: float | None, spec: str) -> str:
        return "n/a" if value is None else format(value, spec)

    head = f"{'scenario':<14}{'0-9-1 msg/s':>12}{'1.0 msg/s':>11}{'ratio':>7}{'0-9-1 µs':>10}{'1.0 µs':>8}{'ratio':>7}"
    lines = [head, "-" * len(head)]
    for name, row in summary.items():
        lines.append(
            f"{name:<14}{cell(row['amqp091_msg_s'], '.0f'):>12}{cell(row['amqp10_msg_s'], '.0f'):>11}"
            f"{cell(row['ratio_msg_s'], '.2f'):>7}{cell(row['amqp091_broker_us'], '.1f'):>10}"
            f"{cell(row['amqp10_broker_us'], '.1f'):>8}{cell(row['ratio_broker_us'], '.2f'):>7}"
        )
    lines.append("msg/s: messages per second; µs: broker CPU per message (/proc/PID/stat); ratio: 0-9-1 / 1.0")
    return "\n".join(lines)


def errors(runs: list[dict[str, dict[str, Any]]]) -> list[str]:
    return [
        f"run {i} {pair} {protocol}: {figures['error']}"
        for i, run in enumerate(runs)
        for pair, by_protocol in run.items()
        for protocol, figures in by_protocol.items()
        if "error" in figures
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.amqp091", description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=5000, help="messages per send scenario (default 5000)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--url", help="HOST:PORT of a running broker (default: start one)")
    parser.add_argument("--pid", type=int, help="with --url: the broker's pid, for its CPU time")
    parser.add_argument("--time-limit", type=float, default=30.0, help="seconds per scenario at most")
    parser.add_argument("--json", help="write the summary and every run's figures here")
    args = parser.parse_args(argv)
    broker = None if args.url else BrokerProcess()
    url, pid = (args.url, args.pid) if broker is None else (broker.url, broker.pid)
    try:
        runs = [run_once(url, pid, args.count, args.time_limit, run) for run in range(args.runs)]
    finally:
        if broker is not None:
            broker.stop()
    summary = summarize(runs)
    print(table(summary))
    problems = errors(runs)
    for problem in problems:
        print(problem, file=sys.stderr)
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"count": args.count, "summary": summary, "runs": runs}, file, indent=1)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
