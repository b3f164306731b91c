"""Adversarial review of issue 19's transaction path, frame by frame against the real broker core and engine
(in memory, virtual time: the helpers and the ``mb`` fixture of tests/broker/test_transactions_frames.py (see
conftest.py), which
checks that no transaction, staged or acquired message is left). Each probe attacks one changed piece: the
python-qpid-proton encodings of declare/discharge taken by the fast path, one-delivery dispositions, commit
settlements grouped by outcome, the inline "no transactional control message" test, discharge answered at once
without a data dir (AMQP 1.0 Part 4 §4.3, §4.4; Part 2 §2.7.6)."""

from __future__ import annotations

import pytest
import trio
from trio.testing import MockClock

from minibroker.amqp import fastpath
from minibroker.amqp.definitions import (
    Accepted,
    Declared,
    Detach,
    Discharge,
    Disposition,
    End,
    Header,
    Modified,
    Rejected,
    Released,
    TransactionalState,
    Transfer,
)
from minibroker.amqp.errors import Condition
from minibroker.amqp.types import UInt
from minibroker.broker import transactions
from minibroker.testing import frames
from minibroker.testing.memory import MemoryBroker
from tests.broker.test_transactions_frames import (
    COORD,
    Client,
    _fill,
    body,
    client,
    condition,
)

pytestmark = pytest.mark.timeout(30)

EMPTY_HEADER = b"\x00\x53\x70\x45"
EMPTY_PROPERTIES = b"\x00\x53\x73\x45"
VALUE = b"\x00\x53\x77"
PROTON_DECLARE = EMPTY_HEADER + EMPTY_PROPERTIES + VALUE + b"\x00\xa3\x11amqp:declare:list\x45"


def proton_discharge(txn_id: bytes, fail: bool) -> bytes:
    """A discharge as python-qpid-proton encodes it: empty header and properties, symbol descriptor."""
    fields = bytes((0xA0, len(txn_id))) + txn_id + (b"\x41" if fail else b"\x42")
    return (
        EMPTY_HEADER
        + EMPTY_PROPERTIES
        + VALUE
        + b"\x00\xa3\x13amqp:discharge:list"
        + bytes((0xC0, len(fields) + 1, 2))
        + fields
    )


