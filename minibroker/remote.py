"""A running broker seen through its HTTP management API: the embedded handle's surface, remotely.

    broker = minibroker.connect("http://127.0.0.1:8672")
    broker.url                          # the AMQP URL to connect clients to
    broker.queue("orders").depth        # as on the embedded handle (``ThreadedBroker``)
    broker.wait_for(queue="orders", depth=1, timeout=5)

``connect`` returns a ``RemoteBroker``: the same names as ``ThreadedBroker`` (``queue(name)`` with ``depth``,
``acquired``, ``staged``, ``stats()``, ``peek()``, ``purge()``, ``exists``; ``queues``, ``topics``,
``transactions``, ``txn_stats``, ``connections``, ``reset()``, ``create_namespace()``, ``drop_namespace()``), so a
test written against the ``minibroker`` fixture runs unchanged against a broker in a container. Every read is one
HTTP request, synchronous, made with the standard library only; nothing is cached.

What differs, on purpose: ``wait_for`` takes the keyword conditions the ``/api/wait`` endpoint checks
(``queue`` and ``depth``, ``transactions``), never a predicate: a Python function cannot run inside another
process, so passing one raises ``TypeError`` (the embedded handle takes both). Transactions and connections come
back as ``RemoteTransaction`` and ``RemoteConnection``, with the attribute names of ``TransactionInfo`` and
``ConnectionInfo`` for what the API reports. Errors say whose fault: ``BrokerUnreachable`` when no answer came,
``RemoteError`` (with the HTTP status) when the broker answered with an error.
"""

from __future__ import annotations

import base64
import http.client
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlencode, urlsplit

from minibroker.broker.namespace import DEFAULT_NAMESPACE
from minibroker.broker.transactions import TransactionStats
from minibroker.broker.views import MessageView

DEFAULT_HTTP_URL = "http://127.0.0.1:8672"
DEFAULT_TIMEOUT = 10.0


