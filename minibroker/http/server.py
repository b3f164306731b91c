"""A small HTTP/1.1 server on trio, with h11 as its parser: one task per connection, keep-alive, bounded.

Theory of operation
-------------------
h11 owns the protocol (parsing, framing, keep-alive rules); this module only moves bytes between it and a
socket and turns whole requests into ``Request`` values for an app, ``async (Request) -> Response``. Nothing
here knows about the broker.

Bounds, so that no client can hold more than its share:

- a request (head and body) must arrive within ``request_timeout`` seconds of its first byte: a slower client
  gets 408 and is closed; an idle keep-alive connection is closed quietly after as long;
- a body larger than ``max_body_size`` gets 413 (at once when its Content-Length says so) and a close;
- a head larger than h11's limit gets 431, malformed HTTP gets 400 (h11's ``RemoteProtocolError``), each
  followed by a close; an app that raises gets 500 (logged), and the connection goes on;
- at most ``max_connections`` connections are served at once. One more takes the place of the connection idle
  longest (one with no byte of a request yet: a fresh one, or a keep-alive one between requests), which is
  closed quietly, so idle connections never lock a real client out; when none is idle, it is answered 503 with
  ``Retry-After`` and closed.

A connection's failure never reaches the listener: every error is answered or ends that connection only.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import h11
import trio

log = logging.getLogger("minibroker.http")

MAX_HEAD_SIZE = 16 * 1024
"""Bytes of a request head (request line and headers); a larger one is answered 431."""


@dataclass(frozen=True)
class Request:
    """One whole HTTP request."""

    method: str
    target: str
    """The request target as sent (path and query)."""
    path: str
    """The path, percent-decoded."""
    query: dict[str, str]
    headers: tuple[tuple[str, str], ...]
    """Header names in lower case."""
    body: bytes = b""
    peer: str | None = None
    """The client's IP address."""

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (case-insensitive), or None."""
        name = name.lower()
        return next((value for key, value in self.headers if key == name), None)


@dataclass(frozen=True)
class Response:
    """One HTTP response; ``content-length`` is added when it is sent."""

    status: int
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    @classmethod
    def json(cls, status: int, value: Any, headers: tuple[tuple[str, str], ...] = ()) -> Response:
        """A JSON response."""
        body = json.dumps(value, separators=(",", ":")).encode()
        return cls(status, body, (("content-type", "application/json"), *headers))

    @classmethod
    def error(cls, status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> Response:
        """A JSON error, ``{"error": message}``."""
        return cls.json(status, {"error": message}, headers)


App = Callable[[Request], Awaitable[Response]]


class HttpListenError(OSError):
    """The HTTP listener cannot be bound; the message names the address."""


class _Refused(Exception):
    """A request that is answered without reaching the app (400, 408, 413, 431), then the connection closed."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status)
        self.response = response


