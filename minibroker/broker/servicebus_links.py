"""The Service Bus side of ``Endpoints``: the ``$management`` operations (``management.py``), the service nodes
``$cbs`` and ``ENTITY/$management`` (``services.py``) and the event hubs (``eventhubs.py``), with the link
contexts each gives its links (``ServiceLink``, ``Writer``, ``Reader``) and which of them a link event is for.

``Endpoints.servicebus`` makes one at the first use, the first attach in a namespace of the ``servicebus``
personality: a broker whose namespaces have other personalities never loads these modules (issue 19, lazy
imports: they took some 2 % of the process's start-up instructions).
"""

from __future__ import annotations

from collections.abc import Callable

from minibroker.broker.clock import BrokerClock
from minibroker.broker.dispatch import Dispatcher
from minibroker.broker.eventhubs import EventHubs, Reader, Writer
from minibroker.broker.management import Management
from minibroker.broker.nodes import Nodes
from minibroker.broker.outbox import Outbox
from minibroker.broker.services import Read, ServiceLink, Services
from minibroker.engine.connection import ServerConnection
from minibroker.engine.endpoints import Link
from minibroker.engine.events import TransferReceived

LINK_TYPES: tuple[type[ServiceLink | Writer | Reader], ...] = (ServiceLink, Writer, Reader)
"""The link contexts of this side: counted among a connection's links like consumers and producers."""


class ServiceBusLinks:
    """``$management``, ``$cbs`` and the event hubs of one broker, and the link events of their links."""

    def __init__(
        self,
        nodes: Nodes,
        dispatcher: Dispatcher,
        outbox: Outbox,
        clock: BrokerClock,
        sas_keys: dict[str, str],
        *,
        arrival: Callable[[bytes], bytes],
        top_up: Callable[[ServerConnection, Link], None],
        read: Read,
    ) -> None:
        self.management = Management(nodes, dispatcher, clock, arrival)
        self.event_hubs = EventHubs(outbox, clock, top_up)
        """Event hubs of the ``servicebus`` personality (``eventhubs.py``)."""
        self.services = Services(outbox, self.management.answer, sas_keys, clock, read=read)
        """Service nodes of the ``servicebus`` personality (``$cbs``, ``ENTITY/$management``)."""
        self._top_up = top_up

    def detached(self, context: object) -> None:
        """A link of this side (else nothing) detached."""
        if isinstance(context, ServiceLink):
            self.services.detached(context)
        elif isinstance(context, Writer | Reader):
            self.event_hubs.detached(context)

    def flow(self, context: object) -> None:
        """A flow on an outgoing link of this side (else nothing)."""
        if isinstance(context, ServiceLink):
            self.services.flow(context)
        elif isinstance(context, Reader):
            self.event_hubs.flow(context)

    def transfer(self, conn: ServerConnection, context: object, event: TransferReceived) -> None:
        """A transfer on an incoming link of this side (else nothing): a request, or an event for a hub."""
        if isinstance(context, ServiceLink):
            self.services.request(context, event.payload, event.delivery)
            self._top_up(conn, context.link)
        elif isinstance(context, Writer):
            self.event_hubs.transfer(context, event.payload, event.message_format, event.delivery)
