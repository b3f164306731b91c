"""The running broker: listeners, connection tasks, timers, and the handle embedders hold.

``serve(config)`` is the trio entry point: it recovers the journal, binds the listener, creates the configured
nodes, and yields a ``RunningBroker`` only once connections can be accepted. With ``[http] port`` set, the
management API (``minibroker.http``) is served in the same trio run, bound first, so that its ``/readyz`` tells
(503) while the journal is recovered (in a worker thread) and the AMQP listeners bound. Leaving the context
closes every connection with ``amqp:connection:forced`` and stops.
"""

from __future__ import annotations

import ipaddress
import itertools
import logging
import math
import secrets
import ssl
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from minibroker.amqp.definitions import Error, Open
from minibroker.amqp.errors import Condition, error
from minibroker.auth import LoginThrottle, PasswordBook
from minibroker.broker import personality as personalities
from minibroker.broker.checkback import CheckBackSettings
from minibroker.broker.clock import WallClock
from minibroker.broker.core import OFFERED_CAPABILITIES, Broker, BrokerSettings
from minibroker.broker.namespace import DEFAULT_NAMESPACE, Namespace
from minibroker.broker.personality import Personality
from minibroker.broker.transactions import counter_ids
from minibroker.config import Config, TlsConfig
from minibroker.engine.connection import ServerConnection
from minibroker.engine.sasl import SaslPolicy
from minibroker.handles import CaptureOff, NamespaceView
from minibroker.server.clock import BrokerTime
from minibroker.server.connection import ConnectionTask, run_broker_timer, wake_writers
from minibroker.server.login import LoginChecker
from minibroker.server.sniff import PrefixedStream, Protocol, sniff

if TYPE_CHECKING:  # loaded at run time only when used: the HTTP listener (start_http), frame capture
    from minibroker.http.api import ManagementApi
    from minibroker.server.capture import Address, CaptureStore
    from minibroker.server.trace import FrameTracer
    from minibroker.store.journal import Journal
    from minibroker.store.state import DurableState

log = logging.getLogger("minibroker")

ConfigLike = Config | dict[str, Any] | str | Path | None
T = TypeVar("T")
_SHUTDOWN_FLUSH = 1.0  # seconds the stop waits at most for the connections to write their closes


def as_config(config: ConfigLike) -> Config:
    """Accept a ``Config``, a dict shaped like the TOML file, a path to one, or None (defaults)."""
    if config is None:
        return Config()
    if isinstance(config, Config):
        return config
    if isinstance(config, dict):
        return Config.from_dict(config)
    return Config.load(config)


def sasl_policy(config: Config, book: PasswordBook | None = None) -> SaslPolicy:
    """DESIGN §2: any credentials unless users are configured; then PLAIN is checked, ANONYMOUS refused.

    PLAIN credentials of configured users are checked by the server, off the event loop (``deferred``; see
    ``server/login.py``). SASL EXTERNAL is offered to TLS clients that presented a certificate, when
    ``tls.sasl_external``, and only when its common name is a configured user or ``auth.external_any``.
    """
    users = config.auth.users
    book = book if book is not None else PasswordBook(users)
    external = config.tls.enabled and config.tls.sasl_external
    external_any = config.auth.external_any

    def external_accepts(identity: str) -> bool:
        return external_any or identity in users

    if not users:
        # a peer that skips SASL is as anonymous as one choosing ANONYMOUS: refused with it
        anonymous = config.auth.anonymous
        return SaslPolicy(
            anonymous=anonymous,
            plain=True,
            required=not anonymous,
            external=external,
            external_accepts=external_accepts,
        )
    return SaslPolicy(
        anonymous=False,
        plain=True,
        required=True,
        authenticate=book.check,
        external=external,
        external_accepts=external_accepts,
        deferred=True,
    )


def login_checker(config: Config, book: PasswordBook) -> LoginChecker:
    """What checks deferred PLAIN logins: hashing in worker threads, failures limited per address and user."""
    auth = config.auth
    throttle = LoginThrottle(
        auth.max_failures_per_address, auth.max_failures_per_user, auth.failure_window, auth.failure_delay
    )
    return LoginChecker(book, throttle, threads=auth.hash_threads, failure_delay=auth.failure_delay)


