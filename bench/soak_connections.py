"""soak's connections scenario: many python-qpid-proton connections at once, each sending to its own queue
and receiving what its neighbour sent, every message checked (see ``run_connections``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.measures import cpu_seconds
from bench.soak_figures import MessageFigures, Probe, RssSampler, record_broker_after


@dataclass(kw_only=True)
class ConnectionsResult(MessageFigures):
    """Figures of one many-connections run."""

    connections: int
    messages_per_connection: int
    opened: int = 0
    misrouted: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        total = self.connections * self.messages_per_connection
        return (
            not self.timed_out
            and not self.errors
            and self.lost == 0
            and self.duplicates == 0
            and self.misrouted == 0
            and self.received == total
            and self.accepted == total
        )


def run_connections(
    url: str,
    connections: int,
    messages: int,
    *,
    prefetch: int = 100,
    time_limit: float = 600.0,
    probe: Probe | None = None,
    progress: Callable[[str], None] | None = None,
) -> ConnectionsResult:
    """``connections`` proton connections at once; connection i sends ``messages`` to queue soak.i and
    receives the ``messages`` that connection i+1 sent to soak.(i+1)."""
    from proton import Message
    from proton.handlers import MessagingHandler
    from proton.reactor import Container, Handler

    result = ConnectionsResult(connections=connections, messages_per_connection=messages)
    total = connections * messages
    sampler = RssSampler(probe.pid, warmup_at=total // 10) if probe is not None else None
    if probe is not None:
        result.broker_before = probe.stats(collect=True)
    cpu_before = cpu_seconds(probe.pid) if probe is not None else 0.0
    sent = [0] * connections
    expected = [0] * connections  # next sequence number receiver i expects
    seen: list[set[int]] = [set() for _ in range(connections)]

    class Call(Handler):
        def __init__(self, callback: Callable[[], None]) -> None:
            super().__init__()
            self.callback = callback

        def on_timer_task(self, event: Any) -> None:
            self.callback()

    class Load(MessagingHandler):
        def __init__(self) -> None:
            super().__init__(prefetch=prefetch, auto_accept=True, auto_settle=True)
            self.container: Any = None
            self.conns: list[Any] = []
            self.tasks: list[Any] = []
            self.finished = False
            self.transports_closed = 0

        def on_start(self, event: Any) -> None:
            container = self.container = event.container
            for i in range(connections):
                conn = container.connect(url, reconnect=False)
                self.conns.append(conn)
                container.create_sender(conn, f"soak.{i}", name=f"s{i}")
                container.create_receiver(conn, f"soak.{(i + 1) % connections}", name=f"r{i}")
            self.tasks.append(container.schedule(time_limit, Call(self.time_out)))
            self.tasks.append(container.schedule(0.25, Call(self.sample)))

        def time_out(self) -> None:
            result.timed_out = True
            self.finish()

        def sample(self) -> None:
            if self.finished:
                return
            if sampler is not None:
                sampler.sample(result.received)
            self.tasks.append(self.container.schedule(0.25, Call(self.sample)))

        def on_connection_opened(self, event: Any) -> None:
            result.opened += 1

        def on_sendable(self, event: Any) -> None:
            i = int(event.link.name[1:])
            sender = event.sender
            while sender.credit and sent[i] < messages:
                sender.send(Message(id=f"{i}:{sent[i]}", body=sent[i]))
                sent[i] += 1
                result.sent += 1

        def on_accepted(self, event: Any) -> None:
            result.accepted += 1
            self.check_done()

        def on_rejected(self, event: Any) -> None:
            result.errors.append(f"rejected on {event.link.name}: {event.delivery.remote.condition}")
            self.finish()

        def on_released(self, event: Any) -> None:
            result.errors.append(f"released on {event.link.name}")
            self.finish()

        def on_message(self, event: Any) -> None:
            i = int(event.link.name[1:])
            result.received += 1
            origin, _, seq_text = str(event.message.id).partition(":")
            seq = int(seq_text)
            if int(origin) != (i + 1) % connections or event.message.body != seq:
                result.misrouted += 1
            elif seq in seen[i]:
                result.duplicates += 1
            else:
                seen[i].add(seq)
            if seq != expected[i]:
                result.out_of_order += 1
            expected[i] = seq + 1
            if progress is not None and result.received % max(1, total // 10) == 0:
                progress(f"  connections: {result.received:,} of {total:,} received")
            self.check_done()

        def check_done(self) -> None:
            if result.received >= total and result.accepted >= total:
                self.finish()

        def finish(self) -> None:
            if self.finished:
                return
            self.finished = True
            result.seconds = time.perf_counter() - started
            if sampler is not None:
                sampler.sample(result.received)  # the end of the run, connections still open
            for task in self.tasks:
                task.cancel()
            for conn in self.conns:
                conn.close()
            # the run ends when every transport is closed, or a few seconds later at most
            self.container.schedule(5.0, Call(self.container.stop))

        def on_transport_closed(self, event: Any) -> None:
            self.transports_closed += 1
            if not self.finished:
                result.errors.append(f"connection lost: {event.transport.condition}")
                self.finish()
            elif self.transports_closed >= len(self.conns):
                self.container.stop()

        def on_transport_error(self, event: Any) -> None:
            if not self.finished:
                result.errors.append(f"transport error: {event.transport.condition}")
                self.finish()

        def on_connection_error(self, event: Any) -> None:
            result.errors.append(f"connection error: {event.connection.remote_condition}")
            self.finish()

        def on_link_error(self, event: Any) -> None:
            result.errors.append(f"link error on {event.link.name}: {event.link.remote_condition}")
            self.finish()

    started = time.perf_counter()
    handler = Load()
    Container(handler).run()
    if not result.seconds:
        result.seconds = time.perf_counter() - started
    result.lost = total - sum(len(s) for s in seen)
    result.messages_per_s = round(result.received / result.seconds) if result.seconds else 0.0
    if probe is not None and sampler is not None:
        record_broker_after(result, probe, sampler, cpu_before)
        result.broker_cpu_us_per_message = round(1e6 * result.broker_cpu_s / max(1, result.received), 1)
    return result
