"""The gateway: one AMQP 0-9-1 client served through an AMQP 1.0 connection to the broker core.

Theory of operation
-------------------
The client's bytes go to a 0-9-1 engine (``amqp091.engine``, sans-IO), whose events the gateway turns into AMQP
1.0 work on an *inner* connection: an ordinary ``ServerConnection`` the broker serves like any other, fed by an
in-process 1.0 client (``inner.InnerClient``). So everything the broker does for 1.0 clients holds for 0-9-1 ones:
users and permissions (the client's credentials go to the inner connection as SASL PLAIN), namespaces (a vhost is a
namespace), transactions (a channel transaction is a 1.0 transaction, in ``broker.transactions``), journaling,
faults, virtual time, inspection. What 1.0 has no words for (exchanges, bindings, queue arguments) is asked of the
broker's RabbitMQ model directly (``declare.py``).

The gateway is the connection task's *wire* (``server.connection.Wire``): the task reads the socket into
``receive_events`` and writes what ``data_to_send`` returns, and hands the broker the inner connection. Work for the
broker goes through ``to_broker`` (set by the server: the task's step), at once, so one 0-9-1 read is one broker
step. ``pump`` moves bytes between the in-process client and the inner connection until neither has anything more
to say; it stops taking the inner connection's output while a megabyte of 0-9-1 output waits for the client, so a
client that does not read holds the broker's deliveries back as a 1.0 peer would.

Each channel is an inner session of the same number; its commands run in order (``channel.py``): publishing,
confirms and channel transactions are ``publish.py``'s, consumers, ``basic.get`` and acknowledgements
``consume.py``'s, the exchange and queue methods ``declare.py``'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from itertools import count
from typing import Any

from minibroker.amqp.definitions import Error
from minibroker.amqp091 import events as e091
from minibroker.amqp091.definitions import ConnectionOpen, ReplyCode
from minibroker.amqp091.engine import Connection091
from minibroker.amqp091.errors import ProtocolError
from minibroker.broker.rabbit import RabbitError, RabbitModel
from minibroker.engine.connection import ServerConnection
from minibroker.engine.events import Event
from minibroker.engine.sasl import SaslPolicy
from minibroker.gateway091 import consume, declare, publish
from minibroker.gateway091 import inner as i10
from minibroker.gateway091.channel import Channel, Command

log = logging.getLogger("minibroker.amqp091")
_HOLD = 1 << 20
"""Bytes of 0-9-1 output waiting for the client past which the gateway stops taking the broker's output."""

Handler = Callable[["Gateway", Channel, Command], None]
_HANDLERS: dict[type[Any], Handler] = {**declare.HANDLERS, **publish.HANDLERS, **consume.HANDLERS}


def _nothing(answer: object) -> None:
    """What a wait that needs no answer does with it."""


def _no_broker(events: Iterable[Event]) -> None:  # pragma: no cover - the server sets ``to_broker`` first
    raise RuntimeError("the gateway's to_broker is not set")


