"""A running broker seen through its HTTP management API: the embedded handle's surface, remotely.

    broker = minibroker.connect("http://127.0.0.1:8672")
    broker.url                          # the AMQP URL to connect clients to
    broker.queue("orders").depth        # as on the embedded handle (``ThreadedBroker``)
    broker.wait_for(queue="orders", depth=1, timeout=5)

``connect`` returns a ``RemoteBroker``: the same names as ``ThreadedBroker`` (``queue(name)`` with ``depth``,
``acquired``, ``staged``, ``stats()``, ``peek()``, ``purge()``, ``exists``; ``queues``, ``topic(name)``, ``topics``,
``transactions``, ``txn_stats``, ``connections``, ``personality``, ``clock`` (``mode``, ``now``, ``advance()``),
``faults``, ``reset()``, ``create_namespace()``, ``drop_namespace()``), so a
test written against the ``minibroker`` fixture runs unchanged against a broker in a container. Every read is one
HTTP request, synchronous, made with the standard library only; nothing is cached.

What differs, on purpose: ``wait_for`` takes the keyword conditions the ``/api/wait`` endpoint checks
(``queue`` and ``depth``, ``transactions``), never a predicate: a Python function cannot run inside another
process, so passing one raises ``TypeError`` (the embedded handle takes both). ``queue(name).send(...)`` posts a
message (remote only). Stats, transactions, connections and peeked messages come back as the embedded handle's
own types (``QueueStats``, ``SubscriptionStats``, ``TransactionInfo``, ``ConnectionInfo``, ``MessageView``);
``topic(name)`` has no ``peek`` (the API does not show a subscription's messages), and ``url`` (a namespace's
too) is the broker's own idea of its address. Errors say whose fault: ``BrokerUnreachable`` when no answer came,
``RemoteError`` (with the HTTP status) when the broker answered with an error.
"""

from __future__ import annotations

import base64
import http.client
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlencode, urlsplit

from minibroker.broker.faults import FaultInfo, FaultSpec
from minibroker.broker.namespace import DEFAULT_NAMESPACE
from minibroker.broker.reads import QueueReads
from minibroker.broker.transactions import TransactionInfo, TransactionStats
from minibroker.broker.views import (
    PROPERTY_FIELDS,
    BindingInfo,
    ConnectionInfo,
    ExchangeInfo,
    MessageView,
    QueueStats,
    SubscriptionStats,
)
from minibroker.handles import FaultRules, amqp091_url

DEFAULT_HTTP_URL = "http://127.0.0.1:8672"
DEFAULT_TIMEOUT = 10.0
MAX_PEEK = 1000
"""Most messages one ``GET .../messages`` returns (the API's bound)."""


