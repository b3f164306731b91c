"""The JSON management API: a routing table, and a handler per route over the running broker's handle.

Every route under ``/api/`` also answers under ``/api/namespaces/{ns}/`` for the namespace ``ns``. Adding a
route is one line in ``ManagementApi.__init__`` (``self.router.add("GET", "/metrics", handler)``). Errors are
JSON ``{"error": ...}``: 404 for an unknown path or name, 405 (with ``Allow``) for a known path and another
method, 400 for malformed input. With users configured, every call but ``/healthz`` and ``/readyz`` needs HTTP
Basic credentials (401), and POST and DELETE calls a user who may ``manage`` (403): see ``auth.py``.

The API may be served before the broker exists (while its journal is recovered): until ``attach(broker)``
only the probes answer (``/healthz`` 200, ``/readyz`` 503 with the ``phase``), every other call 503 (after
the credentials are checked, as always).

This module knows the broker only through ``ManagedBroker``, the part of ``RunningBroker`` it uses, so the trio
server (which starts it) may import it.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import ipaddress
import json
import math
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar
from urllib.parse import unquote, urlsplit

from minibroker.amqp import codec
from minibroker.amqp.definitions import AmqpValue, ApplicationProperties, Data, Header, MessageAnnotations, Properties
from minibroker.amqp.types import EncodeError, Symbol
from minibroker.broker import personality as personalities
from minibroker.broker.faults import FaultSpec
from minibroker.broker.namespace import DEFAULT_NAMESPACE
from minibroker.broker.permissions import Permissions
from minibroker.broker.transactions import TransactionInfo, TransactionStats
from minibroker.broker.views import (
    PROPERTY_FIELDS,
    ConnectionInfo,
    ExchangeInfo,
    MessageView,
    QueueStats,
    SubscriptionStats,
)
from minibroker.handles import CaptureOff, FaultsHandle, PostRefused, QueueHandle, TopicHandle
from minibroker.http import console, metrics
from minibroker.http.auth import MUTATING, Verify, authorize
from minibroker.http.server import Request, Response

MAX_PEEK = 1000
"""Most messages ``GET /api/queues/{name}/messages`` returns (``limit`` defaults to 100)."""
MAX_PEEK_BYTES = 4 * 1024 * 1024
"""Message bytes a peek answers at most (but always one message): the page is built in the broker's own event
loop, so a thousand large messages at once would stall every connection."""
MAX_WAIT = 300.0
"""Longest ``timeout`` of ``GET /api/wait``, in seconds."""
MAX_ADVANCE = 100 * 365 * 86400.0
"""Most seconds one ``POST /api/clock/advance`` moves virtual time (a century: wall-clock fields stay in range)."""


class ManagedClock(Protocol):
    """What the API uses of the broker's clock (``minibroker.server.clock.BrokerTime``)."""

    mode: str

    @property
    def now(self) -> float: ...
    def advance(self, seconds: float) -> float: ...


class ManagedBroker(Protocol):
    """What the API uses of ``RunningBroker`` (one namespace of a running broker)."""

    namespace_name: str

    @property
    def url(self) -> str: ...
    @property
    def ready(self) -> bool: ...
    @property
    def queues(self) -> list[str]: ...
    @property
    def topics(self) -> list[str]: ...
    @property
    def exchanges(self) -> list[ExchangeInfo]: ...
    @property
    def transactions(self) -> list[TransactionInfo]: ...
    @property
    def txn_stats(self) -> TransactionStats: ...
    @property
    def connections(self) -> list[ConnectionInfo]: ...
    def queue(self, name: str) -> QueueHandle: ...
    def topic(self, name: str) -> TopicHandle: ...
    def post(self, address: str, payload: bytes) -> None: ...
    def close_connection(self, conn_id: int, condition: str = ..., description: str | None = ...) -> bool: ...
    def resolve_transaction(self, txn_id: bytes | str, *, commit: bool = ...) -> str: ...
    def reset(self) -> None: ...
    def drop_namespace(self) -> None: ...
    def namespace_view(self, name: str) -> ManagedBroker: ...
    def connection_peers(self) -> dict[int, str]: ...
    def metrics(self) -> str: ...
    def capture(self, connection: int) -> dict[str, Any] | None: ...
    def frames(self, connection: int | None = None) -> list[dict[str, Any]]: ...
    def pcap(self) -> bytes: ...
    @property
    def faults(self) -> FaultsHandle: ...
    @property
    def personality(self) -> str: ...
    @property
    def clock(self) -> ManagedClock: ...
    async def create_namespace(self, name: str | None = None, personality: str | None = None) -> ManagedBroker: ...
    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None: ...  # noqa: ASYNC109