class RemoteError(Exception):
    """The broker's management API answered with an error; ``status`` is the HTTP status."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class BrokerUnreachable(RemoteError):
    """No answer came from the management API: nothing listening, a refused connection, a timeout."""


@dataclass(frozen=True)
class RemoteTransaction:
    """One open transaction as the API reports it (the names of ``TransactionInfo`` where it has them)."""

    txn_id: bytes
    connection: str
    """The container-id of the connection that declared it."""
    age: float
    posts: int
    retirements: int
    acquisitions: int
    failed: str | None
    state: str


@dataclass(frozen=True)
class RemoteConnection:
    """One client connection as the API reports it (the names of ``ConnectionInfo`` where it has them)."""

    id: int
    container_id: str
    namespace: str
    user: str | None
    sessions: int
    links: int
    peer: str | None


@dataclass(frozen=True)
class RemoteQueueStats:
    """Counts of one queue at one moment, as the API reports them (the names of ``QueueStats``)."""

    name: str
    ready: int
    acquired: int
    staged: int
    consumers: int
    kind: str | None = None

    @property
    def depth(self) -> int:
        """Messages ready for delivery (the same as ``ready``)."""
        return self.ready


def _queue_stats(name: str, item: Mapping[str, Any]) -> RemoteQueueStats:
    return RemoteQueueStats(
        name=item.get("name", name),
        ready=int(item.get("depth", item.get("ready", 0))),
        acquired=int(item.get("acquired", 0)),
        staged=int(item.get("staged", 0)),
        consumers=int(item.get("consumers", 0)),
        kind=item.get("kind"),
    )


def message_view(item: Mapping[str, Any]) -> MessageView:
    """A message of ``GET .../messages`` as ``peek()`` presents it locally (proton's names, times in seconds)."""
    body = item.get("body")
    if item.get("body_encoding") == "base64" and isinstance(body, str):
        body = base64.b64decode(body)
    fields: dict[str, Any] = {"body": body}
    properties = item.get("properties") or {}
    for api_name, name in _PROPERTY_NAMES.items():
        if api_name in properties:
            fields[name] = properties[api_name]
    for api_name, name in (("absolute_expiry_time", "expiry_time"), ("creation_time", "creation_time")):
        if properties.get(api_name) is not None:
            fields[name] = properties[api_name] / 1000
    header = item.get("header") or {}
    if header.get("durable") is not None:
        fields["durable"] = bool(header["durable"])
    if header.get("priority") is not None:
        fields["priority"] = int(header["priority"])
    if header.get("ttl") is not None:
        fields["ttl"] = header["ttl"] / 1000
    if header.get("first_acquirer") is not None:
        fields["first_acquirer"] = bool(header["first_acquirer"])
    if header.get("delivery_count") is not None:
        fields["delivery_count"] = int(header["delivery_count"])
    fields["properties"] = dict(item.get("application_properties") or {})
    fields["annotations"] = dict(item.get("annotations") or {})
    return MessageView(**fields)


_PROPERTY_NAMES = {
    "message_id": "id",
    "user_id": "user_id",
    "to": "address",
    "subject": "subject",
    "reply_to": "reply_to",
    "correlation_id": "correlation_id",
    "content_type": "content_type",
    "content_encoding": "content_encoding",
    "group_id": "group_id",
    "group_sequence": "group_sequence",
    "reply_to_group_id": "reply_to_group_id",
}
"""The API's name of each field of the properties section (§3.2.4), and ``MessageView``'s."""


class _Api:
    """The management API at one base URL: one HTTP request per call, Basic auth when a user is given."""

    def __init__(self, http_url: str, user: str | None, password: str | None, timeout: float) -> None:
        parts = urlsplit(http_url if "://" in http_url else f"http://{http_url}")
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"{http_url!r} is not an http:// or https:// URL")
        self.http_url = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"
        self.scheme = parts.scheme
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        if user is None and parts.username is not None:
            user, password = unquote(parts.username), unquote(parts.password or "")
        self.timeout = timeout
        self.headers = {"Accept": "application/json"}
        if user is not None:
            token = base64.b64encode(f"{user}:{password or ''}".encode()).decode("ascii")
            self.headers["Authorization"] = f"Basic {token}"

    def request(
        self, method: str, path: str, body: Any = None, *, timeout: float | None = None, ok: tuple[int, ...] = ()
    ) -> tuple[int, Any]:
        """(status, decoded JSON body or None) of ``method path``; ``RemoteError`` for an error status not in
        ``ok``, ``BrokerUnreachable`` when no answer came."""
        connection_class = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        conn = connection_class(self.host, self.port, timeout=self.timeout if timeout is None else timeout)
        headers = dict(self.headers)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            status, raw = response.status, response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise BrokerUnreachable(f"cannot reach the broker's HTTP API at {self.http_url}: {exc}") from None
        finally:
            conn.close()
        try:
            answer = json.loads(raw) if raw else None
        except ValueError:
            answer = raw.decode("utf-8", "replace")
        if status >= 400 and status not in ok:
            detail = answer.get("error", answer) if isinstance(answer, dict) else answer
            raise RemoteError(f"{method} {path}: HTTP {status}: {detail or response.reason}", status)
        return status, answer

    def get(self, path: str) -> Any:
        return self.request("GET", path)[1]


def _quoted(name: str) -> str:
    return quote(name, safe="")


