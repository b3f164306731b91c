"""Deterministic cost of the broker core and engine: machine instructions per operation, under callgrind.

    python -m bench.cost [--tree DIR ...] [--scenarios presettled_send,presettled_receive,txn_one]

CPU time on a shared machine moves by tens of per cent from run to run; instruction counts do not (the same
binary, input and environment give the same count, whatever else the machine does). Each scenario drives an
engine wired to a ``Broker`` in process, with no sockets and no trio, and is run under ``valgrind
--tool=callgrind`` at two sizes; the difference, divided by the difference in operations, is the cost of one
operation with start-up cancelled out. The same run with the broker switched off (frames built, not fed)
gives the cost of building the client's frames, which is subtracted. ``--tree`` measures another checkout
(say, the commit before a change) beside this one, in one run, so the two figures compare directly.

Scenarios: ``presettled_send`` (one pre-settled 256-byte transfer into a queue), ``presettled_receive`` (the
same, then sent on to a consumer that takes it pre-settled), ``txn_one`` (declare, one transactional post,
commit: three requests), ``txn_roundtrip`` (declare, then commit an empty transaction), ``txn_10`` (declare, ten
transactional posts, commit), ``txn_accept_100`` (declare, flow 100, accept each of the 100 deliveries in the
transaction unsettled, commit, then settle them in one ranged disposition: not what ``bench.perf``'s
``txn_accept_100`` sends, whose transaction settles each accept with it, ``settle_before_discharge``). Each
transactional figure is per transaction; the coordinator messages, transactional posts and accepts are encoded
as python-qpid-proton encodes them (``bench.proton_wire``), the transfers carrying a declare or a discharge, and
the flows, by minibroker's codec (kept so, that the figures stay comparable with earlier runs). Needs Debian's
valgrind.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SIZES = {
    "presettled_send": (400, 2400),
    "presettled_receive": (300, 2400),
    "txn_one": (20, 220),
    "txn_roundtrip": (20, 220),
    "txn_10": (5, 45),
    "txn_accept_100": (2, 12),
}


def _drive(scenario: str, n: int, build_only: bool) -> None:
    """Run ``scenario`` ``n`` times against an in-process broker (``build_only``: make the frames only)."""
    # (this file's directory, not the measured checkout's ``bench``: ``--drive`` runs it as a script, first on sys.path)
    import proton_wire

    from minibroker.amqp.definitions import Coordinator, Source
    from minibroker.amqp.framing import AMQP_HEADER
    from minibroker.amqp.types import UInt
    from minibroker.broker.core import Broker
    from minibroker.engine.connection import ServerConnection
    from minibroker.testing import frames

    body = frames.message("x" * 256)
    message = proton_wire.message(b"x" * 256)
    broker = Broker()
    conn = ServerConnection()
    broker.connection_made(conn)

    receive = getattr(conn, "receive_events", conn.receive_data)  # (older checkouts took whole reads)

    def feed(data: bytes) -> None:
        if not build_only:
            broker.handle(conn, receive(data, 0.0), 0.0)
            conn.data_to_send()
            broker.take_dirty()

    def transfers(count: int, handle: int = 0) -> list[bytes]:  # 400 a read: the credit the broker tops up
        frame = frames.frame
        return [
            b"".join(frame(0, frames.transfer(handle, i, settled=True), body) for i in range(j, min(count, j + 400)))
            for j in range(0, count, 400)
        ]

    def grant(handle: int, got: int, credit: int, next_outgoing: int) -> None:
        """Give receiving link ``handle`` ``credit`` after ``got`` deliveries (a flow; the windows left wide)."""
        flow = frames.flow(
            next_incoming_id=got,
            incoming_window=1 << 30,
            next_outgoing_id=next_outgoing,
            outgoing_window=1 << 30,
            handle=handle,
            delivery_count=got,
            link_credit=credit,
        )
        feed(frames.frame(0, flow))

    feed(AMQP_HEADER + frames.frame(0, frames.open_()) + frames.frame(0, frames.begin(incoming_window=1 << 30)))
    if scenario in ("presettled_send", "presettled_receive"):
        feed(frames.frame(0, frames.attach_sender("q", 0)))
        for chunk in transfers(n):
            feed(chunk)
        if scenario == "presettled_receive":
            feed(frames.frame(0, frames.attach_receiver("q", 1, snd_settle_mode=UInt(1))))
            for got in range(0, n, 300):  # 300 at a time: the engine stops at 1 MiB of output nobody read
                grant(1, got, 300, next_outgoing=n)
        return
    feed(frames.frame(0, frames.attach_sender(None, 0, "ctl", target=Coordinator(), source=Source())))
    feed(frames.frame(0, frames.attach_sender("q", 1)))
    declare = proton_wire.declare()
    next_id = 0  # the client's next delivery-id (one sequence for the session's transfers)

    def post(handle: int, payload: bytes, **fields: Any) -> None:
        nonlocal next_id
        feed(frames.frame(0, frames.transfer(handle, next_id, **fields), payload))
        next_id += 1

    def post_in(txn_id: bytes) -> None:
        nonlocal next_id
        feed(frames.raw_frame(body=proton_wire.txn_post(1, next_id, txn_id, message, tag=str(next_id).encode())))
        next_id += 1

    if scenario == "txn_accept_100":  # a queue deep enough for the larger run, filled the same in both runs
        for chunk in transfers(100 * SIZES[scenario][1], handle=1):
            feed(chunk)
        next_id = 100 * SIZES[scenario][1]
        feed(frames.frame(0, frames.attach_receiver("q", 2)))
    per_txn = {"txn_one": 1, "txn_roundtrip": 0, "txn_10": 10, "txn_accept_100": 0}[scenario]
    for i in range(n):
        txn_id = (i + 1).to_bytes(8, "big")  # the broker's default ids count from 1
        post(0, declare)
        for _ in range(per_txn):
            post_in(txn_id)
        if scenario == "txn_accept_100":
            got = 100 * i
            grant(2, got, 100, next_outgoing=next_id)
            for d in range(got, got + 100):
                feed(frames.raw_frame(body=proton_wire.txn_accept(d, txn_id, settled=False)))
        post(0, proton_wire.discharge(txn_id))
        if scenario == "txn_accept_100":
            feed(frames.frame(0, frames.disposition(100 * i, 100 * i + 99)))


def _instructions(tree: Path, scenario: str, n: int, build_only: bool) -> int:
    argv = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        __file__,
        "--drive",
        scenario,
        str(n),
        *(["--build-only"] if build_only else []),
    ]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    result = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, check=True)
    from bench.measures import callgrind_instructions  # (here, not at the top: ``--drive`` runs under another tree)

    return callgrind_instructions(result.stderr)


def _per_operation(tree: Path, scenario: str, build_only: bool = False) -> float:
    low, high = SIZES[scenario]
    return (_instructions(tree, scenario, high, build_only) - _instructions(tree, scenario, low, build_only)) / (
        high - low
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", type=Path, default=[], help="another checkout to measure too")
    parser.add_argument("--scenarios", default=",".join(SIZES))
    parser.add_argument("--drive", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.drive:
        _drive(args.drive[0], int(args.drive[1]), args.build_only)
        return
    trees = [ROOT, *[tree.resolve() for tree in args.tree]]
    print(f"{'scenario':20} " + " ".join(f"{str(t)[-28:]:>28}" for t in trees) + "   (instructions per operation)")
    for scenario in args.scenarios.split(","):
        frames_cost = _per_operation(ROOT, scenario, build_only=True)
        costs = [_per_operation(tree, scenario) - frames_cost for tree in trees]
        ratios = "" if len(costs) < 2 else "   this / first --tree: " + f"{costs[0] / costs[1]:.3f}"
        print(f"{scenario:20} " + " ".join(f"{c:28,.0f}" for c in costs) + ratios)


if __name__ == "__main__":
    main()
