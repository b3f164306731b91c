"""Event hubs of the ``servicebus`` personality (issue 17 item 10): partitions kept as logs, their senders and
readers, and the ``$management`` READ of a hub or a partition. Addresses, filters and encodings are
``minibroker.servicebus.eventhubs``.

Theory of operation: an event hub is a fixed set of partitions (``PARTITION_COUNT``), each an append-only log in
memory holding at most ``RETENTION`` events (the oldest dropped first). A sender link to ``HUB/Partitions/N``
appends to that partition, one to ``HUB`` to the partitions in turn; every event is stamped with its
sequence number, offset (the bytes the partition held before it) and enqueued time. A reader link from
``HUB/ConsumerGroups/CG/Partitions/N`` has a position in the log (from its selector filter) and is sent every
event from there on, settled, as its credit allows: nothing is removed by reading, so every consumer group (and
every reader) sees every event. Consumer groups are created on first use. A hub exists once a READ or an
address of the Event Hubs form has named it; only then does a sender link to its plain name reach it (before,
the name is a Service Bus queue's). Nothing here is journaled.
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Callable, Mapping
from types import MappingProxyType

from minibroker.amqp.definitions import Accepted, Error, Rejected
from minibroker.amqp.errors import Condition, error
from minibroker.amqp.types import Symbol
from minibroker.broker.clock import BrokerClock
from minibroker.broker.message import Message
from minibroker.broker.outbox import Outbox
from minibroker.engine.connection import ServerConnection
from minibroker.engine.endpoints import IncomingDelivery, Link, LinkState
from minibroker.servicebus import eventhubs as eh
from minibroker.servicebus import management as sb_management
from minibroker.servicebus import messages as sb_messages
from minibroker.servicebus.cbs import Request

_ATTACHED = LinkState.ATTACHED  # globals: ~10x cheaper than enum lookups (issue 19)

RETENTION = 10_000
"""Events kept per partition; older ones are dropped (and ``begin_sequence_number`` moves on)."""
MAX_HUBS = 1_000
"""Event hubs a broker creates on demand; a READ or attach naming one more is refused."""
_ACCEPTED = Accepted()
_NO_HUBS: Mapping[str, EventHub] = MappingProxyType({})


class Event:
    """One event in a partition: its numbers and its encoding as readers get it (annotations stamped)."""

    __slots__ = ("enqueued_ms", "offset", "payload", "sequence_number")

    def __init__(self, sequence_number: int, offset: int, enqueued_ms: int, payload: bytes) -> None:
        self.sequence_number = sequence_number
        self.offset = offset
        self.enqueued_ms = enqueued_ms
        self.payload = payload


class Partition:
    """One partition: a log of events, and the readers waiting for more."""

    def __init__(self, hub: str, partition_id: str) -> None:
        self.hub = hub
        self.id = partition_id
        self.events: deque[Event] = deque(maxlen=RETENTION)
        self.next_sequence_number = 0
        self.next_offset = 0
        self.readers: list[Reader] = []

    def append(self, message: Message, enqueued_ms: int) -> Event:
        payload = message.rewritten(eh.event_annotations(self.next_sequence_number, self.next_offset, enqueued_ms))
        event = Event(self.next_sequence_number, self.next_offset, enqueued_ms, payload)
        self.events.append(event)
        self.next_sequence_number += 1
        self.next_offset += len(payload)
        return event

    def start(self, position: eh.Position) -> int:
        """The sequence number of the first event a reader starting at ``position`` gets."""
        if position.latest:
            return self.next_sequence_number
        for event in self.events:
            value = {"offset": event.offset, "sequence": event.sequence_number, "enqueued": event.enqueued_ms}[
                position.field
            ]
            if value > position.value or (position.inclusive and value == position.value):
                return event.sequence_number
        return self.next_sequence_number

    def beyond(self, position: eh.Position) -> bool:
        """Whether a reader starting at ``position`` would skip events not yet sent: its sequence number or offset
        lies past the next event's. Event Hubs refuses such a reader ("The supplied sequence number '488' is
        invalid. The last sequence number in the system is '482'", nicolgit/azure-firewall-mon#21)."""
        if position.latest or position.field == "enqueued":
            return False
        end = self.next_sequence_number if position.field == "sequence" else self.next_offset
        return position.value > end or (position.value == end and not position.inclusive)

    def state(self) -> eh.PartitionState:
        last = self.events[-1] if self.events else None
        return eh.PartitionState(
            hub=self.hub,
            partition=self.id,
            begin_sequence_number=self.events[0].sequence_number if self.events else self.next_sequence_number,
            last_sequence_number=last.sequence_number if last else -1,
            last_offset=last.offset if last else -1,
            last_enqueued_ms=last.enqueued_ms if last else 0,
            empty=last is None,
        )


