"""perf's ``--profile``: the broker recorded with py-spy during a few scenarios, and the functions it spent
its own time in (``top_own``)."""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.broker_process import BrokerProcess
from bench.measures import settle_cpu
from bench.perf_report import summarise_one
from bench.perf_scenarios import BY_NAME, ClientOptions, spawn_client


def profile(args: argparse.Namespace, directory: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """Record the broker with py-spy during the profiled scenarios; top 15 functions by own time."""
    pyspy = shutil.which("py-spy")
    if pyspy is None:
        raise SystemExit("--profile needs py-spy (pip install py-spy)")
    directory.mkdir(parents=True, exist_ok=True)
    plan = [  # (scenario profiled, scenario that fills its queue first or None)
        ("send_presettled", None),
        ("consume_accept", "send_confirmed"),
        ("txn_1", None),
        ("raw_send_presettled", None),
        ("raw_consume_accept", "raw_send_confirmed"),
    ]
    profiles: dict[str, Any] = {}
    for name, fill in plan:
        broker = BrokerProcess()
        try:
            scenario = BY_NAME[name]
            count = max(1, round(args.profile_count * scenario.scale))
            address = f"{args.address_prefix}{scenario.address}.profile"
            sync = f"{args.address_prefix}bench.sync.profile"
            if fill:
                filled = spawn_client(fill, ClientOptions(broker.url, address, count, args.time_limit, None, sync))
                count = filled.get("count", count)
            settle_cpu(broker.pid)
            out = directory / f"{name}.txt"
            recorder = subprocess.Popen(
                [pyspy, "record", "--pid", str(broker.pid), "--format", "raw", "--function", "--rate", "500",
                 "--nonblocking", "--output", str(out)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            time.sleep(1.0)  # py-spy attaches
            result = spawn_client(name, ClientOptions(broker.url, address, count, args.time_limit, broker.pid, sync))
            recorder.send_signal(signal.SIGINT)
            recorder.wait(30)
            top, waiting = top_own(out)
            profiles[name] = {"result": result, "top_own": top, "epoll_wait_pct": waiting, "file": str(out)}
            log(f"profile {name}: {summarise_one(scenario, result)}")
        finally:
            broker.stop()
    return profiles


IDLE_LEAVES = ("EpollIOManager.get_events (",)  # trio's event loop waiting in epoll_wait


def top_own(path: Path, n: int = 15) -> tuple[list[dict[str, Any]], float]:
    """Top ``n`` functions by own samples (the leaf of each stack) in a py-spy raw (collapsed) file,
    with their inclusive share too, as percentages of the busy samples; and the share of all samples
    spent waiting in epoll (idle, left out of the percentages)."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    busy = idle = 0
    if not path.exists():
        return [], 0.0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames_ = stack.split(";")
        leaf = _short(frames_[-1])
        if leaf.startswith(IDLE_LEAVES):
            idle += count
            continue
        busy += count
        own[leaf] += count
        for name in {_short(f) for f in frames_}:
            total[name] += count
    rows = [
        {"function": name, "own_pct": 100 * c / busy, "total_pct": 100 * total[name] / busy, "samples": c}
        for name, c in own.most_common(n)
    ]
    return rows, 100 * idle / max(1, busy + idle)


def _short(frame: str) -> str:
    # py-spy --function frames look like "name (path/to/file.py)"
    match = re.match(r"(.*) \((.*)\)$", frame)
    if not match:
        return frame
    name, path = match.groups()
    for marker in ("minibroker/", "site-packages/", "lib/python3.11/"):
        if marker in path:
            path = path[path.rindex(marker) + (0 if marker == "minibroker/" else len(marker)) :]
            break
    return f"{name} ({path})"
