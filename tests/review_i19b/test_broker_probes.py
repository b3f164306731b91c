"""Adversarial review (b) of issue 19 against the real broker core and engine (in memory, virtual time, the ``mb``
fixture of tests/broker/test_transactions_frames.py, which checks no transaction, staged or acquired message is
left): the cached transactional-state shared by every connection (Part 4 §4.5.5), the shared empty header and the
properties-at test of an arrival (Part 3 §3.2.1, §3.2.4 absolute-expiry-time), the fast arrival, and the ready
list's first/pop_first under a positional index (deep queue, credit 1, releases)."""

from __future__ import annotations

import struct

import pytest
import trio
from trio.testing import MockClock

from minibroker import replay
from minibroker.amqp.definitions import (
    Accepted,
    Disposition,
    Flow,
    Modified,
    Rejected,
    Released,
    Source,
    TransactionalState,
    Transfer,
)
from minibroker.amqp.errors import Condition
from minibroker.amqp.framing import encode_frame
from minibroker.amqp.types import Symbol
from minibroker.broker.core import BrokerSettings
from minibroker.broker.personality import ACTIVEMQ
from minibroker.broker.policy import NodePolicy
from minibroker.testing import frames
from minibroker.testing.memory import MemoryBroker
from tests.broker.test_transactions_frames import body, client, collect, condition, discharge_with

pytestmark = pytest.mark.timeout(60)


