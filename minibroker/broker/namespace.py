"""Namespaces (virtual hosts): isolated sets of nodes inside one broker.

Each connection belongs to one namespace, chosen when its ``open`` arrives: the namespace named by the
open's ``hostname`` if one exists, else the namespace of the listener it came through (the default one,
unless the embedder opened a listener for a namespace of its own). Tests use them to get isolated
state without starting a broker each: resetting a namespace drops its nodes in O(number of nodes).
"""

from __future__ import annotations

from minibroker.broker.queue import Queue
from minibroker.engine.connection import ServerConnection

DEFAULT_NAMESPACE = "default"


class Namespace:
    """One isolated set of nodes, and the connections working in it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.queues: dict[str, Queue] = {}
        self.connections: set[ServerConnection] = set()

    def __repr__(self) -> str:
        return f"Namespace({self.name!r}, queues={len(self.queues)}, connections={len(self.connections)})"