class RemoteError(Exception):
    """The broker's management API answered with an error; ``status`` is the HTTP status."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class BrokerUnreachable(RemoteError):
    """No answer came from the management API: nothing listening, a refused connection, a timeout."""


def _queue_stats(name: str, item: Mapping[str, Any]) -> QueueStats:
    return QueueStats(name=item.get("name", name), **QueueStats.counts_from_json(item))


def message_view(item: Mapping[str, Any]) -> MessageView:
    """A message of ``GET .../messages`` as ``peek()`` presents it locally (proton's names, times in seconds)."""
    body = item.get("body")
    if item.get("body_encoding") == "base64" and isinstance(body, str):
        body = base64.b64decode(body)
    fields: dict[str, Any] = {"body": body, "size": int(item.get("size", 0))}
    properties = dict(item.get("properties") or {})
    if isinstance(properties.get("user_id"), str):
        properties["user_id"] = base64.b64decode(properties["user_id"])
    for api_name, name in PROPERTY_FIELDS.items():
        if properties.get(api_name) is not None:
            fields[name] = properties[api_name]
    header = item.get("header") or {}
    for name in ("durable", "priority", "ttl", "first_acquirer", "delivery_count"):
        if header.get(name) is not None:
            fields[name] = header[name]
    fields["properties"] = dict(item.get("application_properties") or {})
    fields["annotations"] = dict(item.get("annotations") or {})
    return MessageView(**fields)


class _Api:
    """The management API at one base URL: one HTTP request per call, Basic auth when a user is given."""

    def __init__(self, http_url: str, user: str | None, password: str | None, timeout: float) -> None:
        parts = urlsplit(http_url if "://" in http_url else f"http://{http_url}")
        if parts.scheme not in ("http", "https"):
            # the URL itself is not quoted: it may hold a password
            raise ValueError(f"not an http:// or https:// URL (scheme {parts.scheme!r})")
        self.base = parts.path.rstrip("/")
        """A path the API sits under (behind a reverse proxy, say); empty when it is at the root."""
        self.http_url = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{self.base}"
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
        status, reason, raw = self._exchange(method, path, body, timeout)
        return status, self._decoded(method, path, status, reason, raw, ok)

    def get_bytes(self, path: str) -> bytes:
        """The body of ``GET path`` as it is (a pcap file, say); ``RemoteError`` for an error status."""
        status, reason, raw = self._exchange("GET", path, None, None)
        if not 200 <= status < 300:
            self._decoded("GET", path, status, reason, raw, ())
        return raw

    def _exchange(self, method: str, path: str, body: Any, timeout: float | None) -> tuple[int, str, bytes]:
        """(status, reason, raw body) of one request; ``BrokerUnreachable`` when no answer came."""
        connection_class = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        conn = connection_class(self.host, self.port, timeout=self.timeout if timeout is None else timeout)
        headers = dict(self.headers)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, f"{self.base}{path}", body=data, headers=headers)
            response = conn.getresponse()
            return response.status, response.reason, response.read()
        except (OSError, http.client.HTTPException) as exc:
            raise BrokerUnreachable(f"cannot reach the broker's HTTP API at {self.http_url}: {exc}") from None
        finally:
            conn.close()

    def _decoded(self, method: str, path: str, status: int, reason: str, raw: bytes, ok: tuple[int, ...]) -> Any:
        """The JSON answer ``raw``; ``RemoteError`` for an error status not in ``ok``, or for what is not JSON."""
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = None
        if not isinstance(answer, dict | list):
            # every answer of the API is a JSON object or array: this is some other server (a proxy's error page,
            # a web server's welcome page); a redirect is not followed, as it may lead anywhere
            raise RemoteError(
                f"{method} {path}: HTTP {status} {reason}: not an answer of minibroker's management API"
                f" at {self.http_url} (it sent {_snippet(raw)})",
                status,
            )
        if not 200 <= status < 300 and status not in ok:
            detail = answer.get("error", answer) if isinstance(answer, dict) else answer
            raise RemoteError(f"{method} {path}: HTTP {status}: {_snippet(str(detail).encode())}", status)
        return answer


def _snippet(raw: bytes, limit: int = 200) -> str:
    """The start of an answer, for an error message."""
    if not raw:
        return "nothing"
    text = raw[:limit].decode("utf-8", "replace")
    return repr(text) + (f" and {len(raw) - limit} more bytes" if len(raw) > limit else "")


def _quoted(name: str) -> str:
    return quote(name, safe="")


class _RemoteNode:
    """A queue or topic by name in one namespace, and the requests about it."""

    _collection = ""
    """The API's path of this kind of node (``/queues``)."""

    def __init__(self, owner: RemoteBroker, name: str) -> None:
        self._owner = owner
        self.namespace = owner.namespace_name
        self.name = name

    @property
    def _path(self) -> str:
        return f"{self._collection}/{_quoted(self.name)}"

    def _request(self, method: str, path: str = "", body: Any = None) -> Any:
        """The answer of ``method`` on this node's ``path``; None when the node does not exist (404)."""
        return self._owner._request(method, f"{self._path}{path}", body, missing_ok=True)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, namespace={self.namespace!r})"


class RemoteQueue(_RemoteNode, QueueReads):
    """A queue by name, read through the API; every property is a fresh request (zeros when it does not exist)."""

    _collection = "/queues"

    def stats(self) -> QueueStats:
        """Ready, acquired, staged and scheduled counts at one instant (zeros when the queue does not exist)."""
        return _queue_stats(self.name, self._request("GET") or {})

    @property
    def exists(self) -> bool:
        """Whether the queue exists now."""
        return self._request("GET") is not None

    @property
    def kind(self) -> str | None:
        """How the queue came to be ("dynamic", "auto" or "static"); None when it does not exist."""
        answer = self._request("GET")
        return None if answer is None else answer.get("kind")

    def peek(self, limit: int | None = None) -> list[MessageView]:
        """The ready messages in delivery order, decoded, without consuming them (none when it does not exist).

        At most ``MAX_PEEK`` (the API's bound) even without a ``limit``.
        """
        query = urlencode({"limit": MAX_PEEK if limit is None else min(limit, MAX_PEEK)})
        return [message_view(item) for item in self._request("GET", f"/messages?{query}") or []]

    def purge(self) -> int:
        """Drop every ready message; return how many were dropped (0 when the queue does not exist)."""
        answer = self._request("DELETE", "/messages")
        return 0 if answer is None else int(answer["purged"])

    def delete(self) -> bool:
        """Delete the queue with its messages (its links are detached); whether it existed."""
        return self._request("DELETE") is not None

    def send(
        self,
        body: Any,
        *,
        properties: Mapping[str, Any] | None = None,
        application_properties: Mapping[str, Any] | None = None,
    ) -> None:
        """Post one message to the queue, creating it as an attach would (remote only: locally, a client sends).

        ``bytes`` go as a data section, anything else JSON can carry as an amqp-value; ``properties`` take the
        API's names (``message_id``, ``subject``, times in seconds).
        """
        message: dict[str, Any] = {"body": body}
        if isinstance(body, bytes):
            message = {"body": base64.b64encode(body).decode("ascii"), "body_encoding": "base64"}
        if properties:
            message["properties"] = dict(properties)
        if application_properties:
            message["application_properties"] = dict(application_properties)
        self._owner._request("POST", f"{self._path}/messages", message)


