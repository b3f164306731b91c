"""``bench.perf``'s issue-19 targets (each row against ActiveMQ's best run) and its start-up sample (the bytecode
written first, as an installed broker has it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import ROOT
from bench.broker_process import BrokerProcess, TimedBroker
from bench.perf import measured_commit
from bench.perf_report import ISSUE_19_BASE_CPU_US, ISSUE_19_CPU_US, targets


def _summary(broker_us: dict[str, float], p50_ms: float, listening_s: float) -> dict[str, Any]:
    """``p50_ms`` is the proton client's declare + discharge p50 (the issue's client); the raw client's is a tenth of
    it, as on this machine, so a target read from the wrong client's figure is met where it should be missed."""

    def spread(value: float) -> dict[str, float]:
        return {"median": value, "min": value, "max": value, "n": 1}

    scenarios = {name: {"broker_cpu_us": spread(us), "latency_p50_ms": None} for name, us in broker_us.items()}
    for name, p50 in (("txn_roundtrip", p50_ms), ("raw_txn_roundtrip", p50_ms / 10)):
        scenarios.setdefault(name, {"broker_cpu_us": spread(100.0)})["latency_p50_ms"] = spread(p50)
    figures = ("startup_s", "listening_s", "idle_rss_mib", "bytes_per_queued_message")
    return {"scenarios": scenarios} | {key: spread(listening_s) for key in figures}


def _issue_19_lines(summary: dict[str, Any]) -> list[str]:
    return [line for line in targets(summary) if "issue 19" in line]


def test_every_issue_19_row_is_met_at_its_limit() -> None:
    lines = _issue_19_lines(_summary(dict(ISSUE_19_CPU_US), 0.89, 0.149))
    assert len(lines) == len(ISSUE_19_CPU_US) + 2
    assert all("[MET" in line for line in lines), lines


@pytest.mark.parametrize("name", sorted(ISSUE_19_CPU_US))
def test_a_row_above_its_limit_is_missed(name: str) -> None:
    figures = dict(ISSUE_19_CPU_US) | {name: ISSUE_19_CPU_US[name] * 1.01}
    missed = [line for line in _issue_19_lines(_summary(figures, 0.5, 0.1)) if "MISSED" in line]
    assert len(missed) == 1
    assert missed[0].lstrip().startswith(f"[MISSED] {name}:")


def test_a_slow_round_trip_or_start_is_missed() -> None:
    missed = [line for line in _issue_19_lines(_summary(dict(ISSUE_19_CPU_US), 0.9, 0.15)) if "MISSED" in line]
    assert len(missed) == 2
    assert "declare+discharge" in missed[0]
    assert "listening line" in missed[1]