async def send_control(c: Client, payload: bytes, *, pieces: int = 1, state: object = None) -> int:
    """Send a control message's ``payload`` on the coordinator link in ``pieces`` transfer frames."""
    delivery_id = c.next_id()
    size = -(-len(payload) // pieces)
    chunks = [payload[i : i + size] for i in range(0, len(payload), size)]
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1
        await c.peer.transfer(COORD, delivery_id if i == 0 else None, chunk, more=not last, state=state)
    return delivery_id


async def answer(c: Client, delivery_id: int) -> Disposition:
    got = await c.peer.expect(Disposition)
    assert got.first == delivery_id
    return got


async def proton_declare(c: Client, pieces: int = 1) -> bytes:
    got = await answer(c, await send_control(c, PROTON_DECLARE, pieces=pieces))
    assert isinstance(got.state, Declared), got
    txn_id: bytes = got.state.txn_id
    return txn_id


@pytest.mark.parametrize("pieces", [1, 2, 5], ids=["one-frame", "two-frames", "five-frames"])
async def test_proton_declare_and_discharge_commit_a_post(
    mb: MemoryBroker, autojump_clock: MockClock, pieces: int
) -> None:
    """§4.3: declare/discharge as python-qpid-proton writes them, in one transfer or several (§2.6.14 more)."""
    c = await client(mb)
    await c.coordinator()
    await c.sender("q", 1)
    txn = await proton_declare(c, pieces)
    await c.post(1, frames.message("m"), txn=txn)
    provisional = await c.peer.expect(Disposition)
    assert provisional.state == TransactionalState(txn_id=txn, outcome=Accepted())
    got = await answer(c, await send_control(c, proton_discharge(txn, False), pieces=pieces))
    assert got.settled
    assert got.state == Accepted()
    assert mb.queue("q").depth == 1
    assert mb.broker.txn_stats.committed == 1


@pytest.mark.parametrize("pieces", [1, 3], ids=["one-frame", "three-frames"])
async def test_proton_discharge_fail_true_rolls_back(mb: MemoryBroker, autojump_clock: MockClock, pieces: int) -> None:
    """§4.4.1: fail=true discards the posts; the answer is still accepted."""
    c = await client(mb)
    await c.coordinator()
    await c.sender("q", 1)
    txn = await proton_declare(c)
    await c.post(1, frames.message("m"), txn=txn)
    await c.peer.expect(Disposition)
    got = await answer(c, await send_control(c, proton_discharge(txn, True), pieces=pieces))
    assert got.state == Accepted()
    assert mb.queue("q").depth == 0
    assert mb.broker.txn_stats.rolled_back == 1


async def test_proton_discharge_of_a_finished_transaction_is_unknown(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    """§4.3: a discharge naming a txn-id that is no longer live: rejected, transaction:unknown-id."""
    c = await client(mb)
    await c.coordinator()
    txn = await proton_declare(c)
    assert (await answer(c, await send_control(c, proton_discharge(txn, False)))).state == Accepted()
    again = await answer(c, await send_control(c, proton_discharge(txn, False)))
    assert isinstance(again.state, Rejected)
    assert condition(again.state) == str(Condition.UNKNOWN_TXN_ID)


async def test_proton_discharge_of_a_wrong_txn_id_is_unknown(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    c = await client(mb)
    await c.coordinator()
    txn = await proton_declare(c)
    wrong = await answer(c, await send_control(c, proton_discharge(txn + b"x", False)))
    assert isinstance(wrong.state, Rejected)
    assert condition(wrong.state) == str(Condition.UNKNOWN_TXN_ID)
    assert (await answer(c, await send_control(c, proton_discharge(txn, True)))).state == Accepted()


async def test_transactional_proton_declare_is_refused(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    """§4 intro "No transactional work is allowed on the control link": a declare whose transfer carries a
    transactional-state (the inline test that replaced ``named_transactions`` for one frame) is refused."""
    c = await client(mb)
    await c.coordinator(outcomes=["amqp:accepted:list", "amqp:rejected:list"])
    txn = await proton_declare(c)
    got = await answer(c, await send_control(c, PROTON_DECLARE, state=TransactionalState(txn_id=txn)))
    assert isinstance(got.state, Rejected), got
    assert condition(got.state) == str(Condition.NOT_ALLOWED)
    assert (await answer(c, await send_control(c, proton_discharge(txn, True)))).state == Accepted()


async def test_transactional_state_on_a_later_frame_of_a_declare_is_refused(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    """As above, the transactional-state on the last of two frames only."""
    c = await client(mb)
    await c.coordinator(outcomes=["amqp:accepted:list", "amqp:rejected:list"])
    txn = await proton_declare(c)
    delivery_id = c.next_id()
    half = len(PROTON_DECLARE) // 2
    await c.peer.transfer(COORD, delivery_id, PROTON_DECLARE[:half], more=True)
    await c.peer.transfer(COORD, None, PROTON_DECLARE[half:], state=TransactionalState(txn_id=txn))
    got = await answer(c, delivery_id)
    assert isinstance(got.state, Rejected), got
    assert condition(got.state) == str(Condition.NOT_ALLOWED)
    assert (await answer(c, await send_control(c, proton_discharge(txn, True)))).state == Accepted()


def _expand(dispositions: list[Disposition]) -> dict[int, object]:
    """Delivery id -> settled outcome, from the broker's ranged dispositions (§2.7.6 first..last)."""
    out: dict[int, object] = {}
    for d in dispositions:
        assert d.settled
        assert d.role is frames.SENDER
        first = int(d.first or 0)
        for i in range(first, (first if d.last is None else int(d.last)) + 1):
            assert i not in out, f"delivery {i} settled twice"
            out[i] = d.state
    return out


async def commit(c: Client, txn: bytes) -> list[Disposition]:
    """Discharge ``txn`` (commit); return the broker's settlements (role sender) that came before its answer."""
    delivery_id = await c.control(Discharge(txn_id=txn, fail=False))
    settlements: list[Disposition] = []
    while True:
        got = await c.peer.expect(Disposition)
        if got.role is frames.RECEIVER and got.first == delivery_id:
            assert got.state == Accepted(), got
            return settlements
        settlements.append(got)


async def test_commit_settles_each_delivery_with_its_own_outcome(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    """§4.4.2: at commit the broker settles what it holds unsettled, each with the outcome staged for it;
    grouping equal field-less outcomes into one range must not give any delivery another's outcome."""
    c = await client(mb)
    await _fill(c, "q", [f"m{i}" for i in range(6)])
    await c.coordinator()
    await c.receiver("q", 2)
    await c.credit(2, 6)
    ids = [t.performative.delivery_id for t in await c.take(6)]
    txn = await c.declare()
    failed = Modified(delivery_failed=True)
    rejected = Rejected()
    staged = [Accepted(), Released(), Accepted(), failed, Released(), rejected]
    for delivery_id, outcome in zip(ids, staged, strict=True):
        await c.peer.disposition(delivery_id, settled=False, state=TransactionalState(txn_id=txn, outcome=outcome))
    got = await commit(c, txn)
    assert _expand(got) == dict(zip(ids, staged, strict=True))
    queue = mb.queue("q")
    assert (queue.depth, queue.acquired) == (3, 0)  # released twice and modified back; accepted twice, rejected gone


async def test_released_accepts_from_separate_dispositions_settle_in_ranges(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    """Equal outcomes of consecutive deliveries, staged by separate dispositions, may settle in one range."""
    c = await client(mb)
    await _fill(c, "q", ["a", "b", "c", "d"])
    await c.coordinator()
    await c.receiver("q", 2)
    await c.credit(2, 4)
    ids = [t.performative.delivery_id for t in await c.take(4)]
    txn = await c.declare()
    for delivery_id in ids:
        outcome = Released() if delivery_id in ids[:2] else Accepted()
        await c.peer.disposition(delivery_id, settled=False, state=TransactionalState(txn_id=txn, outcome=outcome))
    got = await commit(c, txn)
    assert _expand(got) == {ids[0]: Released(), ids[1]: Released(), ids[2]: Accepted(), ids[3]: Accepted()}
    assert (mb.queue("q").depth, mb.queue("q").acquired) == (2, 0)


@pytest.mark.parametrize("settled", [True, False], ids=["settled", "unsettled"])
async def test_transactional_accept_of_an_unknown_delivery_id_is_nothing(
    mb: MemoryBroker, autojump_clock: MockClock, settled: bool
) -> None:
    """§2.7.6: a disposition naming one delivery id that was never sent (the one-lookup path) changes nothing."""
    c = await client(mb)
    await _fill(c, "q", ["a"])
    await c.coordinator()
    await c.receiver("q", 2)
    await c.credit(2, 1)
    (delivered,) = await c.take(1)
    txn = await c.declare()
    staged = TransactionalState(txn_id=txn, outcome=Accepted())
    await c.peer.disposition(4000, settled=settled, state=staged)
    await c.peer.disposition(delivered.performative.delivery_id + 1, settled=settled, state=staged)
    assert await c.discharge(txn) == Accepted()
    await c.peer.expect_nothing()
    assert (mb.queue("q").depth, mb.queue("q").acquired) == (0, 1)
    await c.peer.disposition(delivered.performative.delivery_id, state=Accepted())
    await c.peer.expect_nothing()
    assert (mb.queue("q").depth, mb.queue("q").acquired) == (0, 0)


async def test_transactional_accept_range_spanning_unknown_and_settled_ids(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    """§2.7.6: a range covering settled and never-sent ids applies to the unsettled ones in it only."""
    c = await client(mb)
    await _fill(c, "q", ["a", "b", "c"])
    await c.coordinator()
    await c.receiver("q", 2)
    await c.credit(2, 3)
    ids = [t.performative.delivery_id for t in await c.take(3)]
    await c.peer.disposition(ids[0], state=Accepted())  # settled outside any transaction
    txn = await c.declare()
    staged = TransactionalState(txn_id=txn, outcome=Accepted())
    await c.peer.disposition(ids[0], ids[2] + 10, settled=False, state=staged)
    assert _expand(await commit(c, txn)) == {ids[1]: Accepted(), ids[2]: Accepted()}
    assert (mb.queue("q").depth, mb.queue("q").acquired) == (0, 0)


async def test_shared_accepted_outcomes_stay_field_less(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    """The shared ``Accepted`` objects (fast path, transactions) cannot be given fields, and equal any other."""
    for shared in (fastpath.ACCEPTED, transactions._ACCEPTED):
        with pytest.raises(AttributeError):
            shared.error = "x"  # type: ignore[attr-defined]
        assert shared == Accepted()
        assert shared.field_values() == []
    c = await client(mb)
    await c.coordinator()
    txn = await c.declare()
    await c.sender("q", 1)
    await c.post(1, frames.message("m"), txn=txn)
    provisional = await c.peer.expect(Disposition)
    assert provisional.state == TransactionalState(txn_id=txn, outcome=Accepted())
    assert await c.discharge(txn, fail=True) == Accepted()
    assert fastpath.ACCEPTED.field_values() == transactions._ACCEPTED.field_values() == []


# -- the core's changed paths: post reading header/times from content, retirements across sessions -----------
async def test_committed_post_with_a_ttl_expires_from_its_arrival(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    """Part 3 §3.2.1 header ttl ("computed based on the time of arrival at an intermediary"), read by the post path
    from the message's content: counted from the transactional transfer's arrival (as on a0f32da), so it is
    visible after a quick commit and gone once the ttl has passed."""
    c = await client(mb)
    await c.coordinator()
    await c.sender("ttl", 1)
    txn = await c.declare()
    await c.post(1, frames.message("short", Header(ttl=UInt(1000))), txn=txn)
    await c.peer.expect(Disposition)
    await c.post(1, frames.message("long", Header(ttl=UInt(60_000), durable=True)), txn=txn)
    await c.peer.expect(Disposition)
    await trio.sleep(0.5)
    assert await c.discharge(txn) == Accepted()
    assert mb.queue("ttl").depth == 2
    await trio.sleep(2)
    await c.receiver("ttl", 2)
    await c.credit(2, 5)
    (delivered,) = await c.take(1)
    assert body(delivered.payload) == "long"
    await c.peer.disposition(delivered.performative.delivery_id, state=Accepted())
    await c.peer.expect_nothing()
    assert mb.queue("ttl").depth == 0


async def test_presettled_transactional_post_is_staged_and_committed(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    """§4.4.1: a pre-settled transactional transfer is still work of the transaction (no answer is due)."""
    c = await client(mb)
    await c.coordinator()
    await c.sender("ps", 1)
    txn = await c.declare()
    await c.post(1, frames.message("m"), txn=txn, settled=True)
    await c.peer.expect_nothing()
    assert (mb.queue("ps").depth, mb.queue("ps").staged) == (0, 1)
    assert await c.discharge(txn) == Accepted()
    assert (mb.queue("ps").depth, mb.queue("ps").staged) == (1, 0)


async def test_frames_of_one_post_naming_two_transactions_are_refused(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    """§4.4.1 "all frames MUST be explicitly associated with the same transaction": the multi-frame branch the
    one-frame fast read left in place; both transactions are rolled back and the controller detached with
    transaction-rollback (as on a0f32da)."""
    c = await client(mb)
    await c.coordinator()
    await c.sender("two", 1)
    first, second = await c.declare(), await c.declare()
    delivery_id = c.next_id()
    payload = frames.message("x" * 50)
    await c.peer.transfer(1, delivery_id, payload[:20], more=True, state=TransactionalState(txn_id=first))
    await c.peer.transfer(1, None, payload[20:], state=TransactionalState(txn_id=second))
    got = await answer(c, delivery_id)
    assert isinstance(got.state, Rejected)
    assert condition(got.state) == str(Condition.TRANSACTION_ROLLBACK)
    detached = await c.peer.expect(Detach)
    assert detached.handle == c.handles[COORD]
    assert condition(detached) == str(Condition.TRANSACTION_ROLLBACK)
    assert mb.broker.transactions == []
    assert (mb.queue("two").depth, mb.queue("two").staged) == (0, 0)


async def test_retirement_from_another_session_committed_after_that_session_ended(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    """§4.4.2 with the consumer on session 1 and the controller on session 0: the transactional accept is the
    transaction's even after session 1 ends (its link's default outcome does not apply); commit consumes it and
    settles nothing on the ended session."""
    c = await client(mb)
    await _fill(c, "q", ["a", "b"])
    await c.coordinator()
    await c.peer.begin(channel=1)
    await c.peer.attach_receiver("q", 2, channel=1)
    await c.peer.flow(2, 2, channel=1)
    got = [await c.peer.expect_frame(Transfer) for _ in range(2)]
    assert {f.channel for f in got} == {1}
    txn = await c.declare()
    ids = [f.performative.delivery_id for f in got]
    await c.peer.disposition(
        ids[0], ids[1], settled=False, channel=1, state=TransactionalState(txn_id=txn, outcome=Accepted())
    )
    await c.peer.send(End(), 1)
    await c.peer.expect(End)
    queue = mb.queue("q")
    assert (queue.depth, queue.acquired) == (0, 2)
    assert await c.discharge(txn) == Accepted()
    await c.peer.expect_nothing()
    assert (queue.depth, queue.acquired) == (0, 0)


async def test_commit_after_the_posts_node_was_deleted_fails(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    """§4.4.1: a commit that cannot apply its posts fails (rejected, the transaction rolled back); the commit's
    direct answer without a data dir must not skip that check."""
    c = await client(mb)
    await c.coordinator()
    await c.sender("gone", 1)
    txn = await c.declare()
    await c.post(1, frames.message("m"), txn=txn)
    await c.peer.expect(Disposition)
    assert mb.queue("gone").delete()
    await c.peer.expect(Detach)  # our sender's node went (resource-deleted)
    outcome = await c.discharge(txn)
    assert isinstance(outcome, Rejected), outcome
    assert mb.broker.txn_stats.committed == 0


async def test_commit_of_an_accept_after_its_node_was_deleted(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    """§4.4.2: the transactional accept's delivery went with its queue (its link detached, resource-deleted);
    the commit still succeeds, settling nothing more and leaving nothing behind."""
    c = await client(mb)
    await _fill(c, "gone", ["a"])
    await c.coordinator()
    await c.receiver("gone", 2)
    await c.credit(2, 1)
    (delivered,) = await c.take(1)
    txn = await c.declare()
    staged = TransactionalState(txn_id=txn, outcome=Accepted())
    await c.peer.disposition(delivered.performative.delivery_id, settled=False, state=staged)
    assert mb.queue("gone").delete()
    detaches = [await c.peer.expect(Detach) for _ in range(2)]  # our consumer's and _fill's sender's
    assert {condition(d) for d in detaches} == {str(Condition.RESOURCE_DELETED)}
    assert await c.discharge(txn) == Accepted()
    await c.peer.expect_nothing()


async def test_commit_settles_accepts_of_two_links_in_session_ranges(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    """§2.7.6: delivery-ids are the session's, so the commit's grouped settlements may range over deliveries of
    two links; each delivery is settled once, with its own outcome, and both queues are emptied."""
    c = await client(mb)
    await _fill(c, "q1", ["a", "b"], handle=8)
    await _fill(c, "q2", ["c", "d"], handle=9)
    await c.coordinator()
    await c.receiver("q1", 2)
    await c.receiver("q2", 3)
    await c.credit(2, 1)
    await c.credit(3, 1)
    await c.credit(2, 2)
    await c.credit(3, 2)
    ids = [t.performative.delivery_id for t in await c.take(4)]
    txn = await c.declare()
    for delivery_id in ids:
        staged = TransactionalState(txn_id=txn, outcome=Accepted())
        await c.peer.disposition(delivery_id, settled=False, state=staged)
    assert _expand(await commit(c, txn)) == dict.fromkeys(ids, Accepted())
    for name in ("q1", "q2"):
        assert (mb.queue(name).depth, mb.queue(name).acquired) == (0, 0)


def _odd_discharge(txn_id: bytes, kind: str) -> bytes:
    """A discharge (fail false or absent) in an odd-but-legal encoding the fast path also reads."""
    vbin32 = b"\xb0" + len(txn_id).to_bytes(4, "big") + txn_id
    if kind == "list32-vbin32":
        fields = vbin32 + b"\x42"
        return VALUE + b"\x00\x53\x32\xd0" + (len(fields) + 4).to_bytes(4, "big") + (2).to_bytes(4, "big") + fields
    if kind == "symbol-no-fail":
        fields = bytes((0xA0, len(txn_id))) + txn_id
        return EMPTY_HEADER + VALUE + b"\x00\xa3\x13amqp:discharge:list" + bytes((0xC0, len(fields) + 1, 1)) + fields
    assert kind == "properties-only-null-fail"
    fields = bytes((0xA0, len(txn_id))) + txn_id + b"\x40"
    return EMPTY_PROPERTIES + VALUE + b"\x00\x53\x32" + bytes((0xC0, len(fields) + 1, 2)) + fields


@pytest.mark.parametrize("kind", ["list32-vbin32", "symbol-no-fail", "properties-only-null-fail"])
async def test_discharge_in_odd_encodings_commits(mb: MemoryBroker, autojump_clock: MockClock, kind: str) -> None:
    """§4.3 discharge: fail absent or null is false (commit), whatever the widths chosen."""
    c = await client(mb)
    await c.coordinator()
    await c.sender("odd", 1)
    txn = await proton_declare(c)
    await c.post(1, frames.message("m"), txn=txn)
    await c.peer.expect(Disposition)
    assert (await answer(c, await send_control(c, _odd_discharge(txn, kind)))).state == Accepted()
    assert mb.queue("odd").depth == 1
    assert mb.broker.txn_stats.committed == 1


async def in_one_read(c: Client, *sends: tuple[object, bytes]) -> None:
    """Put ``(performative, payload)`` frames on channel 0 in one write: the broker reads them together."""
    for performative, payload in sends:
        c.peer.conn.send(performative, 0, payload)
    await c.peer.send_raw(b"")


@pytest.mark.parametrize("control", ["declare", "discharge"])
async def test_provisional_answer_of_a_post_precedes_a_control_answer_in_the_same_read(
    mb: MemoryBroker, autojump_clock: MockClock, control: str
) -> None:
    """§4.4.1 (DESIGN §4): a post's provisional outcome goes out before the declare or discharge read after it
    in the same batch is answered (the core's per-read handling and the declare's "flush only when pending")."""
    c = await client(mb)
    await c.coordinator()
    await c.sender("batch", 1)
    txn = await proton_declare(c)
    post_id, control_id = c.next_id(), c.next_id()
    post = frames.transfer(1, post_id, state=TransactionalState(txn_id=txn))
    body_ = PROTON_DECLARE if control == "declare" else proton_discharge(txn, False)
    await in_one_read(c, (post, frames.message("m")), (frames.transfer(COORD, control_id), body_))
    first, second = await c.peer.expect(Disposition), await c.peer.expect(Disposition)
    assert (first.first, second.first) == (post_id, control_id)
    assert first.state == TransactionalState(txn_id=txn, outcome=Accepted())
    if control == "declare":
        assert isinstance(second.state, Declared)
        assert await c.discharge(second.state.txn_id, fail=True) == Accepted()
        assert await c.discharge(txn) == Accepted()
    else:
        assert second.state == Accepted()
    assert mb.queue("batch").depth == 1


async def test_transactional_accept_and_commit_in_the_same_read(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    """The accept read before the discharge in one batch is the transaction's work when it commits."""
    c = await client(mb)
    await _fill(c, "q", ["a", "b"])
    await c.coordinator()
    await c.receiver("q", 2)
    await c.credit(2, 2)
    ids = [t.performative.delivery_id for t in await c.take(2)]
    txn = await proton_declare(c)
    staged = TransactionalState(txn_id=txn, outcome=Accepted())
    control_id = c.next_id()
    await in_one_read(
        c,
        (frames.disposition(ids[0], ids[1], settled=False, state=staged), b""),
        (frames.transfer(COORD, control_id), proton_discharge(txn, False)),
    )
    settled = await c.peer.expect(Disposition)
    assert _expand([settled]) == dict.fromkeys(ids, Accepted())
    assert (await answer(c, control_id)).state == Accepted()
    assert (mb.queue("q").depth, mb.queue("q").acquired) == (0, 0)