class RemoteTopic(_RemoteNode):
    """A topic by name, read through the API; every call is a fresh request (nothing when it does not exist).

    No ``peek`` of a subscription: the API does not show a subscription's messages.
    """

    _collection = "/topics"

    def _read(self) -> Any:
        return self._request("GET")

    @property
    def exists(self) -> bool:
        """Whether the topic exists now."""
        return self._read() is not None

    @property
    def staged(self) -> int:
        """Messages posted to the topic in open transactions, invisible until commit (0 when it does not exist)."""
        answer = self._read()
        return 0 if answer is None else int(answer["staged"])

    def subscriptions(self) -> list[SubscriptionStats]:
        """Each subscription's key, kind and counts at one instant, in the order they were made."""
        answer = self._read()
        return [
            SubscriptionStats(
                container=item["container"],
                name=item["name"],
                durable=bool(item["durable"]),
                shared=bool(item["shared"]),
                held_bytes=int(item["held_bytes"]),
                **SubscriptionStats.counts_from_json(item),
            )
            for item in ([] if answer is None else answer["subscriptions"])
        ]

    def delete(self) -> bool:
        """Delete the topic with its subscriptions (their links are detached); whether it existed."""
        return self._request("DELETE") is not None


class RemoteClock:
    """The broker's clock through the API (``GET /api/clock``, ``POST /api/clock/advance``): every read is a request.

    ``advance`` on a real clock raises ``RemoteError`` with status 409; a negative ``seconds``, status 400.
    """

    def __init__(self, owner: RemoteBroker) -> None:
        self._owner = owner

    @property
    def mode(self) -> str:
        """ "real" or "virtual"."""
        return str(self._owner._request("GET", "/clock")["mode"])

    @property
    def now(self) -> float:
        """Broker time as wall-clock seconds since the epoch."""
        return float(self._owner._request("GET", "/clock")["now"])

    def advance(self, seconds: float) -> float:
        """Move virtual time ``seconds`` forward; the broker fires every timer due on the way before it answers.
        The new ``now``."""
        return float(self._owner._request("POST", "/clock/advance", {"seconds": seconds})["now"])

    def __repr__(self) -> str:
        return f"RemoteClock({self._owner.http_url})"


class RemoteFaults(FaultRules):
    """The broker's fault injection rules through ``/api/faults`` (validated here first, as embedded)."""

    def __init__(self, owner: RemoteBroker) -> None:
        self._owner = owner

    def _add(self, spec: FaultSpec) -> int:
        return int(self._owner._request("POST", "/faults", spec.as_json())["id"])

    def list(self) -> list[FaultInfo]:
        return [FaultInfo.from_json(rule) for rule in self._owner._request("GET", "/faults")]

    def remove(self, rule_id: int) -> bool:
        return self._owner._request("DELETE", f"/faults/{int(rule_id)}", missing_ok=True) is not None

    def clear(self) -> None:
        self._owner._request("DELETE", "/faults")