def socket_of(stream: trio.abc.Stream) -> trio.SocketStream | None:
    """The socket stream under ``stream`` (under TLS, under the octets read to tell the protocol); None off a socket."""
    while isinstance(stream, (trio.SSLStream, PrefixedStream)):
        stream = stream.transport_stream
    return stream if isinstance(stream, trio.SocketStream) else None


def socket_ends(stream: trio.abc.Stream) -> tuple[Address | None, Address | None]:
    """The (host, port) of the peer and of our end of ``stream``'s socket (under TLS too); None off a socket."""
    sock = socket_of(stream)
    if sock is None:
        return None, None
    try:
        peer, own = sock.socket.getpeername(), sock.socket.getsockname()
        return (str(peer[0]), int(peer[1])), (str(own[0]), int(own[1]))
    except (OSError, IndexError, TypeError, ValueError):
        return None, None


def peer_address(stream: trio.abc.Stream) -> str | None:
    """The peer's address as failed logins are counted: the IPv4 address, or the IPv6 /64 network."""
    sock = socket_of(stream)
    if sock is None:
        return None
    try:
        host = sock.socket.getpeername()[0]
    except (OSError, IndexError):
        return None
    return throttle_address(host)


def throttle_address(host: str | None) -> str | None:
    """``host`` (an IP address) as failed logins are counted: the IPv4 address, or the IPv6 /64 network."""
    if host is None:
        return None
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network(f"{address}/64", strict=False))
    return str(address)


EngineFactory = Callable[..., ServerConnection]


def engine_factory(
    config: Config, tracer: FrameTracer | None = None, book: PasswordBook | None = None
) -> EngineFactory:
    """A function that makes one engine per accepted connection, set up from ``config``."""
    policy = sasl_policy(config, book)
    server = config.server

    def make(
        conn_id: int,
        *,
        refuse: Any = None,
        external_identity: str | None = None,
        admit: Callable[[], Error | None] | None = None,
        all_fields: Callable[[Open], bool] | None = None,
        started: float | None = None,
    ) -> ServerConnection:
        return ServerConnection(
            container_id=server.container_id,
            sasl=policy,
            max_frame_size=server.max_frame_size,
            channel_max=server.channel_max,
            idle_time_out=server.idle_timeout or None,
            min_heartbeat_interval=server.min_heartbeat_interval,
            max_message_size=server.max_message_size or None,
            offered_capabilities=list(OFFERED_CAPABILITIES),
            trace=tracer.bind(conn_id) if tracer is not None else None,
            conn_id=conn_id,
            max_sessions=server.max_sessions,
            max_links=server.max_links_per_session,
            handshake_timeout=server.handshake_timeout or None,
            now=trio.current_time() if started is None else started,
            refuse=refuse,
            external_identity=external_identity,
            admit=admit,
            all_fields=all_fields,
        )

    return make


def ssl_context(tls: TlsConfig) -> ssl.SSLContext:
    """The server's TLS context from ``[tls]``."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls.cert_file, tls.key_file)
    if tls.client_auth != "none":
        context.load_verify_locations(tls.ca_file)
        context.verify_mode = ssl.CERT_REQUIRED if tls.client_auth == "required" else ssl.CERT_OPTIONAL
    return context


def certificate_identity(stream: trio.SSLStream[Any]) -> str | None:
    """The subject common name of the client's verified certificate, if it sent one."""
    certificate = stream.getpeercert()
    if not certificate:
        return None
    for rdn in certificate.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def format_url(host: str, port: int, scheme: str = "amqp") -> str:
    """``amqp://HOST:PORT``, with brackets around an IPv6 host."""
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


