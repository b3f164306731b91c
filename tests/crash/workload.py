"""Crash workload and checker: does every message survive a broker crash exactly as the client was told?

Run as a process (``python -m tests.crash.workload run --url HOST:PORT --log FILE --prefix P``) it connects
to a broker with python-qpid-proton and, until the connection breaks (the broker was killed) or
``--duration`` runs out, it

* sends durable messages unsettled, outside transactions (the broker answers ``accepted`` only once the
  message is on disk);
* declares transactions in which it sends durable messages and accepts messages it received, then
  commits (mostly) or aborts;
* consumes from every queue and from a durable topic subscription, accepting outside transactions (the
  client settles first: the broker never acknowledges that) or holding messages for the next transaction.

Every message carries a unique id (its body, and application property ``id``). Before each action the
client appends what it is about to do to its log (``write`` then ``fsync``, before the action goes out), so
everything that might have reached the broker is in the log; answers and observations are appended as they
come, in order, with the next such write (or within a tick), so the log never claims an answer the client
did not get.

Log lines (one event each, fields separated by spaces)::

    cycle N                       a new workload process (one per broker life) starts
    send-requested ID DEST        an unsettled durable send is about to go out
    sent-accepted ID              ... and the broker answered accepted (acknowledged: must survive)
    send-failed ID STATE          ... and the broker refused it (must not exist)
    txn-declared T                transaction T (our own label) is declared
    txn-send T ID DEST            a durable send in T is about to go out
    txn-accept T ID               a transactional accept of a received message in T is about to go out
    txn-requested T ID...         commit of T is about to go out (outcome unknown yet); IDs: T's sends
    committed T ID...             the commit was accepted (acknowledged: sends must survive, accepts stay
                                  consumed)
    commit-failed T ID...         the commit was refused: T was rolled back
    abort-requested T ID...       rollback of T is about to go out (T must leave no trace)
    aborted T ID...               ... and the broker confirmed it
    received ID SOURCE            a message was delivered to us
    accepting ID                  we are about to accept and settle it outside a transaction
    consumed-settled ID           ... done (the broker does not acknowledge that: a crash may bring it back)
    disconnected REASON           the connection broke; the process ends

``check(log, drained)`` classifies every id against what a fresh client drains from the restarted broker
(see ``Report``). ``run_cycles`` is the whole crash loop: start the broker on a data directory, start the
workload, SIGKILL the broker at a random moment (some brokers die first at a named crash point,
``MINIBROKER_CRASH_AT``), repeat; then drain and check. A process death keeps what the broker wrote (the
page cache survives it) whether or not it was fsynced; the torn-record case is in test_crash.py.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proton import Delivery, Endpoint, Handler, Message
from proton.handlers import MessagingHandler, TransactionHandler
from proton.reactor import Container, DurableSubscription, Transaction

from bench import ROOT
from bench.broker_process import BrokerProcess, readline

QUEUES = ("crash.q0", "crash.q1")
TOPIC = "crash.t"
SUBSCRIPTION = "crash-sub"  # link name of the durable subscription; with CONTAINER_ID it names it
CONTAINER_ID = "minibroker-crash-workload"
DESTINATIONS = (*QUEUES, f"topic://{TOPIC}")
CRASH_POINTS = ("after-write", "before-fsync", "after-fsync")  # minibroker.store.crash.POINTS
CRASH_EXIT_STATUS = 86
TICK = 0.002  # seconds between the workload's decisions
CREDIT = 20  # credit of each of the workload's receivers
MAX_TRANSACTIONS = 3  # open at once


class ClientLog:
    """The client's append-only log.

    ``write`` appends the lines given (after any ``note``-d before them) with one ``os.write`` and then
    ``fsync``s: it is for intentions, which must be in the log before the action goes out. ``note`` only
    buffers: it is for answers and observations, which the next ``write`` or ``flush`` puts out in order
    (a line lost with the process only makes the checker less strict, never wrong).
    """

    def __init__(self, path: str | Path, *, sync: bool = True) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.sync = sync
        self.pending: list[str] = []

    def note(self, line: str) -> None:
        self.pending.append(line)

    def write(self, *lines: str) -> None:
        self.pending.extend(lines)
        self.flush()

    def flush(self) -> None:
        if self.pending:
            data = "".join(line + "\n" for line in self.pending).encode()
            self.pending.clear()
            os.write(self.fd, data)
            if self.sync:
                os.fsync(self.fd)

    def close(self) -> None:
        self.flush()
        os.close(self.fd)


# -- the workload ---------------------------------------------------------------------------------------
class Timer(Handler):  # type: ignore[misc]
    """``container.schedule(delay, Timer(callback))`` calls ``callback`` after ``delay`` seconds."""

    def __init__(self, callback: Any) -> None:
        self.callback = callback

    def on_timer_task(self, event: Any) -> None:
        self.callback()


@dataclass
class _Held:
    """A message received and not yet settled, kept for a transactional accept."""

    delivery: Any
    message_id: str


@dataclass
class _Open:
    """A transaction of the workload, from declare to discharge."""

    label: str
    sends: list[tuple[Any, str]] = field(default_factory=list)  # (delivery, id)
    accepts: list[_Held] = field(default_factory=list)


class Workload(MessagingHandler, TransactionHandler):  # type: ignore[misc]
    """The workload client (see the module docstring). Ends when the connection breaks or time runs out."""

    def __init__(self, url: str, log: ClientLog, prefix: str, seed: int, duration: float) -> None:
        super().__init__(prefetch=0, auto_accept=False)
        self.url = url
        self.log = log
        self.prefix = prefix
        self.rng = random.Random(seed)
        self.deadline = time.monotonic() + duration
        self.container: Any = None
        self.conn: Any = None
        self.senders: dict[str, Any] = {}
        self.numbers = iter(range(1, 1 << 62))
        self.plain: dict[Any, str] = {}  # unsettled plain sends: delivery -> id
        self.held: list[_Held] = []
        self.to_accept: list[_Held] = []
        self.txns: dict[Transaction, _Open] = {}  # declared or being declared, not discharged yet
        self.stopped = False
        self.ready = False

    def next_id(self) -> str:
        return f"{self.prefix}-{next(self.numbers)}"

    # -- set up ------------------------------------------------------------------------------------------
    def on_start(self, event: Any) -> None:
        self.container = event.container
        self.conn = self.container.connect(self.url, reconnect=False)
        # receivers first: the durable subscription exists before anything is sent to its topic
        for queue in QUEUES:
            self.container.create_receiver(self.conn, queue)
        self.container.create_receiver(self.conn, f"topic://{TOPIC}", name=SUBSCRIPTION, options=DurableSubscription())
        for destination in DESTINATIONS:
            self.senders[destination] = self.container.create_sender(self.conn, destination)
        self._schedule()

    def on_link_opened(self, event: Any) -> None:
        if event.link.is_receiver:
            event.link.flow(CREDIT)
        if not self.ready and all(s.state & Endpoint.REMOTE_ACTIVE for s in self.senders.values()):
            self.ready = True
            print("ready", flush=True)

    def _schedule(self) -> None:
        if not self.stopped:
            self.container.schedule(TICK, Timer(self._tick))

    # -- what to do next -------------------------------------------------------------------------------
    def _tick(self) -> None:
        if self.stopped:
            return
        if time.monotonic() > self.deadline:
            self._stop("duration")
            return
        if self.ready:
            self._accept_plain()
            if len(self.txns) < MAX_TRANSACTIONS and self.rng.random() < 0.5:
                self._declare()
            elif len(self.plain) < 32:
                self._send_plain(self.rng.randint(1, 5))
        self.log.flush()
        self._schedule()

    def _message(self, message_id: str) -> Message:
        return Message(id=message_id, body=message_id, durable=True, properties={"id": message_id})

    def _send_plain(self, n: int) -> None:
        batch: list[tuple[str, str]] = []
        for _ in range(n):
            destination = self.rng.choice(DESTINATIONS)
            if self.senders[destination].credit > len(batch):
                batch.append((destination, self.next_id()))
        self.log.write(*(f"send-requested {message_id} {destination}" for destination, message_id in batch))
        for destination, message_id in batch:
            self.plain[self.senders[destination].send(self._message(message_id))] = message_id

    def on_accepted(self, event: Any) -> None:
        message_id = self.plain.pop(event.delivery, None)
        if message_id is not None:
            self.log.note(f"sent-accepted {message_id}")

    def on_rejected(self, event: Any) -> None:
        self._send_failed(event, "rejected")

    def on_released(self, event: Any) -> None:
        self._send_failed(event, "released")

    def _send_failed(self, event: Any, state: str) -> None:
        message_id = self.plain.pop(event.delivery, None)
        if message_id is not None:
            self.log.note(f"send-failed {message_id} {state}")

    # -- transactions --------------------------------------------------------------------------------
    def _declare(self) -> None:
        label = f"{self.prefix}-t{next(self.numbers)}"
        self.txns[self.container.declare_transaction(self.conn, handler=self)] = _Open(label)

    def on_transaction_declared(self, event: Any) -> None:
        txn = event.transaction
        state = self.txns[txn]
        sends = [(self.rng.choice(DESTINATIONS), self.next_id()) for _ in range(self.rng.randint(0, 4))]
        take = self.rng.randint(0, min(3, len(self.held)))
        state.accepts, self.held = self.held[:take], self.held[take:]
        self.log.write(
            f"txn-declared {state.label}",
            *(f"txn-send {state.label} {message_id} {destination}" for destination, message_id in sends),
            *(f"txn-accept {state.label} {held.message_id}" for held in state.accepts),
        )
        state.sends = [(txn.send(self.senders[d], self._message(message_id)), message_id) for d, message_id in sends]
        for held in state.accepts:
            txn.accept(held.delivery)
        self._discharge_when_posted(txn)

    def _discharge_when_posted(self, txn: Transaction) -> None:
        # the discharge must not overtake the transfers (a sender short of credit holds them back)
        if self.stopped:
            return
        state = self.txns[txn]
        if any(d.remote_state == 0 for d, _ in state.sends):
            self.container.schedule(TICK, Timer(lambda: self._discharge_when_posted(txn)))
            return
        ids = " ".join(message_id for _, message_id in state.sends)
        if self.rng.random() < 0.75:
            self.log.write(f"txn-requested {state.label} {ids}".rstrip())
            txn.commit()
        else:
            self.log.write(f"abort-requested {state.label} {ids}".rstrip())
            txn.abort()

    def _discharged(self, txn: Transaction, outcome: str) -> None:
        state = self.txns.pop(txn)
        ids = " ".join(message_id for _, message_id in state.sends)
        self.log.note(f"{outcome} {state.label} {ids}".rstrip())
        for held in state.accepts:  # consumed, or released by proton (abort): room for one more each
            held.delivery.link.flow(1)

    def on_transaction_committed(self, event: Any) -> None:
        if event.delivery.remote_state == Delivery.ACCEPTED:
            self._discharged(event.transaction, "committed")
        else:  # not an acknowledgement: leave the transaction in doubt
            self._stop(f"discharge-state-{event.delivery.remote_state}")

    def on_transaction_aborted(self, event: Any) -> None:
        self._discharged(event.transaction, "aborted")

    def on_transaction_commit_failed(self, event: Any) -> None:
        self._discharged(event.transaction, "commit-failed")

    def on_transaction_declare_failed(self, event: Any) -> None:
        state = self.txns.pop(event.transaction)
        self.log.note(f"txn-declare-failed {state.label}")

    # -- consuming -----------------------------------------------------------------------------------
    def on_message(self, event: Any) -> None:
        message_id = str(event.message.body)
        link = event.receiver
        source = link.name if link.name == SUBSCRIPTION else link.source.address
        self.log.note(f"received {message_id} {source}")
        if self.rng.random() < 0.6 or len(self.held) >= 10:
            self.to_accept.append(_Held(event.delivery, message_id))  # at the next tick, with others
        else:
            self.held.append(_Held(event.delivery, message_id))

    def _accept_plain(self) -> None:
        """Accept (and settle: rcv-settle-mode first) what ``on_message`` chose, after logging it."""
        if not self.to_accept:
            return
        batch, self.to_accept = self.to_accept, []
        self.log.write(*(f"accepting {held.message_id}" for held in batch))
        for held in batch:
            held.delivery.update(Delivery.ACCEPTED)
            held.delivery.settle()
            held.delivery.link.flow(1)
            self.log.note(f"consumed-settled {held.message_id}")

    # -- the end -------------------------------------------------------------------------------------
    def _stop(self, reason: str) -> None:
        if self.stopped:
            return
        self.stopped = True
        self.log.write(f"disconnected {reason}")  # flushes what was noted
        if self.conn is not None:
            self.conn.close()
        if self.container is not None:
            self.container.stop()

    def on_transport_error(self, event: Any) -> None:
        self._stop("transport-error")

    def on_disconnected(self, event: Any) -> None:
        self._stop("disconnected")

    def on_connection_error(self, event: Any) -> None:
        self._stop("connection-error")

    def on_link_error(self, event: Any) -> None:
        condition = event.link.remote_condition
        self._stop(f"link-error:{condition.name if condition else '?'}")

    def on_transport_closed(self, event: Any) -> None:
        self._stop("transport-closed")


def run_workload(url: str, log_path: str | Path, prefix: str, seed: int, duration: float, cycle: int = 0) -> None:
    """Run the workload until the connection breaks or ``duration`` seconds pass."""
    log = ClientLog(log_path)
    log.write(f"cycle {cycle}")
    try:
        Container(Workload(url, log, prefix, seed, duration), container_id=CONTAINER_ID).run()
    finally:
        log.close()


# -- draining a restarted broker -------------------------------------------------------------------------
class Drain(MessagingHandler):  # type: ignore[misc]
    """Consumes (accepting) everything on ``queues`` and, with ``subscription``, the durable subscription."""

    def __init__(self, url: str, queues: Iterable[str], subscription: bool, idle: float, timeout: float) -> None:
        super().__init__(prefetch=500, auto_accept=True)
        self.url = url
        self.queues = list(queues)
        self.subscription = subscription
        self.idle = idle
        self.deadline = time.monotonic() + timeout
        self.ids: list[str] = []
        self.opened = 0
        self.last = time.monotonic()
        self.error = ""
        self.done = False

    def on_start(self, event: Any) -> None:
        self.container = event.container
        self.conn = self.container.connect(self.url, reconnect=False)
        for queue in self.queues:
            self.container.create_receiver(self.conn, queue)
        if self.subscription:
            self.container.create_receiver(
                self.conn, f"topic://{TOPIC}", name=SUBSCRIPTION, options=DurableSubscription()
            )
        self.container.schedule(0.05, Timer(self._check))

    def on_link_opened(self, event: Any) -> None:
        self.opened += 1
        self.last = time.monotonic()

    def on_message(self, event: Any) -> None:
        self.ids.append(str(event.message.body))
        self.last = time.monotonic()

    def _check(self) -> None:
        now = time.monotonic()
        if now > self.deadline:
            self.error = "drain timed out"
            self._finish()
        elif self.opened == len(self.queues) + self.subscription and now - self.last > self.idle:
            self._finish()
        else:
            self.container.schedule(0.05, Timer(self._check))

    def _finish(self) -> None:
        self.done = True
        self.conn.close()  # not the links: closing the subscription's link would delete it
        self.container.stop()

    def on_transport_error(self, event: Any) -> None:
        if not self.done:
            self.error = "transport error while draining"
            self.container.stop()


def drain(
    url: str, queues: Iterable[str] = QUEUES, *, subscription: bool = True, idle: float = 1.0, timeout: float = 30.0
) -> list[str]:
    """Every message id on ``queues`` (and the workload's durable subscription), in the order received;
    consumes them. Ends once nothing arrived for ``idle`` seconds (generous: a loaded machine stalls)."""
    handler = Drain(url, queues, subscription, idle, timeout)
    Container(handler, container_id=CONTAINER_ID).run()
    if handler.error:
        raise RuntimeError(handler.error)
    return handler.ids


# -- the checker ----------------------------------------------------------------------------------------
@dataclass
class _Txn:
    label: str
    cycle: int
    sends: list[str] = field(default_factory=list)
    accepts: list[str] = field(default_factory=list)
    request: str = ""  # "commit" or "abort"
    request_index: int = 0
    outcome: str = ""  # "committed", "aborted", "commit-failed"
    outcome_index: int = 0


@dataclass
class Report:
    """The verdict. Violations: ``lost``, ``unexpected``, ``illegal_duplicates``, ``partial``."""

    cycles: int = 0
    acknowledged: int = 0  # ids whose send was acknowledged (sent-accepted, or their commit accepted)
    in_doubt: int = 0  # ids sent without an answer (the broker may or may not have them)
    consumed: int = 0  # deliveries the workload received
    drained: int = 0  # messages on the broker at the end
    committed: int = 0
    aborted: int = 0
    txn_in_doubt: int = 0
    lost: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    allowed_duplicates: list[str] = field(default_factory=list)
    illegal_duplicates: list[str] = field(default_factory=list)
    partial: list[str] = field(default_factory=list)  # in-doubt transactions that were half applied

    @property
    def ok(self) -> bool:
        return not (self.lost or self.unexpected or self.illegal_duplicates or self.partial)

    def counts(self) -> dict[str, int]:
        return {
            "cycles": self.cycles,
            "acknowledged": self.acknowledged,
            "in_doubt": self.in_doubt,
            "consumed": self.consumed,
            "drained": self.drained,
            "committed_transactions": self.committed,
            "aborted_transactions": self.aborted,
            "in_doubt_transactions": self.txn_in_doubt,
            "lost": len(self.lost),
            "unexpected": len(self.unexpected),
            "allowed_duplicates": len(self.allowed_duplicates),
            "illegal_duplicates": len(self.illegal_duplicates),
            "partial_transactions": len(self.partial),
        }

    def summary(self, limit: int = 10) -> str:
        lines = [json.dumps(self.counts())]
        for name in ("lost", "unexpected", "illegal_duplicates", "partial"):
            items: list[str] = getattr(self, name)
            if items:
                lines.append(f"{name}: {items[:limit]}{' ...' if len(items) > limit else ''}")
        return "\n".join(lines)


def check(log_lines: Iterable[str], drained: Counter[str]) -> Report:
    """Classify every message id of the workload's log against what was ``drained`` after the last restart.

    * send state of an id: acknowledged (``sent-accepted``, or in a ``committed`` transaction), in doubt
      (requested, no answer), or void (refused, aborted, commit failed, or in a transaction never
      discharged);
    * a removal: the client accepted the message; acknowledged only through a ``committed`` transaction
      (a plain accept is settled by the client first, so a crash may bring the message back);
    * an in-doubt transaction is judged by its sends: it happened if any of them was ever seen (received
      or drained), and then all of them must have been, and its accepts count as acknowledged removals;
      if none was seen it did not happen, and its accepts removed nothing.

    lost: acknowledged, never removed, not drained. unexpected: seen but void or never sent.
    illegal duplicate: drained twice; or seen again after an acknowledged removal; or received again in
    the same broker life after a plain accept. allowed duplicate: seen again after a crash that followed a
    plain (unacknowledged) accept. partial: an in-doubt transaction with some but not all sends seen.
    """
    report = Report()
    send_state: dict[str, str] = {}  # id -> "acked" | "doubt" | "void"
    txns: dict[str, _Txn] = {}
    txn_of: dict[str, str] = {}
    receptions: dict[str, list[tuple[int, int]]] = {}  # id -> [(index, cycle)]
    plain_accepts: dict[str, list[tuple[int, int]]] = {}
    cycle = 0
    index = 0
    for index, line in enumerate(log_lines):
        parts = line.split()
        if not parts:
            continue
        event, args = parts[0], parts[1:]
        if event == "cycle":
            cycle = int(args[0])
            report.cycles += 1
        elif event == "send-requested":
            send_state.setdefault(args[0], "doubt")
        elif event == "sent-accepted":
            send_state[args[0]] = "acked"
        elif event == "send-failed":
            send_state[args[0]] = "void"
        elif event == "txn-declared":
            txns[args[0]] = _Txn(args[0], cycle)
        elif event == "txn-send":
            txns[args[0]].sends.append(args[1])
            txn_of[args[1]] = args[0]
        elif event == "txn-accept":
            txns[args[0]].accepts.append(args[1])
        elif event in ("txn-requested", "abort-requested"):
            txn = txns[args[0]]
            txn.request = "commit" if event == "txn-requested" else "abort"
            txn.request_index = index
        elif event in ("committed", "aborted", "commit-failed"):
            txn = txns[args[0]]
            txn.outcome = event
            txn.outcome_index = index
        elif event == "received":
            receptions.setdefault(args[0], []).append((index, cycle))
        elif event == "accepting":
            plain_accepts.setdefault(args[0], []).append((index, cycle))
    end = index + 1
    final_cycle = cycle + 1
    for message_id, n in drained.items():
        receptions.setdefault(message_id, []).extend([(end, final_cycle)] * n)

    def seen(message_id: str) -> bool:
        return bool(receptions.get(message_id))

    # transactions: what their sends are, and which accepts removed messages (and how surely)
    removals: dict[str, list[tuple[int, int, bool]]] = {}  # id -> [(index, cycle, acknowledged)]
    for message_id, accepts in plain_accepts.items():
        removals.setdefault(message_id, []).extend((i, c, False) for i, c in accepts)
    for txn in txns.values():
        if txn.outcome == "committed":
            report.committed += 1
            happened: bool | None = True
            for message_id in txn.sends:
                send_state[message_id] = "acked"
        elif txn.request == "commit" and not txn.outcome:
            report.txn_in_doubt += 1
            seen_sends = [m for m in txn.sends if seen(m)]
            happened = bool(seen_sends) if txn.sends else None
            if seen_sends and len(seen_sends) < len(txn.sends):
                missing = sorted(set(txn.sends) - set(seen_sends))
                report.partial.append(f"{txn.label}: sends {missing} missing, {seen_sends} present")
            for message_id in txn.sends:
                send_state[message_id] = "doubt"
        else:
            report.aborted += txn.request == "abort"
            happened = False
            for message_id in txn.sends:
                send_state[message_id] = "void"
        if happened is not False:
            at = txn.outcome_index if txn.outcome else txn.request_index
            for message_id in txn.accepts:
                removals.setdefault(message_id, []).append((at, txn.cycle, happened is True))

    all_ids = set(send_state) | set(receptions)
    for message_id in sorted(all_ids):
        state = send_state.get(message_id)
        seen_at = sorted(receptions.get(message_id, []))
        report.consumed += sum(1 for i, _ in seen_at if i < end)
        report.drained += drained.get(message_id, 0)
        if state == "acked":
            report.acknowledged += 1
        elif state == "doubt":
            report.in_doubt += 1
        if seen_at and state not in ("acked", "doubt"):
            where = txn_of.get(message_id, "plain")
            report.unexpected.append(f"{message_id} ({state or 'never sent'}, {where})")
            continue
        gone = sorted(removals.get(message_id, []))
        if state == "acked" and not gone and not drained.get(message_id):
            report.lost.append(message_id)
            continue
        if drained.get(message_id, 0) > 1:
            report.illegal_duplicates.append(f"{message_id} (drained {drained[message_id]} times)")
            continue
        illegal = allowed = False
        for i, c, acknowledged in gone:
            for j, d in seen_at:
                if j <= i:
                    continue
                if acknowledged or c == d:
                    illegal = True
                else:
                    allowed = True
        if illegal:
            report.illegal_duplicates.append(f"{message_id} (seen again after an acknowledged removal)")
        elif allowed:
            report.allowed_duplicates.append(message_id)
    return report


def check_file(log_path: str | Path, drained: Counter[str]) -> Report:
    with open(log_path) as handle:
        return check(handle.read().splitlines(), drained)


# -- broker processes and the crash loop ----------------------------------------------------------------
@contextmanager
def broker(data_dir: str | Path | None, **options: Any) -> Iterator[BrokerProcess]:
    """A ``BrokerProcess`` on ``data_dir`` for a ``with`` block, killed (SIGKILL) at its end."""
    process = BrokerProcess(data_dir, **options)
    try:
        yield process
    finally:
        process.kill()


class WorkloadProcess:
    """A workload process, started ahead of its broker (importing proton takes a while): ``go(url)``
    hands it the broker's address."""

    def __init__(self, log_path: Path, prefix: str, seed: int, cycle: int, duration: float = 30.0) -> None:
        command = [
            sys.executable, "-m", "tests.crash.workload", "run", "--url", "-", "--log", str(log_path),
            "--prefix", prefix, "--seed", str(seed), "--cycle", str(cycle), "--duration", str(duration),
        ]  # fmt: skip
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)

    def go(self, url: str, timeout: float = 10.0) -> bool:
        """Start working against ``url``; True once its links are open (False after ``timeout``)."""
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(url + "\n")
        self.proc.stdin.close()
        return readline(self.proc.stdout, timeout).strip() == "ready"

    def finish(self, timeout: float = 10.0) -> None:
        """Wait for it to end by itself (its connection broke), else kill it."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


@dataclass
class CrashRun:
    """What ``run_cycles`` did and found."""

    report: Report
    cycles: int
    seconds: float
    not_ready: int = 0  # cycles whose workload was not under way before the kill
    point_crashes: int = 0  # cycles whose broker died at a named crash point before the SIGKILL


def run_cycles(
    workdir: str | Path,
    cycles: int,
    *,
    seed: int = 0,
    kill_after: tuple[float, float] = (0.05, 0.5),
    crash_points: float = 0.25,
) -> CrashRun:
    """``cycles`` times: start the broker on ``workdir/data``, run the workload, SIGKILL the broker once
    the workload has been at it for a random ``kill_after`` seconds; then restart the broker once more,
    drain it, and check the workload's log (``workdir/client.log``) against what is left.

    A ``crash_points`` share of the brokers also get ``MINIBROKER_CRASH_AT`` (a random point, at one of
    their first 60 journal records), so some deaths fall exactly between a write and its fsync, or
    between the fsync and the answers."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    data_dir = workdir / "data"
    log_path = workdir / "client.log"
    stderr_path = workdir / "broker.stderr"
    rng = random.Random(seed)
    started = time.monotonic()
    not_ready = point_crashes = 0

    def workload(cycle: int) -> WorkloadProcess:
        return WorkloadProcess(log_path, f"c{cycle}", rng.randrange(1 << 30), cycle)

    upcoming = workload(1)
    try:
        for cycle in range(1, cycles + 1):
            current = upcoming
            env = {}
            if rng.random() < crash_points:
                env["MINIBROKER_CRASH_AT"] = f"{rng.choice(CRASH_POINTS)}:{rng.randint(1, 60)}"
            process = BrokerProcess(data_dir, env=env, stderr_path=stderr_path)
            try:
                if not current.go(process.url):
                    not_ready += 1
                upcoming = workload(cycle + 1) if cycle < cycles else current
                with suppress(subprocess.TimeoutExpired):  # it may die at its crash point meanwhile
                    process.proc.wait(rng.uniform(*kill_after))
            finally:
                point_crashes += process.kill() == CRASH_EXIT_STATUS
                current.finish()
    finally:
        upcoming.finish(0)
    with broker(data_dir, stderr_path=stderr_path) as final:
        drained = Counter(drain(final.url))
    seconds = time.monotonic() - started
    return CrashRun(check_file(log_path, drained), cycles, seconds, not_ready, point_crashes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the workload against a broker until the connection breaks")
    run.add_argument("--url", required=True, help="HOST:PORT, or - to read it from the first line of stdin")
    run.add_argument("--log", required=True)
    run.add_argument("--prefix", required=True, help="prefix of message ids (unique per run)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--cycle", type=int, default=0)
    run.add_argument("--duration", type=float, default=30.0)
    checker = commands.add_parser("check", help="drain a (restarted) broker and check it against a log")
    checker.add_argument("--url", required=True)
    checker.add_argument("--log", required=True)
    args = parser.parse_args(argv)
    if args.command == "run":
        url = args.url if args.url != "-" else sys.stdin.readline().strip()  # "-": the driver sends it
        if url:
            with suppress(KeyboardInterrupt):
                run_workload(url, args.log, args.prefix, args.seed, args.duration, args.cycle)
        return 0
    report = check_file(args.log, Counter(drain(args.url)))
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
