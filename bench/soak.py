"""Load and soak test of minibroker: many connections, a million messages through one queue, connection churn,
attacks on the limits.

    python -m bench.soak [--scale 1.0] [--json PATH] [--only connections,throughput,churn,attacks]

Four scenarios, each against a fresh broker process, each bounded in time (``--time-limit`` seconds,
scaled), everything on 127.0.0.1:

* **connections** (``soak_connections``; python-qpid-proton, one ``Container`` for every connection): 200
  connections at once, each sending 500 messages at-least-once (the broker accepts each) to its own queue
  and receiving the 500 messages its neighbour sent (prefetch, auto-accept). Every message carries
  ``"sender:seq"`` as its message-id and ``seq`` as its body: a loss, a duplicate or a reordering is counted
  per queue.
* **throughput** (``soak_throughput``; the raw-socket client of ``bench.raw``): 1,000,000 messages through
  one queue, one producer connection and one consumer connection driven by one selector loop. The producer
  sends unsettled (the broker accepts each), the consumer takes them unsettled and accepts them in ranged
  dispositions. The producer stays at most 2,000 messages ahead of the consumer, so the queue depth is
  bounded and the broker's RSS must stay flat. The run pauses twice with its connections open, once the
  queue is empty and every message settled: after warm-up and after the last message. Warm-up is the first
  10 % of the messages, but at least 100,000 (at most half) when the run is shorter: the broker's RSS climbs
  over roughly the first 100,000 messages while its allocator reaches its working size, then levels off.
  "Flat" means the RSS at the second pause is within 10 % of the RSS at the first; the broker's allocated
  memory blocks (after a garbage collection) at the two pauses show whether anything is kept per message.
  Each message's body carries its sequence number: losses and duplicates are counted exactly.
* **churn** (``soak_churn``; the raw-socket client, a few threads): 10,000 connect/disconnect cycles of five
  kinds in turn (clean open/close; SASL ANONYMOUS then open/close; a sender and a receiver that move one
  message through a shared queue and accept it; a receiver with credit dropped without close; a TCP
  connection dropped during the protocol header). Afterwards the broker must hold no connection, no extra
  trio task and no extra socket, its shared queue must be empty, and its RSS should be back near the start.

Why a raw-socket client for the large scenarios: python-qpid-proton's Python layer costs tens of
microseconds per message on top of the broker's own cost (see bench/roundtrip.py), so it, not the
broker, would set the pace. The raw client sends pre-encoded transfer frames (a template with the
delivery-id, tag and sequence patched in) and decodes what the broker sends with ``minibroker.amqp``.

The broker is started as ``python -m bench.introspect``: ``minibroker.serve`` exactly as ``python -m
minibroker`` runs it, plus a line protocol on stdin ("stats", "stats gc") that answers with its connection
count, trio task count, queue depths and allocated memory blocks, so leaks can be read from the broker
itself ("trim" runs ``malloc_trim``: what RSS remains after it is in use, or held by Python's allocator, not
free heap). RSS, peak RSS (VmHWM), CPU time and open file descriptors are read from /proc/PID of that
process. Each scenario ends by reading the broker's RSS once its connections are closed, and again after
"trim".

Throughput on a loaded machine says little; the broker's CPU time per message (from /proc) says more.

The functions ``run_connections``, ``run_throughput`` and ``run_churn`` are also used by
tests/integration/test_load.py at reduced size. ``--only attacks`` runs bench/attacks.py.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.attacks import ATTACKS, run_attacks
from bench.broker_process import HOST, BrokerProcess
from bench.soak_churn import run_churn
from bench.soak_connections import run_connections
from bench.soak_throughput import run_throughput


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
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every count by this (default 1.0)")
    parser.add_argument("--only", default="connections,throughput,churn,attacks", help="comma-separated scenarios")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON to PATH")
    parser.add_argument("--time-limit", type=float, default=900.0, help="seconds per scenario at scale 1")
    parser.add_argument("--size", type=int, default=128, help="body bytes of each throughput message")
    parser.add_argument("--workers", type=int, default=8, help="churn threads")
    args = parser.parse_args()
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
        with BrokerProcess(introspect=True) as broker:
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
        with BrokerProcess(introspect=True) as broker:
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
        with BrokerProcess(introspect=True) as broker:
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
