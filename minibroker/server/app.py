"""The running broker: listeners, connection tasks, timers, and the handle embedders hold.

``serve(config)`` is the trio entry point: it binds the listener, creates the configured nodes, and yields
a ``RunningBroker`` only once connections can be accepted. Leaving the context closes every connection
with ``amqp:connection:forced`` and stops.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import trio

from minibroker.amqp.errors import Condition, error
from minibroker.broker.clock import WallClock
from minibroker.broker.core import Broker, BrokerSettings
from minibroker.broker.namespace import DEFAULT_NAMESPACE, Namespace
from minibroker.broker.transactions import counter_ids
from minibroker.config import Config
from minibroker.engine.connection import ServerConnection
from minibroker.engine.sasl import SaslPolicy
from minibroker.handles import NamespaceView
from minibroker.server.connection import ConnectionTask, run_broker_timer, wake_writers
from minibroker.server.trace import FrameTracer

log = logging.getLogger("minibroker")

ConfigLike = Config | dict[str, Any] | str | Path | None
T = TypeVar("T")


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
        return expected is not None and secrets.compare_digest(expected, password)

    return SaslPolicy(anonymous=False, plain=True, required=True, authenticate=authenticate)


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
            conn_id=conn_id,
        )

    return make


def format_url(host: str, port: int) -> str:
    """``amqp://HOST:PORT``, with brackets around an IPv6 host."""
    return f"amqp://[{host}]:{port}" if ":" in host else f"amqp://{host}:{port}"


class _Server:
    """The trio side of one broker: where connections are accepted and served."""

    def __init__(self, config: Config, broker: Broker, nursery: trio.Nursery) -> None:
        self.config = config
        self.broker = broker
        self.nursery = nursery
        self.tasks: set[ConnectionTask] = set()
        self.make_engine = engine_factory(config, FrameTracer() if config.trace_frames else None)
        self.ids = itertools.count(1)
        self.all_closed = trio.Event()
        self.changed = trio.Event()
        self.waiters = 0
        self.change_listeners: list[Callable[[], None]] = []
        self.listener_scopes: dict[str, trio.CancelScope] = {}
        broker.on_change = self._on_change

    def _on_change(self) -> None:
        if self.waiters:
            self.changed.set()
            self.changed = trio.Event()
        for listener in self.change_listeners:
            listener()

    async def listen(self, host: str, port: int, namespace: Namespace) -> int:
        """Accept connections on ``host:port`` into ``namespace``; return the bound port."""
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound: int = listeners[0].socket.getsockname()[1]
        scope = trio.CancelScope()
        self.listener_scopes.setdefault(namespace.name, scope)

        async def handle(stream: trio.SocketStream) -> None:
            await self.serve_stream(stream, namespace)

        async def accept() -> None:
            with scope:
                await trio.serve_listeners(handle, listeners)

        self.nursery.start_soon(accept)
        return bound

    def stop_listening(self, namespace: str) -> None:
        scope = self.listener_scopes.pop(namespace, None)
        if scope is not None:
            scope.cancel()

    async def serve_stream(self, stream: trio.abc.Stream, namespace: Namespace) -> None:
        conn_id = next(self.ids)
        task = ConnectionTask(conn_id, stream, self.broker, self.make_engine(conn_id), namespace)
        self.tasks.add(task)
        try:
            await task.run()
        except Exception:  # a bug must cost one connection, never the broker
            log.exception("connection %d failed", conn_id)
        finally:
            self.tasks.discard(task)
            if not self.tasks:
                self.all_closed.set()

    async def shutdown(self) -> None:
        """Close every connection cleanly, give them a moment to flush, then stop serving."""
        for scope in self.listener_scopes.values():
            scope.cancel()
        for task in list(self.tasks):
            task.engine.close(error(Condition.CONNECTION_FORCED, "broker shutting down"))
            self.broker.handle(task.engine, task.engine.take_events(), trio.current_time())
        wake_writers(self.broker)
        if self.tasks:
            self.all_closed = trio.Event()
            with trio.move_on_after(1.0):
                await self.all_closed.wait()
        self.nursery.cancel_scope.cancel()


class RunningBroker(NamespaceView):
    """A broker serving in this trio run: its address, its state, and namespaces for isolated tests."""

    def __init__(self, server: _Server, host: str, port: int, namespace: str = DEFAULT_NAMESPACE) -> None:
        self._server = server
        self.config = server.config
        self.broker = server.broker
        self.host = host
        self.port = port
        self.namespace_name = namespace

    @property
    def url(self) -> str:
        """``amqp://HOST:PORT`` of the listener."""
        return format_url(self.host, self.port)

    def _call(self, fn: Callable[[Broker], T]) -> T:
        result = fn(self.broker)
        wake_writers(self.broker)
        return result

    def _now(self) -> float:
        return trio.current_time()

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:  # noqa: ASYNC109
        """Wait until ``predicate()`` holds, re-checking after every change of broker state.

        Raises ``TimeoutError`` after ``timeout`` seconds.
        """
        server = self._server
        server.waiters += 1
        try:
            with trio.move_on_after(timeout):
                while not predicate():
                    await server.changed.wait()
                return
        finally:
            server.waiters -= 1
        raise TimeoutError(f"condition not met within {timeout} s")

    async def create_namespace(self, name: str | None = None) -> RunningBroker:
        """A new isolated namespace with a listener of its own; its ``url`` connects into it.

        A connection also lands in it when its open's hostname is ``name``.
        """
        name = name or f"ns-{secrets.token_hex(6)}"
        namespace = self.broker.namespace(name)
        port = await self._server.listen(self.host, 0, namespace)
        return RunningBroker(self._server, self.host, port, name)

    def drop_namespace(self) -> None:
        """Close this namespace's listener and connections and forget its state."""
        if self.namespace_name == DEFAULT_NAMESPACE:
            raise ValueError("the default namespace cannot be dropped; use reset()")
        self._server.stop_listening(self.namespace_name)
        self._call(lambda broker: broker.drop_namespace(self.namespace_name))

    def __repr__(self) -> str:
        return f"RunningBroker({self.url}, namespace={self.namespace_name!r})"


def make_broker(config: Config) -> Broker:
    """The broker core configured from ``config``, with its declared queues."""
    return Broker(
        BrokerSettings(
            auto_create=config.broker.auto_create,
            link_credit=config.broker.link_credit,
            transaction_timeout=config.broker.transaction_timeout,
            node_defaults=config.node_defaults,
            queues=dict(config.queues),
            topics=dict(config.topics),
        ),
        txn_ids=counter_ids(secrets.token_bytes(8)),
        clock=WallClock(time.time() - trio.current_time()),
    )


@asynccontextmanager
async def serve(config: ConfigLike = None) -> AsyncIterator[RunningBroker]:
    """Run a broker for the duration of the ``async with`` block."""
    cfg = as_config(config)
    broker = make_broker(cfg)
    async with trio.open_nursery() as nursery:
        server = _Server(cfg, broker, nursery)
        port = await server.listen(cfg.server.host, cfg.server.port, broker.default)
        nursery.start_soon(run_broker_timer, broker)
        try:
            yield RunningBroker(server, cfg.server.host, port)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(2.0):
                await server.shutdown()
            nursery.cancel_scope.cancel()


__all__ = ["RunningBroker", "as_config", "format_url", "serve"]
