"""The cost floor of a Python server for a transaction's requests and answers: how much of minibroker's CPU per
one-message transaction any CPython server, on trio or not, pays before it parses a byte.

    python -m bench.floor [--count 5000] [--rounds 3] [--servers trio,plainsocket,selectors,blocking,minibroker]
    python -m bench.floor --callgrind [--count 400]      # whole-process instructions per transaction instead
    python -m bench.floor --servers minibroker@/tmp/base,minibroker [--think 2000]   # beside another checkout

A one-message transaction as python-qpid-proton runs it is two round trips: a ``transfer`` carrying ``declare``
(answered by a ``disposition`` with ``declared``), then the message's ``transfer`` and the ``transfer`` carrying
``discharge`` in one write (answered by the dispositions of both). The client here sends exactly those bytes
(pre-encoded as proton encodes them: ``bench.perf_scenarios.ENCODED`` for the message, ``bench.proton_wire``
for declare and discharge), waits for the whole answer (its dispositions counted by their
frame headers), and goes on: N transactions, one after the other, on one connection. It drives, each in a process
of its own:

- ``trio``: a trio server that answers each read with pre-recorded answer bytes, parsing nothing: for each request
  ``wait_readable``, ``recv_into`` a reused buffer, one ``send`` (the socket technique of minibroker's plain
  socket path, at its cheapest: one trip through trio's scheduler per request);
- ``plainsocket``: the same, reading with minibroker's own ``PlainSocket`` (``minibroker.server.plainsocket``), so
  the figure moves with that module;
- ``selectors``: the same without trio: a ``selectors`` (epoll) loop, the floor of an event-loop server in CPython;
- ``blocking``: a blocking ``recv_into`` and ``send``, no event loop at all: CPython's floor for a socket echo;
- ``minibroker``: ``python -m minibroker`` of this checkout, answering for real.

The answers the fixed servers send are recorded first from minibroker (its answers to one transaction), so every
server writes the same bytes. What is reported is the server process's CPU (user + system, ``/proc/PID/stat``, as
``bench.perf`` reads it) over the N transactions, per transaction, and its ratio to minibroker's; the servers are
measured in turn, ``--rounds`` times (interleaved, so a change in the machine's load touches them all), and the
median of the rounds is printed. ``--callgrind`` runs ``trio``, ``plainsocket`` and ``minibroker`` under
``valgrind --tool=callgrind`` instead, counters zeroed after a warm-up, and prints the whole process's instructions
per transaction (slow: minibroker runs about 50 times slower under valgrind).

``KIND@DIR`` runs ``minibroker`` or ``plainsocket`` from another checkout (its minibroker package), so a change
compares in one run. ``--think US`` makes the client wait before each request: a client slower than the server,
as python-qpid-proton is. Under callgrind that matters: the server runs 50 times slower and the client does not,
so without it the next request is often there already when the server reads, which natively it seldom is (the
raw replay: three reads in four find nothing); instruction counts of code whose path depends on it (whether a
read waits) are only comparable at the same ``--think``.
"""

from __future__ import annotations

import argparse
import os
import re
import selectors
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench import ROOT
from bench.measures import cpu_seconds

SERVERS = ("trio", "plainsocket", "selectors", "blocking", "minibroker")
CALLGRIND_SERVERS = ("trio", "plainsocket", "minibroker")  # trio's floor, minibroker's reading, minibroker
LISTENING = re.compile(r"(?:floor|minibroker) listening on (?:amqp://)?[\d.]+:(\d+)")
_DISPOSITION = b"\x00\x53\x15"  # the descriptor of a disposition performative (AMQP 1.0 section 2.7.6)
_TXN_MARK = b"\xee" * 16  # stands for the txn-id in the second request (minibroker's are 16 octets)
_BUFFER = 65536