class _Server:
    """The trio side of one broker: where connections are accepted and served."""

    def __init__(
        self,
        config: Config,
        broker: Broker,
        nursery: trio.Nursery,
        login: LoginChecker,
        journal: Journal | None = None,
        clock: BrokerTime | None = None,
    ) -> None:
        self.config = config
        self.broker = broker
        self.clock = clock if clock is not None else BrokerTime(broker, config.broker.clock)
        """Broker time (``minibroker.server.clock``): real, or virtual and moved by ``advance``."""
        self.nursery = nursery
        self.journal = journal
        """The journal with a data dir (its write and fsync counts are metrics), else None."""
        self.tasks: set[ConnectionTask] = set()
        self.make_engine = engine_factory(config, frame_tracer(config), login.book)
        self.login = login
        """Checks PLAIN logins, and the management API's Basic credentials (which may come before this server)."""
        self.ids = itertools.count(1)
        self.opened = 0
        """Connections past their open: what ``server.max_connections`` limits."""
        self.pending: OrderedDict[int, trio.CancelScope] = OrderedDict()
        """Connections still in their handshake whose credentials are not being checked (silent or slow sockets,
        logins already refused), oldest first: the first closed when ``server.max_pending_handshakes`` is met."""
        self.checking: OrderedDict[int, trio.CancelScope] = OrderedDict()
        """Connections still in their handshake whose PLAIN credentials are being checked, or passed: closed to
        make room only when no other pending connection is left. Together with ``pending``, what
        ``server.max_pending_handshakes`` limits."""
        self._eviction_logged = -float("inf")
        self.changed = trio.Event()
        self.waiters = 0
        self.change_listeners: list[Callable[[], None]] = []
        self.listener_scopes: dict[str, list[trio.CancelScope]] = {}
        self.tls_context = ssl_context(config.tls) if config.tls.enabled else None
        self.ready = False
        """Listeners bound (and recovery done, which comes before): what ``/readyz`` tells."""
        self.stopping = False
        """``shutdown`` has begun: an open that arrives from then on is refused with amqp:connection:forced."""
        self.namespace_ports: dict[str, int] = {}
        """The plain listener's port of each namespace that has one."""
        self.captures: CaptureStore | None = None
        """Every connection's frames, with ``[broker] capture``; None when off."""
        if config.broker.capture:
            from minibroker.server.capture import CaptureStore  # imported only when capturing

            self.captures = CaptureStore(config.broker.capture_limit)
        broker.on_change = self._on_change

    def _on_change(self) -> None:
        if self.waiters:
            self.changed.set()
            self.changed = trio.Event()
        for listener in self.change_listeners:
            listener()

    async def listen(self, host: str, port: int, namespace: Namespace, *, tls: bool = False) -> int:
        """Accept connections on ``host:port`` into ``namespace``; return the bound port."""
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound: int = listeners[0].socket.getsockname()[1]
        if not tls:
            self.namespace_ports.setdefault(namespace.name, bound)
        scope = trio.CancelScope()
        self.listener_scopes.setdefault(namespace.name, []).append(scope)

        async def handle(stream: trio.SocketStream) -> None:
            await self.accepted(stream, namespace, tls=tls)

        async def accept() -> None:
            with scope:
                await trio.serve_listeners(handle, listeners)

        self.nursery.start_soon(accept)
        return bound

    def stop_listening(self, namespace: str) -> None:
        self.namespace_ports.pop(namespace, None)
        for scope in self.listener_scopes.pop(namespace, []):
            scope.cancel()

    async def accepted(self, stream: trio.SocketStream, namespace: Namespace, *, tls: bool = False) -> None:
        """Serve one accepted socket. Until its open is admitted it counts as a pending handshake; when too many
        are pending, one is closed to make room (see ``_add_pending``)."""
        conn_id = next(self.ids)
        with trio.CancelScope() as scope:
            self._add_pending(conn_id, scope)
            try:
                if not tls:
                    await self.serve_stream(stream, namespace, conn_id=conn_id)
                    return
                assert self.tls_context is not None
                secure = trio.SSLStream(stream, self.tls_context, server_side=True)
                try:
                    with trio.fail_after(self.config.server.handshake_timeout or 10.0):
                        await secure.do_handshake()
                except (trio.BrokenResourceError, trio.TooSlowError, ssl.SSLError, OSError) as exc:
                    log.info("TLS handshake failed: %s", exc)
                    await trio.aclose_forcefully(stream)
                    return
                try:
                    identity = certificate_identity(secure)
                except Exception:  # a certificate we cannot read costs this connection, never the listener
                    log.exception("reading the client certificate failed")
                    await trio.aclose_forcefully(secure)
                    return
                await self.serve_stream(secure, namespace, conn_id=conn_id, external_identity=identity)
            finally:
                self._done_pending(conn_id)
        if scope.cancelled_caught:
            await trio.aclose_forcefully(stream)  # evicted, perhaps before a connection task owned the socket

    def _add_pending(self, conn_id: int, scope: trio.CancelScope) -> None:
        """Count a new socket as a pending handshake. At ``server.max_pending_handshakes``, the oldest pending
        connection whose credentials are not being checked is closed first (a socket that has sent no SASL init
        yet, a login already refused); only when every pending connection is a login under check (or past it,
        before its open) is the oldest of those closed. So silent sockets cannot push out a real client waiting
        for its password check, however long the check takes."""
        limit = self.config.server.max_pending_handshakes
        while len(self.pending) + len(self.checking) >= limit:
            _oldest, evicted = (self.pending or self.checking).popitem(last=False)
            evicted.cancel()
            now = trio.current_time()
            if now - self._eviction_logged >= 60.0:
                self._eviction_logged = now
                log.warning(
                    "%d connections are in their handshake (server.max_pending_handshakes): closing the oldest",
                    limit,
                )
        self.pending[conn_id] = scope

    def _checking(self, conn_id: int, checking: bool) -> None:
        """A pending connection's credentials go to be checked (True), or were refused (False): it moves among
        those closed last, or back among those closed first (ahead of the others: its answer is known)."""
        source, target = (self.pending, self.checking) if checking else (self.checking, self.pending)
        scope = source.pop(conn_id, None)
        if scope is not None:
            target[conn_id] = scope
            if not checking:
                target.move_to_end(conn_id, last=False)

    def _done_pending(self, conn_id: int) -> None:
        """The connection is past its handshake, or gone: it no longer counts as pending."""
        self.pending.pop(conn_id, None)
        self.checking.pop(conn_id, None)

    async def serve_stream(
        self,
        stream: trio.abc.Stream,
        namespace: Namespace,
        *,
        conn_id: int | None = None,
        external_identity: str | None = None,
    ) -> None:
        conn_id = next(self.ids) if conn_id is None else conn_id
        limit = self.config.server.max_connections
        counted = False

        def admit() -> Error | None:
            # asked when the peer's open arrives: only connections past their handshake count against the limit
            nonlocal counted
            if self.stopping:  # a connect that raced the stop: its close now, not a cut socket a moment later
                return error(Condition.CONNECTION_FORCED, "broker shutting down")
            if self.opened >= limit:
                return error(Condition.RESOURCE_LIMIT_EXCEEDED, f"at most {limit} connections")
            self._done_pending(conn_id)
            self.opened += 1
            counted = True
            return None

        def all_fields(open_: Open) -> bool:
            # the servicebus personality sends every performative whole (azure-eventhub reads fields by position)
            return self.broker.nodes.namespaces.get(open_.hostname or "", namespace).personality.servicebus

        started = trio.current_time()
        patience = self.config.server.handshake_timeout or math.inf
        address, ends = peer_address(stream), socket_ends(stream)
        protocol, prefix = await sniff(stream, started + patience)
        if prefix:
            stream = PrefixedStream(stream, prefix)
        engine = self.make_engine(
            conn_id, external_identity=external_identity, admit=admit, all_fields=all_fields, started=started
        )
        gateway = None
        if protocol is Protocol.AMQP_0_9_1:
            from minibroker.server.amqp091 import make_gateway  # loaded by the first AMQP 0-9-1 client

            gateway = make_gateway(self.config, self.broker, engine, started)
        # (frames are captured as AMQP 1.0: an AMQP 0-9-1 connection is not captured)
        capture = None if self.captures is None or gateway is not None else self.captures.open(conn_id, *ends)
        task = ConnectionTask(
            conn_id,
            stream,
            self.broker,
            engine,
            namespace,
            self.config.auth.failure_delay,
            login=self.login,
            address=address,
            checking=lambda checking: self._checking(conn_id, checking),
            capture=capture,
            clock=self.clock,
            wire=gateway,
        )
        if gateway is not None:
            gateway.to_broker = task.step
        self.tasks.add(task)
        try:
            await task.run()
        except Exception:  # a bug must cost one connection, never the broker
            log.exception("connection %d failed", conn_id)
        finally:
            if counted:
                self.opened -= 1
            if self.captures is not None:
                self.captures.close(conn_id)
            self.tasks.discard(task)

    async def shutdown(self) -> None:
        """Close every connection with amqp:connection:forced, let each write its close (a second at most: a peer
        that does not read holds the stop no longer), then stop serving. The connection tasks run under the
        listeners' scopes, so those are cancelled only once the closes are written: cancelled first, the sockets
        ended with no word of why. The peers' own closes are not awaited (§2.4.3 lets the broker close its socket
        once its close is sent). A connection accepted meanwhile (the listeners accept until cancelled) has its
        open refused with amqp:connection:forced (``admit``)."""
        self.ready = False
        self.stopping = True
        for task in list(self.tasks):
            task.engine.close(error(Condition.CONNECTION_FORCED, "broker shutting down"))
            self.broker.handle(task.engine, task.engine.take_events(), self.clock.time())
        wake_writers(self.broker)
        with trio.move_on_after(_SHUTDOWN_FLUSH):
            # (a poll, only while stopping: an event would cost every write on the hot path)
            while not all(task.flushed for task in self.tasks):  # noqa: ASYNC110
                await trio.sleep(0.001)
        for scopes in self.listener_scopes.values():
            for scope in scopes:
                scope.cancel()
        self.nursery.cancel_scope.cancel()


