"""``bench.perf``'s issue-19 targets (each row against ActiveMQ's best run) and its start-up sample (the bytecode
written first, as an installed broker has it)."""

from __future__ import annotations

from typing import Any

import pytest

from bench import ROOT
from bench.broker_process import TimedBroker
from bench.perf_report import ISSUE_19_CPU_US, targets


def _summary(broker_us: dict[str, float], p50_ms: float, listening_s: float) -> dict[str, Any]:
    def spread(value: float) -> dict[str, float]:
        return {"median": value, "min": value, "max": value, "n": 1}

    scenarios = {name: {"broker_cpu_us": spread(us), "latency_p50_ms": None} for name, us in broker_us.items()}
    scenarios.setdefault("raw_txn_roundtrip", {"broker_cpu_us": spread(100.0)})["latency_p50_ms"] = spread(p50_ms)
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
