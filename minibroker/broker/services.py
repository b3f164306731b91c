"""Service nodes of the ``servicebus`` personality (issue 17): request/response links to ``$cbs`` and to
``ENTITY/$management`` (``management.py``).

A client attaches a sender link to the node (requests) and a receiver link from it (answers). Each request is
answered at once (``minibroker.servicebus.cbs``) on the connection's answer link whose target is the request's
``reply-to`` (the JS SDK sets it), or else on the connection's answer link from the same node (the Python SDK's
``ManagementLink`` sets none). An answer that finds no link with credit waits on the link until there is.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from minibroker.amqp.definitions import Accepted, Target
from minibroker.broker.clock import BrokerClock
from minibroker.broker.outbox import Outbox
from minibroker.engine.connection import ServerConnection
from minibroker.engine.endpoints import IncomingDelivery, Link, LinkState
from minibroker.servicebus import addresses as sb_addresses
from minibroker.servicebus import cbs
from minibroker.servicebus import eventhubs as sb_eventhubs

_ATTACHED = LinkState.ATTACHED  # globals: ~10x cheaper than enum lookups (issue 19)

Manage = Callable[[ServerConnection, str, bytes], bytes]
"""Answers a request to a management node: ``(connection, node, request) -> answer`` (``management.py``)."""
Read = Callable[[ServerConnection, cbs.Request], bytes]
"""Answers an Event Hubs ``READ`` sent to a management node on a connection (``eventhubs.py``: of a hub of its
namespace)."""

MAX_PENDING = 100
"""Answers kept for a link without credit (older ones are dropped)."""
_ACCEPTED = Accepted()


class ServiceLink:
    """One link to or from a service node: ``outgoing`` when the broker sends answers on it."""

    __slots__ = ("conn", "link", "node", "outgoing", "pending")

    def __init__(self, conn: ServerConnection, link: Link, node: str, *, outgoing: bool) -> None:
        self.conn = conn
        self.link = link
        self.node = node
        self.outgoing = outgoing
        self.pending: deque[bytes] = deque(maxlen=MAX_PENDING)

    @property
    def reply_address(self) -> object:
        """The address the client receives answers at (its target's; the JS SDK names it in ``reply-to``)."""
        target = self.link.target
        return target.address if isinstance(target, Target) else None

    def __repr__(self) -> str:
        return f"ServiceLink({self.node!r}, {'out' if self.outgoing else 'in'})"


class Services:
    """The service links of one broker, per connection."""

    def __init__(
        self,
        outbox: Outbox,
        manage: Manage | None = None,
        sas_keys: dict[str, str] | None = None,
        clock: BrokerClock | None = None,
        read: Read | None = None,
    ) -> None:
        self.outbox = outbox
        self.manage = manage
        self.sas_keys = sas_keys or {}
        """Keys ``$cbs`` checks tokens against (``cbs.check_token``); none: any token."""
        self.clock = clock or BrokerClock()
        self.read = read
        """Answers an Event Hubs ``READ`` request (``eventhubs.py``)."""
        self._answering: dict[ServerConnection, list[ServiceLink]] = {}

    def attached(self, service: ServiceLink) -> None:
        if service.outgoing:
            self._answering.setdefault(service.conn, []).append(service)

    def detached(self, service: ServiceLink) -> None:
        links = self._answering.get(service.conn)
        if links is not None and service in links:
            links.remove(service)
            if not links:
                del self._answering[service.conn]

    def request(self, service: ServiceLink, payload: bytes, delivery: IncomingDelivery) -> None:
        """A request arrived on ``service``'s incoming link: accept it, and send the answer."""
        conn = service.conn
        if self.manage is not None and sb_addresses.is_management(service.node):
            request = cbs.read_request(payload)
            if self.read is not None and request.operation == sb_eventhubs.READ:
                answer = self.read(conn, request)
            else:
                answer = self.manage(conn, service.node, payload)
        else:
            request, answer = cbs.answer(payload, self.sas_keys, self.clock.wall_ms() / 1000)
        out = self._answer_link(conn, service.node, request.reply_to)
        if out is not None:
            out.pending.append(answer)
            self.flow(out)
        self.outbox.answer_now(conn, delivery, _ACCEPTED)  # (nothing to tell when pre-settled)

    def _answer_link(self, conn: ServerConnection, node: str, reply_to: object) -> ServiceLink | None:
        links = self._answering.get(conn, [])
        if reply_to is not None:
            for link in links:
                if link.reply_address == reply_to:
                    return link
        for link in links:
            if link.node == node:
                return link
        return None

    def flow(self, service: ServiceLink) -> None:
        """Send what waits on an answer link, as far as its credit goes."""
        link, conn = service.link, service.conn
        while service.pending and link.credit > 0 and link.state is _ATTACHED:
            conn.deliver(link, service.pending.popleft(), settled=True)
        self.outbox.touch(conn)