class RemoteQueue:
    """A queue by name, read through the API; every property is a fresh request (zeros when it does not exist)."""

    def __init__(self, owner: RemoteBroker, name: str) -> None:
        self._owner = owner
        self.namespace = owner.namespace_name
        self.name = name

    @property
    def _path(self) -> str:
        return f"{self._owner._prefix}/queues/{_quoted(self.name)}"

    def _read(self) -> Mapping[str, Any] | None:
        status, answer = self._owner._api.request("GET", self._path, ok=(404,))
        return None if status == 404 else answer

    def stats(self) -> RemoteQueueStats:
        """Ready, acquired and staged counts at one instant (zeros when the queue does not exist)."""
        return _queue_stats(self.name, self._read() or {})

    @property
    def exists(self) -> bool:
        """Whether the queue exists now."""
        return self._read() is not None

    @property
    def depth(self) -> int:
        """Messages ready for delivery (not counting acquired ones or ones staged in transactions)."""
        return self.stats().ready

    @property
    def ready(self) -> int:
        return self.stats().ready

    @property
    def acquired(self) -> int:
        """Messages delivered to a consumer and not yet settled."""
        return self.stats().acquired

    @property
    def staged(self) -> int:
        """Messages posted in open transactions, invisible until commit."""
        return self.stats().staged

    def peek(self, limit: int | None = None) -> list[MessageView]:
        """The ready messages in delivery order, decoded, without consuming them (none when it does not exist)."""
        query = "" if limit is None else f"?{urlencode({'limit': limit})}"
        status, answer = self._owner._api.request("GET", f"{self._path}/messages{query}", ok=(404,))
        if status == 404:
            return []
        items = answer.get("messages", []) if isinstance(answer, dict) else answer
        return [message_view(item) for item in items]

    def purge(self) -> int:
        """Drop every ready message; return how many were dropped (0 when the queue does not exist)."""
        status, answer = self._owner._api.request("DELETE", f"{self._path}/messages", ok=(404,))
        return 0 if status == 404 else int(answer["purged"])

    def send(
        self,
        body: Any,
        *,
        properties: Mapping[str, Any] | None = None,
        application_properties: Mapping[str, Any] | None = None,
    ) -> None:
        """Post one message to the queue (remote only: locally, a client sends). ``bytes`` go as base64."""
        message: dict[str, Any] = {"body": body}
        if isinstance(body, bytes):
            message = {"body": base64.b64encode(body).decode("ascii"), "body_encoding": "base64"}
        if properties:
            message["properties"] = dict(properties)
        if application_properties:
            message["application_properties"] = dict(application_properties)
        self._owner._api.request("POST", f"{self._path}/messages", message)

    def __repr__(self) -> str:
        return f"RemoteQueue({self.name!r}, namespace={self.namespace!r})"


