"""What every soak scenario reads about the broker: a ``Probe`` (its process id and its own stats), its RSS
sampled along the run (``RssSampler``), and its stats once the run's connections are gone (``settled_stats``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from bench.measures import cpu_seconds, peak_rss_kib, rss_kib


class Probe(Protocol):
    """Where figures about the broker come from: its process, and the broker itself."""

    pid: int

    def stats(self, *, collect: bool = False) -> dict[str, Any]: ...


@dataclass
class RssSampler:
    """RSS of the broker's process sampled along a run, against a progress count (messages, cycles).

    Figures: RSS before the run, after warm-up (the first sample at ``warmup_at``), at the end of the run
    (the last sample, taken while the run's connections are still open), after the run's connections
    closed, and the largest sample. Flatness compares the end of the run with the end of warm-up.
    """

    pid: int
    warmup_at: int
    started: float = field(default_factory=time.perf_counter)
    samples: list[tuple[int, float, int]] = field(default_factory=list)  # (progress, seconds, KiB)
    start_kib: int = 0
    warm_kib: int | None = None

    def __post_init__(self) -> None:
        self.start_kib = rss_kib(self.pid)

    def sample(self, progress: int) -> None:
        kib = rss_kib(self.pid)
        self.samples.append((progress, round(time.perf_counter() - self.started, 3), kib))
        if self.warm_kib is None and progress >= self.warmup_at:
            self.warm_kib = kib

    def summary(self, after_close_kib: int) -> dict[str, Any]:
        end = self.samples[-1][2] if self.samples else after_close_kib
        warm = self.warm_kib if self.warm_kib is not None else end
        peak = max([after_close_kib, self.start_kib, *(kib for _, _, kib in self.samples)])
        return {
            "rss_start_kib": self.start_kib,
            "rss_after_warmup_kib": warm,
            "rss_end_kib": end,
            "rss_after_close_kib": after_close_kib,
            "rss_peak_sampled_kib": peak,
            "rss_growth_after_warmup_pct": round(100.0 * (end - warm) / warm, 2) if warm else 0.0,
            "rss_after_close_vs_start_pct": round(100.0 * (after_close_kib - self.start_kib) / self.start_kib, 2),
        }


def settled_stats(probe: Probe, before: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """The broker's stats once every connection and its tasks are gone (or after ``timeout``), after a gc.

    A connection leaves ``broker.connections`` when its close is handled; its task ends a moment later,
    once its socket is flushed and closed: so wait for the trio task count to come back to ``before``'s.
    """
    deadline = time.monotonic() + timeout
    while True:
        stats = probe.stats()
        settled = not stats["connections"] and stats["connection_tasks"] <= 0
        if (settled and stats["trio_tasks"] <= before.get("trio_tasks", 0)) or time.monotonic() > deadline:
            return probe.stats(collect=True)
        time.sleep(0.02)


@dataclass(kw_only=True)
class BrokerFigures:
    """What every soak run records: whether it ran out of time, how long it took, and the broker's CPU, stats
    and memory before and after (``record_broker_after``)."""

    timed_out: bool = False
    seconds: float = 0.0
    broker_cpu_s: float = 0.0
    broker_before: dict[str, Any] = field(default_factory=dict)
    broker_after: dict[str, Any] = field(default_factory=dict)
    rss: dict[str, Any] = field(default_factory=dict)
    rss_samples: list[tuple[int, float, int]] = field(default_factory=list)
    peak_rss_kib: int = 0


@dataclass(kw_only=True)
class MessageFigures(BrokerFigures):
    """A run that moves messages: each one counted where it was sent, answered and received."""

    sent: int = 0
    accepted: int = 0
    received: int = 0
    lost: int = 0
    duplicates: int = 0
    out_of_order: int = 0
    messages_per_s: float = 0.0
    broker_cpu_us_per_message: float = 0.0


def record_broker_after(result: BrokerFigures, probe: Probe, sampler: RssSampler, cpu_before: float) -> None:
    """Once a run is over, into ``result``: the broker's CPU time since ``cpu_before``, its stats once the run's
    connections are gone (``settled_stats``), its RSS now and along the run, and its peak RSS."""
    result.broker_cpu_s = round(cpu_seconds(probe.pid) - cpu_before, 2)
    result.broker_after = settled_stats(probe, result.broker_before)
    result.rss = sampler.summary(rss_kib(probe.pid))
    result.rss_samples = sampler.samples
    result.peak_rss_kib = max(peak_rss_kib(probe.pid), result.rss["rss_peak_sampled_kib"])