# -- the traffic ------------------------------------------------------------------------------------------------
@dataclass
class Traffic:
    """A one-message transaction's two requests (as python-qpid-proton writes them) for transaction ``i``."""

    setup: bytes
    """The connection's set-up after the AMQP header exchange: ``open``, ``begin``, the coordinator's and the
    queue's sender ``attach``."""

    @staticmethod
    def make() -> Traffic:
        from minibroker.amqp.definitions import Coordinator, Source
        from minibroker.amqp.framing import AMQP_HEADER
        from minibroker.amqp.types import UInt
        from minibroker.testing import frames

        setup = (
            AMQP_HEADER
            + frames.frame(0, frames.open_("bench-floor", max_frame_size=UInt(65536)))
            + frames.frame(0, frames.begin(incoming_window=1 << 20, outgoing_window=1 << 20))
            + frames.frame(0, frames.attach_sender(None, 0, "ctl", target=Coordinator(), source=Source()))
            + frames.frame(0, frames.attach_sender("q", 1, "q"))
        )
        return Traffic(setup)

    @staticmethod
    def requests(i: int) -> tuple[bytes, bytes]:
        """Transaction ``i``'s requests: the declare, then the message and the discharge (with ``_TXN_MARK`` for the
        txn-id the broker declares)."""
        from bench import proton_wire
        from bench.perf_scenarios import ENCODED
        from minibroker.testing import frames

        declare = proton_wire.declare()
        discharge = proton_wire.discharge(_TXN_MARK)
        first = 3 * i
        return (
            frames.frame(0, frames.transfer(0, first), declare),
            frames.raw_frame(body=proton_wire.txn_post(1, first + 1, _TXN_MARK, ENCODED, tag=str(first + 1).encode()))
            + frames.frame(0, frames.transfer(0, first + 2), discharge),
        )


def _dispositions(buffer: bytearray) -> tuple[int, int]:
    """(dispositions among the complete frames at the start of ``buffer``, the octets those frames take)."""
    count = at = 0
    while len(buffer) - at >= 8:
        size = int.from_bytes(buffer[at : at + 4], "big")
        if len(buffer) - at < size:
            break
        body = at + 4 * buffer[at + 4]
        count += buffer[body : body + 3] == _DISPOSITION
        at += size
    return count, at


class Client:
    """One connection replaying transactions and waiting for each whole answer: a blocking socket, frame sizes
    read, nothing decoded (the client's CPU is not what is measured, but it sets the pace)."""

    def __init__(self, port: int, think: float = 0.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.pending = bytearray()
        self.think = think
        """Seconds the client waits before each request (a client slower than the server, as proton is)."""

    def ask(self, request: bytes, dispositions: int) -> bytes:
        """Send ``request``; the answer holding ``dispositions`` dispositions (and any frame before them)."""
        if self.think:
            time.sleep(self.think)
        self.sock.sendall(request)
        pending = self.pending
        while True:
            seen, end = _dispositions(pending)
            if seen >= dispositions:
                break
            data = self.sock.recv(_BUFFER)
            if not data:
                raise ConnectionError("the server closed the connection")
            pending += data
        answer = bytes(pending[:end])
        del pending[:end]
        return answer

    def set_up(self, traffic: Traffic) -> None:
        """The connection's set-up against minibroker: AMQP header, open, begin, two attaches, each link's credit."""
        self.sock.sendall(traffic.setup)
        answer = bytearray()
        while answer.count(b"\x00\x53\x13") < 2:  # both links' flows (credit granted)
            data = self.sock.recv(_BUFFER)
            if not data:
                raise ConnectionError("minibroker closed the connection during set-up")
            answer += data

    def transactions(self, start: int, count: int) -> tuple[bytes, bytes]:
        """Run transactions ``start`` to ``start + count - 1``; the last one's two answers."""
        first_answer = second_answer = b""
        requests = [Traffic.requests(i) for i in range(start, start + count)]  # encoded before the clock starts
        for declare, rest in requests:
            first_answer = self.ask(declare, 1)
            at = first_answer.rfind(b"\xa0\x10")  # the declared txn-id: a vbin8 of 16 octets
            txn_id = first_answer[at + 2 : at + 18] if at >= 0 else _TXN_MARK
            second_answer = self.ask(rest.replace(_TXN_MARK, txn_id), 2)
        return first_answer, second_answer


# -- the fixed servers ----------------------------------------------------------------------------------------
def _listener() -> socket.socket:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    print(f"floor listening on 127.0.0.1:{listener.getsockname()[1]}", flush=True)
    return listener


def serve_blocking(answers: tuple[bytes, bytes]) -> None:
    """One connection at a time, blocking reads: no event loop."""
    listener = _listener()
    buffer = bytearray(_BUFFER)
    while True:
        sock, _ = listener.accept()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        turn = 0
        while sock.recv_into(buffer):
            sock.send(answers[turn])
            turn ^= 1
        sock.close()


def serve_selectors(answers: tuple[bytes, bytes]) -> None:
    """A ``selectors`` loop: readiness from epoll, then ``recv_into`` and one ``send``."""
    listener = _listener()
    listener.setblocking(False)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, None)
    buffer = bytearray(_BUFFER)
    turns: dict[socket.socket, int] = {}
    while True:
        for key, _ in selector.select():
            if key.data is None:
                sock, _ = listener.accept()
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                turns[sock] = 0
                selector.register(sock, selectors.EVENT_READ, True)
                continue
            sock = key.fileobj  # type: ignore[assignment]
            try:
                size = sock.recv_into(buffer)
            except BlockingIOError:
                continue
            if not size:
                selector.unregister(sock)
                del turns[sock]
                sock.close()
                continue
            sock.send(answers[turns[sock]])
            turns[sock] ^= 1


