"""perf's figures summarised: one line per scenario as it ends, the median and [min-max] over the runs, the
table beside the reference brokers (ActiveMQ, RabbitMQ, proton's example broker), and the targets."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from bench.perf_scenarios import MEMORY_MESSAGES, SCENARIOS, Scenario


def per_unit_us(result: dict[str, Any], key: str) -> float | None:
    value = result.get(key)
    if value is None or not result.get("count"):
        return None
    return float(value) / float(result["count"]) * 1e6


def summarise_one(scenario: Scenario, result: dict[str, Any]) -> str:
    if "error" in result:
        return f"ERROR {result['error']}"
    rate = result["count"] / result["elapsed_s"]
    broker = per_unit_us(result, "broker_cpu_s")
    client = per_unit_us(result, "client_cpu_s")
    text = f"{result['count']} {scenario.unit}s, {rate:.0f}/s, broker {_fmt(broker)} µs/{scenario.unit}, "
    text += f"client {_fmt(client)} µs/{scenario.unit}"
    if "latency_p50_ms" in result:
        text += f", p50 {result['latency_p50_ms']:.2f} ms, p99 {result['latency_p99_ms']:.2f} ms"
    return text


def _fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def aggregate(runs: list[dict[str, Any]], scenarios: list[Scenario]) -> dict[str, Any]:
    summary: dict[str, Any] = {"scenarios": {}}
    for scenario in scenarios:
        results = [r["scenarios"].get(scenario.name, {}) for r in runs]
        ok = [r for r in results if r and "error" not in r]
        figures: dict[str, Any] = {"unit": scenario.unit, "errors": [r["error"] for r in results if "error" in r]}
        metrics: dict[str, Callable[[dict[str, Any]], float | None]] = {
            "rate_per_s": lambda r: r["count"] / r["elapsed_s"],
            "broker_cpu_us": lambda r: per_unit_us(r, "broker_cpu_s"),
            "client_cpu_us": lambda r: per_unit_us(r, "client_cpu_s"),
            "latency_p50_ms": lambda r: r.get("latency_p50_ms"),
            "latency_p99_ms": lambda r: r.get("latency_p99_ms"),
            "count": lambda r: r["count"],
        }
        for key, get in metrics.items():
            values = [v for v in (get(r) for r in ok) if v is not None]
            figures[key] = spread(values)
        summary["scenarios"][scenario.name] = figures
    startup = [s for r in runs for s in r.get("startup_s", [])]
    summary["startup_s"] = spread(startup)
    summary["listening_s"] = spread([s for r in runs for s in r.get("listening_s", [])])
    summary["startup_cpu_s"] = spread([s for r in runs for s in r.get("startup_cpu_s", []) if s is not None])
    memory = [r["memory"] for r in runs if "memory" in r]
    for key in ("idle_rss_mib", "queued_rss_mib", "bytes_per_queued_message"):
        summary[key] = spread([m[key] for m in memory if key in m])
    return summary


REFERENCE_EXTRA = {
    "startup_s": (1.33, 7.8, 0.24),
    "idle_rss_mib": (103, 142, 25),
    "bytes_per_queued_message": (2400, 3000, 2400),
    "txn_roundtrip_p50_ms": (1.19, None, None),
    "txn_roundtrip_p99_ms": (2.41, None, None),
}


def _med(d: dict[str, Any] | None) -> float | None:
    return None if d is None else float(d["median"])


def _ms(d: dict[str, Any] | None, scale: float = 1.0, digits: int = 1) -> str:
    if d is None:
        return "n/a"
    return f"{d['median'] * scale:.{digits}f} [{d['min'] * scale:.{digits}f}-{d['max'] * scale:.{digits}f}]"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def report(summary: dict[str, Any], scenarios: list[Scenario]) -> list[str]:
    lines = [
        "figures: median [min-max] over the runs; broker/client CPU in µs per message (per transaction for txn_1, "
        "txn_roundtrip and their raw_ versions); ratio columns: ours/ActiveMQ and proton-example/ours",
        f"{'scenario':22} {'msg/s':>20} {'broker µs':>20} {'client µs':>20} {'p50 ms':>8} {'p99 ms':>8}"
        f" {'AMQ':>6} {'Rabbit':>6} {'proton':>6} {'us/AMQ':>7} {'prot/us':>7}",
    ]
    for scenario in scenarios:
        f = summary["scenarios"][scenario.name]
        broker = _med(f["broker_cpu_us"])
        amq, rabbit, prot = scenario.reference
        ref = [_fmt(x, 1) if x is not None else "-" for x in (amq, rabbit, prot)]
        lines.append(
            f"{scenario.name:22} {_ms(f['rate_per_s'], digits=0):>20} {_ms(f['broker_cpu_us']):>20} "
            f"{_ms(f['client_cpu_us']):>20} {_fmt(_med(f['latency_p50_ms']), 2):>8} "
            f"{_fmt(_med(f['latency_p99_ms']), 2):>8} {ref[0]:>6} {ref[1]:>6} {ref[2]:>6} "
            f"{_ratio(broker, amq):>7} {_ratio(prot, broker):>7}" + (f"  errors: {f['errors']}" if f["errors"] else "")
        )
    lines.append(f"start-up to AMQP open answered: {_ms(summary['startup_s'], 1000)} ms "
                 f"(to the listening line: {_ms(summary['listening_s'], 1000)} ms; broker CPU used by then: "
                 f"{_ms(summary['startup_cpu_s'], 1000)} ms); "
                 f"ActiveMQ 1330, RabbitMQ 7800, proton example 240")  # fmt: skip
    lines.append(f"RSS idle: {_ms(summary['idle_rss_mib'])} MiB; with {MEMORY_MESSAGES} messages queued: "
                 f"{_ms(summary['queued_rss_mib'])} MiB; per queued 256-byte message: "
                 f"{_ms(summary['bytes_per_queued_message'], digits=0)} bytes "
                 f"(ActiveMQ 103 MiB / 2400, RabbitMQ 142 / 3000, proton example 25 / 2400)")  # fmt: skip
    return lines


# Issue 19's bar: ActiveMQ 5.17's best run beside minibroker (same machine, clients, 256-byte bodies), broker CPU per
# message (per transaction for raw_txn_1), each row measured with the client that is not the bottleneck.
ISSUE_19_CPU_US = {
    "raw_txn_1": 150.0,
    "raw_txn_10": 26.0,
    "raw_txn_100": 16.0,
    "raw_txn_accept_100": 16.5,
    "raw_send_presettled": 9.5,
    "raw_send_confirmed": 19.8,
    "send_20_conns": 16.1,
}
ISSUE_19_P50_MS = 0.89
# ... with python-qpid-proton's client, as every latency then (df67daa's README: 1.25 ms p50 with it, 0.48 ms with the
# raw client; the issue's 1.38 ms is the former): the raw client's round trip is under half as long, not comparable.
ISSUE_19_P50_SCENARIO = "txn_roundtrip"
# The same table's minibroker column: the code it measured (df67daa) beside ActiveMQ in that run. This machine's
# speed moves by up to 2x from day to day, and ActiveMQ cannot be run here now (Debian's ActiveMQ has no AMQP
# transport), so the bar that holds on any day is the ratio: ActiveMQ / df67daa then, against this checkout /
# df67daa measured in one run (``--tree`` at df67daa).
ISSUE_19_BASE = "df67daa"
ISSUE_19_BASE_CPU_US = {
    "raw_txn_1": 520.0,
    "raw_txn_10": 84.0,
    "raw_txn_100": 36.5,
    "raw_txn_accept_100": 36.5,
    "raw_send_presettled": 19.6,
    "raw_send_confirmed": 22.5,
    "send_20_conns": 23.3,
}
ISSUE_19_BASE_P50_MS = 1.38
ISSUE_19_LISTENING_S, ISSUE_19_BASE_LISTENING_S = 0.15, 0.29  # (the target; df67daa's 0.27-0.31 s)


def comparison(summary: dict[str, Any], other: dict[str, Any], name: str, scenarios: list[Scenario]) -> list[str]:
    """This checkout's broker CPU and latency beside ``other``'s (another checkout, measured in the same runs)."""
    header = f"{'scenario':22} {'broker µs':>20} {'that broker µs':>20} {'ratio':>6} {'p50 ms':>8} {'that p50':>8}"
    lines = [f"beside {name} (same runs; ratio: this / that)", header]
    for scenario in scenarios:
        ours, theirs = summary["scenarios"][scenario.name], other["scenarios"][scenario.name]
        lines.append(
            f"{scenario.name:22} {_ms(ours['broker_cpu_us']):>20} {_ms(theirs['broker_cpu_us']):>20} "
            f"{_ratio(_med(ours['broker_cpu_us']), _med(theirs['broker_cpu_us'])):>6} "
            f"{_fmt(_med(ours['latency_p50_ms']), 2):>8} {_fmt(_med(theirs['latency_p50_ms']), 2):>8}"
        )
    lines.append(f"listening line: {_ms(summary['listening_s'], 1000)} ms, that {_ms(other['listening_s'], 1000)} ms "
                 f"({_ratio(_med(summary['listening_s']), _med(other['listening_s']))})")  # fmt: skip
    return lines


def targets(summary: dict[str, Any], others: dict[str, tuple[str, dict[str, Any]]] | None = None) -> list[str]:
    """MET / MISSED / n/a for each target; ``others`` (name: (commit, summary) of checkouts measured in the same
    runs) adds issue 19's bar as a ratio when one of them is the code that issue measured."""
    s = summary["scenarios"]

    def broker(name: str) -> float | None:
        return _med(s[name]["broker_cpu_us"]) if name in s else None

    checks: list[tuple[str, float | None, float, str]] = []
    for scenario in SCENARIOS:
        if scenario.name not in s or scenario.unit != "msg" or "txn" in scenario.name:
            continue
        amq, _rabbit, prot = scenario.reference
        value = broker(scenario.name)
        if amq is not None:
            checks.append((f"{scenario.name}: broker CPU ≤ 2x ActiveMQ ({2 * amq:.1f} µs)", value, 2 * amq, "≤"))
        if prot is not None:
            checks.append((f"{scenario.name}: ≥ 4x cheaper than proton example ({prot / 4:.1f} µs)", value,
                           prot / 4, "≤"))  # fmt: skip
    for scenario in SCENARIOS:  # transactions: at or below ActiveMQ itself (issue 19), with either client
        amq = scenario.reference[0]
        if scenario.name in s and "txn" in scenario.name and amq is not None:
            checks.append((f"{scenario.name}: broker CPU ≤ ActiveMQ ({amq} µs)", broker(scenario.name), amq, "≤"))
    for name, client in (("txn_roundtrip", "proton client"), ("raw_txn_roundtrip", "raw client")):
        if name in s:
            checks.append((f"declare+discharge p50 < 1 ms ({client})", _med(s[name]["latency_p50_ms"]), 1.0, "<"))
    for name, limit in ISSUE_19_CPU_US.items():
        if name in s:
            label = f"{name}: broker CPU ≤ ActiveMQ's best run ({limit} µs, issue 19)"
            checks.append((label, broker(name), limit, "≤"))
    p50 = ISSUE_19_P50_SCENARIO
    if p50 in s:
        checks.append((f"declare+discharge p50 ≤ ActiveMQ's ({ISSUE_19_P50_MS} ms, issue 19, proton client)",
                       _med(s[p50]["latency_p50_ms"]), ISSUE_19_P50_MS, "≤"))  # fmt: skip
    for commit, base in (others or {}).values():
        if not commit.startswith(ISSUE_19_BASE):
            continue
        b = base["scenarios"]
        for row, then in ISSUE_19_BASE_CPU_US.items():
            theirs = b.get(row, {}).get("broker_cpu_us")
            if row in s and theirs is not None:
                share = ISSUE_19_CPU_US[row] / then
                limit = share * theirs["median"]
                label = f"{row}: ≤ {share:.2f} x {ISSUE_19_BASE}'s in this run ({limit:.1f} µs; issue 19, as a ratio)"
                checks.append((label, broker(row), limit, "≤"))
        theirs = b.get(p50, {}).get("latency_p50_ms")
        if p50 in s and theirs is not None:
            share = ISSUE_19_P50_MS / ISSUE_19_BASE_P50_MS
            limit = share * theirs["median"]
            checks.append((f"declare+discharge p50 ≤ {share:.2f} x {ISSUE_19_BASE}'s ({limit:.2f} ms; issue 19, as a "
                           "ratio, proton client)", _med(s[p50]["latency_p50_ms"]), limit, "≤"))  # fmt: skip
        if base["listening_s"] is not None:
            share = ISSUE_19_LISTENING_S / ISSUE_19_BASE_LISTENING_S
            limit = share * float(base["listening_s"]["median"])
            checks.append((f"listening line ≤ {share:.2f} x {ISSUE_19_BASE}'s ({limit:.3f} s; issue 19, as a ratio)",
                           _med(summary["listening_s"]), limit, "≤"))  # fmt: skip
    startup = _med(summary["startup_s"])
    checks.append(("process ready < 0.3 s", startup, 0.3, "<"))
    checks.append((f"listening line < {ISSUE_19_LISTENING_S} s (issue 19)", _med(summary["listening_s"]),
                   ISSUE_19_LISTENING_S, "<"))  # fmt: skip
    checks.append(("idle RSS < 40 MiB", _med(summary["idle_rss_mib"]), 40.0, "<"))
    checks.append(("< 1 kB per queued 256-byte message", _med(summary["bytes_per_queued_message"]), 1000.0, "<"))
    lines = []
    for label, value, limit, op in checks:
        if value is None:
            status = "n/a"
        elif value <= limit if op == "≤" else value < limit:
            status = "MET"
        else:
            status = "MISSED"
        lines.append(f"  [{status:6}] {label}: {_fmt(value, 2)}")
    return lines