class RunningBroker(NamespaceView):
    """A broker serving in this trio run: its address, its state, and namespaces for isolated tests."""

    def __init__(
        self,
        server: _Server,
        host: str,
        port: int,
        namespace: str = DEFAULT_NAMESPACE,
        tls_port: int | None = None,
        http_port: int | None = None,
    ) -> None:
        self._server = server
        self.http_port = http_port
        self.config = server.config
        self.broker = server.broker
        self.host = host
        self.port = port
        self.tls_port = tls_port
        self.namespace_name = namespace

    @property
    def url(self) -> str:
        """``amqp://HOST:PORT`` of the listener."""
        return format_url(self.host, self.port)

    @property
    def tls_url(self) -> str | None:
        """``amqps://HOST:PORT`` of the TLS listener, when TLS is enabled."""
        return format_url(self.host, self.tls_port, "amqps") if self.tls_port is not None else None

    @property
    def urls(self) -> list[str]:
        """Every listener's URL."""
        return [self.url] + ([self.tls_url] if self.tls_url else [])

    @property
    def http_url(self) -> str | None:
        """``http://HOST:PORT`` of the management API (on ``[http] host``), None when it is off."""
        if self.http_port is None:
            return None
        return format_url(self.config.http.host, self.http_port, "http")

    @property
    def ready(self) -> bool:
        """Whether the listeners are bound and recovery is done (and shutdown has not begun)."""
        return self._server.ready

    @property
    def waiting(self) -> int:
        """How many ``wait_for`` calls (long-polls of ``GET /api/wait`` among them) are waiting now."""
        return self._server.waiters

    def connection_peers(self) -> dict[int, str]:
        """The ``HOST:PORT`` each socket connection (by id) comes from."""
        peers = {}
        for task in self._server.tasks:
            stream = socket_of(task.stream)
            if stream is not None:
                try:
                    host, port = stream.socket.getpeername()[:2]
                except (OSError, ValueError):
                    continue
                peers[task.id] = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return peers

    def _captures(self) -> CaptureStore:
        captures = self._server.captures
        if captures is None:
            raise CaptureOff("frame capture is off: start the broker with --capture or [broker] capture = true")
        return captures

    def capture(self, connection: int) -> dict[str, Any] | None:
        """Connection ``connection``'s capture as ``GET /api/connections/{id}/frames`` answers it (its addresses,
        ``dropped`` frames and ``frames``); None when it is unknown (or forgotten). ``CaptureOff`` when off."""
        capture = self._captures().get(connection)
        return None if capture is None else capture.summary()

    def frames(self, connection: int | None = None) -> list[dict[str, Any]]:
        """The captured frames of connection ``connection`` (connection ids are broker-wide), or of every
        connection kept, decoded (``minibroker.server.capture``), in the order they crossed the wire.
        ``LookupError`` for an unknown connection; ``CaptureOff`` unless ``[broker] capture`` is on."""
        captures = self._captures()
        if connection is None:
            records = [r for capture in captures.all() for r in capture.records()]
            return sorted(records, key=lambda record: record["time"])
        capture = captures.get(connection)
        if capture is None:
            raise LookupError(f"no captured connection {connection}")
        return capture.records()

    def pcap(self) -> bytes:
        """Every kept capture as a pcap file (``minibroker.server.pcap``); ``CaptureOff`` when off."""
        from minibroker.server.pcap import write_pcap  # imported only when asked for

        return write_pcap(self._captures().all())

    def write_pcap(self, path: str | Path) -> None:
        """Write ``pcap()`` to ``path``."""
        Path(path).write_bytes(self.pcap())

    def namespace_view(self, name: str) -> RunningBroker:
        """The handle of the existing namespace ``name`` (``LookupError`` when there is none)."""
        if name not in self.broker.namespaces:
            raise LookupError(f"namespace {name!r} does not exist")
        port = self._server.namespace_ports.get(name, self.port)
        return RunningBroker(self._server, self.host, port, name, http_port=self.http_port)

    def _call(self, fn: Callable[[Broker], T]) -> T:
        self.broker.clock.move_to(self._now())
        result = fn(self.broker)
        wake_writers(self.broker)
        return result

    def _now(self) -> float:
        return self._server.clock.time()

    @property
    def clock(self) -> BrokerTime:
        """The broker's clock (the whole broker's, whichever namespace): ``mode`` ("real" or "virtual"), ``now``
        (wall-clock seconds since the epoch) and, on the virtual clock, ``advance(seconds)``, which fires every
        broker timer due on the way before it returns (``minibroker.server.clock``)."""
        return self._server.clock

    def metrics(self) -> str:
        """The whole broker's metrics in the Prometheus text format (``minibroker.http.metrics``)."""
        from minibroker.http.metrics import exposition  # loaded with the HTTP listener only

        return exposition(self.broker, self._server.journal)

    async def wait_for(
        self,
        predicate: Callable[[], bool] | None = None,
        timeout: float = 5.0,  # noqa: ASYNC109
        *,
        queue: str | None = None,
        depth: int | None = None,
        transactions: int | None = None,
    ) -> None:
        """Wait until ``predicate()`` holds, re-checking after every change of broker state.

        Instead of a predicate, the keyword conditions a remote broker checks too: ``wait_for(queue="q",
        depth=1)``, ``wait_for(transactions=0)``. Raises ``TimeoutError`` after ``timeout`` seconds.
        """
        if predicate is None:
            predicate = self.condition(queue=queue, depth=depth, transactions=transactions)
        elif (queue, depth, transactions) != (None, None, None):
            raise TypeError("wait_for: a predicate or keyword conditions, not both")
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

    async def create_namespace(
        self, name: str | None = None, personality: str | Personality | None = None
    ) -> RunningBroker:
        """A new isolated namespace with a listener of its own; its ``url`` connects into it.

        A connection also lands in it when its open's hostname is ``name``. ``personality`` (a name that
        ``minibroker personalities`` lists, or a ``Personality``) is whose behaviour its connections meet; by
        default the broker's (``[broker] personality``). ``ValueError`` for an unknown name, or for a namespace
        ``name`` that exists already with another personality.
        """
        chosen = resolve_personality(personality)
        name = name or f"ns-{secrets.token_hex(6)}"
        existing = self.broker.namespaces.get(name)
        if chosen is not None and existing is not None and existing.personality != chosen:
            raise ValueError(
                f"namespace {name!r} exists with personality {existing.personality.name!r}, not {chosen.name!r}"
            )
        namespace = self.broker.namespace(name, chosen)
        port = await self._server.listen(self.host, 0, namespace)
        return RunningBroker(self._server, self.host, port, name, http_port=self.http_port)

    def drop_namespace(self) -> None:
        """Close this namespace's listener and connections and forget its state."""
        if self.namespace_name == DEFAULT_NAMESPACE:
            raise ValueError("the default namespace cannot be dropped; use reset()")
        self._server.stop_listening(self.namespace_name)
        self._call(lambda broker: broker.drop_namespace(self.namespace_name))

    def __repr__(self) -> str:
        return f"RunningBroker({self.url}, namespace={self.namespace_name!r})"