class HttpError(Exception):
    """A request answered with an error status and a JSON ``{"error": message}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Call:
    """One routed request: the request, the path parameters, and the namespace it addresses."""

    request: Request
    params: dict[str, str]
    target: ManagedBroker | None
    """The namespace addressed; None before the broker is attached (only the probes are routed then)."""

    @property
    def broker(self) -> ManagedBroker:
        """The namespace addressed (503 before the broker is attached)."""
        if self.target is None:
            raise HttpError(503, "not ready")
        return self.target

    def json(self) -> Any:
        """The request body as JSON (400 when it is not)."""
        try:
            return json.loads(self.request.body or b"null")
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise HttpError(400, f"malformed JSON: {exc}") from None

    def int_arg(self, name: str, default: int | None = None) -> int | None:
        text = self.request.query.get(name)
        if text is None:
            return default
        try:
            value = int(text)
        except ValueError:
            raise HttpError(400, f"{name}: {text!r} is not an integer") from None
        if value < 0:
            raise HttpError(400, f"{name}: must not be negative")
        return value


Handler = Callable[[Call], Awaitable[Response]]


@dataclass(frozen=True)
class Route:
    method: str
    pattern: tuple[str, ...]
    """The path's segments; ``{name}`` is a parameter."""
    handler: Handler
    public: bool
    """Answered without credentials (health probes)."""


class Router:
    """A routing table: ``add(method, "/api/queues/{name}", handler)``; ``{x}`` matches one path segment.

    Routes match the path's segments after each is percent-decoded on its own, so that ``%2F`` stays inside its
    segment: ``/api/queues/a%2Fb`` names the queue ``a/b`` and never reaches the route of ``/api/queues/a/b``.
    """

    def __init__(self) -> None:
        self.routes: list[Route] = []

    def add(self, method: str, path: str, handler: Handler, *, public: bool = False) -> None:
        self.routes.append(Route(method, tuple(path.split("/")), handler, public))

    def match(self, method: str, segments: list[str]) -> tuple[Route, dict[str, str]]:
        """The route for ``method`` and the decoded path ``segments`` and its parameters; HttpError 404 or 405
        when there is none. HEAD is answered as GET (RFC 9110 §9.3.2), the server leaving the body out."""
        allowed = []
        for route in self.routes:
            params = _match_segments(route.pattern, segments)
            if params is None:
                continue
            if route.method == method or (method == "HEAD" and route.method == "GET"):
                return route, params
            allowed.append(route.method)
        if allowed:
            if "GET" in allowed:
                allowed.insert(allowed.index("GET") + 1, "HEAD")
            raise _MethodNotAllowed(allowed)
        raise HttpError(404, f"no such resource: {'/'.join(segments)}")


def _match_segments(pattern: tuple[str, ...], segments: list[str]) -> dict[str, str] | None:
    if len(pattern) != len(segments):
        return None
    params = {}
    for expected, segment in zip(pattern, segments, strict=True):
        if expected.startswith("{") and expected.endswith("}"):
            if not segment:
                return None
            params[expected[1:-1]] = segment
        elif expected != segment:
            return None
    return params


def _segments(request: Request) -> list[str]:
    """The request path split at its slashes, each segment percent-decoded (400 when one is not UTF-8)."""
    raw_path = urlsplit(request.target).path
    try:
        return [unquote(segment, errors="strict") for segment in raw_path.split("/")]
    except UnicodeDecodeError:
        raise HttpError(400, "the path is not percent-encoded UTF-8") from None


class _MethodNotAllowed(HttpError):
    def __init__(self, allowed: list[str]) -> None:
        super().__init__(405, f"method not allowed here; allowed: {', '.join(allowed)}")
        self.allowed = allowed


