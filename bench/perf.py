"""Broker CPU per message, throughput, latency, start-up and memory of an AMQP 1.0 broker.

    python -m bench.perf [--runs 3] [--count N] [--url HOST:PORT [--pid PID]] [--json out.json]
                         [--scenarios a,b,...] [--profile DIR] [--tree OTHER_CHECKOUT ...]

Without ``--url`` each run starts minibroker as a subprocess (``python -m minibroker --port 0 --log-level
warning``). With ``--url`` it drives any AMQP 1.0 broker; broker CPU and RSS then need ``--pid`` (the
broker's process id, read from /proc) and are otherwise reported as n/a.

Every scenario runs in its own client process (``python -m bench.perf_client NAME ...``), so the
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
  raw_txn_roundtrip  empty transactions (the codec's encodings)
  raw_txn_1, raw_txn_10, raw_txn_100, raw_txn_accept_100: txn_1 ... txn_accept_100 with python-qpid-proton's
                     very octets, written in its pieces (bench.proton_wire), by a client that does not take the
                     machine from the broker as proton does (its CPU per transaction is a fraction of proton's)
memory: a fresh broker's RSS idle, then with 100,000 256-byte messages queued (filled by the raw sender).

Each run starts fresh brokers (one for the memory figures, one for the scenarios); the summary gives the
median and the min-max spread over the runs. ``--tree DIR`` measures another checkout's minibroker in the same
runs (every run goes through each checkout in turn) and prints its figures beside this one's with the ratios: a
change against its parent, or today's code against an older one on a machine whose speed moves from day to day.
``--profile DIR`` additionally records the broker with py-spy (``pip install py-spy``) during send_presettled and
consume_accept (and their raw versions) and prints the top 15 functions by own time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import ROOT
from bench.broker_process import TimedBroker
from bench.measures import rss_kib, settle_cpu
from bench.perf_profile import profile
from bench.perf_report import aggregate, comparison, report, summarise_one, targets
from bench.perf_scenarios import BY_NAME, MEMORY_MESSAGES, SCENARIOS, ClientOptions, Scenario, spawn_client
from minibroker.health import NotHealthy, check


def memory_figures(url: str, pid: int, prefix: str, tag: str, time_limit: float) -> dict[str, Any]:
    """RSS idle, then with MEMORY_MESSAGES 256-byte messages queued (raw pre-settled sender)."""
    settle_cpu(pid, quiet=0.3)
    idle = rss_kib(pid)
    opts = ClientOptions(url, f"{prefix}bench.memory.{tag}", MEMORY_MESSAGES, max(time_limit, 60), pid,
                         f"{prefix}bench.sync.{tag}")  # fmt: skip
    fill = spawn_client("memory_fill", opts)
    settle_cpu(pid, quiet=0.3)
    full = rss_kib(pid)
    out: dict[str, Any] = {"fill": fill}
    if idle is not None:
        out["idle_rss_mib"] = idle / 1024
    if full is not None and idle is not None and "error" not in fill:
        out["queued_rss_mib"] = full / 1024
        out["bytes_per_queued_message"] = (full - idle) * 1024 / fill["count"]
    return out


def one_run(
    args: argparse.Namespace, run: int, scenarios: list[Scenario], log: Callable[[str], None], tree: Path = ROOT
) -> dict[str, Any]:
    tag = f"{os.getpid()}.{run}"
    prefix = args.address_prefix
    out: dict[str, Any] = {"scenarios": {}}
    # 1. memory, on a broker of its own (also a start-up sample)
    broker = None if args.url else TimedBroker(tree)
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
    broker = None if args.url else TimedBroker(tree)
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


def source_state(tree: Path = ROOT) -> dict[str, str]:
    """The commit measured, and a digest of uncommitted changes to minibroker/ (the figures' code)."""

    def git(*argv: str) -> str:
        try:
            return subprocess.run(["git", *argv], cwd=tree, capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            return ""

    diff = git("diff", "HEAD", "--", "minibroker")
    return {
        "commit": git("rev-parse", "HEAD").strip(),
        "uncommitted_minibroker_diff_sha256": hashlib.sha256(diff.encode()).hexdigest() if diff else "",
        "uncommitted_files": " ".join(git("status", "--short", "--", "minibroker").split()),
    }


def measured_commit(tree: Path) -> str:
    """The commit whose code ``tree``'s figures are of; none ("") while its minibroker/ has uncommitted changes, so
    an edited checkout of df67daa is not held to issue 19's shares as the code that issue measured."""
    state = source_state(tree)
    return "" if state["uncommitted_files"] else state["commit"]


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.perf", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
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
    parser.add_argument("--tree", action="append", type=Path, default=[],
                        help="another checkout's minibroker, measured in the same runs (each run goes through "
                             "every checkout in turn); its figures beside this one's, with the ratios")  # fmt: skip
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--profile", type=Path, metavar="DIR", help="also profile the broker with py-spy")
    parser.add_argument("--profile-count", type=int, default=20_000, help="messages per profiled scenario")
    args = parser.parse_args()

    if args.url and args.url.startswith("amqp://"):
        args.url = args.url[len("amqp://") :]
    scenarios = SCENARIOS
    if args.scenarios:
        wanted = args.scenarios.split(",")
        unknown = [w for w in wanted if w not in BY_NAME]
        if unknown:
            parser.error(f"unknown scenarios: {unknown}")
        scenarios = [s for s in SCENARIOS if s.name in wanted]
    if args.url and args.tree:
        parser.error("--tree starts each checkout's broker: not with --url")
    trees = [ROOT, *[tree.resolve() for tree in args.tree]]
    for tree in trees:
        if not (tree / "minibroker" / "__main__.py").exists():
            parser.error(f"--tree {tree}: no minibroker checkout there")
    if len(set(trees)) < len(trees):
        parser.error("--tree: each checkout once, and not this one")
    if args.url:
        try:
            check(args.url, timeout=5)
        except NotHealthy as exc:
            raise SystemExit(f"{args.url}: {exc}") from None

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    started = time.perf_counter()
    runs: dict[Path, list[dict[str, Any]]] = {tree: [] for tree in trees}
    for run in range(args.runs):
        for tree in trees if run % 2 == 0 else trees[::-1]:  # (turns swapped every run: a drift moves all alike)
            log(f"run {run + 1}/{args.runs}" + (f" ({tree})" if len(trees) > 1 else ""))
            runs[tree].append(one_run(args, run, scenarios, log, tree))
    summaries = {tree: aggregate(tree_runs, scenarios) for tree, tree_runs in runs.items()}
    summary = summaries[ROOT]
    others = {str(tree): (measured_commit(tree), summaries[tree]) for tree in trees[1:]}
    if args.runs:  # --runs 0 --profile DIR: only the profiles
        print("\n".join(report(summary, scenarios)))
        for name, (_commit, other) in others.items():
            print("\n".join(comparison(summary, other, name, scenarios)))
        print("targets:")
        print("\n".join(targets(summary, others)))
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
            "settings": json.loads(json.dumps(vars(args), default=str)),  # (paths as strings)
            "source": source_state(),
            "summary": summary,
            "runs": runs[ROOT],
            "trees": {
                name: {"source": source_state(Path(name)), "summary": summaries[Path(name)], "runs": runs[Path(name)]}
                for name in others
            },
            "profiles": profiles,
        }
        args.json.write_text(json.dumps(document, indent=2))


if __name__ == "__main__":
    main()