def resolve_personality(personality: str | Personality | None) -> Personality | None:
    """The ``Personality`` a name stands for (``ValueError`` listing the known names when it stands for none);
    a ``Personality`` or None as they are; ``TypeError`` for anything else."""
    if isinstance(personality, str):
        return personalities.get(personality)
    if personality is not None and not isinstance(personality, Personality):
        known = ", ".join(personalities.names())
        raise TypeError(f"personality: expected a name ({known}) or a Personality, not {type(personality).__name__}")
    return personality


def make_broker(config: Config, *, durable: bool = False) -> Broker:
    """The broker core configured from ``config``, with its declared queues and its ``[[faults]]`` rules."""
    broker = Broker(
        BrokerSettings(
            auto_create=config.broker.auto_create,
            link_credit=config.broker.link_credit,
            transaction_timeout=config.broker.transaction_timeout,
            node_defaults=config.node_defaults,
            queues=dict(config.queues),
            topics=dict(config.topics),
            permissions=dict(config.auth.permissions),
            max_transactions_per_connection=config.broker.max_transactions_per_connection,
            max_staged_bytes=config.broker.max_staged_bytes,
            max_total_staged_bytes=config.broker.max_total_staged_bytes,
            max_nodes=config.broker.max_nodes,
            max_links=config.broker.max_links,
            max_subscriptions_per_topic=config.broker.max_subscriptions_per_topic,
            max_subscriptions_per_connection=config.broker.max_subscriptions_per_connection,
            auto_delete_idle=config.broker.auto_delete_idle,
            max_selector_length=config.broker.max_selector_length,
            max_selector_properties_size=config.broker.max_selector_properties_size,
            personality=personalities.get(config.broker.personality),
            check_back=check_back_settings(config),
            servicebus=config.servicebus.entities,
            sas_keys=dict(config.servicebus.sas_keys),
        ),
        txn_ids=counter_ids(secrets.token_bytes(8)),
        clock=WallClock(time.time() - trio.current_time()),
        durable=durable,
    )
    for spec in config.faults:
        broker.add_fault(spec)
    unused = config.servicebus.entities.not_implemented
    if unused:
        log.warning("[servicebus]: accepted without effect (not implemented): %s", ", ".join(unused))
    return broker


