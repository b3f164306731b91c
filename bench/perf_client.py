"""perf's client process: runs one scenario against a broker and prints its figures as one JSON line.

    python -m bench.perf_client NAME --url HOST:PORT --address QUEUE --sync-address QUEUE --count N
                                [--time-limit S] [--pid PID]

``bench.perf`` starts one for every scenario (``perf_scenarios.spawn_client``), so the client's CPU time
is measured apart from the broker's and from the other scenarios'.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from bench.perf_proton import (
    ConsumeAccept,
    RecvPresettled,
    SendConfirmed,
    SendManyConnections,
    SendPresettled,
    TxnAccept,
    TxnRoundTrip,
    TxnSend,
    run_proton,
)
from bench.perf_raw import raw_consume, raw_send, raw_txn, raw_txn_accept, raw_txn_roundtrip
from bench.perf_scenarios import ClientOptions


def run_client(name: str, opts: ClientOptions) -> dict[str, Any]:
    """In the client process: run one scenario and return its figures."""
    if name == "send_presettled":
        return run_proton(SendPresettled(opts))
    if name == "recv_presettled":
        return run_proton(RecvPresettled(opts))
    if name == "send_confirmed":
        return run_proton(SendConfirmed(opts))
    if name == "consume_accept":
        return run_proton(ConsumeAccept(opts))
    if name == "send_20_conns":
        return run_proton(SendManyConnections(opts))
    if name == "txn_1":
        return run_proton(TxnSend(opts, 1))
    if name == "txn_roundtrip":
        return run_proton(TxnRoundTrip(opts))
    if name == "txn_10":
        return run_proton(TxnSend(opts, 10))
    if name == "txn_100":
        return run_proton(TxnSend(opts, 100))
    if name == "txn_accept_100":
        return run_proton(TxnAccept(opts, 100))
    if name in ("raw_send_presettled", "raw_send_confirmed", "memory_fill"):
        return raw_send(opts, presettled=name != "raw_send_confirmed")
    if name in ("raw_consume_accept", "drain"):
        return raw_consume(opts)
    if name == "raw_txn_roundtrip":
        return raw_txn_roundtrip(opts)
    if name in ("raw_txn_1", "raw_txn_10", "raw_txn_100"):
        return raw_txn(opts, int(name.rpartition("_")[2]))
    if name == "raw_txn_accept_100":
        return raw_txn_accept(opts, 100)
    raise SystemExit(f"unknown scenario {name!r}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.perf_client", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("name", help="the scenario (memory_fill and drain: perf's memory figures)")
    parser.add_argument("--url", required=True)
    parser.add_argument("--address", required=True)
    parser.add_argument("--sync-address", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--pid", type=int)
    args = parser.parse_args(argv)
    opts = ClientOptions(args.url, args.address, args.count, args.time_limit, args.pid, args.sync_address)
    print(json.dumps(run_client(args.name, opts)), flush=True)


if __name__ == "__main__":
    main()