class EventHub:
    """One event hub: its partitions and consumer groups."""

    def __init__(self, name: str, created_ms: int, partition_count: int = eh.PARTITION_COUNT) -> None:
        self.name = name
        self.created_ms = created_ms
        self.partitions = {str(i): Partition(name, str(i)) for i in range(partition_count)}
        self.consumer_groups = {eh.DEFAULT_CONSUMER_GROUP}
        self._turn = 0

    def next_partition(self, key: str | None) -> Partition:
        """The partition an event sent to the hub itself goes to: the one its partition key hashes to (so events of
        one key keep their order), else each in turn."""
        ids = list(self.partitions)
        if key is not None:
            return self.partitions[ids[zlib.crc32(key.encode()) % len(ids)]]
        partition = self.partitions[ids[self._turn % len(ids)]]
        self._turn += 1
        return partition


class Writer:
    """A sender link to a hub (``partition`` None: to the partitions in turn) or to one partition."""

    __slots__ = ("conn", "hub", "link", "partition")

    def __init__(self, conn: ServerConnection, link: Link, hub: EventHub, partition: Partition | None) -> None:
        self.conn = conn
        self.link = link
        self.hub = hub
        self.partition = partition


class Reader:
    """A receiver link reading a partition for a consumer group, from ``next_sequence_number`` on."""

    __slots__ = ("conn", "consumer_group", "link", "next_sequence_number", "partition")

    def __init__(self, conn: ServerConnection, link: Link, partition: Partition, group: str, start: int) -> None:
        self.conn = conn
        self.link = link
        self.partition = partition
        self.consumer_group = group
        self.next_sequence_number = start