_NOT_FRAMED = (("x-frame-options", "DENY"), ("content-security-policy", "frame-ancestors 'none'"))
"""The console has buttons that purge and reset: no other site may frame it (clickjacking)."""
_CONDITION = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class ManagementApi:
    """The app ``HttpServer`` serves: routes every request to its handler, as the caller is allowed."""

    def __init__(
        self,
        broker: ManagedBroker | None,
        *,
        users: bool = False,
        verify: Verify | None = None,
        permissions: Mapping[str, Permissions] | None = None,
        loopback: bool = False,
    ) -> None:
        """``broker`` None: it does not exist yet (its journal is being recovered); see ``attach``."""
        self.broker = broker
        self.phase = "starting"
        """What ``/readyz`` says while the broker is not ready: ``starting`` (not attached yet, or its listeners
        not bound), ``recovering`` (its journal being read), ``stopping`` (once shutdown began)."""
        self.loopback = loopback
        """Listening on a loopback address only: a request must name a loopback host (DNS rebinding)."""
        self.users = users
        self.verify = verify
        self.permissions = dict(permissions or {})
        router = self.router = Router()
        router.add("GET", "/healthz", healthz, public=True)
        router.add("GET", "/readyz", self.readyz, public=True)
        router.add("GET", "/", console_page)
        router.add("GET", "/api/namespaces/{name}/", console_page)  # the console of one namespace
        router.add("GET", "/api/info", info)
        router.add("GET", "/metrics", metrics_page)
        router.add("GET", "/api/queues", list_queues)
        router.add("GET", "/api/queues/{name}", get_queue)
        router.add("DELETE", "/api/queues/{name}", delete_queue)
        router.add("GET", "/api/queues/{name}/messages", peek_messages)
        router.add("POST", "/api/queues/{name}/messages", post_message)
        router.add("DELETE", "/api/queues/{name}/messages", purge_messages)
        router.add("GET", "/api/topics", list_topics)
        router.add("GET", "/api/topics/{name}", get_topic)
        router.add("DELETE", "/api/topics/{name}", delete_topic)
        router.add("GET", "/api/exchanges", list_exchanges)
        router.add("GET", "/api/transactions", list_transactions)
        router.add("POST", "/api/transactions/{id}/commit", commit_transaction)
        router.add("POST", "/api/transactions/{id}/rollback", rollback_transaction)
        router.add("GET", "/api/stats", stats)
        router.add("GET", "/api/connections", list_connections)
        router.add("DELETE", "/api/connections/{id}", close_connection)
        router.add("GET", "/api/connections/{id}/frames", connection_frames)
        router.add("GET", "/api/frames", all_frames)
        router.add("GET", "/api/capture.pcap", capture_pcap)
        router.add("POST", "/api/faults", add_fault)
        router.add("GET", "/api/faults", list_faults)
        router.add("DELETE", "/api/faults", clear_faults)
        router.add("DELETE", "/api/faults/{id}", remove_fault)
        router.add("POST", "/api/reset", reset)
        router.add("GET", "/api/wait", wait)
        router.add("GET", "/api/clock", get_clock)
        router.add("POST", "/api/clock/advance", advance_clock)
        router.add("POST", "/api/namespaces", create_namespace)
        router.add("DELETE", "/api/namespaces/{name}", drop_namespace)

    def attach(self, broker: ManagedBroker) -> None:
        """The broker is serving: every route answers from now on."""
        self.broker = broker

    @property
    def status(self) -> str:
        """``ready`` when the broker is attached and ready, else the ``phase``."""
        return "ready" if self.broker is not None and self.broker.ready else self.phase

    async def readyz(self, call: Call) -> Response:
        status = self.status
        return Response.json(200 if status == "ready" else 503, {"status": status})

    async def __call__(self, request: Request) -> Response:
        try:
            return await self._route(request)
        except _MethodNotAllowed as exc:
            return Response.error(405, exc.message, (("allow", ", ".join(exc.allowed)),))
        except HttpError as exc:
            return Response.error(exc.status, exc.message)

    async def _route(self, request: Request) -> Response:
        if self.loopback and not is_loopback_host(request.header("host")):
            # a page whose DNS name was re-pointed at 127.0.0.1 is same-origin for the browser: only the Host
            # header it sends tells it apart (RFC 9110 §15.5.20: not a target this server answers for)
            raise HttpError(421, "this API answers only loopback host names (127.0.0.1, localhost, [::1])")
        segments = _segments(request)
        namespace = None
        # /api/namespaces/{ns}/... is /api/... in the namespace ns (but /api/namespaces/{ns}/ is its console)
        if len(segments) > 4 and segments[1:3] == ["api", "namespaces"] and segments[3] and segments[4:] != [""]:
            namespace = segments[3]
            segments = ["", "api", *segments[4:]]
        route, params = self.router.match(request.method, segments)
        if request.method in MUTATING and not _same_origin(request):
            # a page on another site posting through an operator's browser (CSRF): a form POST needs no CORS
            # preflight, and the browser adds its cached Basic credentials; scripts and CLIs send no Origin
            raise HttpError(403, "cross-origin request refused")
        if not route.public and self.users:
            # before the namespace is looked up: which namespaces exist is not told to strangers
            refusal = await authorize(request, self.verify, self.permissions)
            if refusal is not None:
                return refusal
        broker = self.broker
        if broker is None:
            if not route.public:
                raise HttpError(503, f"not ready ({self.phase}): see /readyz")
        elif namespace is not None:
            broker = _namespace(broker, namespace)
        return await route.handler(Call(request, params, broker))