def serve_trio(answers: tuple[bytes, bytes], *, plainsocket: bool) -> None:
    """Each connection a trio task: ``wait_readable``, ``recv_into``, one ``send`` per request (or minibroker's
    ``PlainSocket`` reading, with ``plainsocket``)."""
    import trio

    from minibroker.server.plainsocket import PlainSocket

    async def fixed(stream: trio.SocketStream) -> None:
        fd = stream.socket.fileno()
        sock = socket.socket(fileno=fd)  # the same descriptor (as PlainSocket does): detached before trio closes it
        sock.setblocking(False)
        buffer = bytearray(_BUFFER)
        turn = 0
        try:
            while True:
                await trio.lowlevel.wait_readable(fd)
                if not sock.recv_into(buffer):
                    return
                sock.send(answers[turn])
                turn ^= 1
        finally:
            sock.detach()

    async def plain(stream: trio.SocketStream) -> None:
        reader = PlainSocket.of(stream)
        assert reader is not None
        turn = 0
        try:
            while await reader.receive(None):
                reader.send(answers[turn])
                turn ^= 1
        finally:
            reader.detach()

    async def main() -> None:
        listener = trio.socket.from_stdlib_socket(_listener())
        await trio.serve_listeners(plain if plainsocket else fixed, [trio.SocketListener(listener)])

    trio.run(main)


# -- running and measuring ------------------------------------------------------------------------------------
class Server:
    """One server in a process of its own (under callgrind with ``callgrind_out``)."""

    def __init__(
        self, name: str, answers_file: Path | None, callgrind_out: Path | None = None, think: float = 0.0
    ) -> None:
        self.name = name
        kind, _, tree = name.partition("@")  # KIND@DIR: minibroker (or PlainSocket) of another checkout
        self.kind = kind
        root = Path(tree).resolve() if tree else ROOT
        if kind == "minibroker":
            command = [sys.executable, "-m", "minibroker", "--host", "127.0.0.1", "--port", "0"]
            command += ["--log-level", "warning"]
        else:
            command = [sys.executable, "-m", "bench.floor", "--serve", kind, "--answers", str(answers_file)]
            command += ["--tree", str(root)]
        if callgrind_out is not None:
            command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={callgrind_out}", *command]
        env = {**os.environ, "PYTHONPATH": str(root if kind == "minibroker" else ROOT)}  # (bench.floor is ours)
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     cwd=root if kind == "minibroker" else ROOT, env=env)  # fmt: skip
        self.pid = self.proc.pid
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        match = LISTENING.search(line)
        if match is None:
            self.proc.kill()
            raise RuntimeError(f"{kind} did not start: {line!r}")
        self.port = int(match.group(1))
        self.client = Client(self.port, think)
        if kind == "minibroker":
            self.client.set_up(Traffic.make())
        self.done = 0

    def run(self, count: int) -> float:
        """Run ``count`` transactions; the server's CPU seconds meanwhile."""
        before = cpu_seconds(self.pid)
        answers = self.client.transactions(self.done, count)
        spent = cpu_seconds(self.pid) - before
        self.done += count
        if self.kind == "minibroker":
            check_answers(*answers)  # committed for real, not rejected
        return spent

    def stop(self) -> None:
        self.client.sock.close()
        self.proc.send_signal(2)  # SIGINT: minibroker and valgrind write what they hold
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        assert self.proc.stdout is not None
        self.proc.stdout.close()


def record(answers_file: Path) -> None:
    """minibroker's answers to one transaction, written to ``answers_file`` (two length-prefixed blocks)."""
    server = Server("minibroker", None)
    try:
        server.client.transactions(0, 50)  # past the first credit and window top-ups
        first, second = server.client.transactions(50, 1)
        server.done = 51
    finally:
        server.stop()
    check_answers(first, second)
    answers_file.write_bytes(struct.pack(">I", len(first)) + first + second)