class RemoteBroker:
    """A broker (one namespace of it: the default unless created) through its HTTP management API.

    Made by ``minibroker.connect``; see the module's docstring for what it shares with ``ThreadedBroker``.
    """

    def __init__(self, api: _Api, namespace: str = DEFAULT_NAMESPACE, url: str | None = None) -> None:
        self._api = api
        self.namespace_name = namespace
        self._url = url
        self.http_url = api.http_url

    @property
    def _prefix(self) -> str:
        if self.namespace_name == DEFAULT_NAMESPACE:
            return "/api"
        return f"/api/namespaces/{_quoted(self.namespace_name)}"

    def _request(self, method: str, path: str, body: Any = None, *, missing_ok: bool = False) -> Any:
        """The answer of ``method`` on ``path`` under this namespace; with ``missing_ok``, None for a 404 that is
        about the thing asked for. A 404 because the namespace is gone is ``LookupError``, as locally."""
        status, answer = self._api.request(method, f"{self._prefix}{path}", body, ok=(404,))
        if status != 404:
            return answer
        error = answer.get("error", "") if isinstance(answer, dict) else ""
        if error.startswith("no namespace"):
            raise LookupError(f"namespace {self.namespace_name!r} does not exist (any more)")
        if missing_ok:
            return None
        raise RemoteError(f"{method} {self._prefix}{path}: HTTP 404: {error}", 404)

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """The decoded JSON answer of ``method`` on ``path`` under this namespace's API (``/queues``, say), for
        what the handle does not wrap; ``RemoteError`` for an error status."""
        return self._request(method, path, body)

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

    @property
    def url(self) -> str:
        """The AMQP URL clients connect to (this namespace's listener), as the broker reports it (``/api/info``)."""
        if self._url is None:
            self._url = str(self._request("GET", "/info")["url"])
        return self._url

    @property
    def amqp091_url(self) -> str:
        """``amqp://guest:guest@HOST:PORT/``: this namespace for AMQP 0-9-1 clients (``handles.amqp091_url``)."""
        return amqp091_url(self.url)

    def queue(self, name: str) -> RemoteQueue:
        """The queue called ``name`` (it need not exist yet)."""
        return RemoteQueue(self, name)

    @property
    def faults(self) -> RemoteFaults:
        """Fault injection (broker-wide): ``add(point, action, ...)``, ``list()``, ``remove(id)``, ``clear()``."""
        return RemoteFaults(self)

    @property
    def queues(self) -> list[str]:
        """Names of the queues that exist now."""
        return sorted(item["name"] for item in self._request("GET", "/queues"))

    def topic(self, name: str) -> RemoteTopic:
        """The topic called ``name`` (it need not exist yet)."""
        return RemoteTopic(self, name)

    @property
    def topics(self) -> list[str]:
        """Names of the topics that exist now."""
        return sorted(item["name"] for item in self._request("GET", "/topics"))

    @property
    def exchanges(self) -> list[ExchangeInfo]:
        """The namespace's RabbitMQ exchanges with their bindings (argument values as JSON carries them: bytes as
        base64 text, other non-JSON types as text)."""
        return [
            ExchangeInfo(
                name=item["name"],
                type=item["type"],
                durable=bool(item["durable"]),
                auto_delete=bool(item["auto_delete"]),
                internal=bool(item["internal"]),
                arguments=item["arguments"],
                bindings=tuple(
                    BindingInfo(b["destination"], b["kind"], b["routing_key"], b["arguments"]) for b in item["bindings"]
                ),
            )
            for item in self._request("GET", "/exchanges")
        ]

    @property
    def transactions(self) -> list[TransactionInfo]:
        """Open transactions of this namespace's connections, oldest first, with what each staged."""
        return [
            TransactionInfo(
                txn_id=bytes.fromhex(item["id"]),
                connection=item["connection"],
                age=float(item["age_s"]),
                posts=int(item["posts"]),
                retirements=int(item["retirements"]),
                acquisitions=int(item["acquisitions"]),
                failed=item.get("failed"),
                staged_addresses=tuple(item.get("addresses", ())),
                state="in-doubt" if item.get("state") == "in-doubt" else "open",
            )
            for item in self._request("GET", "/transactions")
        ]

    @property
    def connections(self) -> list[ConnectionInfo]:
        """The connections working in this namespace."""
        return [
            ConnectionInfo(
                id=int(item["id"]),
                container_id=item["container_id"],
                hostname=item.get("hostname"),
                namespace=item["namespace"],
                user=item.get("user"),
                sessions=int(item["sessions"]),
                links=int(item["links"]),
            )
            for item in self._request("GET", "/connections")
        ]

    @property
    def txn_stats(self) -> TransactionStats:
        """Broker-wide transaction counters (declared, committed, rolled back, timed out)."""
        counters = self._request("GET", "/stats")["transactions"]
        return TransactionStats(
            declared=int(counters["declared"]),
            committed=int(counters["committed"]),
            rolled_back=int(counters["rolled_back"]),
            timed_out=int(counters["timed_out"]),
            failed_commits=int(counters["failed"]),
            in_doubt=int(counters.get("in_doubt", 0)),
            abandoned=int(counters.get("abandoned", 0)),
        )

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
        path = f"{self._prefix}/wait?{urlencode(query)}"
        status, _ = self._api.request("GET", path, timeout=timeout + self._api.timeout, ok=(408,))
        if status == 408:
            raise TimeoutError(f"condition not met within {timeout} s")

    def close_connection(
        self, conn_id: int, condition: str = "amqp:connection:forced", description: str | None = None
    ) -> bool:
        """Close connection ``conn_id`` of this namespace with ``condition``; whether it was open here."""
        query = {"condition": condition} | ({} if description is None else {"description": description})
        return self._request("DELETE", f"/connections/{conn_id}?{urlencode(query)}", missing_ok=True) is not None

    def resolve_transaction(self, txn_id: bytes | str, *, commit: bool = True) -> str:
        """Commit (``commit=False``: roll back) the in-doubt transaction ``txn_id`` (bytes, or hex): its state then,
        "committed" or "rolled-back" (asked for, or a commit that could not be applied). ``LookupError`` when no such
        transaction is in doubt here."""
        hex_id = txn_id.hex() if isinstance(txn_id, bytes) else txn_id
        path = f"{self._prefix}/transactions/{_quoted(hex_id)}/{'commit' if commit else 'rollback'}"
        status, answer = self._api.request("POST", path, None, ok=(404, 409))
        if status == 404:
            error = answer.get("error", "") if isinstance(answer, dict) else ""
            if error.startswith("no namespace"):
                raise LookupError(f"namespace {self.namespace_name!r} does not exist (any more)")
            raise LookupError(error)
        return "rolled-back" if status == 409 else str(answer["state"])

    def reset(self) -> None:
        """Drop every node, message and transaction of this namespace; close its connections."""
        self._request("POST", "/reset")

    def capture(self, connection: int) -> dict[str, Any] | None:
        """One connection's capture (``GET /api/connections/{id}/frames``): its addresses, ``dropped`` and
        ``frames``; None when the broker has no capture of it. ``RemoteError`` (409) when capture is off."""
        answer = self._request("GET", f"/connections/{int(connection)}/frames", missing_ok=True)
        return None if answer is None else dict(answer)

    def frames(self, connection: int | None = None) -> list[dict[str, Any]]:
        """The captured frames of one connection, or of every one kept, decoded (``GET /api/frames``);
        ``LookupError`` for an unknown connection, as locally."""
        if connection is None:
            return list(self._request("GET", "/frames"))
        capture = self.capture(connection)
        if capture is None:
            raise LookupError(f"no captured connection {connection}")
        return list(capture["frames"])

    def pcap(self) -> bytes:
        """Every kept capture as a pcap file (``GET /api/capture.pcap``)."""
        return self._api.get_bytes(f"{self._prefix}/capture.pcap")

    def write_pcap(self, path: str | Path) -> None:
        """Write ``pcap()`` to ``path``."""
        Path(path).write_bytes(self.pcap())

    @property
    def personality(self) -> str:
        """The name of this namespace's personality, as the broker reports it (``/api/info``)."""
        return str(self._request("GET", "/info")["personality"])

    @property
    def clock(self) -> RemoteClock:
        """The broker's clock (``mode``, ``now``, ``advance(seconds)``), as ``GET /api/clock`` shows it."""
        return RemoteClock(self)

    def create_namespace(self, name: str | None = None, personality: str | None = None) -> RemoteBroker:
        """A new isolated namespace with a listener of its own; its ``url`` connects into it.

        ``personality`` (a name ``minibroker personalities`` lists) is whose behaviour its connections meet; by
        default the broker's. ``RemoteError`` (status 400, naming the known ones) for an unknown name.
        """
        body = {key: value for key, value in (("name", name), ("personality", personality)) if value is not None}
        answer = self._api.request("POST", "/api/namespaces", body)[1]
        return RemoteBroker(self._api, answer["name"], answer["url"])

    def namespace(self, name: str) -> RemoteBroker:
        """A handle on the namespace called ``name`` (remote only: locally, keep the created handle)."""
        return RemoteBroker(self._api, name)

    def drop_namespace(self) -> None:
        """Close this namespace's listener and connections and forget its state."""
        if self.namespace_name == DEFAULT_NAMESPACE:
            raise ValueError("the default namespace cannot be dropped; use reset()")
        self._api.request("DELETE", f"/api/namespaces/{_quoted(self.namespace_name)}")

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
    "RemoteError",
    "RemoteQueue",
    "RemoteTopic",
    "connect",
    "message_view",
]
