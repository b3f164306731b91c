"""HTTP for the broker: a small HTTP/1.1 server on trio over h11 (``server``), and the JSON management API
(``api``) with its access rules (``auth``)."""

from minibroker.http.api import ManagementApi, Router
from minibroker.http.server import HttpServer, Request, Response

__all__ = ["HttpServer", "ManagementApi", "Request", "Response", "Router"]
