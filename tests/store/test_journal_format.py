"""The journal's format (store/records.py, state.py, journal.py): names of any characters, times kept, one
payload per publish, an O(1) compaction check, torn tails told from corruption (and the copies kept), and
journals of the first format still read.

Issue 12: items 5 (journal side), 7, 10, 11, 12.
"""

from __future__ import annotations

import logging
import struct
import tempfile
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minibroker.store.journal import Journal, JournalCorrupt, record_offsets
from minibroker.store.records import Kind, Op, _pack_key, decode_ops, encode_ops, encode_record
from minibroker.store.state import DurableState

QUEUE = ("default", "queue", "orders")


def _journal(path: Path, **kwargs: Any) -> Journal:
    journal = Journal(path, **kwargs)
    journal.recover()
    return journal


def subscription(topic: str, container: str, link: str, namespace: str = "default") -> tuple[str, ...]:
    return (namespace, "subscription", topic, container, link)


# -- item 11: names of any characters -----------------------------------------------------------------------
names = st.text(st.characters(codec="utf-8"), max_size=30)  # any valid unicode, NUL included


@given(names, names, names, names, names)
@settings(max_examples=150, deadline=None)
def test_any_names_round_trip_through_records(
    namespace: str, topic: str, container: str, link: str, selector: str
) -> None:
    key = subscription(topic, container, link, namespace)
    ops = [
        Op(Kind.SUBSCRIBE, key, selector=selector),
        Op(Kind.ENQUEUE, key, 7, 2, b"payload", expires_at=123, deliver_at=None),
        Op(Kind.COUNT, key, 7, 3),
        Op(Kind.SETTLE, key, 7),
        Op(Kind.UNSUBSCRIBE, key),
    ]
    for single in ops:
        record = encode_ops([single])
        assert decode_ops(Kind(record[8]), record[9:]) == [single]
    record = encode_ops(ops)
    assert decode_ops(Kind(record[8]), record[9:]) == ops


@given(st.lists(st.tuples(names, names, names, names), min_size=1, max_size=4, unique=True))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_names_round_trip_through_a_restart(subscriptions: list[tuple[str, str, str, str]]) -> None:
    """Durable subscriptions and their messages, named with any characters, come back after a restart (twice:
    once from the records, once from a compacted snapshot)."""
    with tempfile.TemporaryDirectory() as directory:
        journal = _journal(Path(directory))
        for i, (topic, container, link, selector) in enumerate(subscriptions, 1):
            key = subscription(topic, container, link)
            journal.append([Op(Kind.SUBSCRIBE, key, selector=selector)])
            journal.append([Op(Kind.ENQUEUE, key, i, 0, f"m{i}".encode())])
        journal.close()
        expected = {subscription(t, c, ln): sel for t, c, ln, sel in subscriptions}
        for _ in range(2):
            journal = _journal(Path(directory), compact_at=0)
            assert journal.state.subscriptions == expected
            for i, (topic, container, link, _) in enumerate(subscriptions, 1):
                stored = journal.state.messages[subscription(topic, container, link)][i]
                assert stored.payload == f"m{i}".encode()
            journal.compact()
            journal.close()


def test_a_subscription_name_of_the_first_format_is_read(tmp_path: Path) -> None:
    """The first format kept "topic\\0container\\0link" in one string; it is read as the three names."""
    legacy_key = b"".join(struct.pack(">I", len(p)) + p for p in (b"default", b"subscription", b"news\x00app\x00sub"))
    subscribe = encode_record(Kind.LEGACY_SUBSCRIBE, legacy_key + struct.pack(">I", 5) + b"a = 1")
    enqueue = encode_record(Kind.LEGACY_ENQUEUE, legacy_key + struct.pack(">QI", 4, 1) + b"body")
    queue_key = b"".join(struct.pack(">I", len(p)) + p for p in (b"default", b"queue", b"orders"))
    plain = encode_record(Kind.LEGACY_ENQUEUE, queue_key + struct.pack(">QI", 9, 0) + b"q")
    (tmp_path / "journal-00000001.log").write_bytes(subscribe + enqueue + plain)
    journal = _journal(tmp_path)
    key = subscription("news", "app", "sub")
    assert journal.state.subscriptions == {key: "a = 1"}
    (stored,) = journal.state.messages[key].values()
    assert (stored.message_id, stored.delivery_count, stored.payload, stored.timed) == (4, 1, b"body", False)
    assert list(journal.state.messages[QUEUE]) == [9]
    # the first format's segment is read, never appended to: new records go to a new segment of this format
    journal.append([Op(Kind.SETTLE, QUEUE, 9)])
    journal.close()
    assert [p.name for p in journal.segments()] == ["journal-00000001.log", "journal-00000002.log"]
    assert not _journal(tmp_path).state.messages.get(QUEUE)


