"""The remote handle against servers that are not a broker: a clear RemoteError, never a TypeError, and never
the password of the URL in a message."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import minibroker
from minibroker.remote import RemoteError


class _NotABroker(BaseHTTPRequestHandler):
    answers = {
        "/html": (200, "text/html", b"<html><body>It works!</body></html>"),
        "/redirect": (302, "text/html", b""),
        "/empty": (200, "application/json", b""),
        "/wrong-json": (200, "application/json", b'"just a string"'),
        "/error-html": (502, "text/html", b"<html>" + b"x" * 100_000 + b"</html>"),
    }

    def do_GET(self) -> None:
        prefix = "/" + self.path.split("/")[1]
        status, kind, body = self.answers[prefix]
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        if status == 302:
            self.send_header("Location", "http://127.0.0.1:1/elsewhere")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _NotABroker)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize("base", ["/html", "/redirect", "/empty", "/wrong-json", "/error-html"])
def test_a_server_that_is_not_a_broker_is_a_clear_remote_error(server: str, base: str) -> None:
    remote = minibroker.connect(f"http://admin:s3cret-pw@{server}{base}")
    with pytest.raises(RemoteError) as caught:
        remote.queue("q").stats()
    message = str(caught.value)
    assert "s3cret-pw" not in message
    assert len(message) < 1000
