"""The durable state a journal describes: durable nodes, their messages, durable subscriptions, shared payloads,
kept up to date as operations (``store/records.py``) are applied. Pure: no file, no clock, no thread (the broker
core rebuilds itself from it; the journal applies what it writes to it).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from minibroker.store.records import CorruptRecord, Kind, NodeKey, Op

_MESSAGE_OVERHEAD = 64  # what a message costs in a snapshot besides its payload (for the compaction check)
_BASE_LIVE = 1024


@dataclass(slots=True)
class StoredMessage:
    """One durable message as the journal keeps it (its payload shared with the other copies of one publish)."""

    message_id: int
    delivery_count: int
    payload: bytes
    payload_id: int = 0
    expires_at: int | None = None  # wall-clock ms
    deliver_at: int | None = None  # wall-clock ms
    timed: bool = True  # False: written by the first format, which did not keep the times


@dataclass
class DurableState:
    """What the journal says exists: durable nodes, their messages, durable subscriptions, shared payloads.

    ``live_bytes`` (what a snapshot of this state would about take: payloads, and each message's and
    subscription's node name) and ``message_count`` are kept up to date by ``apply``: deciding whether to
    compact never walks the messages.
    """

    messages: dict[NodeKey, dict[int, StoredMessage]] = field(default_factory=dict)
    subscriptions: dict[NodeKey, str] = field(default_factory=dict)
    shared: set[NodeKey] = field(default_factory=set)  # the subscriptions that are shared
    max_message_id: int = 0
    payloads: dict[int, bytes] = field(default_factory=dict)
    refs: dict[int, int] = field(default_factory=dict)
    live_bytes: int = _BASE_LIVE
    message_count: int = 0
    _key_sizes: dict[NodeKey, int] = field(default_factory=dict, repr=False)

    def apply(self, op: Op) -> None:
        freed: list[int] = []
        self._apply(op, freed)
        if freed:
            self._free(freed)

    def apply_all(self, ops: Iterable[Op], *, lenient: bool = False) -> list[tuple[Op, str]]:
        """Apply the operations of one record. A payload no message holds any more is freed at the end of the
        record (so an operation later in the record may still refer to it). ``lenient``: an operation that
        cannot apply (a reference to a payload that is not there) is skipped and returned with the reason;
        otherwise it raises ``CorruptRecord``."""
        freed: list[int] = []
        skipped: list[tuple[Op, str]] = []
        if not lenient:
            for op in ops:
                self._apply(op, freed)
        else:
            for op in ops:
                try:
                    self._apply(op, freed)
                except CorruptRecord as exc:
                    skipped.append((op, str(exc)))
        if freed:
            self._free(freed)
        return skipped

    def _free(self, freed: list[int]) -> None:
        for payload_id in freed:
            if self.refs.get(payload_id) == 0:
                del self.refs[payload_id]
                self.live_bytes -= len(self.payloads.pop(payload_id))

    def _apply(self, op: Op, freed: list[int]) -> None:
        kind = op.kind
        if kind is Kind.ENQUEUE or kind is Kind.ENQUEUE_REF:
            payload_id = op.payload_id or op.message_id
            if kind is Kind.ENQUEUE_REF:
                if payload_id not in self.payloads:
                    raise CorruptRecord(f"message {op.message_id} refers to payload {payload_id}, not in the journal")
            elif payload_id not in self.payloads:
                self.payloads[payload_id] = op.payload
                self.refs[payload_id] = 0
                self.live_bytes += len(op.payload)
            node = self.messages.setdefault(op.key, {})
            old = node.get(op.message_id)
            if old is not None:
                self._release(op.key, old, freed)
            node[op.message_id] = StoredMessage(
                op.message_id,
                op.delivery_count,
                self.payloads[payload_id],
                payload_id,
                op.expires_at,
                op.deliver_at,
                op.timed,
            )
            self.refs[payload_id] += 1
            self.live_bytes += _MESSAGE_OVERHEAD + self._key_size(op.key)
            self.message_count += 1
            if payload_id > self.max_message_id or op.message_id > self.max_message_id:
                self.max_message_id = max(op.message_id, payload_id)
        elif kind is Kind.SETTLE:
            messages = self.messages.get(op.key)
            stored = messages.pop(op.message_id, None) if messages is not None else None
            if stored is not None:
                self._release(op.key, stored, freed)
        elif kind is Kind.COUNT:
            stored = self.messages.get(op.key, {}).get(op.message_id)
            if stored is not None:
                stored.delivery_count = op.delivery_count
        elif kind is Kind.SUBSCRIBE:
            old_selector = self.subscriptions.get(op.key)
            if old_selector is not None:
                self.live_bytes -= self._key_size(op.key) + len(old_selector)
            self.subscriptions[op.key] = op.selector
            self.live_bytes += self._key_size(op.key) + len(op.selector)
            if op.shared:
                self.shared.add(op.key)
            else:
                self.shared.discard(op.key)
            self.messages.setdefault(op.key, {})
        elif kind is Kind.UNSUBSCRIBE:
            old_selector = self.subscriptions.pop(op.key, None)
            self.shared.discard(op.key)
            if old_selector is not None:
                self.live_bytes -= self._key_size(op.key) + len(old_selector)
            for stored in self.messages.pop(op.key, {}).values():
                self._release(op.key, stored, freed)
            self._key_sizes.pop(op.key, None)
        else:
            raise CorruptRecord(f"record kind {kind.name} is not an operation")

    def _key_size(self, key: NodeKey) -> int:
        """Bytes of ``key`` in a record (each of its messages repeats it in a snapshot); computed once a key."""
        size = self._key_sizes.get(key)
        if size is None:
            size = self._key_sizes[key] = 1 + sum(4 + len(part.encode("utf-8", "surrogatepass")) for part in key)
        return size

    def _release(self, key: NodeKey, stored: StoredMessage, freed: list[int]) -> None:
        self.live_bytes -= _MESSAGE_OVERHEAD + self._key_size(key)
        self.message_count -= 1
        refs = self.refs[stored.payload_id] - 1
        self.refs[stored.payload_id] = refs
        if refs == 0:
            freed.append(stored.payload_id)

    def live_ops(self) -> Iterator[Op]:
        """Operations that recreate this state (for compaction): each payload written once."""
        return snapshot_ops(self.capture())

    def capture(self) -> Capture:
        """What ``live_ops`` needs, taken now (cheap: no message is copied) and read later, in a worker thread
        while the state goes on changing: a message's delivery-count may then be newer than at the capture, which
        the records appended after the capture (replayed after the snapshot) make right anyway."""
        messages = [(key, list(node.values())) for key, node in self.messages.items()]
        return Capture(dict(self.subscriptions), set(self.shared), messages)


@dataclass
class Capture:
    """The live state taken for a snapshot (``DurableState.capture``), read later by ``snapshot_ops``."""

    subscriptions: dict[NodeKey, str]
    shared: set[NodeKey]
    messages: list[tuple[NodeKey, list[StoredMessage]]]


def snapshot_ops(capture: Capture) -> Iterator[Op]:
    """The operations that recreate ``capture``: subscriptions first, then messages, each payload written once."""
    for key, selector in capture.subscriptions.items():
        yield Op(Kind.SUBSCRIBE, key, selector=selector, shared=key in capture.shared)
    written: set[int] = set()
    for key, messages in capture.messages:
        for m in messages:
            shared = m.payload_id in written
            written.add(m.payload_id)
            yield Op(
                Kind.ENQUEUE_REF if shared else Kind.ENQUEUE,
                key,
                m.message_id,
                m.delivery_count,
                b"" if shared else m.payload,
                "",
                m.expires_at,
                m.deliver_at,
                0 if m.payload_id == m.message_id else m.payload_id,
                m.timed,
            )