# -- item 12: times kept as wall-clock instants -----------------------------------------------------------------
def test_expiry_and_delivery_times_are_kept(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    journal.append([Op(Kind.ENQUEUE, QUEUE, 1, 0, b"a", expires_at=1_900_000_000_123, deliver_at=1_800_000_000_456)])
    journal.append([Op(Kind.ENQUEUE, QUEUE, 2, 0, b"b", expires_at=None, deliver_at=5)])
    journal.append([Op(Kind.ENQUEUE, QUEUE, 3, 0, b"c")])
    journal.close()
    stored = _journal(tmp_path, compact_at=0).state.messages[QUEUE]
    assert (stored[1].expires_at, stored[1].deliver_at, stored[1].timed) == (1_900_000_000_123, 1_800_000_000_456, True)
    assert (stored[2].expires_at, stored[2].deliver_at) == (None, 5)
    assert (stored[3].expires_at, stored[3].deliver_at) == (None, None)


# -- item 5: one payload per publish ---------------------------------------------------------------------------
def test_one_payload_for_a_publish_to_5000_subscriptions(tmp_path: Path) -> None:
    """5000 durable subscriptions and one 60 kB publish: the payload is written once (the journal grows by
    well under a megabyte, not 300 MB), every subscription gets it back, and compaction keeps one copy while
    any subscription holds it."""
    journal = _journal(tmp_path, compact_at=0)
    keys = [subscription("prices", "app", f"sub-{i}") for i in range(5000)]
    for key in keys:
        journal.append([Op(Kind.SUBSCRIBE, key)])
    before = _size(journal)
    payload = bytes(range(256)) * 240  # 60 kB, one object as the broker shares it among its copies
    journal.append([Op(Kind.ENQUEUE, key, i, 0, payload, expires_at=42) for i, key in enumerate(keys, 1)])
    grown = _size(journal) - before
    assert len(payload) < grown < len(payload) + 5000 * 120, grown
    assert len(journal.state.payloads) == 1
    journal.close()

    journal = _journal(tmp_path, compact_at=0)
    for i, key in enumerate(keys, 1):
        stored = journal.state.messages[key][i]
        assert stored.payload == payload
        assert stored.expires_at == 42
    assert len({id(m.payload) for key in keys for m in journal.state.messages[key].values()}) == 1
    for i, key in enumerate(keys[:-1], 1):  # all but the last subscription take it (the first one too)
        journal.append([Op(Kind.SETTLE, key, i)])
    assert len(journal.state.payloads) == 1
    journal.compact()
    assert _size(journal) < len(payload) + 5000 * 80
    journal.close()
    journal = _journal(tmp_path)
    (stored,) = journal.state.messages[keys[-1]].values()
    assert stored.payload == payload
    journal.append([Op(Kind.SETTLE, keys[-1], 5000)])
    assert journal.state.payloads == {}
    assert journal.state.refs == {}
    journal.close()


def test_separate_records_of_one_publish_share_the_payload(tmp_path: Path) -> None:
    """A publish journaled as one record per node (outside a transaction) shares the payload too, and a
    payload whose messages are all gone is never referred to again."""
    journal = _journal(tmp_path)
    payload = b"x" * 10_000
    journal.append([Op(Kind.ENQUEUE, QUEUE, 1, 0, payload)])
    journal.append([Op(Kind.ENQUEUE, subscription("t", "c", "l"), 2, 0, payload)])
    assert _size(journal) < 11_000 + 200
    journal.append([Op(Kind.SETTLE, QUEUE, 1), Op(Kind.SETTLE, subscription("t", "c", "l"), 2)])
    assert journal.state.payloads == {}
    journal.append([Op(Kind.ENQUEUE, QUEUE, 3, 0, payload)])  # the same bytes object again: written again
    journal.close()
    assert _journal(tmp_path).state.messages[QUEUE][3].payload == payload


def test_a_reference_to_a_missing_payload_is_corruption(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    journal.append([Op(Kind.ENQUEUE, QUEUE, 1, 0, b"a")])
    journal.close()
    segment = journal.segments()[-1]
    salt = segment.read_bytes()[8:16]
    ref = Op(Kind.ENQUEUE_REF, QUEUE, 2, 0, payload_id=99).encode()
    with segment.open("ab") as handle:
        handle.write(encode_record(Kind(ref[0]), ref[1:], salt))
    with pytest.raises(JournalCorrupt, match="payload 99"):
        _journal(tmp_path)
    assert list(_journal(tmp_path, recover="skip-corrupt").state.messages[QUEUE]) == [1]


def _size(journal: Journal) -> int:
    return sum(p.stat().st_size for p in journal.segments())


# -- item 7: the compaction check is O(1) --------------------------------------------------------------------
class _NoWalking(dict):  # type: ignore[type-arg]
    """A mapping that fails the test when anything walks it."""

    def _walked(self, *args: Any) -> Any:
        raise AssertionError("the compaction check walked the live messages")

    __iter__ = values = items = keys = _walked  # type: ignore[assignment]


def test_the_compaction_check_does_not_walk_live_messages(tmp_path: Path) -> None:
    journal = _journal(tmp_path, compact_at=1)
    for i in range(1, 2001):
        journal.append([Op(Kind.ENQUEUE, QUEUE, i, 0, b"p" * 100)])
        if i % 10:
            journal.append([Op(Kind.SETTLE, QUEUE, i)])
    live = journal.state.messages
    journal.state.messages = _NoWalking({key: _NoWalking(node) for key, node in live.items()})
    assert journal.needs_compaction()  # answered from the running totals alone
    journal.state.messages = live
    journal.compact()
    assert not journal.needs_compaction()


ops_strategy = st.lists(
    st.one_of(
        st.builds(
            lambda k, i, n: Op(Kind.ENQUEUE, (f"k{k}",), i, 0, b"p" * n),
            st.integers(0, 2),
            st.integers(1, 30),
            st.integers(0, 50),
        ),
        st.builds(lambda k, i: Op(Kind.SETTLE, (f"k{k}",), i), st.integers(0, 2), st.integers(1, 30)),
        st.builds(lambda k: Op(Kind.SUBSCRIBE, (f"k{k}",)), st.integers(0, 2)),
        st.builds(lambda k: Op(Kind.UNSUBSCRIBE, (f"k{k}",)), st.integers(0, 2)),
    ),
    max_size=60,
)


@given(ops_strategy)
@settings(max_examples=100, deadline=None)
def test_live_size_kept_up_to_date_matches_a_count(ops: list[Op]) -> None:
    state = DurableState()
    for op in ops:
        state.apply(op)
    messages = [m for node in state.messages.values() for m in node.values()]
    payloads = {m.payload_id: m.payload for m in messages}
    assert state.message_count == len(messages)
    names = sum(len(_pack_key(key)) * len(node) for key, node in state.messages.items())
    names += sum(len(_pack_key(key)) + len(selector) for key, selector in state.subscriptions.items())
    assert state.live_bytes == 1024 + 64 * len(messages) + names + sum(len(p) for p in payloads.values())
    assert set(state.payloads) == set(payloads)


# -- item 10: torn tails and corruption -------------------------------------------------------------------------
def _five(tmp_path: Path) -> Path:
    journal = _journal(tmp_path)
    for i in range(1, 6):
        journal.append([Op(Kind.ENQUEUE, QUEUE, i, 0, f"message {i}".encode() * 5)])
    journal.close()
    return journal.segments()[-1]


def test_a_torn_tail_is_cut_with_a_log_line_and_its_bytes_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    segment = _five(tmp_path)
    data = segment.read_bytes()
    last, end, _ = record_offsets(segment)[-1]
    segment.write_bytes(data[: end - 7])
    with caplog.at_level(logging.WARNING, logger="minibroker.store"):
        journal = _journal(tmp_path)
    assert list(journal.state.messages[QUEUE]) == [1, 2, 3, 4]
    assert segment.stat().st_size == last
    (kept,) = journal.quarantined
    assert kept.read_bytes() == data[last : end - 7]
    assert f"torn-at-{last}" in kept.name
    assert any("torn tail" in r.message and f"at byte {last}" in r.message for r in caplog.records)


def test_zeros_at_the_end_are_a_torn_tail(tmp_path: Path) -> None:
    """After a power loss a file may end in zeros where the last write never landed."""
    segment = _five(tmp_path)
    size = segment.stat().st_size
    with segment.open("ab") as handle:
        handle.write(bytes(300))
    journal = _journal(tmp_path)
    assert list(journal.state.messages[QUEUE]) == [1, 2, 3, 4, 5]
    assert segment.stat().st_size == size


@pytest.mark.parametrize("where", ["length", "checksum", "body", "marker"])
def test_damage_followed_by_valid_records_is_corruption(tmp_path: Path, where: str) -> None:
    segment = _five(tmp_path)
    data = bytearray(segment.read_bytes())
    second, _, _ = record_offsets(segment)[1]
    data[second + {"marker": 1, "length": 5, "checksum": 9, "body": 20}[where]] ^= 0x40
    segment.write_bytes(bytes(data))
    with pytest.raises(JournalCorrupt) as refused:
        _journal(tmp_path)
    assert refused.value.offset == second
    assert list(_journal(tmp_path, recover="skip-corrupt").state.messages[QUEUE]) == [1, 3, 4, 5]


def test_a_torn_tail_in_a_segment_with_later_segments_is_corruption(tmp_path: Path) -> None:
    """A segment of the first format that ends in an incomplete record, with a segment after it: the records
    after it make this corruption (a crash only ever tears the newest segment)."""
    newer = _five(tmp_path / "newer")
    queue_key = b"".join(struct.pack(">I", len(p)) + p for p in (b"default", b"queue", b"legacy"))
    first = encode_record(Kind.LEGACY_ENQUEUE, queue_key + struct.pack(">QI", 100, 0) + b"old")
    (tmp_path / "journal-00000001.log").write_bytes(first + first[:-4])
    (tmp_path / "journal-00000002.log").write_bytes(newer.read_bytes())
    with pytest.raises(JournalCorrupt, match="valid segments after it") as refused:
        _journal(tmp_path)
    assert refused.value.offset == len(first)
    journal = _journal(tmp_path, recover="skip-corrupt")
    assert list(journal.state.messages[("default", "queue", "legacy")]) == [100]
    assert list(journal.state.messages[QUEUE]) == [1, 2, 3, 4, 5]


def test_a_record_forged_inside_a_message_is_never_taken_for_a_record(tmp_path: Path) -> None:
    """A client can put any bytes in a message, a copy of a journal record included: the checksum is seeded
    with the segment's random salt, so a torn record that holds such bytes is still just a torn tail."""
    journal = _journal(tmp_path)
    journal.append([Op(Kind.ENQUEUE, QUEUE, 1, 0, b"first")])
    segment = journal.segments()[-1]
    salt = segment.read_bytes()[8:16]
    forged = Op(Kind.UNSUBSCRIBE, QUEUE).encode()
    fake = b"".join(encode_record(Kind(forged[0]), forged[1:], s) for s in (None, b"\x00" * 8, salt[:4] + b"\x00" * 4))
    journal.append([Op(Kind.ENQUEUE, QUEUE, 2, 0, b"x" * 100 + fake * 3 + b"y" * 100)])
    journal.close()
    _, end, _ = record_offsets(segment)[-1]
    data = segment.read_bytes()
    segment.write_bytes(data[: end - 50])  # torn inside the forged bytes' tail
    journal = _journal(tmp_path)  # a torn tail, not corruption
    assert list(journal.state.messages[QUEUE]) == [1]


def test_a_damaged_segment_header_is_corruption_not_a_torn_tail(tmp_path: Path) -> None:
    segment = _five(tmp_path)
    data = bytearray(segment.read_bytes())
    data[10] ^= 0x01  # inside the salt: no record checks out any more
    segment.write_bytes(bytes(data))
    with pytest.raises(JournalCorrupt) as refused:
        _journal(tmp_path)
    assert refused.value.offset == 0
    assert segment.read_bytes() == bytes(data)


def test_a_damaged_header_checksum_alone_is_skipped(tmp_path: Path) -> None:
    segment = _five(tmp_path)
    data = bytearray(segment.read_bytes())
    data[17] ^= 0x01  # the header's checksum: the salt is intact, the records check out
    segment.write_bytes(bytes(data))
    with pytest.raises(JournalCorrupt):
        _journal(tmp_path)
    journal = _journal(tmp_path, recover="skip-corrupt")
    assert list(journal.state.messages[QUEUE]) == [1, 2, 3, 4, 5]
    journal.close()
    assert list(_journal(tmp_path).state.messages[QUEUE]) == [1, 2, 3, 4, 5]  # rewritten with a good header


def test_an_unknown_format_version_refuses(tmp_path: Path) -> None:
    head = struct.pack(">4sI8s", b"MBJL", 9, b"12345678")
    (tmp_path / "journal-00000001.log").write_bytes(head + struct.pack(">I", zlib.crc32(head)))
    with pytest.raises(Exception, match="format version 9"):
        _journal(tmp_path)


def test_a_subscription_keeps_being_shared_and_older_records_read_as_not_shared(tmp_path: Path) -> None:
    key = ("default", "subscription", "news", "", "orders")
    op = Op(Kind.SUBSCRIBE, key, selector="a = 1", shared=True)
    assert Op.decode(op.encode()) == op
    older = op.encode()[:-1]  # a SUBSCRIBE written before the flags byte
    assert Op.decode(older) == Op(Kind.SUBSCRIBE, key, selector="a = 1")
    journal = Journal(tmp_path, compact_at=1)
    journal.recover()
    journal.append([op])
    journal.sync()
    assert journal.compact()
    journal.close()
    journal = Journal(tmp_path)
    assert journal.recover().shared == {key}
    journal.close()
