"""The journal (store/journal.py, records.py, state.py): record encoding, torn and corrupt tails cut on recovery,
transactions all-or-nothing, and compaction that a crash at any moment cannot harm."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.store.journal import Journal, JournalCorrupt, record_offsets
from minibroker.store.records import Kind, Op, decode_ops, encode_ops, encode_record, segment_header
from minibroker.store.state import DurableState

KEY = ("default", "queue", "orders")
OTHER = ("default", "queue", "other")
SUB = ("default", "subscription", "news\x00app\x00sub")


def enqueue(message_id: int, payload: bytes = b"m", key: tuple[str, str, str] = KEY) -> Op:
    return Op(Kind.ENQUEUE, key, message_id, 0, payload)


ops_strategy = st.lists(
    st.one_of(
        st.builds(enqueue, st.integers(1, 2**40), st.binary(max_size=64)),
        st.builds(lambda i: Op(Kind.SETTLE, KEY, i), st.integers(1, 2**40)),
        st.builds(lambda i, c: Op(Kind.COUNT, OTHER, i, c), st.integers(1, 2**40), st.integers(0, 2**31)),
        st.builds(lambda s: Op(Kind.SUBSCRIBE, SUB, selector=s), st.text(max_size=20)),
        st.just(Op(Kind.UNSUBSCRIBE, SUB)),
    ),
    min_size=1,
    max_size=8,
)


@given(ops_strategy)
@settings(max_examples=200, deadline=None)
def test_records_round_trip(ops: list[Op]) -> None:
    record = encode_ops(ops)
    length = int.from_bytes(record[:4], "big")
    assert length == len(record) - 4
    kind = Kind(record[8])
    assert decode_ops(kind, record[9:]) == ops
    assert (kind is Kind.TXN) == (len(ops) > 1)


def _journal(path: Path, **kwargs: object) -> Journal:
    journal = Journal(path, **kwargs)  # type: ignore[arg-type]
    journal.recover()
    return journal


def test_append_sync_recover(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    assert journal.append([enqueue(1, b"a")]) == 1
    journal.append([enqueue(2, b"b")])
    journal.append([Op(Kind.COUNT, KEY, 2, 3)])
    journal.append([Op(Kind.SETTLE, KEY, 1)])
    assert journal.sync() == 4
    journal.close()
    state = _journal(tmp_path).state
    (stored,) = state.messages[KEY].values()
    assert (stored.message_id, stored.delivery_count, stored.payload) == (2, 3, b"b")
    assert state.max_message_id == 2


def test_transaction_is_all_or_nothing_when_torn(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    journal = _journal(tmp_path)
    journal.append([enqueue(1)])
    journal.append([enqueue(2, key=OTHER), enqueue(3), Op(Kind.SETTLE, KEY, 1)])  # one TXN record
    journal.close()
    segment = journal.segments()[-1]
    size = segment.stat().st_size
    for cut in range(1, 40):  # every torn length of the last record
        copy = tmp_path / f"copy{cut}"
        copy.mkdir()
        shutil.copy(segment, copy / segment.name)
        with (copy / segment.name).open("r+b") as handle:
            handle.truncate(size - cut)
        with caplog.at_level(logging.WARNING, logger="minibroker.store"):
            state = _journal(copy).state
        assert set(state.messages) == {KEY}, cut  # the transaction is absent entirely
        assert list(state.messages[KEY]) == [1]
        assert any("torn tail" in r.message for r in caplog.records)
        assert (copy / segment.name).stat().st_size == _first_record_end(segment)


def _first_record_end(segment: Path) -> int:
    return record_offsets(segment)[0][1]


def test_corrupt_record_mid_journal_refuses_then_skip_corrupt_skips_it(tmp_path: Path) -> None:
    """A flipped byte with valid records after it is corruption, not a torn tail: recovery refuses and changes
    nothing; with skip-corrupt only that record is skipped (a copy of the segment kept), and appending goes on."""
    journal = _journal(tmp_path)
    for i in range(1, 6):
        journal.append([enqueue(i)])
    journal.close()
    segment = journal.segments()[-1]
    original = segment.read_bytes()
    data = bytearray(original)
    third, third_end, _ = record_offsets(segment)[2]
    data[third + 16] ^= 0xFF  # flip a byte inside the third record
    segment.write_bytes(bytes(data))
    with pytest.raises(JournalCorrupt) as refused:
        _journal(tmp_path)
    assert refused.value.offset == third
    assert refused.value.path == segment
    assert f"at byte {third}" in str(refused.value)
    assert segment.read_bytes() == bytes(data)  # nothing changed, nothing copied
    assert not (tmp_path / "quarantine").exists()
    recovered = _journal(tmp_path, recover="skip-corrupt")
    assert list(recovered.state.messages[KEY]) == [1, 2, 4, 5]
    assert recovered.dropped_bytes == third_end - third
    (kept,) = recovered.quarantined
    assert kept.parent == tmp_path / "quarantine"
    assert kept.read_bytes() == bytes(data)
    recovered.append([enqueue(9)])  # appending goes on
    recovered.close()
    assert list(_journal(tmp_path).state.messages[KEY]) == [1, 2, 4, 5, 9]  # and the next start is clean


def test_compaction_keeps_live_state_and_shrinks(tmp_path: Path) -> None:
    journal = _journal(tmp_path, compact_at=1)
    for i in range(1, 201):
        journal.append([enqueue(i, b"x" * 100)])
        if i % 10:
            journal.append([Op(Kind.SETTLE, KEY, i)])
    journal.append([Op(Kind.SUBSCRIBE, SUB, selector="a = 1")])
    before = sum(p.stat().st_size for p in journal.segments())
    assert journal.needs_compaction()
    journal.compact()
    after = sum(p.stat().st_size for p in journal.segments())
    assert len(journal.segments()) == 1
    assert after < before / 4
    journal.append([enqueue(500)])
    journal.close()
    state = _journal(tmp_path).state
    assert sorted(state.messages[KEY]) == [*range(10, 201, 10), 500]
    assert state.subscriptions == {SUB: "a = 1"}


@pytest.mark.parametrize("stage", ["tmp-written", "renamed", "old-deleted"])
def test_a_crash_during_compaction_loses_nothing(tmp_path: Path, stage: str) -> None:
    """Simulate each step of compaction having happened, then a crash; recovery sees the same state."""
    journal = _journal(tmp_path)
    for i in range(1, 21):
        journal.append([enqueue(i)])
        if i % 2:
            journal.append([Op(Kind.SETTLE, KEY, i)])
    journal.close()
    expected = sorted(_journal(tmp_path).state.messages[KEY])
    salt = b"compact!"  # a segment of this format (a headerless one after it would be a damaged header)
    snapshot = segment_header(salt) + encode_record(Kind.SNAPSHOT, b"", salt)
    snapshot += b"".join(encode_ops([op], salt) for op in _journal(tmp_path).state.live_ops())
    complete = snapshot + encode_record(Kind.SNAPSHOT_END, b"", salt)
    old = sorted(tmp_path.glob("journal-*.log"))
    if stage == "tmp-written":
        (tmp_path / "journal-00000002.log.tmp").write_bytes(complete)
    elif stage == "renamed":
        (tmp_path / "journal-00000002.log").write_bytes(complete)
    else:
        (tmp_path / "journal-00000002.log").write_bytes(complete)
        for path in old:
            path.unlink()
    recovered = _journal(tmp_path)
    assert sorted(recovered.state.messages[KEY]) == expected
    assert not list(tmp_path.glob("*.tmp"))
    # an incomplete snapshot (crash while writing it, then renamed by mistake) is not trusted
    recovered.close()


def test_incomplete_snapshot_is_ignored(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    journal.append([enqueue(1)])
    journal.close()
    salt = bytes(8)
    (tmp_path / "journal-00000002.log").write_bytes(segment_header(salt) + encode_record(Kind.SNAPSHOT, b"", salt))
    assert list(_journal(tmp_path).state.messages[KEY]) == [1]


def test_sync_never_does_not_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(fd))
    journal = _journal(tmp_path, sync=False)
    position = journal.append([enqueue(1)])
    assert journal.synced == position  # nothing waits
    journal.sync()
    assert calls == []


def test_state_replay_matches_model() -> None:
    state = DurableState()
    state.apply(enqueue(1))
    state.apply(Op(Kind.SUBSCRIBE, SUB, selector=""))
    state.apply(enqueue(2, key=SUB))
    state.apply(Op(Kind.UNSUBSCRIBE, SUB))
    assert SUB not in state.messages
    assert state.message_count == 1


def test_a_record_larger_than_recovery_reads_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from minibroker.store import records
    from minibroker.store.journal import RecordTooLarge

    monkeypatch.setattr(records, "MAX_RECORD", 1000)
    journal = _journal(tmp_path)
    with pytest.raises(RecordTooLarge):
        journal.append([enqueue(1, payload=b"x" * 600), enqueue(2, payload=b"y" * 600)])
    assert journal.writable
    assert not journal.state.messages.get(KEY)
    journal.append([enqueue(3)])
    journal.close()
    assert list(_journal(tmp_path).state.messages[KEY]) == [3]


def test_no_compaction_again_before_the_journal_is_well_past_its_snapshot(tmp_path: Path) -> None:
    journal = Journal(tmp_path, compact_at=1)
    journal.recover()
    for i in range(1, 101):
        journal.append([enqueue(i, payload=b"p" * 1000)])
    journal.sync()
    assert journal.compact()
    snapshot = (tmp_path / "journal-00000002.log").stat().st_size
    journal.state.live_bytes = 1  # whatever the live size says (an estimate)
    assert not journal.needs_compaction()
    i = 1000
    while (tmp_path / "journal-00000002.log").stat().st_size <= 3 * snapshot:
        assert not journal.needs_compaction()
        i += 1
        journal.append([enqueue(i, payload=b"q" * 1000)])
        journal.append([Op(Kind.SETTLE, KEY, i)])
    assert journal.needs_compaction()
    journal.close()


def test_records_appended_while_the_snapshot_is_written_follow_it(tmp_path: Path) -> None:
    """The I/O layer writes the snapshot in a worker thread while the broker goes on appending."""
    journal = Journal(tmp_path, compact_at=1)
    journal.recover()
    for i in range(1, 21):
        journal.append([enqueue(i, payload=b"p" * 100)])
    for i in range(1, 11):
        journal.append([Op(Kind.SETTLE, KEY, i)])
    compaction = journal.begin_compaction()
    assert compaction is not None
    assert journal.begin_compaction() is None  # one at a time
    journal.append([enqueue(21)])
    journal.append([Op(Kind.SETTLE, KEY, 11)])
    journal.write_snapshot(compaction)
    journal.append([Op(Kind.SETTLE, KEY, 12), enqueue(22)])
    journal.append([Op(Kind.COUNT, KEY, 13, 5)])
    assert journal.finish_compaction(compaction)
    assert journal.synced == journal.appended
    journal.append([enqueue(23)])
    journal.close()
    assert [p.name for p in tmp_path.glob("journal-*")] == ["journal-00000002.log"]
    state = _journal(tmp_path).state
    assert sorted(state.messages[KEY]) == [*range(13, 24)]
    assert state.messages[KEY][13].delivery_count == 5


def test_a_compaction_abandoned_at_close_leaves_nothing_behind(tmp_path: Path) -> None:
    journal = Journal(tmp_path, compact_at=1)
    journal.recover()
    journal.append([enqueue(1)])
    compaction = journal.begin_compaction()
    assert compaction is not None
    journal.write_snapshot(compaction)
    journal.append([enqueue(2)])
    journal.close()
    recovered = _journal(tmp_path)
    assert sorted(recovered.state.messages[KEY]) == [1, 2]
    assert not list(tmp_path.glob("*.tmp"))