class EventHubs:
    """The event hubs of one broker, each in its namespace (by the namespace's name): a hub of one namespace is not
    seen from another, and a namespace reset drops its hubs (``forget``)."""

    def __init__(self, outbox: Outbox, clock: BrokerClock, top_up: Callable[[ServerConnection, Link], None]) -> None:
        self.outbox = outbox
        self.clock = clock
        self.top_up = top_up
        """Gives a sender link its credit back (``Endpoints._top_up``)."""
        self.hubs: dict[str, dict[str, EventHub]] = {}
        """The hubs of each namespace by name."""

    def of(self, namespace: str) -> Mapping[str, EventHub]:
        """The hubs of ``namespace`` by name."""
        return self.hubs.get(namespace, _NO_HUBS)

    def hub(self, namespace: str, name: str) -> EventHub | None:
        """The hub ``name`` of ``namespace``, created on first use (None past ``MAX_HUBS`` in the broker)."""
        hubs = self.hubs.setdefault(namespace, {})
        found = hubs.get(name)
        if found is None and sum(map(len, self.hubs.values())) < MAX_HUBS:
            found = hubs[name] = EventHub(name, self.clock.wall_ms())
        return found

    def forget(self, namespace: str) -> None:
        """Drop the hubs of ``namespace`` (reset: its connections, and so its hubs' links, are closed already)."""
        self.hubs.pop(namespace, None)

    # -- $management ----------------------------------------------------------------------------------------
    def read(self, namespace: str, request: Request) -> bytes:
        """The answer to a READ of a hub of ``namespace`` or of one of its partitions."""
        properties = request.application_properties
        kind, name, partition_id = properties.get("type"), properties.get("name"), properties.get("partition")
        if kind not in (eh.HUB_TYPE, eh.PARTITION_TYPE):
            return sb_management.response(request, sb_management.BAD_REQUEST, f"cannot READ a {str(kind)[:100]!r}")
        if not isinstance(name, str) or eh.parse_address(f"{name}/Partitions/0") is None:
            return sb_management.response(request, sb_management.BAD_REQUEST, "READ needs the event hub's name")
        hub = self.hub(namespace, name)
        if hub is None:
            return sb_management.response(request, 403, f"at most {MAX_HUBS} event hubs")
        if kind == eh.HUB_TYPE:
            value = eh.hub_value(hub.name, hub.created_ms, list(hub.partitions))
            return sb_management.response(request, sb_management.OK, "OK", value)
        partition = hub.partitions.get(partition_id) if isinstance(partition_id, str) else None
        if partition is None:
            text = str(partition_id)[:100]
            return sb_management.response(request, sb_management.NOT_FOUND, f"no partition {text!r} in {name!r}")
        return sb_management.response(request, sb_management.OK, "OK", eh.partition_value(partition.state()))

    # -- links ---------------------------------------------------------------------------------------------
    def writer(self, conn: ServerConnection, link: Link, namespace: str, address: eh.EventHubAddress) -> Writer | Error:
        """A sender link to ``address`` in ``namespace``, or why it is refused."""
        found = self._partition(namespace, address)
        if isinstance(found, Error):
            return found
        hub, partition = found
        return Writer(conn, link, hub, partition)

    def reader(
        self, conn: ServerConnection, link: Link, namespace: str, address: eh.EventHubAddress, selector: object
    ) -> Reader | Error:
        """A receiver link from ``address`` in ``namespace`` starting where ``selector`` (the filter's text) says,
        or why not."""
        position = eh.parse_position(selector)
        if isinstance(position, str):
            return error(Condition.INVALID_FIELD, position)
        found = self._partition(namespace, address)
        if isinstance(found, Error):
            return found
        hub, partition = found
        group = address.consumer_group
        if partition is None or group is None:
            return error(Condition.NOT_ALLOWED, "events are read from a consumer group's partition")
        if partition.beyond(position):
            text = f"the starting position is past the end of partition {partition.id!r} of {hub.name!r}"
            return Error(condition=Symbol(eh.ARGUMENT_OUT_OF_RANGE), description=text)
        hub.consumer_groups.add(group)
        reader = Reader(conn, link, partition, group, partition.start(position))
        partition.readers.append(reader)
        return reader

    def _partition(self, namespace: str, address: eh.EventHubAddress) -> tuple[EventHub, Partition | None] | Error:
        hub = self.hub(namespace, address.hub)
        if hub is None:
            return error(Condition.RESOURCE_LIMIT_EXCEEDED, f"at most {MAX_HUBS} event hubs")
        if address.partition is None:
            return hub, None
        partition = hub.partitions.get(address.partition)
        if partition is None:
            count = len(hub.partitions)
            return error(
                Condition.NOT_FOUND,
                f"no partition {address.partition!r} in event hub {hub.name!r} (partitions 0 to {count - 1})",
            )
        return hub, partition

    def detached(self, context: Writer | Reader) -> None:
        if isinstance(context, Reader) and context in context.partition.readers:
            context.partition.readers.remove(context)

    # -- events --------------------------------------------------------------------------------------------
    def transfer(self, writer: Writer, payload: bytes, message_format: int, delivery: IncomingDelivery) -> None:
        """An event (or a batch of them: message-format 0x80013700) arrived on ``writer``: append, answer, send."""
        envelope = Message(payload)
        parts = sb_messages.split_batch(payload) if message_format == sb_messages.BATCH_FORMAT else None
        messages = [Message(part) for part in parts] if parts is not None else [envelope]
        bad = next((m.malformed for m in messages if m.malformed is not None), None)
        if bad is not None:
            refusal = error(Condition.DECODE_ERROR, f"an event that cannot be read: {bad}")
            self.outbox.answer_now(writer.conn, delivery, Rejected(error=refusal))
        else:
            key = eh.partition_key(envelope.content.annotations)
            partition = writer.partition or writer.hub.next_partition(key)
            now = self.clock.wall_ms()
            for message in messages:
                partition.append(message, now)
            self.outbox.answer_now(writer.conn, delivery, _ACCEPTED)
            for reader in list(partition.readers):
                self.flow(reader)
        self.top_up(writer.conn, writer.link)

    def resume(self, conn: ServerConnection) -> None:
        """``conn``'s peer read what was queued for it: its readers held back (``can_send``) go on."""
        for hubs in self.hubs.values():
            for partition in (p for hub in hubs.values() for p in hub.partitions.values()):
                for reader in list(partition.readers):
                    if reader.conn is conn:
                        self.flow(reader)

    def flow(self, reader: Reader) -> None:
        """Send ``reader`` the events from its position on, as far as its credit goes; a draining reader that
        caught up has the rest of its credit used up (§2.7.6 drain: the engine advances delivery-count and says so
        in a flow)."""
        link, conn, partition = reader.link, reader.conn, reader.partition
        events = partition.events
        first = events[0].sequence_number if events else reader.next_sequence_number
        # a reader whose next event was dropped (retention) goes on from the oldest one kept
        index = max(reader.next_sequence_number - first, 0)
        while index < len(events) and link.credit > 0 and link.state is _ATTACHED:
            if not conn.can_send(link):
                break
            event = events[index]
            conn.deliver(link, event.payload, settled=True)
            reader.next_sequence_number = event.sequence_number + 1
            index += 1
        if link.drain and index >= len(events):
            conn.complete_drain(link)
        self.outbox.touch(conn)