def check_answers(first: bytes, second: bytes) -> None:
    """The answers are what a committed transaction gets: declared, then the message's transactional state and the
    discharge's accepted (``RuntimeError`` otherwise: the traffic is wrong)."""
    from minibroker.amqp.definitions import Accepted, Declared, Disposition, TransactionalState
    from minibroker.testing.client import parse_frames

    states = [f.performative.state for f in parse_frames(first + second) if isinstance(f.performative, Disposition)]
    kinds = [type(state) for state in states]
    if kinds != [Declared, TransactionalState, Accepted]:
        raise RuntimeError(f"unexpected answers to a transaction: {states}")


def load_answers(answers_file: Path) -> tuple[bytes, bytes]:
    data = answers_file.read_bytes()
    (size,) = struct.unpack(">I", data[:4])
    return data[4 : 4 + size], data[4 + size :]


def measure(kinds: list[str], count: int, rounds: int, answers_file: Path, think: float) -> None:
    """Each server's CPU per transaction, ``rounds`` interleaved runs of ``count``; medians and ratios printed."""
    servers = [Server(kind, answers_file, think=think) for kind in kinds]
    try:
        for server in servers:
            server.run(max(count // 10, 100))  # warm-up: imports done, caches filled
        figures: dict[str, list[float]] = {kind: [] for kind in kinds}
        for _ in range(rounds):
            for server in servers:
                figures[server.name].append(server.run(count) / count * 1e6)
    finally:
        for server in servers:
            server.stop()
    load = os.getloadavg()
    print(f"server CPU per one-message transaction, median of {rounds} rounds of {count} "
          f"(load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; bench.measures.cpu_seconds)")  # fmt: skip
    base = statistics.median(figures["minibroker"]) if "minibroker" in figures else None
    for kind in kinds:
        median = statistics.median(figures[kind])
        rounds_text = " ".join(f"{x:.1f}" for x in figures[kind])
        ratio = f"{median / base:6.3f} of minibroker" if base else ""
        print(f"  {kind:28} {median:8.1f} µs   {ratio}   (rounds: {rounds_text})")


def callgrind(kinds: list[str], count: int, answers_file: Path, think: float) -> None:
    """Whole-process instructions per transaction under callgrind (counters zeroed after a warm-up)."""
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="floor-cg-") as folder:
        for index, kind in enumerate(kinds):
            out = Path(folder) / f"{index}.out"
            server = Server(kind, answers_file, callgrind_out=out, think=think)
            try:
                server.run(100)
                subprocess.run(["callgrind_control", "-z", str(server.pid)], check=True, capture_output=True)
                server.run(count)
                subprocess.run(["callgrind_control", "-d", str(server.pid)], check=True, capture_output=True)
            finally:
                server.stop()
            dumps = sorted(Path(folder).glob(f"{index}.out*"), key=lambda p: p.stat().st_mtime)
            totals = [_total(path) for path in dumps if path.name != out.name]
            results[kind] = (totals[0] if totals else _total(out)) / count
    base = results.get("minibroker")
    print(f"whole-process instructions per one-message transaction (callgrind, {count} transactions after 100, "
          f"client thinking {think * 1e6:.0f} µs)")  # fmt: skip
    for kind, value in results.items():
        ratio = f"{value / base:6.3f} of minibroker" if base else ""
        print(f"  {kind:28} {value:12,.0f}   {ratio}")


def _total(path: Path) -> int:
    """The instruction total of a callgrind dump."""
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {path}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=5000, help="transactions per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--servers", default=",".join(SERVERS))
    parser.add_argument("--callgrind", action="store_true", help="instruction counts of trio, plainsocket, minibroker")
    parser.add_argument("--serve", choices=SERVERS[:-1], help=argparse.SUPPRESS)
    parser.add_argument("--think", type=float, default=0.0, help="µs the client waits before each request")
    parser.add_argument("--answers", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        sys.path.insert(0, args.tree)  # (PlainSocket from that checkout)
        answers = load_answers(args.answers)
        if args.serve == "blocking":
            serve_blocking(answers)
        elif args.serve == "selectors":  # (the servers run until SIGINT)
            serve_selectors(answers)
        else:
            serve_trio(answers, plainsocket=args.serve == "plainsocket")
        return
    with tempfile.TemporaryDirectory(prefix="floor-") as folder:
        answers_file = Path(folder) / "answers"
        record(answers_file)
        if args.callgrind:
            kinds = [k for k in args.servers.split(",") if k.partition("@")[0] in CALLGRIND_SERVERS]
            callgrind(kinds, args.count, answers_file, args.think / 1e6)
        else:
            measure(args.servers.split(","), args.count, args.rounds, answers_file, args.think / 1e6)


if __name__ == "__main__":
    main()