async def test_same_txn_id_bytes_on_two_connections(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    """§4.3/§4.4: connection b names connection a's txn-id (the same bytes: the fast path hands both the one cached
    state object) between a's posts: b's posts are refused as not its transaction, a's all land in a's, and a's
    commit publishes exactly its own."""
    a, b = await client(mb, "a"), await client(mb, "b")
    for c in (a, b):
        await c.coordinator()
        await c.sender("q", 1)
    ta, tb = await a.declare(), await b.declare()
    for i in range(3):
        await a.post(1, frames.message(f"a{i}"), txn=ta)
        assert (await a.peer.expect(Disposition)).state == TransactionalState(txn_id=ta, outcome=Accepted())
        await b.post(1, frames.message(f"b{i}"), txn=ta)
        refused = await b.peer.expect(Disposition)
        assert isinstance(refused.state, Rejected), refused
        assert condition(refused.state) == str(Condition.UNKNOWN_TXN_ID)
        await b.post(1, frames.message(f"b{i}"), txn=tb)
        assert (await b.peer.expect(Disposition)).state == TransactionalState(txn_id=tb, outcome=Accepted())
    assert await b.discharge(tb, fail=True) == Accepted()
    assert await a.discharge(ta) == Accepted()
    await a.receiver("q", 2)
    await a.credit(2, 10)
    got = [body(f.payload) for f in await a.take(3)]
    assert got == ["a0", "a1", "a2"]
    await a.peer.expect_nothing(0.5)
    for delivery_id in range(3):
        await a.peer.disposition(delivery_id, state=Accepted())


async def test_replay_in_process_does_not_redirect_the_brokers_posts(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    """Part 4 §4.5.5: a transfer's transactional-state names the transaction its bytes name. A replay substituting
    a longer txn-id in the same process (``replay._substituted``: an embedding application, a test harness) must
    not change what the broker reads from the same bytes next (it shared the cached state object)."""
    c = await client(mb)
    await c.coordinator()
    await c.sender("q", 1)
    txn = await c.declare()
    await c.post(1, frames.message("one"), txn=txn)
    assert (await c.peer.expect(Disposition)).state == TransactionalState(txn_id=txn, outcome=Accepted())
    wire = encode_frame(
        0,
        Transfer(handle=1, delivery_id=1, delivery_tag=b"t", settled=False, state=TransactionalState(txn_id=txn)),
    )
    replay._substituted(wire, [(txn, txn + b"-replayed")])
    await c.post(1, frames.message("two"), txn=txn)
    got = await c.peer.expect(Disposition)
    assert got.state == TransactionalState(txn_id=txn, outcome=Accepted())
    assert await c.discharge(txn) == Accepted()
    assert mb.queue("q").depth == 2


EMPTY_HEADER_LIST0 = b"\x00\x53\x70\x45"
EMPTY_HEADER_LIST8 = b"\x00\x53\x70\xc0\x01\x00"
# durable false, priority 7, ttl 65536 ms, first-acquirer false, delivery-count 0
HEADER_TTL_PRIORITY = b"\x00\x53\x70\xc0\x0b\x05\x42\x50\x07\x70\x00\x01\x00\x00\x42\x43"
VALUE = b"\x00\x53\x77\xa1\x01x"


def properties(count: int, *, expiry: int | None = None, wide: bool = False) -> bytes:
    """A properties section of ``count`` fields, all null but absolute-expiry-time (the ninth) when given."""
    fields = [b"\x40"] * count
    if expiry is not None:
        fields[8] = b"\x83" + struct.pack(">q", expiry)
    encoded = b"".join(fields)
    if count == 0 and not wide:
        return b"\x00\x53\x73\x45"
    if wide:
        return b"\x00\x53\x73\xd0" + struct.pack(">II", len(encoded) + 4, count) + encoded
    return b"\x00\x53\x73" + bytes((0xC0, len(encoded) + 1, count)) + encoded


HEADERS = {"none": b"", "list0": EMPTY_HEADER_LIST0, "list8": EMPTY_HEADER_LIST8, "full": HEADER_TTL_PRIORITY}
PROPERTIES = {
    "none": (b"", False),
    "list0": (properties(0), False),
    "list32-empty": (properties(0, wide=True), False),
    "8-fields": (properties(8), False),
    "9-fields-null": (properties(9), False),
    "9-fields-past": (properties(9, expiry=1), True),
    "13-fields-past": (properties(13, expiry=1), True),
    "9-fields-past-list32": (properties(9, expiry=1, wide=True), True),
    "9-fields-future": (properties(9, expiry=2**62), False),
}


@pytest.mark.parametrize("header", list(HEADERS))
@pytest.mark.parametrize("props", list(PROPERTIES))
async def test_header_and_properties_edges(
    mb: MemoryBroker, autojump_clock: MockClock, header: str, props: str
) -> None:
    """Part 3 §3.2.4: a message whose absolute-expiry-time has passed is not delivered; one whose properties stop
    before that field (8 of them, list0) or leave it null is. The empty header in any encoding, or a full one, comes
    out byte for byte as it went in (the shared empty header is never written to: Part 3 §3.2.1)."""
    encoded, expired = PROPERTIES[props]
    payload = HEADERS[header] + encoded + VALUE
    c = await client(mb)
    await c.sender("q", 1)
    await c.post(1, payload, settled=True)
    await trio.sleep(1)  # (virtual time: past an absolute-expiry-time of 1 ms after the broker clock's epoch)
    await c.receiver("q", 2)
    await c.credit(2, 1)
    if expired:
        await c.peer.expect_nothing(0.5)
        assert mb.queue("q").depth == 0
        return
    got = (await c.peer.expect_frame(Transfer)).payload
    assert got == payload
    await c.peer.disposition(0, state=Released())  # back: the header written again with its delivery-count
    await c.credit(2, 1)
    again = (await c.peer.expect_frame(Transfer)).payload
    assert again.endswith(encoded + VALUE)
    await c.peer.disposition(1, state=Accepted())
    # the next empty-header message still reads as empty: nothing wrote to the shared record
    await c.post(1, EMPTY_HEADER_LIST0 + VALUE, settled=True)
    await c.credit(2, 1)
    assert (await c.peer.expect_frame(Transfer)).payload == EMPTY_HEADER_LIST0 + VALUE
    await c.peer.disposition(2, state=Accepted())


async def test_deep_queue_credit_one_with_releases_and_index(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    """A queue deeper than two sublists (sortedcontainers' load 1000) drained one credit at a time, every seventh
    released and every eleventh modified (back to their places, §3.4.4/§3.4.5), with a browser between takes (its
    cursor bisects the ready list: the positional index ``pop_first`` must keep): each message comes in order, once
    accepted."""
    total = 2600
    c = await client(mb)
    await c.sender("q", 1)
    for i in range(total):
        await c.post(1, frames.message(i), settled=True)
    # (the broker tops up link credit and the session window as they go: its flows are skipped here)
    for handle, source in ((2, Source(address="q")), (3, Source(address="q", distribution_mode=Symbol("copy")))):
        await c.peer.send(frames.attach_receiver("q", handle, source=source))
        (attach,) = await collect(c.peer, 1, skip=(Flow,))
        c.handles[handle] = attach.handle
    # the browser first reads past the first sublist: its cursor then lies in a later one, where a bisection
    # (``available`` past the cursor, asked when its flow is echoed) builds the positional index
    ahead = 1500
    await c.credit(3, ahead)
    assert all(isinstance(f, Transfer) for f in await collect(c.peer, ahead, skip=(Flow,)))
    seen: list[int] = []
    taken = browsed = echoed = 0
    await c.credit(2, 1)
    while len(seen) < total:
        frame = await c.peer.receive()
        if isinstance(frame.performative, Flow):
            echoed += 1
            continue
        assert isinstance(frame.performative, Transfer), frame
        if frame.performative.handle != c.handles[2]:
            browsed += 1
            continue
        delivery_id, value = frame.performative.delivery_id, body(frame.payload)
        if taken % 7 == 3:
            await c.peer.disposition(delivery_id, state=Released())
        elif taken % 11 == 5:
            await c.peer.disposition(delivery_id, state=Modified(delivery_failed=False))
        else:
            await c.peer.disposition(delivery_id, state=Accepted())
            seen.append(value)
        if taken % 5 == 0:
            await c.peer.flow(3, 0, echo=True)  # (``available`` past the browser's cursor: the index is built)
        if taken % 97 == 0:
            await c.credit(3, 3)  # the browser moves on a little
        taken += 1
        await c.credit(2, 1)
    assert seen == sorted(seen) == list(range(total))
    assert browsed > 0
    assert echoed > 0
    assert mb.queue("q").depth == 0


@pytest.mark.parametrize(
    ("trailing", "staged"),
    [({"batchable": True}, True), ({"resume": False, "batchable": False}, True), ({"aborted": True}, False)],
    ids=["batchable", "resume-false", "aborted"],
)
async def test_transactional_post_with_trailing_fields(
    mb: MemoryBroker, autojump_clock: MockClock, trailing: dict[str, bool], staged: bool
) -> None:
    """§2.7.5: a transactional transfer carrying fields after its state (the slow reader's case, no cached state):
    batchable/resume change nothing, aborted discards the delivery (§2.6.14), so the commit publishes nothing."""
    c = await client(mb)
    await c.coordinator()
    await c.sender("q", 1)
    txn = await c.declare()
    await c.post(1, frames.message("one"), txn=txn)  # (the usual form first: its state cached)
    assert (await c.peer.expect(Disposition)).state == TransactionalState(txn_id=txn, outcome=Accepted())
    await c.post(1, frames.message("two"), txn=txn, **trailing)
    if staged:
        assert (await c.peer.expect(Disposition)).state == TransactionalState(txn_id=txn, outcome=Accepted())
    assert await c.discharge(txn) == Accepted()
    assert mb.queue("q").depth == (2 if staged else 1)


@pytest.mark.parametrize("settings", [BrokerSettings(personality=ACTIVEMQ)], ids=["activemq"])
async def test_per_connection_txn_ids_alike_on_two_connections(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    """§4.3/§4.4 with ActiveMQ's txn-ids (each connection numbers its own from 1: the SAME bytes on both, so the
    fast path hands both connections one cached state object): interleaved posts land in their own connection's
    transaction; a's commit publishes exactly its own, b's rollback drops exactly its own."""
    a, b = await client(mb, "a"), await client(mb, "b")
    for c in (a, b):
        await c.coordinator()
        await c.sender("q", 1)
    ta, tb = await a.declare(), await b.declare()
    assert ta == tb  # (the premise)
    for i in range(3):
        for c, name in ((a, "a"), (b, "b")):
            await c.post(1, frames.message(f"{name}{i}"), txn=ta)
            assert (await c.peer.expect(Disposition)).state == TransactionalState(txn_id=ta, outcome=Accepted())
    assert await b.discharge(tb, fail=True) == Accepted()
    assert await a.discharge(ta) == Accepted()
    await a.receiver("q", 2)
    await a.credit(2, 10)
    assert [body(f.payload) for f in await a.take(3)] == ["a0", "a1", "a2"]
    await a.peer.expect_nothing(0.5)
    for delivery_id in range(3):
        await a.peer.disposition(delivery_id, state=Accepted())


@pytest.mark.parametrize("settings", [BrokerSettings(personality=ACTIVEMQ)], ids=["activemq"])
async def test_per_connection_txn_accepts_alike_on_two_connections(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    """Part 4 §4.4.2: transactional accepts carrying the same txn-id bytes on two connections (one cached state):
    a's commit retires a's message only; b's rollback leaves b's message acquired, and b's release puts it back."""
    a, b = await client(mb, "a"), await client(mb, "b")
    await a.sender("q", 1)
    for text in ("m0", "m1"):
        await a.post(1, frames.message(text), settled=True)
    taken = {}
    for c in (a, b):
        await c.coordinator()
        await c.receiver("q", 2)
        await c.credit(2, 1)
        taken[c] = (await c.peer.expect_frame(Transfer)).performative.delivery_id
    ta, tb = await a.declare(), await b.declare()
    assert ta == tb
    for c in (a, b):
        state = TransactionalState(txn_id=ta, outcome=Accepted())
        await c.peer.disposition(taken[c], settled=False, state=state)
        assert (await c.peer.expect(Disposition)).state == state  # the broker's provisional answer
    state, others = await discharge_with(a, ta, 1)  # the commit settles a's delivery too
    assert state == Accepted()
    assert [(f.performative.first, f.performative.settled) for f in others] == [(taken[a], True)]
    assert await b.discharge(tb, fail=True) == Accepted()
    assert (mb.queue("q").depth, mb.queue("q").stats().acquired) == (0, 1)  # m0 retired, m1 still b's
    await b.peer.disposition(taken[b], state=Released())
    await b.credit(2, 1)
    assert body((await b.peer.expect_frame(Transfer)).payload) == "m1"
    await b.peer.disposition(taken[b] + 1, state=Accepted())


@pytest.mark.parametrize("settings", [BrokerSettings(queues={"b": NodePolicy(max_bytes=200)})], ids=["max-bytes"])
async def test_max_bytes_accounting_through_fast_arrivals(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    """A queue bounded in bytes (reject-publish: amqp:resource-limit-exceeded) takes as many messages again once
    drained, released and redelivered ones included: ``Message.size`` (now a field) is added and taken back alike."""
    c = await client(mb)
    await c.sender("b", 1)
    await c.receiver("b", 2)
    payloads = [EMPTY_HEADER_LIST0 + properties(0) + frames.message("x" * 20) for _ in range(12)]
    accepted = []
    for _ in range(2):
        outcomes = []
        for payload in payloads:
            await c.post(1, payload)
            outcomes.append(type((await c.peer.expect(Disposition)).state).__name__)
        accepted.append(outcomes.count("Accepted"))
        assert outcomes.count("Rejected") == len(payloads) - accepted[-1]
        await c.credit(2, accepted[-1])
        frames_ = [await c.peer.expect_frame(Transfer) for _ in range(accepted[-1])]
        await c.peer.disposition(frames_[0].performative.delivery_id, state=Released())  # back, then taken again
        await c.credit(2, 1)
        again = await c.peer.expect_frame(Transfer)
        for f in [*frames_[1:], again]:
            await c.peer.disposition(f.performative.delivery_id, state=Accepted())
        await mb.settle()
        assert mb.queue("b").depth == 0
    assert accepted[0] == accepted[1] == 200 // len(payloads[0])