class Gateway:
    """The wire of one AMQP 0-9-1 connection (see the module's docstring)."""

    def __init__(
        self,
        engine: Connection091,
        inner: ServerConnection,
        model: RabbitModel,
        clock: Callable[[], float],
        *,
        tags: Iterator[str] | None = None,
    ) -> None:
        self.engine = engine
        """The 0-9-1 engine: the client's side."""
        self.inner = inner
        """The AMQP 1.0 connection the broker serves for this client."""
        self.client = i10.InnerClient(container_id=f"amqp091-{inner.conn_id}")
        """What speaks AMQP 1.0 to ``inner``."""
        self.model = model
        self.clock = clock
        self.to_broker: Callable[[Iterable[Event]], None] = _no_broker
        """Hands the inner connection's events to the broker (one broker step); set by the server."""
        self.channels: dict[int, Channel] = {}
        self.tags = tags if tags is not None else (f"amq.ctag-{inner.conn_id}-{n}" for n in count(1))
        """Server-generated consumer tags."""
        self._closing_inner = False
        self.user = ""
        """Who the client logged in as (a publish's ``user_id`` must be this, as RabbitMQ checks it)."""

    # -- the wire (``server.connection.Wire``) --------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.engine.finished

    @property
    def has_output(self) -> bool:
        return self.engine.has_output or (self.inner.has_output and self.engine.output_size < _HOLD)

    @property
    def output_size(self) -> int:
        """The 0-9-1 output waiting for the client and, once that is past ``_HOLD`` (so the broker's output, and its
        credit, are no longer taken), the client's publishes held for credit meanwhile: the I/O layer stops reading
        a client past a point, so a publisher that reads nothing (its returns, say) cannot make us buffer without
        bound (RabbitMQ's TCP back-pressure)."""
        size = self.engine.output_size
        if size >= _HOLD:
            size += self.client.held_size()
        return size

    @property
    def awaiting_verdict(self) -> bool:
        return self.inner.awaiting_verdict

    @property
    def authentication_failed(self) -> bool:
        return self.inner.authentication_failed

    @property
    def sasl(self) -> SaslPolicy:
        return self.inner.sasl

    def receive_events(self, data: bytes | bytearray, now: float) -> Iterable[Event]:
        self._engine_events(self.engine.receive_data(data, now))
        self.pump(now)
        return ()

    def resume_events(self, now: float) -> Iterable[Event]:
        self.to_broker(self.inner.resume_events(now))
        self.pump(now)
        return ()

    def handle_timeout(self, now: float) -> Iterable[Event]:
        self._engine_events(self.engine.handle_timeout(now))
        deadline = self.inner.next_deadline()
        if deadline is not None and deadline <= now:
            self.to_broker(self.inner.handle_timeout(now))
        self.pump(now)
        return ()

    def next_deadline(self) -> float | None:
        deadlines = [d for d in (self.engine.next_deadline(), self.inner.next_deadline()) if d is not None]
        return min(deadlines) if deadlines else None

    def data_to_send(self) -> bytes:
        self.pump(self.clock())
        return self.engine.data_to_send()

    def take_throttled(self) -> bool:
        return self.inner.take_throttled()

    def take_credentials(self) -> tuple[str, str]:
        return self.inner.take_credentials()

    def sasl_verdict(self, ok: bool) -> None:
        self.inner.sasl_verdict(ok)

    def close(self, err: Error | None = None) -> None:
        """Close both sides (an internal error: 541 to the client, the error to the broker)."""
        text = "INTERNAL_ERROR" if err is None or not err.description else f"INTERNAL_ERROR - {err.description}"
        if not self.engine.finished:
            self.engine.close(ReplyCode.INTERNAL_ERROR, text)
        self.inner.close(err)

    def take_events(self) -> list[Event]:
        return self.inner.take_events()

    # -- moving bytes between the in-process client and the inner connection ---------------------------------
    def pump(self, now: float) -> None:
        """Until neither side has more to say: the client's 1.0 frames to the inner connection (and its events to
        the broker), the inner connection's frames to the client (while the 0-9-1 output is below ``_HOLD``)."""
        client, inner = self.client, self.inner
        while True:
            if self._flush(now):
                continue
            if inner.has_output and self.engine.output_size < _HOLD:
                for event in client.receive_data(inner.data_to_send()):
                    self._inner_event(event)
                for channel in list(self.channels.values()):
                    if channel.confirmed:
                        publish.send_confirms(self, channel)
                    if (
                        channel.waiting is not None
                        and channel.waiting.kind == "sent"
                        and not client.holding(channel.number)
                    ):
                        channel.resolve("sent", 0, None)
                        self.run(channel)
                continue
            if self.engine.finished and not inner.finished and not self._closing_inner:
                self._closing_inner = True  # the client is gone: so is the inner connection's peer
                self.to_broker(inner.receive_events(b"", now))
                continue
            return

    def _flush(self, now: float) -> bool:
        """Give what the in-process client has written to the inner connection (one broker step); False when it
        had nothing (or the inner connection is gone)."""
        data = self.client.data_to_send()
        if not data or self.inner.finished:
            return False
        self.to_broker(self.inner.receive_events(data, now))
        return True

    # -- the client's events ---------------------------------------------------------------------------------
    def _engine_events(self, events: Iterable[e091.Event]) -> None:
        for event in events:
            if isinstance(event, e091.CommandReceived):
                channel = self.channels.get(event.channel)
                if channel is not None:
                    channel.backlog.append(Command(event.method, event.properties, event.body))
                    self.run(channel)
            elif isinstance(event, e091.CredentialsReceived):
                user, password = self.engine.take_credentials()
                self.user = user
                self.client.sasl(user, password)
            elif isinstance(event, e091.OpenRequested):
                self._open(event.vhost)
            elif isinstance(event, e091.ChannelOpened):
                self.channels[event.channel] = Channel(event.channel)
                self.client.begin(event.channel)
            elif isinstance(event, e091.ChannelClosed):
                self.drop_channel(event.channel)
            elif isinstance(event, e091.FlowRequested):
                channel = self.channels.get(event.channel)
                if channel is not None:
                    channel.flow_active = event.active
                    consume.grant(self, channel)
            elif isinstance(event, e091.ConnectionClosed) and not self.inner.finished and not self._closing_inner:
                self._closing_inner = True
                self.client.close()

    def _open(self, vhost: str) -> None:
        """connection.open: the vhost is a namespace ("/" the listener's own)."""
        hostname = None if vhost in ("", "/") else vhost
        if hostname is not None and not self.model.vhost_exists(hostname):
            # rabbit_reader.erl names the method an error of connection.open came from
            text = f"NOT_ALLOWED - vhost {vhost} not found"
            self.engine.close(ReplyCode.NOT_ALLOWED, text, ConnectionOpen.CLASS_ID, ConnectionOpen.METHOD_ID)
            return
        self.client.open(hostname)

    def after_publishes(self, channel: Channel, command: Command) -> bool:
        """True when the publishes sent on the channel before ``command`` have reached the broker; else hold
        ``command`` until they have (its answer must see them, as RabbitMQ's channel routes a publish before it
        reads the next method)."""
        self._flush(self.clock())  # what the client wrote is not the broker's yet
        if not self.client.holding(channel.number):
            return True
        channel.wait("sent", 0, _nothing, command)
        return False

    def run(self, channel: Channel) -> None:
        """Run the channel's commands in order, until one waits for the broker."""
        while channel.backlog and channel.waiting is None and self.channels.get(channel.number) is channel:
            command = channel.backlog.popleft()
            handler = _HANDLERS.get(type(command.method))
            try:
                if handler is None:
                    raise ProtocolError(
                        ReplyCode.COMMAND_INVALID,
                        f"COMMAND_INVALID - {command.method.NAME} is not a method a client sends",
                    )
                handler(self, channel, command)
            except (ProtocolError, RabbitError) as exc:
                method = command.method
                self.fail(channel, ReplyCode(exc.reply_code), exc.text, method.CLASS_ID, method.METHOD_ID)

    def fail(self, channel: Channel, code: ReplyCode, text: str, class_id: int = 0, method_id: int = 0) -> None:
        """A channel error closes the channel, a hard error the connection (0-9-1 §1.3)."""
        if ProtocolError(code, text).hard:
            self.engine.close(code, text, class_id, method_id)
        else:
            self.engine.close_channel(channel.number, code, text, class_id, method_id)
        self.drop_channel(channel.number)

    def drop_channel(self, number: int) -> None:
        """Forget a channel and end its inner session: the broker gives back what it had not settled and rolls
        back its transaction, as for a 1.0 session that ends."""
        channel = self.channels.pop(number, None)
        if channel is not None and not self.inner.finished:
            self.client.end(number)

    def log_unconvertible(self, exc: Exception) -> None:
        """A message the broker holds could not be given to a 0-9-1 client (it was rejected instead)."""
        log.warning(
            "connection %d: a message could not be converted to AMQP 0-9-1 (%s); rejected", self.inner.conn_id, exc
        )

    # -- the broker's answers --------------------------------------------------------------------------------
    def _inner_event(self, event: i10.InnerEvent) -> None:
        if isinstance(event, (i10.Outcome, i10.Delivered, i10.Credit, i10.Attached, i10.Detached)):
            channel = self.channels.get(event.channel)
            if channel is None:
                return  # a channel already closed: its session is ending
            if isinstance(event, i10.Outcome):
                publish.outcome(self, channel, event)
            elif isinstance(event, i10.Delivered):
                consume.delivered(self, channel, event)
            elif isinstance(event, i10.Credit):
                if event.handle != channel.relay:  # (the client holds publishes until the relay has credit)
                    consume.credit(self, channel, event)
            elif isinstance(event, i10.Attached):
                channel.resolve("attach", event.handle, event)
            elif event.handle in (channel.relay, channel.coordinator):
                text = event.error.description if event.error is not None and event.error.description else "detached"
                self.fail(channel, ReplyCode.INTERNAL_ERROR, f"INTERNAL_ERROR - {text}")
            else:
                consume.detached(self, channel, event)
            self.run(channel)
        elif isinstance(event, i10.SaslDone):
            self.engine.login_verdict(event.ok)
        elif isinstance(event, i10.Opened):
            if not self.engine.finished:
                self.engine.open_ok()
        elif isinstance(event, i10.Ended):
            channel = self.channels.get(event.channel)
            if channel is not None:
                text = event.error.description if event.error is not None and event.error.description else "ended"
                self.fail(channel, ReplyCode.INTERNAL_ERROR, f"INTERNAL_ERROR - {text}")
        elif isinstance(event, i10.Closed) and not self.engine.finished:
            text = event.error.description if event.error is not None and event.error.description else "closed"
            self.engine.close(ReplyCode.CONNECTION_FORCED, f"CONNECTION_FORCED - {text}")