def check_back_settings(config: Config) -> CheckBackSettings:
    """``[transactions]`` as the core takes it (``checkback.py``)."""
    txn = config.transactions
    return CheckBackSettings(
        orphaned="hold" if txn.orphaned == "hold" else "rollback",
        check_immunity=txn.check_immunity,
        check_interval=txn.check_interval,
        check_max=txn.check_max,
        outcome_retention=txn.outcome_retention,
    )


@asynccontextmanager
async def serve(config: ConfigLike = None) -> AsyncIterator[RunningBroker]:
    """Run a broker for the duration of the ``async with`` block.

    Start-up, in this order: the management API's listener (with ``[http] port``), whose ``/readyz`` answers 503
    from then until ready; the journal's recovery (with a data dir), in a worker thread so that the API answers
    meanwhile; the recovered state restored; the AMQP listeners; ready. A data dir that cannot be used raises its
    ``JournalError`` as it is (not in an exception group), the HTTP listener closed.
    """
    cfg = as_config(config)
    journal = None
    journal_errors: tuple[type[Exception], ...] = ()  # caught below: none without a journal
    if cfg.data_dir:
        # the journal and its writer only with a data dir: the default configuration starts without them (issue 19)
        from minibroker.server.journal import JournalWriter
        from minibroker.store.journal import Journal, JournalError

        journal = Journal(cfg.data_dir, sync=cfg.data_sync == "always", recover=cfg.data_recover)
        journal_errors = (JournalError,)
    login = login_checker(cfg, PasswordBook(cfg.auth.users))
    broker = make_broker(cfg, durable=journal is not None)  # nothing reaches it before it is restored and ready
    clock = BrokerTime(broker, cfg.broker.clock)
    writer = None
    failed: Exception | None = None
    try:
        async with trio.open_nursery() as nursery:
            api: ManagementApi | None = None
            http_port: int | None = None
            if cfg.http.port is not None:  # first: /healthz answers, /readyz says 503 until the broker is ready
                api, http_port = await start_http(cfg, login, nursery)
            try:
                state = await recover(journal, api)
            except journal_errors as exc:  # re-raised below, once the HTTP listener is closed
                failed = exc
                nursery.cancel_scope.cancel()
            else:
                if state is not None:
                    assert journal is not None
                    restored = broker.restore(state, clock.time())
                    log.info("recovered %d durable messages from %s", restored, cfg.data_dir)
                    writer = JournalWriter(journal, broker, clock.time)
                    nursery.start_soon(writer.run)
                warn_if_exposed(cfg)
                if api is not None:
                    api.phase = "starting"
                server = _Server(cfg, broker, nursery, login, journal, clock)
                running = RunningBroker(server, cfg.server.host, 0, http_port=http_port)
                running.port = await server.listen(cfg.server.host, cfg.server.port, broker.default)
                if cfg.tls.enabled:
                    running.tls_port = await server.listen(cfg.server.host, cfg.tls.port, broker.default, tls=True)
                nursery.start_soon(run_broker_timer, broker, clock)
                server.ready = True
                if api is not None:
                    api.attach(running)
                try:
                    yield running
                finally:
                    if api is not None:
                        api.phase = "stopping"
                    with trio.CancelScope(shield=True), trio.move_on_after(2.0):
                        await server.shutdown()
                    nursery.cancel_scope.cancel()
                    if writer is not None:
                        wake_writers(broker)
        if failed is not None:
            raise failed
    finally:
        if writer is not None:
            writer.close()
        elif journal is not None:
            journal.close()  # after a failed recovery: nothing to close, the data dir already released


