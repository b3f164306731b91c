"""The web console: one static page, shipped as package data, that the HTTP API serves at ``GET /``.

The page has no build step and loads nothing from elsewhere: its CSS and JavaScript are inline. It polls the
JSON API about once a second through relative URLs (``api/queues`` from ``/``; ``queues`` when served at
``/api/namespaces/{ns}/``), so it needs nothing from the server but that API.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

CONTENT_TYPE = "text/html; charset=utf-8"


@cache
def page() -> bytes:
    """The console's HTML, read once from the package."""
    return resources.files("minibroker.http").joinpath("console.html").read_bytes()


__all__ = ["CONTENT_TYPE", "page"]