def _namespace(broker: ManagedBroker, name: str) -> ManagedBroker:
    """The namespace called ``name`` (404 when there is none: the remote handle reads "no namespace" as gone)."""
    try:
        return broker.namespace_view(name)
    except LookupError:
        raise HttpError(404, f"no namespace {name!r}") from None


def is_loopback_host(host: str | None) -> bool:
    """Whether a ``Host`` header (or a listener's address) names this machine's loopback; True when absent
    (HTTP/1.0 without one: not a browser)."""
    if host is None:
        return True
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host).is_loopback  # a listener's address, IPv6 without brackets
    try:
        name = urlsplit(f"//{host}").hostname
    except ValueError:
        return False
    if name is None:
        return False
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _same_origin(request: Request) -> bool:
    """Whether the request's ``Origin`` (sent by browsers, RFC 6454) names this server, or there is none."""
    origin = request.header("origin")
    if origin is None:
        return True
    return urlsplit(origin).netloc.lower() == (request.header("host") or "").lower()


# -- health -------------------------------------------------------------------------------------------
async def healthz(call: Call) -> Response:
    return Response.json(200, {"status": "ok"})


# -- the web console ----------------------------------------------------------------------------------
async def console_page(call: Call) -> Response:
    name = call.params.get("name")
    if name is not None:
        _namespace(call.broker, name)
    return Response(200, console.page(), (("content-type", console.CONTENT_TYPE), *_NOT_FRAMED))


async def metrics_page(call: Call) -> Response:
    """The Prometheus text exposition of the whole broker (every namespace: each sample names its own)."""
    return Response(200, call.broker.metrics().encode(), (("content-type", metrics.CONTENT_TYPE),))


async def info(call: Call) -> Response:
    """What a client needs to use this namespace: its name, the AMQP URL of its listener, and its personality
    (the default namespace's is the broker's, ``[broker] personality``)."""
    broker = call.broker
    return Response.json(
        200, {"namespace": broker.namespace_name, "url": broker.url, "personality": broker.personality}
    )


# -- queues -------------------------------------------------------------------------------------------
def _queue_json(stats: QueueStats, kind: str | None) -> dict[str, Any]:
    return {"name": stats.name, **stats.counts_json(), "kind": kind}


_Node = TypeVar("_Node", QueueHandle, TopicHandle)
T = TypeVar("T")


def _existing(lookup: Callable[[str], _Node], call: Call, kind: str) -> _Node:
    """The queue or topic the path's ``{name}`` names (404 when it does not exist)."""
    name = call.params["name"]
    handle = lookup(name)
    if not handle.exists:
        raise HttpError(404, f"no {kind} {name!r}")
    return handle


def _existing_queue(call: Call) -> QueueHandle:
    return _existing(call.broker.queue, call, "queue")


async def list_queues(call: Call) -> Response:
    queues = [call.broker.queue(name) for name in call.broker.queues]
    return Response.json(200, [_queue_json(q.stats(), q.kind) for q in queues])


async def get_queue(call: Call) -> Response:
    handle = _existing_queue(call)
    return Response.json(200, _queue_json(handle.stats(), handle.kind))


async def delete_queue(call: Call) -> Response:
    handle = _existing_queue(call)
    handle.delete()
    return Response.json(200, {"deleted": handle.name})


async def peek_messages(call: Call) -> Response:
    handle = _existing_queue(call)
    limit = min(call.int_arg("limit", 100) or 0, MAX_PEEK)
    page: list[dict[str, Any]] = []
    total = 0
    for view in handle.peek(limit):
        if page and total + view.size > MAX_PEEK_BYTES:
            break
        page.append(message_json(view))
        total += view.size
    return Response.json(200, page)


async def post_message(call: Call) -> Response:
    name = call.params["name"]
    payload = encode_message(call.json())
    try:
        call.broker.post(name, payload)
    except PostRefused as exc:
        status = {"amqp:not-found": 404, "amqp:resource-limit-exceeded": 507}.get(exc.condition, 400)
        raise HttpError(status, f"refused: {exc}") from None
    return Response.json(201, {"queue": name, "depth": call.broker.queue(name).depth})


