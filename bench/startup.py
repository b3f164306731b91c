"""Start-up, stop and footprint of minibroker, embedded and as a process.

    python -m bench.startup [--runs 20]

Reports, as the median (and min-max) of ``--runs`` runs:
- embedded (trio): ``async with minibroker.serve(...)`` entered (listener bound, nodes created) and left;
- embedded (thread): ``with minibroker.run_in_thread(...)`` entered and left;
- process: ``python -m minibroker --port 0`` started until its "listening" line, and until it answers an
  AMQP open (``minibroker.health.check``); idle RSS of that process;
- install size: the bytes on disk of minibroker and its runtime dependencies (trio and what trio needs,
  sortedcontainers).

    python -m bench.startup --listening [--tree DIR ...] [--runs 20]
    python -m bench.startup --callgrind PYTHON [--callgrind OTHER_PYTHON ...]

reports instead only ``python -m minibroker --port 0 --log-level warning`` from spawning it to its listening line,
and the CPU it used by then, for this checkout and each ``--tree`` (another checkout), runs interleaved so that the
machine's load moves all alike; once with ``PYTHONDONTWRITEBYTECODE=1`` and the checkouts' ``minibroker/**/__pycache__``
deleted first (minibroker's sources compiled on every run, the dependencies' bytecode used), and once without it,
after a warm-up run that writes the ``.pyc`` files (what users normally have).

``--callgrind PYTHON`` counts instead, under valgrind, the instructions of an interpreter's empty program, of its
``import trio`` and of its ``python -m minibroker --port 0`` to the listening line (run outside the checkout, so the
minibroker that interpreter has installed is measured): a figure the machine's load does not move, to compare
start-up changes (two virtual environments) or interpreters (say, Python 3.11 against 3.13).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import trio

import minibroker
from bench import ROOT
from bench.broker_process import LISTENING, TimedBroker
from bench.measures import callgrind_instructions, cpu_seconds, rss_kib

CONFIG = {"server": {"port": 0}, "queues": {"orders": {}}}


def _summary(samples: list[float]) -> dict[str, float]:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples)}


def embedded_trio(runs: int) -> dict[str, float]:
    async def once() -> float:
        started = time.perf_counter()
        async with minibroker.serve(CONFIG):
            pass
        return time.perf_counter() - started

    async def main() -> list[float]:
        return [await once() for _ in range(runs)]

    return _summary(trio.run(main))


def embedded_thread(runs: int) -> dict[str, float]:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        with minibroker.run_in_thread(CONFIG):
            pass
        samples.append(time.perf_counter() - started)
    return _summary(samples)


def process(runs: int) -> dict[str, dict[str, float]]:
    listening, answering, rss = [], [], []
    for _ in range(runs):
        with TimedBroker() as broker:
            listening.append(broker.listening_s)
            answering.append(broker.startup_s)
            time.sleep(0.2)
            rss.append(rss_kib(broker.pid) / 1024)
    return {"listening": _summary(listening), "open_answered": _summary(answering), "idle_rss_mib": _summary(rss)}


def _to_listening(tree: Path, env: dict[str, str]) -> tuple[float, float]:
    """Seconds from spawning ``tree``'s ``python -m minibroker`` to its listening line, and its CPU seconds then."""
    started = time.perf_counter()
    command = [sys.executable, "-m", "minibroker", "--port", "0", "--log-level", "warning"]
    with subprocess.Popen(command, cwd=tree, env=env, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        elapsed = time.perf_counter() - started
        cpu = cpu_seconds(proc.pid)
        proc.terminate()
    if not LISTENING.match(line):
        raise RuntimeError(f"{tree}: no listening line, got {line!r}")
    return elapsed, cpu


def listening(trees: list[Path], runs: int) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """``_to_listening`` of each tree, ``runs`` times interleaved, in both bytecode modes."""
    results: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for mode in ("PYTHONDONTWRITEBYTECODE=1", ".pyc cached"):
        envs = {}
        for tree in trees:
            env = {key: value for key, value in os.environ.items() if not key.startswith("MINIBROKER_")}
            env["PYTHONPATH"] = str(tree)
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            if mode.startswith("PYTHONDONTWRITEBYTECODE"):
                env["PYTHONDONTWRITEBYTECODE"] = "1"
                for cache in list((tree / "minibroker").rglob("__pycache__")):  # else read, if not written
                    shutil.rmtree(cache)
            else:
                _to_listening(tree, env)  # the warm-up run writes the .pyc files
            envs[tree] = env
        samples: dict[Path, list[tuple[float, float]]] = {tree: [] for tree in trees}
        for _ in range(runs):
            for tree in trees:
                samples[tree].append(_to_listening(tree, envs[tree]))
        results[mode] = {
            str(tree): {"wall_s": _summary([s[0] for s in got]), "cpu_s": _summary([s[1] for s in got])}
            for tree, got in samples.items()
        }
    return results


CALLGRIND_TIMEOUT = 300.0
"""Seconds a run under callgrind may take to its listening line, or to its exit."""


def _outside_env() -> dict[str, str]:
    """This environment without PYTHONPATH: the measured interpreter imports its own installation, not the
    checkout this repository's rules put on PYTHONPATH."""
    return {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}


def interpreter(python: str) -> str:
    """The executable ``python`` runs as (a launcher such as pyenv's shim is a shell script that execs it, and
    valgrind, not following the exec, would count the shell): its ``sys.executable``, resolved."""
    result = subprocess.run(
        [python, "-c", "import os, sys; print(os.path.realpath(sys.executable))"],
        cwd="/", env=_outside_env(), capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return result.stdout.strip()


def _callgrind(argv: list[str], until_line: bool, timeout: float = CALLGRIND_TIMEOUT) -> int:
    """Instructions (``valgrind --tool=callgrind``) of ``argv`` to its exit or, ``until_line``, to its first line of
    output (then it is stopped with SIGINT, which the broker answers by shutting down: counted too, a few per cent).
    Run from "/" without PYTHONPATH, so that a checkout's minibroker is not the one started; ``RuntimeError`` (with
    the program's last words) when it prints no listening line within ``timeout`` seconds.
    """
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv]
    with subprocess.Popen(
        command, cwd="/", env=_outside_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        if until_line:
            ready = select.select([proc.stdout], [], [], timeout)[0]  # (a broker stuck before listening: no hang)
            line = proc.stdout.readline() if ready else ""
            if not LISTENING.match(line):
                proc.kill()
                _, err = proc.communicate()
                raise RuntimeError(f"{argv[0]}: no listening line within {timeout} s, got {line!r}: {err[-500:]}")
            proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=timeout)
    return callgrind_instructions(err)


def instructions(pythons: list[str]) -> dict[str, dict[str, int]]:
    """For each interpreter (with minibroker and trio installed, run outside the checkout so that its own
    installation is what starts): the instructions of an empty program, of ``import trio``, and of ``python -m
    minibroker --port 0`` to its listening line. Deterministic, unlike the wall and CPU times: the measure to
    compare start-up changes, or interpreters, on a noisy machine."""
    figures = {}
    for python in pythons:
        executable = interpreter(python)
        figures[python] = {
            "python -c pass": _callgrind([executable, "-c", "pass"], until_line=False),
            "import trio": _callgrind([executable, "-c", "import trio"], until_line=False),
            "to the listening line": _callgrind(
                [executable, "-m", "minibroker", "--port", "0", "--log-level", "warning"], until_line=True
            ),
        }
    return figures


def install_size() -> dict[str, float]:
    """Bytes on disk of minibroker's runtime dependency closure (what ``pip install .`` adds)."""
    seen: set[str] = set()
    pending = ["minibroker"]
    total = 0
    while pending:
        name = pending.pop()
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for file in dist.files or []:
            path = Path(str(file.locate()))
            if path.is_file() and "__editable__" not in path.name:
                total += path.stat().st_size
        if name == "minibroker":  # an editable install: count the package sources instead
            package = Path(minibroker.__file__).parent
            total += sum(p.stat().st_size for p in package.rglob("*.py"))
        for requirement in dist.requires or []:
            if "extra ==" in requirement:
                continue
            pending.append(re.split(r"[ ;<>=!~\[(]", requirement, maxsplit=1)[0])
    return {"mib": total / 2**20, "packages": len(seen)}


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.startup", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--listening", action="store_true", help="only the process's time to its listening line")
    parser.add_argument("--tree", type=Path, action="append", default=[], help="with --listening: another checkout")
    parser.add_argument(
        "--callgrind",
        metavar="PYTHON",
        action="append",
        help="only instructions to the listening line (valgrind), of the minibroker PYTHON has installed; repeat to "
        "compare interpreters",
    )
    args = parser.parse_args()
    if args.callgrind:
        counted = instructions(args.callgrind)
        for python, rows in counted.items():
            for what, count in rows.items():
                print(f"{python:40} {what:24} {count:>14,} instructions")
        if args.json:
            args.json.write_text(json.dumps(counted, indent=2))
        return
    if args.listening:
        timed = listening([ROOT, *args.tree], args.runs)
        for mode, trees in timed.items():
            for tree, figures in trees.items():
                wall, cpu = figures["wall_s"], figures["cpu_s"]
                print(
                    f"{mode:26} {tree:32} to listening: median {wall['median'] * 1000:5.0f} ms, "
                    f"min {wall['min'] * 1000:4.0f} ms; CPU median {cpu['median'] * 1000:4.0f} ms, "
                    f"min {cpu['min'] * 1000:4.0f} ms"
                )
        if args.json:
            args.json.write_text(json.dumps(timed, indent=2))
        return
    results = {
        "embedded_trio_start_stop_s": embedded_trio(args.runs),
        "embedded_thread_start_stop_s": embedded_thread(args.runs),
        "process": process(max(3, args.runs // 4)),
        "install_size": install_size(),
    }
    ms = lambda d: f"{d['median'] * 1000:7.1f} ms (min {d['min'] * 1000:.1f}, max {d['max'] * 1000:.1f})"  # noqa: E731
    print(f"embedded (trio)   start+stop: {ms(results['embedded_trio_start_stop_s'])}")
    print(f"embedded (thread) start+stop: {ms(results['embedded_thread_start_stop_s'])}")
    proc = results["process"]
    print(f"process to listening line:    {ms(proc['listening'])}")
    print(f"process to AMQP open answered:{ms(proc['open_answered'])}")
    print(f"process idle RSS:             {proc['idle_rss_mib']['median']:7.1f} MiB")
    size = results["install_size"]
    print(f"install size:                 {size['mib']:7.1f} MiB in {size['packages']} packages")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
