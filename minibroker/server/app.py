"""The running broker: listener, connection tasks, and the handle embedders hold.

``serve(config)`` is the trio entry point: it binds the listener, creates configured nodes, and yields a
``RunningBroker`` only once connections can be accepted. Leaving the context closes every connection
with ``amqp:connection:forced`` and stops.
"""

from __future__ import annotations

import itertools
import logging
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from minibroker.amqp.errors import Condition, error
from minibroker.broker.core import Broker, BrokerSettings
from minibroker.broker.transactions import counter_ids
from minibroker.config import Config
from minibroker.engine.connection import ServerConnection
from minibroker.engine.sasl import SaslPolicy
from minibroker.server.connection import ConnectionTask, run_broker_timer
from minibroker.server.trace import FrameTracer

log = logging.getLogger("minibroker")

ConfigLike = Config | dict[str, Any] | str | Path | None


def as_config(config: ConfigLike) -> Config:
    """Accept a ``Config``, a dict shaped like the TOML file, a path to one, or None (defaults)."""
    if config is None:
        return Config()
    if isinstance(config, Config):
        return config
    if isinstance(config, dict):
        return Config.from_dict(config)
    return Config.load(config)


def sasl_policy(config: Config) -> SaslPolicy:
    """DESIGN §2: any credentials unless users are configured; then PLAIN is checked, ANONYMOUS refused."""
    users = config.auth.users
    if not users:
        return SaslPolicy(anonymous=config.auth.anonymous, plain=True, required=False)

    def authenticate(user: str, password: str) -> bool:
        expected = users.get(user)
        return expected is not None and expected == password

    return SaslPolicy(anonymous=False, plain=True, required=True, authenticate=authenticate)


class RunningBroker:
    """A broker that is serving: its address and its state, for tests and embedders."""

    def __init__(self, config: Config, broker: Broker, host: str, port: int) -> None:
        self.config = config
        self.broker = broker
        self.host = host
        self.port = port

    @property
    def url(self) -> str:
        """``amqp://HOST:PORT`` of the listener."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"amqp://{host}:{self.port}"


def engine_factory(config: Config, tracer: FrameTracer | None = None) -> Callable[[int], ServerConnection]:
    """A function that makes one engine per accepted connection, set up from ``config``."""
    policy = sasl_policy(config)
    server = config.server

    def make(conn_id: int) -> ServerConnection:
        return ServerConnection(
            container_id=server.container_id,
            sasl=policy,
            max_frame_size=server.max_frame_size,
            channel_max=server.channel_max,
            idle_time_out=server.idle_timeout or None,
            max_message_size=server.max_message_size or None,
            offered_capabilities=["ANONYMOUS-RELAY"],
            trace=tracer.bind(conn_id) if tracer is not None else None,
        )

    return make


@asynccontextmanager
async def serve(config: ConfigLike = None) -> AsyncIterator[RunningBroker]:
    """Run a broker for the duration of the ``async with`` block."""
    cfg = as_config(config)
    broker = Broker(
        BrokerSettings(
            auto_create=cfg.broker.auto_create,
            link_credit=cfg.broker.link_credit,
            transaction_timeout=cfg.broker.transaction_timeout,
        ),
        txn_ids=counter_ids(secrets.token_bytes(8)),
    )
    for name in cfg.queues:
        broker.declare_queue(name)
    listeners = await trio.open_tcp_listeners(cfg.server.port, host=cfg.server.host)
    sockname = listeners[0].socket.getsockname()
    running = RunningBroker(cfg, broker, cfg.server.host, sockname[1])
    tasks: set[ConnectionTask] = set()
    make_engine = engine_factory(cfg, FrameTracer() if cfg.trace_frames else None)
    ids = itertools.count(1)
    all_closed = trio.Event()

    async def handle(stream: trio.SocketStream) -> None:
        conn_id = next(ids)
        task = ConnectionTask(conn_id, stream, broker, make_engine(conn_id))
        tasks.add(task)
        try:
            await task.run()
        except Exception:  # a bug must cost one connection, never the broker
            log.exception("connection %d failed", task.id)
        finally:
            tasks.discard(task)
            if not tasks:
                all_closed.set()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_serve_listeners, listeners, handle)
            nursery.start_soon(run_broker_timer, broker)
            yield running
            # graceful stop: close every connection, give them a moment to flush, then cancel
            for task in list(tasks):
                task.engine.close(error(Condition.CONNECTION_FORCED, "broker shutting down"))
                task.wake()
            if tasks:
                all_closed = trio.Event()
                with trio.move_on_after(1.0):
                    await all_closed.wait()
            nursery.cancel_scope.cancel()
    finally:
        for listener in listeners:
            with trio.CancelScope(shield=True):
                await listener.aclose()


async def _serve_listeners(listeners: list[trio.SocketListener], handle: Callable[..., Any]) -> None:
    async with trio.open_nursery() as nursery:
        for listener in listeners:
            nursery.start_soon(trio.serve_listeners, handle, [listener])