def test_the_start_up_sample_runs_on_written_bytecode(monkeypatch: pytest.MonkeyPatch) -> None:
    """With PYTHONDONTWRITEBYTECODE set (this project's machines), a start would compile minibroker's sources every
    time: the timed broker writes them first, as ``pip install`` does."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    for path in (ROOT / "minibroker" / "broker" / "__pycache__").glob("coordinator.*.pyc"):
        path.unlink()
    with TimedBroker() as broker:
        assert broker.listening_s > 0
    assert list((ROOT / "minibroker" / "broker" / "__pycache__").glob("coordinator.*.pyc"))


def _base(broker_us: dict[str, float], p50_ms: float, listening_s: float) -> tuple[str, dict[str, Any]]:
    return "df67daab424a3110e1b6706b53f0f748660bbc60", _summary(broker_us, p50_ms, listening_s)


def _ratio_lines(summary: dict[str, Any], others: dict[str, tuple[str, dict[str, Any]]]) -> list[str]:
    return [line for line in targets(summary, others) if "as a ratio" in line]


def test_beside_the_issues_own_code_each_row_is_held_to_activemqs_share_of_it() -> None:
    """raw_txn_1: ActiveMQ 150 µs beside df67daa's 520 µs in the issue's run; measured at 300 µs today, df67daa
    makes the bar 150/520 x 300 = 86.5 µs."""
    base = _base({name: then * 300 / 520 for name, then in ISSUE_19_BASE_CPU_US.items()}, 1.38, 0.29)
    at_bar = {name: ISSUE_19_CPU_US[name] * 300 / 520 * 0.999 for name in ISSUE_19_CPU_US}  # (rounding)
    lines = _ratio_lines(_summary(at_bar, 0.89, 0.15), {"/tmp/base": base})
    assert len(lines) == len(ISSUE_19_CPU_US) + 2
    assert all("[MET" in line for line in lines), lines
    assert "(86.5 µs;" in next(line for line in lines if "raw_txn_1:" in line)
    over = at_bar | {"raw_txn_1": at_bar["raw_txn_1"] * 1.02}
    missed = [line for line in _ratio_lines(_summary(over, 0.5, 0.1), {"/tmp/base": base}) if "MISSED" in line]
    assert len(missed) == 1
    assert "raw_txn_1:" in missed[0]


def test_a_slower_round_trip_or_start_than_the_share_is_missed() -> None:
    base = _base(dict(ISSUE_19_BASE_CPU_US), 1.0, 0.2)
    lines = _ratio_lines(_summary(dict(ISSUE_19_CPU_US), 0.66, 0.11), {"/tmp/base": base})
    missed = [line for line in lines if "MISSED" in line]
    assert len(missed) == 2, lines
    assert "declare+discharge" in missed[0]
    assert "listening line" in missed[1]


def test_another_checkout_brings_no_ratio_bar() -> None:
    _commit, summary = _base(dict(ISSUE_19_BASE_CPU_US), 1.0, 0.2)
    assert _ratio_lines(_summary(dict(ISSUE_19_CPU_US), 0.5, 0.1), {"/tmp/other": ("0123abc", summary)}) == []


def test_a_tree_s_own_minibroker_is_started(tmp_path: Path) -> None:
    """``--tree DIR`` starts DIR's minibroker, not the one installed or this checkout's."""
    package = tmp_path / "minibroker"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(
        "import time\nprint('minibroker listening on amqp://127.0.0.1:7', flush=True)\ntime.sleep(30)\n"
    )
    with BrokerProcess(tree=tmp_path) as broker:
        assert broker.port == 7


@pytest.mark.parametrize(("this_checkout", "refusal"), [(False, "no minibroker checkout"), (True, "not this one")])
def test_perf_refuses_a_tree_that_is_no_other_checkout(tmp_path: Path, this_checkout: bool, refusal: str) -> None:
    tree = ROOT if this_checkout else tmp_path
    result = subprocess.run(
        [sys.executable, "-m", "bench.perf", "--runs", "0", "--tree", str(tree)],
        cwd=ROOT, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert refusal in result.stderr


@pytest.mark.timeout(120)
def test_perf_measures_both_checkouts_in_one_run(tmp_path: Path) -> None:
    """A copy of this checkout's minibroker as the other tree: both brokers measured, both in the JSON, the
    comparison printed."""
    shutil.copytree(ROOT / "minibroker", tmp_path / "minibroker", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "perf.json"
    argv = ["--runs", "1", "--count", "40", "--skip-memory", "--scenarios", "raw_txn_roundtrip"]
    result = subprocess.run(
        [sys.executable, "-m", "bench.perf", *argv, "--tree", str(tmp_path), "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=100, check=False,
        env=os.environ | {"PYTHONDONTWRITEBYTECODE": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"beside {tmp_path} (same runs" in result.stdout
    document = json.loads(out.read_text())
    ours = document["summary"]["scenarios"]["raw_txn_roundtrip"]["broker_cpu_us"]
    theirs = document["trees"][str(tmp_path)]["summary"]["scenarios"]["raw_txn_roundtrip"]["broker_cpu_us"]
    assert ours["n"] == theirs["n"] == 1
    assert document["settings"]["tree"] == [str(tmp_path)]
    assert list((tmp_path / "minibroker" / "broker" / "__pycache__").glob("coordinator.*.pyc"))  # its start-up too


def test_an_edited_checkout_is_of_no_commit(tmp_path: Path) -> None:
    """A checkout of df67daa with changes to its minibroker/ is not the code issue 19 measured: no ratio bar."""

    def git(*argv: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *argv], cwd=tmp_path, check=True,
                       capture_output=True)  # fmt: skip

    (tmp_path / "minibroker").mkdir()
    (tmp_path / "minibroker" / "__init__.py").write_text("")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "x")
    commit = measured_commit(tmp_path)
    assert len(commit) == 40
    (tmp_path / "minibroker" / "__init__.py").write_text("FASTER = True\n")
    assert measured_commit(tmp_path) == ""
    (tmp_path / "minibroker" / "__init__.py").write_text("")
    (tmp_path / "minibroker" / "new.py").write_text("")
    assert measured_commit(tmp_path) == ""