async def purge_messages(call: Call) -> Response:
    handle = _existing_queue(call)
    return Response.json(200, {"purged": handle.purge()})


# -- topics -------------------------------------------------------------------------------------------
def _subscription_json(s: SubscriptionStats) -> dict[str, Any]:
    return {
        "container": s.container,
        "name": s.name,
        "durable": s.durable,
        "shared": s.shared,
        **s.counts_json(),
        "held_bytes": s.held_bytes,
    }


def _topic_json(handle: TopicHandle) -> dict[str, Any]:
    return {
        "name": handle.name,
        "staged": handle.staged,
        "subscriptions": [_subscription_json(s) for s in handle.subscriptions()],
    }


async def list_topics(call: Call) -> Response:
    return Response.json(200, [_topic_json(call.broker.topic(name)) for name in call.broker.topics])


def _existing_topic(call: Call) -> TopicHandle:
    return _existing(call.broker.topic, call, "topic")


async def get_topic(call: Call) -> Response:
    return Response.json(200, _topic_json(_existing_topic(call)))


async def delete_topic(call: Call) -> Response:
    handle = _existing_topic(call)
    handle.delete()
    return Response.json(200, {"deleted": handle.name})


# -- exchanges ----------------------------------------------------------------------------------------
def exchange_json(info: ExchangeInfo) -> dict[str, Any]:
    """An exchange as ``GET /api/exchanges`` shows it (argument values as ``jsonable`` makes them)."""
    return {
        "name": info.name,
        "type": info.type,
        "durable": info.durable,
        "auto_delete": info.auto_delete,
        "internal": info.internal,
        "arguments": jsonable(dict(info.arguments)),
        "bindings": [
            {
                "destination": b.destination,
                "kind": b.kind,
                "routing_key": b.routing_key,
                "arguments": jsonable(dict(b.arguments)),
            }
            for b in info.bindings
        ],
    }


async def list_exchanges(call: Call) -> Response:
    return Response.json(200, [exchange_json(info) for info in call.broker.exchanges])


# -- transactions, connections, stats -------------------------------------------------------------------
def _transaction_json(t: TransactionInfo) -> dict[str, Any]:
    return {
        "id": t.txn_id.hex(),
        "connection": t.connection,
        "age_s": round(t.age, 3),
        "posts": t.posts,
        "retirements": t.retirements,
        "acquisitions": t.acquisitions,
        "failed": t.failed,
        "state": t.state if t.state != "open" else "failed" if t.failed else "open",
        "addresses": list(t.staged_addresses),
    }


async def list_transactions(call: Call) -> Response:
    return Response.json(200, [_transaction_json(t) for t in call.broker.transactions])


async def commit_transaction(call: Call) -> Response:
    """Resolve an in-doubt transaction by committing it (``minibroker/broker/checkback.py``)."""
    return _resolve(call, commit=True)


async def rollback_transaction(call: Call) -> Response:
    """Resolve an in-doubt transaction by rolling it back."""
    return _resolve(call, commit=False)


def _resolve(call: Call, *, commit: bool) -> Response:
    text = call.params["id"]
    try:
        txn_id = bytes.fromhex(text)
    except ValueError:
        txn_id = b""
    if not txn_id:
        raise HttpError(400, f"{text!r} is not a transaction id (hex)")
    try:
        state = call.broker.resolve_transaction(txn_id, commit=commit)
    except LookupError as exc:
        raise HttpError(404, str(exc)) from None
    if commit and state != "committed":
        raise HttpError(409, f"transaction {txn_id.hex()} could not be committed and was rolled back")
    return Response.json(200, {"id": txn_id.hex(), "state": state})


async def stats(call: Call) -> Response:
    broker = call.broker
    txn = broker.txn_stats
    queues = [broker.queue(name).stats() for name in broker.queues]
    return Response.json(
        200,
        {
            "namespace": broker.namespace_name,
            "transactions": {
                "declared": txn.declared,
                "committed": txn.committed,
                "rolled_back": txn.rolled_back,
                "timed_out": txn.timed_out,
                "failed": txn.failed_commits,
                "in_doubt": txn.in_doubt,
                "abandoned": txn.abandoned,
                "open": len(broker.transactions),
            },
            "messages": {
                "in": sum(q.enqueued_total for q in queues),
                "out": sum(q.dequeued_total for q in queues),
                "ready": sum(q.ready for q in queues),
                "acquired": sum(q.acquired for q in queues),
            },
            "connections": len(broker.connections),
            "queues": len(queues),
            "topics": len(broker.topics),
        },
    )