class HttpServer:
    """Serves ``app`` on every connection handed to ``serve_connection`` (or accepted by ``listen``)."""

    def __init__(
        self,
        app: App,
        *,
        max_body_size: int = 1024 * 1024,
        request_timeout: float = 10.0,
        max_connections: int = 64,
    ) -> None:
        self.app = app
        self.max_body_size = max_body_size
        self.request_timeout = request_timeout
        self.max_connections = max_connections
        self.connections = 0
        self._idle: dict[object, trio.CancelScope] = {}
        """The connections waiting for the first byte of a request, oldest first: each one's wait, to cancel."""

    async def listen(self, host: str, port: int, nursery: trio.Nursery) -> int:
        """Accept connections on ``host:port`` in ``nursery``; return the bound port."""
        try:
            listeners = await trio.open_tcp_listeners(port, host=host)
        except OSError as exc:
            raise HttpListenError(exc.errno, f"cannot listen for HTTP on {host}:{port}: {exc.strerror or exc}") from exc
        bound: int = listeners[0].socket.getsockname()[1]
        nursery.start_soon(trio.serve_listeners, self.serve_connection, listeners)
        return bound

    async def serve_connection(self, stream: trio.abc.Stream) -> None:
        """Serve requests on ``stream`` until either side closes it (never raises but for cancellation)."""
        if self.connections >= self.max_connections:
            if not self._idle:
                await self._refuse_busy(stream)
                return
            oldest = next(iter(self._idle))
            self._idle.pop(oldest).cancel()  # it closes quietly, as on its idle time-out
        self.connections += 1
        try:
            await self._serve(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError):
            pass  # the client went away, or would not read our answer in time
        except Exception:  # a bug costs this connection, never the listener
            log.exception("HTTP connection failed")
        finally:
            self.connections -= 1
            await trio.aclose_forcefully(stream)

    async def _serve(self, stream: trio.abc.Stream) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_SIZE)
        peer = _peer(stream)
        token = object()
        while True:
            started: list[bool] = [True] if conn.trailing_data[0] else []  # a byte of this request arrived
            try:
                with trio.move_on_after(self.request_timeout) as scope:
                    if not started:
                        self._idle[token] = scope
                    try:
                        request = await self._read(conn, stream, peer, started, lambda: self._idle.pop(token, None))
                    finally:
                        self._idle.pop(token, None)
                if scope.cancelled_caught:
                    if not started:
                        return  # an idle keep-alive connection: closed quietly
                    raise _Refused(Response.error(408, f"request not received within {self.request_timeout:g} s"))
            except _Refused as refused:
                await self._send(conn, stream, refused.response, close=True, head_only=False)
                return
            if request is None:
                return  # the client closed the connection between requests
            response = await self._answer(conn, stream, request)
            if response is None:
                return  # the client went away while a safe request (a long-poll, say) was being answered
            await self._send(conn, stream, response, close=False, head_only=request.method == "HEAD")
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return  # h11 says this connection cannot carry another request (Connection: close, HTTP/1.0)
            conn.start_next_cycle()

    async def _answer(self, conn: h11.Connection, stream: trio.abc.Stream, request: Request) -> Response | None:
        """The app's response to ``request``; None when the client closed the connection before it was ready.

        While a GET or HEAD is answered the connection is watched, so that a long-poll whose client is gone
        gives its connection slot back at once rather than after its timeout. Only these safe methods (RFC 9110
        §9.2.1) are given up on: a change the client asked for is always carried through.
        """
        result: list[Response] = []
        async with trio.open_nursery() as nursery:

            async def run_app() -> None:
                try:
                    result.append(await self.app(request))
                except Exception:
                    log.exception("HTTP %s %s failed", request.method, request.path)
                    result.append(Response.error(500, "internal error (logged)"))
                nursery.cancel_scope.cancel()

            async def watch() -> None:
                data = await stream.receive_some(65536)  # trio: a cancelled receive consumes nothing
                if data:
                    conn.receive_data(bytes(data))  # a pipelined request, kept for the next cycle
                    await trio.sleep_forever()
                nursery.cancel_scope.cancel()  # EOF: nobody is left to answer

            nursery.start_soon(run_app)
            if request.method in ("GET", "HEAD"):
                nursery.start_soon(watch)
        return result[0] if result else None

    async def _read(
        self,
        conn: h11.Connection,
        stream: trio.abc.Stream,
        peer: str | None,
        started: list[bool],
        busy: Callable[[], object],
    ) -> Request | None:
        """The next whole request, or None when the client closed the connection before sending one."""
        head: h11.Request | None = None
        body = bytearray()
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                status = exc.error_status_hint if exc.error_status_hint in (400, 431) else 400
                raise _Refused(Response.error(status, f"malformed HTTP request: {exc}")) from None
            if event is h11.NEED_DATA:
                if conn.they_are_waiting_for_100_continue:  # curl waits for this before a larger body
                    await stream.send_all(conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
                data = await stream.receive_some(65536)
                if data:
                    started.append(True)
                    busy()  # no longer idle: it may not be evicted now
                conn.receive_data(bytes(data))  # b"": the client closed its side
            elif isinstance(event, h11.Request):
                # h11 bounds a head still arriving; one that came whole in a single read is measured here
                if len(event.target) + sum(len(k) + len(v) + 4 for k, v in event.headers) > MAX_HEAD_SIZE:
                    raise _Refused(Response.error(431, f"request head larger than {MAX_HEAD_SIZE} bytes"))
                names = {name for name, _ in event.headers}
                if b"content-length" in names and b"transfer-encoding" in names:
                    # RFC 9112 §6.1: a server MAY reject such a request and MUST close the connection after it;
                    # the two framings disagreeing is how requests are smuggled past a proxy
                    raise _Refused(Response.error(400, "both Content-Length and Transfer-Encoding"))
                head = event
                length = _content_length(event)
                if length is not None and length > self.max_body_size:
                    raise _Refused(self._too_large())
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > self.max_body_size:
                    raise _Refused(self._too_large())
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                return _request(head, bytes(body), peer)
            elif isinstance(event, h11.ConnectionClosed):
                return None

    async def _refuse_busy(self, stream: trio.abc.Stream) -> None:
        """Answer a connection beyond the limit 503 (before reading its request, as RFC 9110 §15.6.4 allows)."""
        body = b'{"error":"too many HTTP connections; retry later"}'
        head = (
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(body)
        )
        with trio.move_on_after(1), contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(head + body)
        await trio.aclose_forcefully(stream)

    def _too_large(self) -> Response:
        return Response.error(413, f"request body larger than {self.max_body_size} bytes")

    async def _send(
        self, conn: h11.Connection, stream: trio.abc.Stream, response: Response, *, close: bool, head_only: bool
    ) -> None:
        """Write ``response`` (its body left out for a HEAD request), within ``request_timeout``."""
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        headers = [*response.headers, ("content-length", str(len(response.body)))]
        if close:
            headers.append(("connection", "close"))
        data = conn.send(h11.Response(status_code=response.status, headers=headers, reason=_reason(response.status)))
        assert data is not None
        if response.body and not head_only:
            data += conn.send(h11.Data(data=response.body)) or b""
        data += conn.send(h11.EndOfMessage()) or b""
        with trio.fail_after(self.request_timeout):
            await stream.send_all(data)


def _content_length(head: h11.Request) -> int | None:
    for name, value in head.headers:
        if name == b"content-length":
            return int(value)  # h11 checked that it is a number
    return None


def _request(head: h11.Request, body: bytes, peer: str | None) -> Request:
    target = head.target.decode("ascii", "replace")
    parts = urlsplit(target)
    return Request(
        method=head.method.decode("ascii", "replace"),
        target=target,
        path=unquote(parts.path),
        query=dict(parse_qsl(parts.query, keep_blank_values=True)),
        headers=tuple((name.decode("latin-1"), value.decode("latin-1")) for name, value in head.headers),
        body=body,
        peer=peer,
    )


def _peer(stream: trio.abc.Stream) -> str | None:
    if isinstance(stream, trio.SocketStream):
        try:
            return str(stream.socket.getpeername()[0])
        except (OSError, IndexError):
            return None
    return None


_REASONS = {
    200: "OK",
    201: "Created",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    413: "Content Too Large",
    421: "Misdirected Request",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
    507: "Insufficient Storage",
}


def _reason(status: int) -> bytes:
    return _REASONS.get(status, "").encode()
