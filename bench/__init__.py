"""minibroker's benchmarks, run from the checkout as ``python -m bench.NAME`` (each prints ``--help``).

Commands (see bench/README.md):

* ``perf``: broker CPU per message, throughput, latency, start-up and memory, against reference brokers;
  its client process is ``perf_client``, its scenarios ``perf_proton`` (python-qpid-proton) and
  ``perf_raw`` (raw sockets), ``perf_scenarios`` the table of them, ``perf_report`` the summary and
  targets, ``perf_profile`` the py-spy profiles;
* ``soak``: many connections (``soak_connections``), a million messages through one queue
  (``soak_throughput``), connection churn (``soak_churn``) and ``attacks``, with ``soak_figures`` for what
  all of them read about the broker;
* ``amqp091``: AMQP 0-9-1 beside AMQP 1.0 (confirms, transactions, consume) with ``raw091``'s 0-9-1 client;
* ``startup``, ``roundtrip``, ``crash``, ``cost``, ``floor``: one program each.

Shared by all of them: ``broker_process`` (minibroker as a subprocess; ``introspect`` is the broker
program that also answers questions about itself), ``measures`` (/proc readers, percentiles) and
``raw`` (the raw-socket AMQP clients).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
"""The checkout these benchmarks belong to (its minibroker is the one measured)."""