def frame_tracer(config: Config) -> FrameTracer | None:
    """The frame printer of ``--trace-frames`` (``[broker] trace_frames``), else None."""
    if not config.trace_frames:
        return None
    from minibroker.server.trace import FrameTracer  # only with --trace-frames: start-up does without (issue 19)

    return FrameTracer()


async def recover(journal: Journal | None, api: ManagementApi | None) -> DurableState | None:
    """The journal's durable state (None without one), read in a worker thread: the event loop, and the management
    API with it, go on meanwhile. Raises ``JournalError`` (``DataDirError``, ``JournalCorrupt``) when the data dir
    cannot be used as it is."""
    if journal is None:
        return None
    if api is not None:
        api.phase = "recovering"
    return await trio.to_thread.run_sync(journal.recover)


async def start_http(config: Config, login: LoginChecker, nursery: trio.Nursery) -> tuple[ManagementApi, int]:
    """Serve the management API on ``[http] host:port``, without a broker until ``attach``; return it and the
    bound port."""
    from minibroker.http.api import ManagementApi, is_loopback_host  # loaded only when the listener is on
    from minibroker.http.server import HttpServer

    http = config.http

    async def verify(user: str, password: str, peer: str | None) -> tuple[bool, float]:
        # the same checker as SASL PLAIN: hashing off the loop, failures counted per address (IPv6: per /64)
        return await login.verify(user, password, throttle_address(peer))

    api = ManagementApi(
        None,
        users=bool(config.auth.users),
        verify=verify,
        permissions=config.auth.permissions,
        loopback=is_loopback_host(http.host),
    )
    listener = HttpServer(
        api,
        max_body_size=http.max_body_size,
        request_timeout=http.request_timeout,
        max_connections=http.max_connections,
    )
    assert http.port is not None
    port = await listener.listen(http.host, http.port, nursery)
    # stdout keeps its lines for when the broker is ready (the AMQP URL first): this is how a supervisor learns
    # early where to ask /readyz, with a port of 0
    log.info(
        "management API on %s (/readyz answers 503 until the broker is ready)", format_url(http.host, port, "http")
    )
    return api, port


def warn_if_exposed(config: Config) -> None:
    """Safe defaults: say so loudly when anyone on the network may connect without credentials."""
    host = config.server.host
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback and config.auth.anonymous and not config.auth.users:
        log.warning(
            "listening on %s with SASL ANONYMOUS allowed: anyone who can reach this address can use the broker; "
            "configure [auth.users] or listen on 127.0.0.1",
            host,
        )


__all__ = ["RunningBroker", "as_config", "format_url", "serve"]
