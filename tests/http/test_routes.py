"""The seam others build on: an embedder (or the next route: metrics, the console) adds a route in one line, and
the API serves it with the same rules (auth, 405, namespaces)."""

from __future__ import annotations

import http.client

import trio

from minibroker.http.api import Call, ManagementApi
from minibroker.http.server import HttpServer, Request, Response
from minibroker.server.app import serve


async def test_adding_a_route_is_one_line() -> None:
    async with serve({"server": {"port": 0}}) as running:
        assert running.http_url is None  # off unless asked
        api = ManagementApi(running)

        async def example(call: Call) -> Response:
            return Response(200, b"queues 0\n", (("content-type", "text/plain"),))

        api.router.add("GET", "/example", example)
        async with trio.open_nursery() as nursery:
            port = await HttpServer(api).listen("127.0.0.1", 0, nursery)

            def get(path: str, method: str = "GET") -> tuple[int, bytes]:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                try:
                    conn.request(method, path)
                    response = conn.getresponse()
                    return response.status, response.read()
                finally:
                    conn.close()

            with trio.fail_after(10):
                assert await trio.to_thread.run_sync(get, "/example") == (200, b"queues 0\n")
                status, _ = await trio.to_thread.run_sync(get, "/example", "POST")
                assert status == 405
                status, _ = await trio.to_thread.run_sync(get, "/healthz")
                assert status == 200
            nursery.cancel_scope.cancel()


async def test_an_app_that_raises_costs_a_500_and_the_connection_goes_on() -> None:
    async def app(request: Request) -> Response:
        if request.path == "/boom":
            raise RuntimeError("a bug")
        return Response.json(200, {"path": request.path, "query": request.query})

    async with trio.open_nursery() as nursery:
        port = await HttpServer(app).listen("127.0.0.1", 0, nursery)

        def two_requests() -> list[tuple[int, bytes]]:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            answers = []
            try:
                for path in ("/boom", "/ok%20path?a=1&b="):
                    conn.request("GET", path)
                    response = conn.getresponse()
                    answers.append((response.status, response.read()))
            finally:
                conn.close()
            return answers

        with trio.fail_after(10):
            boom, ok = await trio.to_thread.run_sync(two_requests)
        assert boom[0] == 500
        assert ok == (200, b'{"path":"/ok path","query":{"a":"1","b":""}}')
        nursery.cancel_scope.cancel()
