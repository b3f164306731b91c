"""perf's scenarios with python-qpid-proton's event-driven ``Container`` as the client (which, at 30-200 µs
per message, usually sets the pace); each handler measures its traffic with a ``Meter``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from proton import Message
from proton.handlers import MessagingHandler, TransactionHandler
from proton.reactor import AtMostOnce, Container

from bench.measures import percentile
from bench.perf_scenarios import BODY, ClientOptions, Meter


class _Timer:
    """``container.schedule(delay, _Timer(callback))`` calls ``callback`` after ``delay`` seconds."""

    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback

    def on_timer_task(self, event: Any) -> None:
        self.callback()


class ProtonBench(MessagingHandler):
    """Common parts: the meter, the time limit, a message to send and closing everything at the end."""

    def __init__(self, opts: ClientOptions, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.opts = opts
        self.meter = Meter(opts.pid)
        self.timed_out = False
        self.message = Message(body=BODY)
        self.connections: list[Any] = []
        self.error: str | None = None

    def connect(self, container: Any) -> Any:
        conn = container.connect(self.opts.url, reconnect=False)
        self.connections.append(conn)
        return conn

    def on_start(self, event: Any) -> None:
        self.container = event.container
        self.timer = event.container.schedule(self.opts.time_limit, _Timer(self.on_time_limit))
        self.setup(event.container)

    def setup(self, container: Any) -> None:
        raise NotImplementedError

    def on_time_limit(self) -> None:
        self.timed_out = True
        self.container.schedule(30.0, _Timer(self.give_up))

    def give_up(self) -> None:
        if self.meter.result is None:
            self.error = "no completion 30 s after the time limit"
            self.container.stop()

    def finish(self, count: int, **extra: Any) -> None:
        self.meter.stop(count, timed_out=self.timed_out, **extra)
        self.timer.cancel()
        for conn in self.connections:
            conn.close()
        self.container.stop()

    def on_transport_error(self, event: Any) -> None:
        self.error = f"transport error: {event.transport.condition}"
        event.container.stop()

    def on_connection_error(self, event: Any) -> None:
        self.error = f"connection error: {event.connection.remote_condition}"
        event.container.stop()

    def on_link_error(self, event: Any) -> None:
        self.error = f"link error: {event.link.remote_condition}"
        event.container.stop()

    def on_rejected(self, event: Any) -> None:
        self.error = f"rejected: {event.delivery.remote.condition}"
        event.container.stop()


class SendPresettled(ProtonBench):
    """Pre-settled sends; the last one unsettled, so its ``accepted`` proves the broker took them all."""

    def setup(self, container: Any) -> None:
        self.target = self.opts.count
        self.sent = 0
        self.sender = container.create_sender(self.connect(container), self.opts.address)

    def on_time_limit(self) -> None:
        super().on_time_limit()
        self.target = min(self.target, self.sent + 1)

    def on_sendable(self, event: Any) -> None:
        self.meter.start()
        sender = self.sender
        while sender.credit and self.sent < self.target:
            delivery = sender.send(self.message)
            self.sent += 1
            if self.sent < self.target:
                delivery.settle()

    def on_accepted(self, event: Any) -> None:
        if self.sent == self.target:
            self.finish(self.sent)


class RecvPresettled(ProtonBench):
    """A receiver with snd-settle-mode settled: the broker sends every message pre-settled."""

    def __init__(self, opts: ClientOptions) -> None:
        super().__init__(opts, prefetch=1000)
        self.received = 0

    def setup(self, container: Any) -> None:
        container.create_receiver(self.connect(container), self.opts.address, options=AtMostOnce())

    def on_link_opened(self, event: Any) -> None:
        self.meter.start()

    def on_time_limit(self) -> None:
        super().on_time_limit()
        self.finish(self.received)

    def on_message(self, event: Any) -> None:
        self.received += 1
        if self.received >= self.opts.count:
            self.finish(self.received)


class SyncMixin:
    """A second sender on the same connection: one unsettled message to ``sync_address``, whose
    ``accepted`` shows the broker has handled every frame sent before it on that connection."""

    sync_sender: Any = None
    sync_delivery: Any = None

    def open_sync(self, container: Any, conn: Any, address: str) -> None:
        self.sync_sender = container.create_sender(conn, address, name="bench-sync")

    def send_sync(self, message: Any) -> None:
        self.sync_delivery = self.sync_sender.send(message)


class SendConfirmed(ProtonBench):
    """Unsettled sends, every one ``accepted``; latency from send() to on_accepted."""

    def setup(self, container: Any) -> None:
        self.target = self.opts.count
        self.sent = self.accepted = 0
        self.sent_at: dict[Any, float] = {}
        self.sender = container.create_sender(self.connect(container), self.opts.address)

    def on_time_limit(self) -> None:
        super().on_time_limit()
        self.target = min(self.target, self.sent)
        self.check_done()

    def on_sendable(self, event: Any) -> None:
        self.meter.start()
        sender = self.sender
        while sender.credit and self.sent < self.target:
            delivery = sender.send(self.message)
            self.sent_at[delivery.tag] = time.perf_counter()
            self.sent += 1

    def on_accepted(self, event: Any) -> None:
        self.accepted += 1
        sent = self.sent_at.pop(event.delivery.tag, None)
        if sent is not None:
            self.meter.latencies_ms.append((time.perf_counter() - sent) * 1000)
        self.check_done()

    def check_done(self) -> None:
        if self.accepted >= self.target and self.meter.started:
            self.finish(self.accepted)


class ConsumeAccept(ProtonBench, SyncMixin):
    """A receiver that accepts each message explicitly; then a sync round trip on the same connection."""

    def __init__(self, opts: ClientOptions) -> None:
        super().__init__(opts, prefetch=1000, auto_accept=False)
        self.received = 0
        self.ready = 0

    def setup(self, container: Any) -> None:
        conn = self.connect(container)
        self.open_sync(container, conn, self.opts.sync_address)
        container.create_receiver(conn, self.opts.address)

    def on_link_opened(self, event: Any) -> None:
        self.ready += 1
        if self.ready == 2:
            self.meter.start()

    def on_time_limit(self) -> None:
        super().on_time_limit()
        if self.sync_delivery is None:
            self.send_sync(self.message)

    def on_message(self, event: Any) -> None:
        self.accept(event.delivery)
        self.received += 1
        if self.received == self.opts.count:
            self.send_sync(self.message)

    def on_accepted(self, event: Any) -> None:
        if event.delivery == self.sync_delivery:
            self.finish(self.received)


class SendManyConnections(ProtonBench):
    """``connections`` connections, each sending count/connections unsettled messages, all at once."""

    CONNECTIONS = 20

    def setup(self, container: Any) -> None:
        n = self.CONNECTIONS
        self.per = max(1, self.opts.count // n)
        self.senders = [container.create_sender(self.connect(container), self.opts.address) for _ in range(n)]
        self.sent = dict.fromkeys(self.senders, 0)
        self.target = dict.fromkeys(self.senders, self.per)
        self.ready: set[Any] = set()
        self.accepted = 0

    def on_time_limit(self) -> None:
        super().on_time_limit()
        self.target = dict(self.sent)
        self.check_done()

    def on_sendable(self, event: Any) -> None:
        self.ready.add(event.sender)
        if len(self.ready) < len(self.senders):
            return
        if not self.meter.started:
            self.meter.start()
            for sender in self.senders:
                self.pump(sender)
        else:
            self.pump(event.sender)

    def pump(self, sender: Any) -> None:
        while sender.credit and self.sent[sender] < self.target[sender]:
            sender.send(self.message)
            self.sent[sender] += 1

    def on_accepted(self, event: Any) -> None:
        self.accepted += 1
        self.check_done()

    def check_done(self) -> None:
        if self.meter.started and self.accepted >= sum(self.target.values()):
            self.finish(self.accepted, connections=len(self.senders))


class TxnSend(ProtonBench, TransactionHandler):
    """Transactions of ``per`` messages each (proton's ``Transaction.send``), one after the other;
    latency from declare_transaction() to on_transaction_committed."""

    def __init__(self, opts: ClientOptions, per: int) -> None:
        super().__init__(opts)
        self.per = per
        self.committed = 0
        self.in_txn = 0
        self.transaction: Any = None
        self.declared_at = 0.0

    def setup(self, container: Any) -> None:
        self.conn = self.connect(container)
        self.sender = container.create_sender(self.conn, self.opts.address)

    def on_sendable(self, event: Any) -> None:
        if event.sender == self.sender and not self.meter.started:
            self.meter.start()
            self.declare()
        self.pump()

    def declare(self) -> None:
        self.declared_at = time.perf_counter()
        self.container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event: Any) -> None:
        self.transaction = event.transaction
        self.in_txn = 0
        self.pump()

    def pump(self) -> None:
        txn = self.transaction
        while txn is not None and self.sender.credit and self.in_txn < self.per:
            txn.send(self.sender, self.message)
            self.in_txn += 1
        if txn is not None and self.in_txn == self.per:
            self.transaction = None
            txn.commit()

    def on_transaction_committed(self, event: Any) -> None:
        self.meter.latencies_ms.append((time.perf_counter() - self.declared_at) * 1000)
        self.committed += 1
        if self.committed * self.per >= self.opts.count or self.timed_out:
            self.finish(self.committed * self.per, transactions=self.committed)
        else:
            self.declare()

    def on_transaction_commit_failed(self, event: Any) -> None:
        self.error = "commit failed"
        self.container.stop()

    def on_transaction_declare_failed(self, event: Any) -> None:
        self.error = "declare failed"
        self.container.stop()


class TxnRoundTrip(TxnSend):
    """Empty transactions: declare, and as soon as it is declared, commit; ``count`` of them."""

    def __init__(self, opts: ClientOptions) -> None:
        super().__init__(opts, per=0)
        self.declare_ms: list[float] = []
        self.discharge_ms: list[float] = []

    def on_transaction_declared(self, event: Any) -> None:
        now = time.perf_counter()
        self.declare_ms.append((now - self.declared_at) * 1000)
        self.commit_at = now
        event.transaction.commit()

    def pump(self) -> None:
        pass

    def on_transaction_committed(self, event: Any) -> None:
        now = time.perf_counter()
        self.discharge_ms.append((now - self.commit_at) * 1000)
        self.meter.latencies_ms.append((now - self.declared_at) * 1000)
        self.committed += 1
        if self.committed >= self.opts.count or self.timed_out:
            self.finish(
                self.committed,
                declare_p50_ms=percentile(self.declare_ms, 0.5),
                discharge_p50_ms=percentile(self.discharge_ms, 0.5),
            )
        else:
            self.declare()


class TxnAccept(ProtonBench, TransactionHandler):
    """As proton's tx_recv example: declare, flow ``per`` credit, accept each message in the
    transaction (settled before discharge), commit after ``per``, declare the next."""

    def __init__(self, opts: ClientOptions, per: int) -> None:
        super().__init__(opts, prefetch=0, auto_accept=False)
        self.per = per
        self.committed = 0
        self.in_txn = 0
        self.transaction: Any = None

    def setup(self, container: Any) -> None:
        self.conn = self.connect(container)
        self.receiver = container.create_receiver(self.conn, self.opts.address)

    def on_link_opened(self, event: Any) -> None:
        if event.receiver == self.receiver:
            self.meter.start()
            self.declare()

    def declare(self) -> None:
        self.declared_at = time.perf_counter()
        self.container.declare_transaction(self.conn, handler=self, settle_before_discharge=True)

    def on_transaction_declared(self, event: Any) -> None:
        self.transaction = event.transaction
        self.in_txn = 0
        self.receiver.flow(min(self.per, self.opts.count - self.committed * self.per))

    def on_message(self, event: Any) -> None:
        txn = self.transaction
        txn.accept(event.delivery)
        self.in_txn += 1
        if self.in_txn == self.per or self.committed * self.per + self.in_txn >= self.opts.count:
            self.transaction = None
            self.last_batch = self.in_txn
            txn.commit()

    def on_transaction_committed(self, event: Any) -> None:
        self.meter.latencies_ms.append((time.perf_counter() - self.declared_at) * 1000)
        self.committed += 1
        done = (self.committed - 1) * self.per + self.last_batch
        if done >= self.opts.count or self.timed_out:
            self.finish(done, transactions=self.committed)
        else:
            self.declare()

    def on_transaction_commit_failed(self, event: Any) -> None:
        self.error = "commit failed"
        self.container.stop()


def run_proton(handler: ProtonBench) -> dict[str, Any]:
    Container(handler).run()
    if handler.error:
        raise RuntimeError(handler.error)
    if handler.meter.result is None:
        raise RuntimeError("the scenario did not complete")
    return handler.meter.result
