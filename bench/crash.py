"""Crash test at full size, and what durability costs.

    python -m bench.crash [--cycles 50] [--seed S] [--transactions 200] [--per-transaction 10] [--json]

1. ``--cycles`` times: start ``python -m minibroker --data-dir DIR``, run the workload of
   tests/crash/workload.py against it (durable sends unsettled and in transactions, commits and aborts,
   consumption with plain and transactional accepts, a durable subscription), SIGKILL the broker after a
   random 0.05-0.5 s (a quarter of the brokers also get a random ``MINIBROKER_CRASH_AT``, and may die there
   first); then restart it, drain it, and check the workload's log against what is left. Prints
   the counts: lost, unexpected, allowed and illegal duplicates, partial transactions, messages
   acknowledged. Exit status 1 if anything was lost, invented, illegally duplicated or half-committed.
2. Throughput of durable transactional sends (``--per-transaction`` durable messages per transaction,
   ``--transactions`` transactions, one after the other on each connection, each commit waiting for its
   ``accepted``) against a broker with ``data_sync = "always"``, one without a data directory (memory),
   and one with ``data_sync = "never"``; with 1 and with 4 connections at once (``--connections``), where
   group commit lets one fsync cover several commits.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from proton import Delivery, Message
from proton.handlers import MessagingHandler, TransactionHandler
from proton.reactor import Container, Transaction

from bench.broker_process import BrokerProcess
from tests.crash.workload import Timer, run_cycles

ADDRESS = "bench.crash.throughput"


class TransactionalSender(MessagingHandler, TransactionHandler):  # type: ignore[misc]
    """On one connection: ``transactions`` times, declare, send ``per`` durable messages, commit."""

    def __init__(self, url: str, transactions: int, per: int, done: Any) -> None:
        super().__init__()
        self.url = url
        self.remaining = transactions
        self.per = per
        self.done = done
        self.sends: list[Any] = []
        self.committed = 0
        self.failed = ""

    def on_start(self, event: Any) -> None:
        self.container = event.container
        self.conn = self.container.connect(self.url, reconnect=False, handler=self)
        self.sender = self.container.create_sender(self.conn, ADDRESS)
        self.container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event: Any) -> None:
        txn = event.transaction
        had_credit = self.sender.credit >= self.per
        self.sends = [txn.send(self.sender, Message(body=b"x" * 100, durable=True)) for _ in range(self.per)]
        if had_credit:
            txn.commit()  # the transfers went out (had credit) and the discharge follows them
        else:
            self._commit_when_posted(txn)

    def _commit_when_posted(self, txn: Transaction) -> None:
        if any(d.remote_state == 0 for d in self.sends):
            self.container.schedule(0.0005, Timer(lambda: self._commit_when_posted(txn)))
        else:
            txn.commit()

    def on_transaction_committed(self, event: Any) -> None:
        if event.delivery.remote_state != Delivery.ACCEPTED:
            self._fail(f"discharge answered {event.delivery.remote_state}")
            return
        self.committed += 1
        self.remaining -= 1
        if self.remaining:
            self.container.declare_transaction(self.conn, handler=self)
        else:
            self.conn.close()
            self.done(self)

    def on_transaction_commit_failed(self, event: Any) -> None:
        self._fail("commit failed")

    def on_transport_error(self, event: Any) -> None:
        self._fail("transport error")

    def _fail(self, why: str) -> None:
        if not self.failed and self.remaining:
            self.failed = why
            self.conn.close()
            self.done(self)


class Start(MessagingHandler):  # type: ignore[misc]
    """Starts ``connections`` senders in one container, and stops it when they are all done."""

    def __init__(self, url: str, connections: int, transactions: int, per: int) -> None:
        super().__init__()
        self.pending = connections
        self.senders = [
            TransactionalSender(url, transactions // connections, per, self._done) for _ in range(connections)
        ]
        self.started = self.ended = 0.0

    def on_start(self, event: Any) -> None:
        self.container = event.container
        self.started = time.perf_counter()
        for sender in self.senders:
            sender.on_start(event)

    def _done(self, sender: TransactionalSender) -> None:
        self.pending -= 1
        if not self.pending:
            self.ended = time.perf_counter()
            self.container.stop()


def throughput(mode: str, workdir: Path, connections: int, transactions: int, per: int) -> float:
    """Messages per second of durable transactional sends against a broker in ``mode``."""
    data_dir = None if mode == "memory" else workdir / f"throughput-{mode}-{connections}"
    config = None if mode == "memory" else {"data_sync": mode}
    process = BrokerProcess(data_dir, config=config, stderr_path=workdir / "throughput.stderr")
    try:
        start = Start(process.url, connections, transactions, per)
        Container(start).run()
    finally:
        process.stop()
    failed = [s.failed for s in start.senders if s.failed]
    if failed:
        raise SystemExit(f"throughput run ({mode}) failed: {failed}")
    messages = sum(s.committed for s in start.senders) * per
    return messages / (start.ended - start.started)


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.crash", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cycles", type=int, default=50, help="broker kills (default 50)")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--transactions", type=int, default=200, help="transactions per throughput run")
    parser.add_argument("--per-transaction", type=int, default=10, help="messages per transaction")
    parser.add_argument("--connections", default="1,4", help="connections at once, for each throughput run")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (client log, data, stderr)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="minibroker-crash-") as scratch:
        workdir = Path(args.keep or scratch)
        workdir.mkdir(parents=True, exist_ok=True)
        run = run_cycles(workdir / "cycles", args.cycles, seed=args.seed)
        rates: dict[str, dict[str, float]] = {}
        for mode in ("always", "memory", "never"):
            for n in (int(c) for c in args.connections.split(",")):
                rate = throughput(mode, workdir, n, args.transactions, args.per_transaction)
                rates.setdefault(mode, {})[f"{n} connection{'s' if n > 1 else ''}"] = round(rate)
    report = run.report
    result = {
        "cycles": run.cycles,
        "seed": args.seed,
        "seconds": round(run.seconds, 1),
        "workload_not_ready_before_kill": run.not_ready,
        "deaths_at_crash_points": run.point_crashes,
        **report.counts(),
        "throughput": {
            "unit": "durable messages/s in committed transactions",
            "messages_per_transaction": args.per_transaction,
            "transactions": args.transactions,
            "data_sync=always": rates["always"],
            "memory (no data_dir)": rates["memory"],
            "data_sync=never": rates["never"],
        },
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"crash cycles run: {run.cycles} in {run.seconds:.1f} s (seed {args.seed})")
        print(f"  brokers that died at a named crash point before their SIGKILL: {run.point_crashes}")
        for key in ("acknowledged", "in_doubt", "consumed", "drained", "committed_transactions"):
            print(f"  {key.replace('_', ' ')}: {result[key]}")
        for key in ("lost", "unexpected", "allowed_duplicates", "illegal_duplicates", "partial_transactions"):
            print(f"  {key.replace('_', ' ')}: {result[key]}")
        print(f"throughput, {args.transactions} transactions of {args.per_transaction} durable messages:")
        for mode, label in (("always", "data_sync=always"), ("memory", "memory"), ("never", "data_sync=never")):
            figures = ", ".join(f"{rate:,} msg/s ({n})" for n, rate in rates[mode].items())
            print(f"  {label:<17} {figures}")
    if not report.ok:
        print(report.summary(), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