class RemoteBroker:
    """A broker (one namespace of it: the default unless created) through its HTTP management API.

    Made by ``minibroker.connect``; see the module's docstring for what it shares with ``ThreadedBroker``.
    """

    def __init__(self, api: _Api, namespace: str | None = None, url: str | None = None) -> None:
        self._api = api
        self._namespace = namespace
        self._url = url
        self.http_url = api.http_url

    @property
    def namespace_name(self) -> str:
        """The namespace this handle reads ("default" for the broker's own)."""
        return self._namespace or DEFAULT_NAMESPACE

    @property
    def _prefix(self) -> str:
        return "/api" if self._namespace is None else f"/api/namespaces/{_quoted(self._namespace)}"

    @property
    def url(self) -> str:
        """The AMQP URL clients connect to (of this namespace's listener), as the broker reports it."""
        if self._url is None:
            self._url = str(self._api.get(f"{self._prefix}/stats")["url"])
        return self._url

    def check(self, timeout: float = 1.0) -> None:
        """Raise ``RemoteError`` (``BrokerUnreachable`` when nothing answers) unless ``/readyz`` answers 200 within
        ``timeout`` seconds, asking again every tenth of a second meanwhile."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._api.request("GET", "/readyz", timeout=max(0.1, deadline - time.monotonic()))
                return
            except RemoteError:
                if time.monotonic() >= deadline:
                    raise
            time.sleep(0.1)

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """The decoded JSON answer of ``method`` on ``path`` under this namespace's API (``/queues``, say), for
        what the handle does not wrap; ``RemoteError`` for an error status."""
        return self._api.request(method, f"{self._prefix}{path}", body)[1]

    def queue(self, name: str) -> RemoteQueue:
        """The queue called ``name`` (it need not exist yet)."""
        return RemoteQueue(self, name)

    @property
    def queues(self) -> list[str]:
        """Names of the queues that exist now."""
        return sorted(item["name"] for item in self._api.get(f"{self._prefix}/queues"))

    @property
    def topics(self) -> list[str]:
        """Names of the topics that exist now."""
        return sorted(
            item["name"] if isinstance(item, dict) else item for item in self._api.get(f"{self._prefix}/topics")
        )

    @property
    def transactions(self) -> list[RemoteTransaction]:
        """Open transactions of this namespace's connections, oldest first."""
        return [
            RemoteTransaction(
                txn_id=bytes.fromhex(item["id"]),
                connection=item["connection"],
                age=float(item["age_s"]),
                posts=int(item["posts"]),
                retirements=int(item["retirements"]),
                acquisitions=int(item["acquisitions"]),
                failed=item.get("failed"),
                state=item.get("state", ""),
            )
            for item in self._api.get(f"{self._prefix}/transactions")
        ]

    @property
    def connections(self) -> list[RemoteConnection]:
        """The connections working in this namespace."""
        return [
            RemoteConnection(
                id=int(item["id"]),
                container_id=item["container_id"],
                namespace=item["namespace"],
                user=item.get("user"),
                sessions=int(item["sessions"]),
                links=int(item["links"]),
                peer=item.get("peer"),
            )
            for item in self._api.get(f"{self._prefix}/connections")
        ]

    @property
    def txn_stats(self) -> TransactionStats:
        """Broker-wide transaction counters (declared, committed, rolled back, timed out)."""
        stats = self._api.get(f"{self._prefix}/stats")
        counters = stats.get("transactions", stats)
        return TransactionStats(**{name: int(counters.get(name, 0)) for name in TransactionStats.__dataclass_fields__})

    def wait_for(
        self,
        predicate: Callable[[], bool] | None = None,
        timeout: float = 5.0,
        *,
        queue: str | None = None,
        depth: int | None = None,
        transactions: int | None = None,
    ) -> None:
        """Block until the broker says the conditions hold: ``queue``'s depth is ``depth``, the number of open
        transactions is ``transactions``. Raises ``TimeoutError`` after ``timeout`` seconds.

        A predicate is for the embedded handle only (it cannot run in the broker's process): ``TypeError`` here.
        """
        if predicate is not None:
            raise TypeError(
                "a remote broker cannot run a Python predicate; wait with keyword conditions instead, "
                "e.g. wait_for(queue='q', depth=1, timeout=5) or wait_for(transactions=0)"
            )
        if (queue is None) != (depth is None):
            raise TypeError("wait_for: queue and depth go together")
        if queue is None and transactions is None:
            raise TypeError("wait_for: give queue= and depth=, or transactions=")
        query: dict[str, Any] = {"timeout": timeout}
        if queue is not None:
            query.update(queue=queue, depth=depth)
        if transactions is not None:
            query["transactions"] = transactions
        status, _ = self._api.request(
            "GET", f"{self._prefix}/wait?{urlencode(query)}", timeout=timeout + self._api.timeout, ok=(408,)
        )
        if status == 408:
            raise TimeoutError(f"condition not met within {timeout} s")

    def reset(self) -> None:
        """Drop every node, message and transaction of this namespace; close its connections."""
        self._api.request("POST", f"{self._prefix}/reset")

    def create_namespace(self, name: str | None = None) -> RemoteBroker:
        """A new isolated namespace with a listener of its own; its ``url`` connects into it."""
        answer = self._api.request("POST", "/api/namespaces", {} if name is None else {"name": name})[1]
        return RemoteBroker(self._api, answer["name"], answer["url"])

    def namespace(self, name: str) -> RemoteBroker:
        """A handle on the existing namespace called ``name`` (remote only: locally, keep the created handle)."""
        return RemoteBroker(self._api, None if name == DEFAULT_NAMESPACE else name)

    def drop_namespace(self) -> None:
        """Close this namespace's listener and connections and forget its state."""
        if self._namespace is None:
            raise ValueError("the default namespace cannot be dropped; use reset()")
        self._api.request("DELETE", f"/api/namespaces/{_quoted(self._namespace)}")

    def __repr__(self) -> str:
        return f"RemoteBroker({self.http_url}, namespace={self.namespace_name!r})"


def connect(
    http_url: str = DEFAULT_HTTP_URL,
    *,
    user: str | None = None,
    password: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    url: str | None = None,
) -> RemoteBroker:
    """A handle on the broker whose management API is at ``http_url`` (``http://HOST:PORT``).

    ``user`` and ``password`` (or ``http://USER:PASSWORD@HOST:PORT``, percent-encoded) are sent with HTTP Basic
    auth (needed when the broker has users). ``timeout``
    bounds each request (a ``wait_for`` gets its own timeout on top). ``url`` overrides the AMQP URL the broker
    reports, for a broker behind a port mapping (a container). It checks nothing: the first call that gets no
    answer raises ``BrokerUnreachable``.
    """
    return RemoteBroker(_Api(http_url, user, password, timeout), url=url)


__all__ = [
    "BrokerUnreachable",
    "RemoteBroker",
    "RemoteConnection",
    "RemoteError",
    "RemoteQueue",
    "RemoteQueueStats",
    "RemoteTransaction",
    "connect",
    "message_view",
]