async def list_connections(call: Call) -> Response:
    peers = call.broker.connection_peers()
    return Response.json(
        200,
        [
            {
                "id": c.id,
                "peer": peers.get(c.id),
                "container_id": c.container_id,
                "hostname": c.hostname,
                "user": c.user,
                "namespace": c.namespace,
                "sessions": c.sessions,
                "links": c.links,
            }
            for c in call.broker.connections
        ],
    )


async def close_connection(call: Call) -> Response:
    text = call.params["id"]
    if not (text.isascii() and text.isdigit()):
        raise HttpError(400, f"{text!r} is not a connection id")
    condition = call.request.query.get("condition", "amqp:connection:forced")
    if not _CONDITION.match(condition):
        raise HttpError(400, f"condition: {condition!r} is not a symbol")
    description = call.request.query.get("description", "closed by the management API")
    if not call.broker.close_connection(int(text), condition, description[:256]):
        raise HttpError(404, f"no connection {text}")
    return Response.json(200, {"closed": int(text), "condition": condition})


# -- frame capture (--capture) ------------------------------------------------------------------------------
PCAP_CONTENT_TYPE = "application/vnd.tcpdump.pcap"


def _captured(read: Callable[[], T]) -> T:
    """``read()``, with a capture that is off answered 409 (the request is fine; the broker is not capturing)."""
    try:
        return read()
    except CaptureOff as exc:
        raise HttpError(409, str(exc)) from None


async def connection_frames(call: Call) -> Response:
    """One connection's captured frames, decoded, with its addresses and the count of frames dropped; 404 for a
    connection never seen, or closed too long ago (the last ``REMEMBERED_CONNECTIONS`` closed ones are kept)."""
    text = call.params["id"]
    if not (text.isascii() and text.isdigit()):
        raise HttpError(400, f"{text!r} is not a connection id")
    answer = _captured(lambda: call.broker.capture(int(text)))
    if answer is None:
        raise HttpError(404, f"no captured connection {text}")
    return Response.json(200, answer)


async def all_frames(call: Call) -> Response:
    """Every kept connection's captured frames in one list, in time order."""
    return Response.json(200, _captured(lambda: call.broker.frames()))


async def capture_pcap(call: Call) -> Response:
    """Every kept capture as a pcap file (Wireshark and tshark read it as AMQP)."""
    data = _captured(call.broker.pcap)
    disposition = 'attachment; filename="minibroker.pcap"'
    return Response(200, data, (("content-type", PCAP_CONTENT_TYPE), ("content-disposition", disposition)))


# -- fault injection (issue 16 §1; the rules are broker-wide, whichever namespace's path names them) ----------
async def add_fault(call: Call) -> Response:
    raw = call.json()
    if not isinstance(raw, dict):
        raise HttpError(400, "expected a JSON object with point, action and the rule's other fields")
    try:
        spec = FaultSpec.from_mapping(raw)
    except (TypeError, ValueError) as exc:
        raise HttpError(400, str(exc)) from None
    try:
        rule_id = call.broker.faults.add(**spec.as_json())
    except ValueError as exc:  # the bound on rules
        raise HttpError(400, str(exc)) from None
    return Response.json(201, {"id": rule_id})


async def list_faults(call: Call) -> Response:
    return Response.json(200, [dataclasses.asdict(rule) for rule in call.broker.faults.list()])


async def clear_faults(call: Call) -> Response:
    faults = call.broker.faults
    count = len(faults.list())
    faults.clear()
    return Response.json(200, {"removed": count})


async def remove_fault(call: Call) -> Response:
    text = call.params["id"]
    if not (text.isascii() and text.isdigit()):
        raise HttpError(400, f"{text!r} is not a fault rule id")
    if not call.broker.faults.remove(int(text)):
        raise HttpError(404, f"no fault rule {text}")
    return Response.json(200, {"removed": int(text)})


# -- namespaces, reset, wait ------------------------------------------------------------------------------
async def reset(call: Call) -> Response:
    call.broker.reset()
    return Response.json(200, {"reset": call.broker.namespace_name})


async def create_namespace(call: Call) -> Response:
    body = call.json() if call.request.body else {}
    if not isinstance(body, dict):
        raise HttpError(400, "expected a JSON object")
    name = body.get("name")
    if name is not None and (not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", name)):
        raise HttpError(400, "name: expected 1-64 letters, digits, '.', '_' or '-'")
    personality = body.get("personality")
    if personality is not None:
        if not isinstance(personality, str):
            raise HttpError(400, f"personality: expected one of {', '.join(personalities.names())}")
        try:
            personalities.get(personality)
        except ValueError as exc:
            raise HttpError(400, f"personality: {exc}") from None
    if name is not None:
        try:
            call.broker.namespace_view(name)
        except LookupError:
            pass
        else:
            raise HttpError(409, f"namespace {name!r} exists")
    created = await call.broker.create_namespace(name, personality)
    return Response.json(201, {"name": created.namespace_name, "url": created.url, "personality": created.personality})


async def drop_namespace(call: Call) -> Response:
    name = call.params["name"]
    if name == DEFAULT_NAMESPACE:
        raise HttpError(400, "the default namespace cannot be deleted; POST /api/reset empties it")
    _namespace(call.broker, name).drop_namespace()
    return Response.json(200, {"deleted": name})


async def wait(call: Call) -> Response:
    """Long-poll until every condition given holds: ``queue`` has ``depth`` ready messages, ``transactions``
    transactions are open. Woken by changes of broker state."""
    broker = call.broker
    query = call.request.query
    queue = query.get("queue")
    depth = call.int_arg("depth")
    transactions = call.int_arg("transactions")
    if (queue is None) != (depth is None):
        raise HttpError(400, "queue and depth go together")
    if queue is None and transactions is None:
        raise HttpError(400, "nothing to wait for: give queue and depth, or transactions")
    try:
        timeout = float(query.get("timeout", "5"))
    except ValueError:
        raise HttpError(400, "timeout: not a number") from None
    if not 0 <= timeout <= MAX_WAIT:
        raise HttpError(400, f"timeout: must be between 0 and {MAX_WAIT:g} seconds")
    handle = broker.queue(queue) if queue is not None else None
    gone: list[bool] = []

    def holds() -> bool:
        try:
            if handle is not None and handle.depth != depth:
                return False
            return transactions is None or len(broker.transactions) == transactions
        except LookupError:  # the namespace was deleted during the wait: nothing more to wait for
            gone.append(True)
            return True

    try:
        await broker.wait_for(holds, timeout)
    except TimeoutError:
        return Response.error(408, f"condition not met within {timeout:g} s")
    if gone:
        raise HttpError(404, f"namespace {broker.namespace_name!r} was deleted during the wait")
    return Response.json(200, {"ok": True})


# -- the clock ------------------------------------------------------------------------------------------------
def _clock_json(clock: ManagedClock) -> dict[str, Any]:
    return {"mode": clock.mode, "now": clock.now}


async def get_clock(call: Call) -> Response:
    """The broker's clock (the whole broker's): ``mode`` "real" or "virtual", and ``now``, broker time as wall-clock
    seconds since the epoch."""
    return Response.json(200, _clock_json(call.broker.clock))


async def advance_clock(call: Call) -> Response:
    """``{"seconds": N}``: move virtual time N seconds forward, firing every broker timer due on the way before the
    answer (the clock as ``GET /api/clock`` shows it). 400 for anything but a non-negative number, 409 on the
    real clock."""
    body = call.json()
    if not isinstance(body, dict) or set(body) != {"seconds"}:
        raise HttpError(400, 'expected a JSON object {"seconds": N}')
    seconds = body["seconds"]
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise HttpError(400, f"seconds: expected a number, got {json.dumps(seconds)[:64]}")
    if seconds < 0:
        raise HttpError(400, "seconds: must not be negative (time only moves forward)")
    if not seconds <= MAX_ADVANCE:
        raise HttpError(400, f"seconds: expected a number from 0 to {MAX_ADVANCE:g}")
    clock = call.broker.clock
    if clock.mode != "virtual":
        raise HttpError(
            409, 'the broker\'s clock is real: start it with --clock virtual ([broker] clock = "virtual") to advance it'
        )
    clock.advance(seconds)
    return Response.json(200, _clock_json(clock))


# -- messages as JSON -----------------------------------------------------------------------------------
def jsonable(value: Any) -> Any:
    """An AMQP value as JSON can carry it: bytes as base64 text, map keys as text, other types as text."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value).replace("nan", "NaN").replace("inf", "Infinity")  # RFC 8259 JSON has no such numbers
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return str(value)


def message_json(view: MessageView) -> dict[str, Any]:
    """A message as ``GET .../messages`` shows it (times in seconds, as ``MessageView`` has them)."""
    properties = {}
    for name, attribute in PROPERTY_FIELDS.items():
        value = getattr(view, attribute)
        if value is not None:
            properties[name] = jsonable(value)
    result: dict[str, Any] = {
        "header": {
            "durable": view.durable,
            "priority": view.priority,
            "ttl": view.ttl,
            "first_acquirer": view.first_acquirer,
            "delivery_count": view.delivery_count,
        },
        "properties": properties,
        "application_properties": jsonable(view.properties),
        "annotations": jsonable(view.annotations),
        "size": view.size,
    }
    if isinstance(view.body, bytes):
        result["body"] = base64.b64encode(view.body).decode()
        result["body_encoding"] = "base64"
    else:
        result["body"] = jsonable(view.body)
    return result


def _object(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise HttpError(400, f"{what}: expected a JSON object")
    return value


def _seconds_to_ms(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value < 2**32:
        raise HttpError(400, f"{what}: expected a number of seconds")
    return round(value * 1000)


def encode_message(spec: Any) -> bytes:
    """The encoded message a ``POST .../messages`` body describes (400 when it does not)."""
    spec = _object(spec, "message")
    unknown = set(spec) - {"body", "body_encoding", "header", "properties", "application_properties", "annotations"}
    if unknown:
        raise HttpError(400, f"unknown keys: {', '.join(sorted(unknown))}")
    sections: list[Any] = []
    header = _object(spec.get("header"), "header")
    if header:
        extra = set(header) - {"durable", "priority", "ttl"}
        if extra:
            raise HttpError(400, f"header: unknown keys: {', '.join(sorted(extra))}")
        durable = header.get("durable")
        priority = header.get("priority")
        if durable is not None and not isinstance(durable, bool):
            raise HttpError(400, "header.durable: expected true or false")
        if priority is not None and not (_is_int(priority) and 0 <= priority <= 255):
            raise HttpError(400, "header.priority: expected an integer 0-255")
        sections.append(Header(durable=durable, priority=priority, ttl=_seconds_to_ms(header.get("ttl"), "header.ttl")))
    annotations = _object(spec.get("annotations"), "annotations")
    if annotations:
        sections.append(MessageAnnotations({Symbol(k): _scalar(v, f"annotations.{k}") for k, v in annotations.items()}))
    properties = _object(spec.get("properties"), "properties")
    if properties:
        extra = set(properties) - set(PROPERTY_FIELDS)
        if extra:
            raise HttpError(400, f"properties: unknown keys: {', '.join(sorted(extra))}")
        fields: dict[str, Any] = {}
        for name, value in properties.items():
            if name in ("absolute_expiry_time", "creation_time"):
                fields[name] = _seconds_to_ms(value, f"properties.{name}")
            elif name == "user_id":
                if not isinstance(value, str):
                    raise HttpError(400, "properties.user_id: expected a string")
                fields[name] = value.encode()
            elif name == "group_sequence":
                if not (_is_int(value) and 0 <= value < 2**32):
                    raise HttpError(400, "properties.group_sequence: expected an unsigned integer")
                fields[name] = value
            elif name in ("message_id", "correlation_id"):
                if not (isinstance(value, str) or (_is_int(value) and value >= 0)):
                    raise HttpError(400, f"properties.{name}: expected a string or an unsigned integer")
                fields[name] = value
            else:
                if not isinstance(value, str):
                    raise HttpError(400, f"properties.{name}: expected a string")
                fields[name] = value
        sections.append(Properties(**fields))
    application = _object(spec.get("application_properties"), "application_properties")
    if application:
        sections.append(
            ApplicationProperties({k: _scalar(v, f"application_properties.{k}") for k, v in application.items()})
        )
    body = spec.get("body")
    encoding = spec.get("body_encoding")
    if encoding == "base64":
        if not isinstance(body, str):
            raise HttpError(400, "body: expected base64 text")
        try:
            sections.append(Data(base64.b64decode(body, validate=True)))
        except binascii.Error:
            raise HttpError(400, "body: not valid base64") from None
    elif encoding is not None:
        raise HttpError(400, f"body_encoding: {encoding!r} is not base64")
    else:
        sections.append(AmqpValue(body))
    try:
        return b"".join(codec.encode(section) for section in sections)
    except (EncodeError, ValueError, TypeError, OverflowError) as exc:  # a number out of AMQP's range
        raise HttpError(400, f"message cannot be encoded: {exc}") from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _scalar(value: Any, what: str) -> Any:
    """A property or annotation value: AMQP allows only simple types there (§3.2.5)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise HttpError(400, f"{what}: expected a string, number, boolean or null")
