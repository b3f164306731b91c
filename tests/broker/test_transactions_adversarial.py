"""Regression tests for issue 11: transactions (AMQP 1.0 part 4) frame by frame, one rule at a time.

R1..R10 are the ten deviations issue 11 lists, numbered as there (R1 partial commit ... R10 unbounded memory of
timed-out ids); D1..D6 are the six cases it asks to decide, in its order (D1 a multi-frame post naming two
transactions ... D6 an unknown id on an unsettled disposition). README "Transactions" states the behaviour
chosen for each; every test name starts with the id of the rule it pins. They were written before the
fix: on the code they were written against (3099981), every R test fails, on the assertion that states
its rule. The tests use the in-memory harness of
``test_transactions_frames.py`` (real broker core, engine and connection tasks under a ``MockClock``) and
observe the broker through the wire: the frames it answers with, and what a second consumer receives. Of
the broker's state they read only queue handles' depth/acquired/staged, ``transactions`` and
``txn_stats``. R9 (cost) drives the broker synchronously through ``txn_driver`` and counts the Python
lines one operation runs, with few and with many other transactions open.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from minibroker.amqp.definitions import (
    Accepted,
    AmqpValue,
    Coordinator,
    Declare,
    Declared,
    Detach,
    Discharge,
    Disposition,
    Flow,
    Modified,
    Received,
    Rejected,
    Released,
    Source,
    Target,
    TransactionalState,
    Transfer,
)
from minibroker.amqp.errors import Condition
from minibroker.amqp.types import Described, Symbol, UInt, ULong
from minibroker.broker.core import Broker, BrokerSettings
from minibroker.testing import frames
from minibroker.testing.client import Frame
from minibroker.testing.memory import MemoryBroker, MemoryPeer
from tests.broker import test_transactions_frames as frame_tests
from tests.broker.test_transactions_frames import (
    ACCEPTED_LIST,
    COORD,
    REJECTED_LIST,
    TXN_ID,
    Client,
    _fill,
    body,
    client,
    condition,
    header,
    to,
)
from tests.broker.txn_driver import Peer, World

# the fixtures of the existing frame-level tests, by the names the tests below ask for
mb = frame_tests.mb
settings = frame_tests.settings

BIG = frames.message("x" * 3000)
"""A message that a connection with max-frame-size 512 receives in about seven transfer frames."""
NEVER_DECLARED = b"never-declared"


# -- helpers ----------------------------------------------------------------------------------------------
async def gather(peer: MemoryPeer, seconds: float = 1.0) -> list[Frame]:
    """Every frame that arrives within ``seconds`` (virtual time): the broker's whole answer to a step."""
    got: list[Frame] = []
    with trio.move_on_after(seconds):
        while True:
            got.append(await peer.receive())
    return got


def kinds(got: list[Frame]) -> list[str]:
    return [type(f.performative).__name__ for f in got]


def answers_to(got: list[Frame], delivery_id: int) -> list[Disposition]:
    """The broker's dispositions (as receiver) covering our delivery ``delivery_id``."""
    found = []
    for f in got:
        p = f.performative
        if isinstance(p, Disposition) and p.role is frames.RECEIVER:
            last = p.first if p.last is None else p.last
            if p.first <= delivery_id <= last:
                found.append(p)
    return found


async def discharge_all(c: Client, txn: Any, *, fail: bool = False, handle: int = COORD) -> tuple[Any, list[Frame]]:
    """Discharge; return the state of the broker's one answer and every other frame it sent meanwhile."""
    delivery_id = await c.control(Discharge(txn_id=txn, fail=fail), handle=handle)
    got = await gather(c.peer)
    answers = answers_to(got, delivery_id)
    assert len(answers) == 1, f"expected one answer to the discharge, got {got}"
    assert answers[0].settled
    return answers[0].state, [f for f in got if f.performative is not answers[0]]


def released(delivery_id: int) -> Disposition:
    """The broker settling a delivery it sent with ``released``."""
    return frames.disposition(delivery_id, role=frames.SENDER, state=Released())


def assert_detached(got: list[Frame], handles: set[int | None], expected: str) -> None:
    """``got`` holds exactly one broker-initiated detach (closed, with ``expected``) per handle."""
    detaches = [f.performative for f in got if isinstance(f.performative, Detach)]
    assert {d.handle for d in detaches} == handles, got
    assert len(detaches) == len(handles), got
    for d in detaches:
        assert d.closed
        assert condition(d) == expected


async def answer_detach(c: Client, *handles: int) -> None:
    """Our half of the detach handshake for links the broker detached."""
    for handle in handles:
        await c.peer.send(Detach(handle=UInt(handle), closed=True))


async def post_ok(c: Client, handle: int, text: str, txn: bytes | None = None) -> int:
    """Post; the broker must answer accepted (transactional-state(T, accepted) under T)."""
    delivery_id = await c.post(handle, frames.message(text), txn=txn)
    answer = await c.peer.expect(Disposition)
    assert answer.first == delivery_id
    expected = Accepted() if txn is None else TransactionalState(txn_id=txn, outcome=Accepted())
    assert answer.state == expected
    return delivery_id


async def post_ok_to(c: Client, handle: int, text: str, address: str) -> None:
    """A plain anonymous-relay post to ``address``, answered accepted."""
    delivery_id = await c.post(handle, frames.message(text, to(address)))
    answer = await c.peer.expect(Disposition)
    assert (answer.first, answer.state) == (delivery_id, Accepted())


async def take_unchanged(c: Client, payload: bytes, handle: int = 2) -> None:
    """The message is back on its queue as it was (delivery-count unchanged): take it again and accept it."""
    await c.credit(handle, 1)
    (again,) = await c.take(1)
    assert again.payload == payload
    await c.peer.disposition(again.performative.delivery_id, state=Accepted())


async def watcher(mb: MemoryBroker, address: str) -> Client:
    """A consumer on another connection with plenty of credit: it must see only what becomes visible."""
    w = await client(mb, f"watcher-{address}")
    await w.receiver(address, 0)
    await w.credit(0, 100)
    return w


async def take_and_accept(c: Client, handle: int, n: int) -> list[Frame]:
    """Give ``n`` credit, take ``n`` transfers and accept them."""
    await c.credit(handle, n)
    got = await c.take(n)
    for t in got:
        await c.peer.disposition(t.performative.delivery_id, state=Accepted())
    return got


async def small_window_client(mb: MemoryBroker, container_id: str, window: int) -> Client:
    """A client with max-frame-size 512 whose session takes ``window`` transfer frames at a time."""
    c = Client(await mb.connect())
    await c.peer.open(container_id=container_id, max_frame_size=UInt(512))
    await c.peer.begin(incoming_window=window)
    return c


async def fill_big(mb: MemoryBroker, address: str) -> None:
    p = await client(mb, "big-producer")
    await p.sender(address, 1)
    await p.post(1, BIG)
    assert (await p.peer.expect(Disposition)).state == Accepted()


# -- R1: a staged post whose node is deleted before the commit -------------------------------------------
@pytest.mark.parametrize("route", ["own-producer-link", "sender-to-dynamic-receiver-node", "anonymous-relay"])
async def test_r1_commit_fails_when_a_post_lost_its_dynamic_node(
    mb: MemoryBroker, autojump_clock: MockClock, route: str
) -> None:
    plain_watcher = await watcher(mb, "plain")
    c = await client(mb, "poster")
    await _fill(c, "work", ["w0", "w1"])
    await c.coordinator()
    txn = await c.declare()
    # T also acquires w0 and retires w1 (accepted, unsettled): a failed commit must treat them as a rollback
    await c.receiver("work", 5)
    await c.credit(5, 1, properties={TXN_ID: txn})
    (w0,) = await c.take(1)
    await c.credit(5, 1, properties={Symbol("other"): 1})
    (w1,) = await c.take(1)
    w0_id, w1_id = w0.performative.delivery_id, w1.performative.delivery_id
    await c.peer.disposition(w1_id, settled=False, state=TransactionalState(txn_id=txn, outcome=Accepted()))
    await c.sender("plain", 4)
    await post_ok(c, 4, "plain under T", txn)

    if route == "own-producer-link":  # a dynamic target: the producer link owns the node
        attach = await c.peer.attach_sender(None, 3, target=Target(dynamic=True))
        await c.peer.expect(Flow)
        address = attach.target.address
        await post_ok(c, 3, "to the dynamic node", txn)
        await c.peer.send(Detach(handle=UInt(3), closed=True))
        assert (await c.peer.expect(Detach)).handle == attach.handle
    else:  # a dynamic source: the consumer link owns the node
        attach = await c.peer.attach_receiver(None, 2, source=Source(dynamic=True))
        address = attach.source.address
        if route == "anonymous-relay":
            await c.sender(None, 3)
            delivery_id = await c.post(3, frames.message("relayed", to(address)), txn=txn)
            answer = await c.peer.expect(Disposition)
            assert (answer.first, answer.state) == (delivery_id, TransactionalState(txn_id=txn, outcome=Accepted()))
            await c.peer.send(Detach(handle=UInt(2), closed=True))
            assert (await c.peer.expect(Detach)).handle == attach.handle
        else:
            await c.sender(address, 3)
            await post_ok(c, 3, "to the dynamic node", txn)
            await c.peer.send(Detach(handle=UInt(2), closed=True))
            got = await gather(c.peer)  # our detach answered, and the sender to the deleted node detached
            assert kinds(got) == ["Detach", "Detach"], got
            deleted = [f.performative for f in got if f.performative.error is not None]
            assert [condition(d) for d in deleted] == [Condition.RESOURCE_DELETED]
            assert deleted[0].handle == c.handles[3]
            await answer_detach(c, 3)
    assert isinstance(address, str)
    assert not mb.queue(address).exists  # the dynamic node is gone

    state, others = await discharge_all(c, txn)
    assert isinstance(state, Rejected), f"the commit must fail, got {state}"
    assert condition(state) == Condition.TRANSACTION_ROLLBACK
    # exactly as by a rollback: the acquisition is settled released, the unsettled retirement is undone silently
    assert [f.performative for f in others] == [released(w0_id)]
    assert mb.broker.transactions == []
    assert mb.queue("plain").exists
    plain = mb.queue("plain").stats()
    assert (plain.depth, plain.staged, plain.acquired) == (0, 0, 0)
    await plain_watcher.peer.expect_nothing()
    work = mb.queue("work")
    assert (work.depth, work.acquired) == (1, 1)
    await c.peer.disposition(w1_id, state=Released())
    await mb.settle()
    assert (work.depth, work.acquired) == (2, 0)


# -- R2: acquired under T, settled by the client without an outcome --------------------------------------
@pytest.mark.parametrize(
    ("default_outcome", "settle_state"),
    [
        (None, None),
        (Modified(delivery_failed=True), None),
        (Accepted(), None),
        (Modified(delivery_failed=True), Received(section_number=UInt(0), section_offset=ULong(0))),
    ],
    ids=["released-default", "modified-default", "accepted-default", "modified-default-received-state"],
)
async def test_r2_commit_applies_the_source_default_outcome_to_a_delivery_settled_without_outcome(
    mb: MemoryBroker, autojump_clock: MockClock, default_outcome: Any, settle_state: Any
) -> None:
    c = await client(mb)
    payloads = await _fill(c, "q", ["m0"])
    await c.coordinator()
    txn = await c.declare()
    await c.receiver("q", 2, source=Source(address="q", default_outcome=default_outcome))
    await c.credit(2, 1, properties={TXN_ID: txn})
    (delivered,) = await c.take(1)
    assert delivered.performative.state == TransactionalState(txn_id=txn)
    await c.peer.disposition(delivered.performative.delivery_id, settled=True, state=settle_state)
    await c.peer.expect_nothing()
    state, others = await discharge_all(c, txn)
    assert state == Accepted()
    assert others == []  # the client settled it: no disposition (D5)
    queue = mb.queue("q")
    if isinstance(default_outcome, Accepted):
        assert (queue.depth, queue.acquired) == (0, 0)  # accepted consumes
        return
    assert (queue.depth, queue.acquired) == (1, 0), "the source's default outcome must put the message back"
    await c.credit(2, 1)
    (again,) = await c.take(1)
    if default_outcome is None:
        assert again.payload == payloads[0]  # released: delivery-count unchanged
    else:
        again_header = header(again.payload)
        count = again_header.delivery_count if again_header is not None else 0
        assert count == 1, "modified(delivery-failed) must count one more failed delivery"
    await c.peer.disposition(again.performative.delivery_id, state=Accepted())


# -- R3: a delivery acquired under T is still partly held back by the session window ----------------------
@pytest.mark.parametrize("settings", [BrokerSettings(transaction_timeout=30)], ids=["timeout-30s"])
@pytest.mark.parametrize("ending", ["rollback", "time-out"])
async def test_r3_ending_t_aborts_its_partly_sent_delivery(
    mb: MemoryBroker, autojump_clock: MockClock, ending: str
) -> None:
    await fill_big(mb, "big")
    c = await small_window_client(mb, "small-window", window=2)
    await c.coordinator()
    txn = await c.declare()
    await c.receiver("big", 2)
    await c.peer.flow(2, 1, incoming_window=2, properties={TXN_ID: txn})
    first = await c.take(2)  # the window lets two of the ~7 frames out
    assert first[0].performative.state == TransactionalState(txn_id=txn)
    assert all(t.performative.more for t in first)
    await c.peer.expect_nothing()
    second = await client(mb, "second")
    await second.receiver("big", 2)
    await second.credit(2, 1)
    await second.peer.expect_nothing()  # the message is acquired by the first consumer

    discharge_id = None
    if ending == "rollback":
        discharge_id = await c.control(Discharge(txn_id=txn, fail=True))
    else:
        await trio.sleep(31)
    # the window is closed: the aborted transfer cannot go out yet, and §4.4.3 wants the abort "before completing
    # the discharge", so the discharge's answer waits too
    assert await gather(c.peer) == []
    await c.peer.flow(incoming_window=100)  # the first consumer opens its window
    got = await gather(c.peer)
    if discharge_id is not None:
        answers = answers_to(got, discharge_id)
        assert [a.state for a in answers] == [Accepted()], got
        assert got[-1].performative is answers[0], f"the discharge was answered before the abort went out: {got}"
        got = got[:-1]
    assert len(got) == 1, f"expected one aborted transfer and no disposition for it, got {got}"
    (aborted,) = got
    assert isinstance(aborted.performative, Transfer)
    assert aborted.performative.handle == c.handles[2]
    assert aborted.performative.aborted is True  # and never the rest of the message

    (whole,) = await second.take(1)  # back on its queue: the second consumer gets all of it, once
    assert whole.payload == BIG
    assert not whole.performative.more
    await second.peer.disposition(whole.performative.delivery_id, state=Accepted())
    await mb.settle()
    assert (mb.queue("big").depth, mb.queue("big").acquired) == (0, 0)


async def test_r3_held_back_frames_of_a_detached_link_are_never_sent(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    await fill_big(mb, "big")
    c = await small_window_client(mb, "small-window", window=1)
    await c.receiver("big", 2)
    await c.peer.flow(2, 1, incoming_window=1)
    (first,) = await c.take(1)
    assert first.performative.more
    await c.peer.send(Detach(handle=UInt(2), closed=True))
    assert (await c.peer.expect(Detach)).handle == c.handles[2]
    await c.peer.flow(incoming_window=100)
    got = await gather(c.peer)
    assert got == [], f"frames held back for a detached link were sent after its detach: {got}"
    # the detach released the message: another consumer gets it whole
    second = await client(mb, "second")
    await second.receiver("big", 2)
    (whole,) = await take_and_accept(second, 2, 1)
    assert whole.payload == BIG


# -- R4: discharging a timed-out id -----------------------------------------------------------------------
@pytest.mark.parametrize("settings", [BrokerSettings(transaction_timeout=10)], ids=["timeout-10s"])
async def test_r4_discharge_of_timed_out_ids_with_rejected_outcome(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    c = await client(mb)
    await c.coordinator(outcomes=[ACCEPTED_LIST, REJECTED_LIST])
    rolled, committed = await c.declare(), await c.declare()
    await trio.sleep(11)
    live = await c.declare()
    # fail=false: timeout, then forgotten
    assert condition(await c.discharge(committed)) == Condition.TRANSACTION_TIMEOUT
    assert condition(await c.discharge(committed, fail=True)) == Condition.UNKNOWN_TXN_ID
    # fail=true: the coordinator must always be able to complete it (§4.3), then forgotten
    assert await c.discharge(rolled, fail=True) == Accepted()
    assert condition(await c.discharge(rolled, fail=True)) == Condition.UNKNOWN_TXN_ID
    # never declared, or another connection's: unknown-id whatever fail says
    for fail in (False, True):
        assert condition(await c.discharge(NEVER_DECLARED, fail=fail)) == Condition.UNKNOWN_TXN_ID
    other = await client(mb, "other")
    await other.coordinator()
    for fail in (False, True):
        assert condition(await other.discharge(live, fail=fail)) == Condition.UNKNOWN_TXN_ID
    assert [i.txn_id for i in mb.broker.transactions] == [live]
    assert await c.discharge(live) == Accepted()
    assert mb.broker.txn_stats.timed_out == 2


@pytest.mark.parametrize("settings", [BrokerSettings(transaction_timeout=10)], ids=["timeout-10s"])
async def test_r4_rollback_of_a_timed_out_id_keeps_an_accepted_only_controller(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    c = await client(mb)
    await c.coordinator(outcomes=[ACCEPTED_LIST])
    await c.sender("q", 1)
    old = await c.declare()
    await trio.sleep(11)
    survivor = await c.declare()
    await post_ok(c, 1, "staged under the survivor", survivor)
    state, others = await discharge_all(c, old, fail=True)
    assert state == Accepted()
    assert others == []  # in particular no detach of the controller
    assert [i.txn_id for i in mb.broker.transactions] == [survivor]
    assert await c.discharge(survivor) == Accepted()
    assert mb.queue("q").depth == 1
    # the id is forgotten: discharging it again is an unknown id (which detaches this controller)
    await c.control(Discharge(txn_id=old, fail=True))
    detach = await c.peer.expect(Detach)
    assert condition(detach) == Condition.UNKNOWN_TXN_ID
    await answer_detach(c, COORD)


@pytest.mark.parametrize("settings", [BrokerSettings(transaction_timeout=10)], ids=["timeout-10s"])
@pytest.mark.parametrize("then", ["window-opens", "consumer-detaches"])
async def test_r4_timed_out_discharge_detach_waits_for_the_abort(
    mb: MemoryBroker, autojump_clock: MockClock, then: str
) -> None:
    """A controller without ``rejected`` learns that its discharge(fail=false) of a timed-out id failed by the
    detach of its link with amqp:transaction:timeout (§4.3). That detach is the discharge's answer, so like any
    answer it goes out only after the aborted transfer of a delivery acquired under the id (§4.4.3: abort
    "before completing the discharge"), which a closed session window holds back. Meanwhile the controller is
    still attached: a transaction declared on it stays open until the detach rolls it back."""
    await fill_big(mb, "big")
    c = await small_window_client(mb, "small-window", window=1)
    await c.coordinator(outcomes=[ACCEPTED_LIST])
    txn = await c.declare()
    await c.receiver("big", 2)
    await c.peer.flow(2, 1, incoming_window=1, properties={TXN_ID: txn})
    (first,) = await c.take(1)
    assert first.performative.more
    await trio.sleep(11)  # T times out: the abort of the partly sent delivery waits for the window
    assert await gather(c.peer) == []
    survivor = await c.declare()  # the controller works on
    await c.sender("q", 1)
    await post_ok(c, 1, "staged under the survivor", survivor)
    await c.control(Discharge(txn_id=txn, fail=False))
    assert await gather(c.peer) == [], "the discharge was answered before the abort went out"
    assert [i.txn_id for i in mb.broker.transactions] == [survivor]

    if then == "window-opens":
        await c.peer.flow(incoming_window=100)
        got = await gather(c.peer)
        assert kinds(got) == ["Transfer", "Detach"], f"expected the abort, then the detach: {got}"
        aborted = got[0].performative
        assert (aborted.handle, aborted.aborted) == (c.handles[2], True)
        assert_detached(got[1:], {c.handles[COORD]}, Condition.TRANSACTION_TIMEOUT)
    else:  # the consumer's link goes: its held-back frames are never sent, and the answer waits no longer
        await c.peer.send(Detach(handle=UInt(2), closed=True))
        got = await gather(c.peer)
        assert kinds(got) == ["Detach", "Detach"], got
        ours = [f for f in got if f.performative.handle == c.handles[2]]
        assert [f.performative.error for f in ours] == [None]  # our detach answered
        coordinator = [f for f in got if f.performative.handle != c.handles[2]]
        assert_detached(coordinator, {c.handles[COORD]}, Condition.TRANSACTION_TIMEOUT)
    await answer_detach(c, COORD)
    await mb.settle()
    assert mb.broker.transactions == []  # the detach rolled the survivor back
    assert (mb.queue("q").depth, mb.queue("q").staged) == (0, 0)
    second = await client(mb, "second")  # the big message is back on its queue, whole
    await second.receiver("big", 2)
    (whole,) = await take_and_accept(second, 2, 1)
    assert whole.payload == BIG


# -- R5: after the time-out, a link acquiring under T stops ------------------------------------------------
@pytest.mark.parametrize("settings", [BrokerSettings(transaction_timeout=10)], ids=["timeout-10s"])
@pytest.mark.parametrize(
    "resume", ["flow-without-txn-id", "flow-naming-live-txn", "discharge-dead-id", "flow-naming-dead-id"]
)
async def test_r5_link_acquiring_under_a_timed_out_transaction_gets_nothing(
    mb: MemoryBroker, autojump_clock: MockClock, resume: str
) -> None:
    producer = await client(mb, "producer")
    await producer.sender("q", 1)
    await post_ok(producer, 1, "m0")
    c = await client(mb, "consumer")
    await c.coordinator()
    txn = await c.declare()
    await c.receiver("q", 2)
    await c.credit(2, 5, properties={TXN_ID: txn})
    (d0,) = await c.take(1)
    assert d0.performative.state == TransactionalState(txn_id=txn)
    await trio.sleep(11)
    # the time-out rolls back: m0 goes back, settled released; the controller is not detached
    got = await gather(c.peer)
    expected = [released(d0.performative.delivery_id)]
    assert [f.performative for f in got] == expected, f"after the time-out the link must send nothing, got {got}"
    await post_ok(producer, 1, "m1")
    await c.peer.expect_nothing()  # credit 4 left, two messages ready: still nothing
    await c.credit(2, 5)  # a flow without properties keeps the link bound to the dead id
    await c.peer.expect_nothing()
    queue = mb.queue("q")
    assert (queue.depth, queue.acquired) == (2, 0)
    # a post naming the dead id says timeout
    await c.sender("elsewhere", 3)
    await c.post(3, frames.message("late"), txn=txn)
    answer = (await c.peer.expect(Disposition)).state
    assert isinstance(answer, Rejected)
    assert condition(answer) == Condition.TRANSACTION_TIMEOUT

    if resume == "flow-naming-dead-id":
        await c.credit(2, 5, properties={TXN_ID: txn})
        got = await gather(c.peer)
        assert_detached(got, {c.handles[2]}, Condition.TRANSACTION_TIMEOUT)
        await answer_detach(c, 2)
        txn2 = await c.declare()  # the controller still works
        assert await c.discharge(txn2) == Accepted()
        assert (queue.depth, queue.acquired) == (2, 0)
        return
    expected_state: Any = None
    if resume == "flow-without-txn-id":
        await c.credit(2, 5, properties={Symbol("other"): 1})
        delivered = await c.take(2)
    elif resume == "flow-naming-live-txn":
        txn2 = await c.declare()
        expected_state = TransactionalState(txn_id=txn2)
        await c.credit(2, 5, properties={TXN_ID: txn2})
        delivered = await c.take(2)
    else:  # the controller discharges the dead id: that clears the link's txn-id (§4.4.3)
        state, delivered = await discharge_all(c, txn)
        assert condition(state) == Condition.TRANSACTION_TIMEOUT
        assert kinds(delivered) == ["Transfer", "Transfer"], delivered  # the credit left acquires at once
    assert [body(t.payload) for t in delivered] == ["m0", "m1"]
    assert all(t.performative.state == expected_state for t in delivered)
    ids = [t.performative.delivery_id for t in delivered]
    if resume == "flow-naming-live-txn":
        staged = TransactionalState(txn_id=txn2, outcome=Accepted())
        await c.peer.disposition(ids[0], ids[1], state=staged)
        assert await c.discharge(txn2) == Accepted()
    else:
        await c.peer.disposition(ids[0], ids[1], state=Accepted())
    await mb.settle()
    assert (queue.depth, queue.acquired) == (0, 0)


# -- R6: discharge while a transactional post is only partly received ------------------------------------
async def test_r6_commit_with_a_partial_post_detaches_the_controller(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    q_watcher = await watcher(mb, "q")
    c = await client(mb)
    await c.coordinator()
    await c.sender("q", 1)
    txn = await c.declare()
    other = await c.declare()  # another open transaction of the same controller
    await post_ok(c, 1, "staged under the other transaction", other)
    state = TransactionalState(txn_id=txn)
    partial_id = c.next_id()
    await c.peer.transfer(1, partial_id, BIG[:1000], state=state, more=True)
    await c.peer.expect_nothing()
    await c.control(Discharge(txn_id=txn, fail=False))
    got = await gather(c.peer)
    # §4.4.1: the control link is terminated with transaction-rollback; the discharge gets no answer
    assert kinds(got) == ["Detach"], f"expected only the controller's detach, got {got}"
    assert_detached(got, {c.handles[COORD]}, Condition.TRANSACTION_ROLLBACK)
    await answer_detach(c, COORD)
    assert mb.broker.transactions == []
    assert mb.broker.txn_stats.rolled_back == 2
    # the partial post completes: its transaction is gone
    await c.peer.transfer(1, None, BIG[1000:], more=False)
    answer = await c.peer.expect(Disposition)
    assert answer.first == partial_id
    assert isinstance(answer.state, Rejected)
    assert condition(answer.state) == Condition.UNKNOWN_TXN_ID
    await q_watcher.peer.expect_nothing()
    queue = mb.queue("q")
    assert (queue.depth, queue.staged) == (0, 0)


async def test_r6_rollback_with_a_partial_post_is_accepted(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    q_watcher = await watcher(mb, "q")
    c = await client(mb)
    await c.coordinator()
    await c.sender("q", 1)
    txn = await c.declare()
    partial_id = c.next_id()
    await c.peer.transfer(1, partial_id, BIG[:1000], state=TransactionalState(txn_id=txn), more=True)
    state, others = await discharge_all(c, txn, fail=True)
    assert state == Accepted()
    assert others == []
    await c.peer.transfer(1, None, BIG[1000:], more=False)
    answer = await c.peer.expect(Disposition)
    assert answer.first == partial_id
    assert isinstance(answer.state, Rejected)
    assert condition(answer.state) == Condition.UNKNOWN_TXN_ID
    await q_watcher.peer.expect_nothing()
    assert (mb.queue("q").depth, mb.queue("q").staged) == (0, 0)
    txn2 = await c.declare()  # the controller is still attached
    assert await c.discharge(txn2) == Accepted()


async def test_r6_a_release_bounced_through_the_controllers_other_transaction(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    """The scenario of the model test's falsifying example, frame by frame. The controller holds T1 and T2; a
    post naming T1 is partial; m, acquired outside any transaction, was settled under T1 with accepted, and
    its link now acquires under T2. discharge(T1, fail=false) detaches the controller (R6): T1 rolls back (m
    gets the default outcome, released) and so does T2. If m went out again under T2 meanwhile, that delivery
    is settled released in the same answer: the client is left holding nothing, and m is on "q" once, as it
    was."""
    c = await client(mb)
    await c.coordinator()
    await c.sender("q", 1)
    await post_ok(c, 1, "m")
    t1 = await c.declare()
    t2 = await c.declare()
    await c.sender("q1", 3)
    await c.peer.transfer(3, c.next_id(), BIG[:1000], state=TransactionalState(txn_id=t1), more=True)
    await c.receiver("q", 2)
    await c.credit(2, 1)
    (m,) = await c.take(1)
    m_id = m.performative.delivery_id
    assert m.performative.state is None  # acquired outside any transaction
    await c.peer.disposition(m_id, settled=True, state=TransactionalState(txn_id=t1, outcome=Accepted()))
    await c.credit(2, 1, properties={TXN_ID: t2})
    await c.peer.expect_nothing()  # the queue is empty: m is held by T1
    await c.control(Discharge(txn_id=t1, fail=False))
    got = await gather(c.peer)
    assert_detached(got, {c.handles[COORD]}, Condition.TRANSACTION_ROLLBACK)
    again = [f.performative for f in got if isinstance(f.performative, Transfer)]
    settled = [f.performative for f in got if isinstance(f.performative, Disposition)]
    assert [f.payload for f in got if isinstance(f.performative, Transfer)] in ([], [m.payload]), got
    for t in again:  # handed to the link acquiring under T2 before T2 rolled back too: released at once
        assert t.state == TransactionalState(txn_id=t2)
        assert t.delivery_id is not None
        assert released(t.delivery_id) in settled, got
    assert m_id not in {d.first for d in settled}, "a disposition for a delivery the client had settled"
    await answer_detach(c, COORD)
    assert mb.broker.transactions == []
    assert mb.broker.txn_stats.rolled_back == 2
    queue = mb.queue("q")
    assert (queue.depth, queue.acquired) == (1, 0)
    # the link acquired under T2, which ended without a discharge: it sends again after a flow that says what next
    await c.credit(2, 1, properties={Symbol("other"): 1})
    (m2,) = await c.take(1)
    assert m2.payload == m.payload
    await c.peer.disposition(m2.performative.delivery_id, state=Accepted())
    await c.peer.transfer(3, None, BIG[1000:], more=False)  # the partial post completes: T1 is gone
    answer = await c.peer.expect(Disposition)
    assert condition(answer.state) == Condition.UNKNOWN_TXN_ID


# -- R7: settled control messages, and a coordinator attach asking for them -------------------------------
@pytest.mark.parametrize("control", ["declare", "discharge"])
async def test_r7_settled_declare_or_discharge_detaches_the_controller(
    mb: MemoryBroker, autojump_clock: MockClock, control: str
) -> None:
    q_watcher = await watcher(mb, "q")
    c = await client(mb)
    await c.coordinator()
    await c.sender("q", 1)
    txn = await c.declare()
    await post_ok(c, 1, "staged", txn)
    await c.declare()  # a second open transaction of the controller
    body_ = Declare() if control == "declare" else Discharge(txn_id=txn, fail=False)
    await c.control(body_, settled=True)
    got = await gather(c.peer)
    assert kinds(got) == ["Detach"], f"expected the controller's detach, got {got}"
    assert_detached(got, {c.handles[COORD]}, Condition.NOT_ALLOWED)
    await answer_detach(c, COORD)
    # nothing declared, nothing committed, and the controller's transactions rolled back with its link
    assert mb.broker.transactions == []
    stats = mb.broker.txn_stats
    assert (stats.declared, stats.committed, stats.rolled_back) == (2, 0, 2)
    await q_watcher.peer.expect_nothing()
    assert (mb.queue("q").depth, mb.queue("q").staged) == (0, 0)


async def test_r7_coordinator_attach_with_settled_sender_mode_is_refused(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    c = await client(mb)
    attach = await c.peer.attach_sender(
        None,
        COORD,
        name="settled-controller",
        source=Source(),
        target=Coordinator(capabilities=[Symbol("amqp:local-transactions")]),
        snd_settle_mode=1,
    )
    assert attach.target is None, f"the refusal's attach carries a null target, got {attach.target}"
    detach = await c.peer.expect(Detach)
    assert detach.handle == attach.handle
    assert detach.closed
    assert condition(detach) == Condition.NOT_ALLOWED
    await answer_detach(c, COORD)
    await c.peer.expect_nothing()
    # the connection survives: an ordinary controller works
    await c.coordinator(handle=1)
    txn = await c.declare(handle=1)
    assert await c.discharge(txn, handle=1) == Accepted()


# -- R8: dispositions on deliveries the broker sent -------------------------------------------------------
async def test_r8_settled_txn_state_without_outcome_on_a_delivery_acquired_under_t(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    c = await client(mb)
    payloads = await _fill(c, "q", ["m0"])
    await c.coordinator()
    txn = await c.declare()
    await c.receiver("q", 2)
    await c.credit(2, 1, properties={TXN_ID: txn})
    (delivered,) = await c.take(1)
    await c.peer.disposition(delivered.performative.delivery_id, settled=True, state=TransactionalState(txn_id=txn))
    await c.peer.expect_nothing()
    queue = mb.queue("q")
    assert (queue.depth, queue.acquired) == (0, 1)  # T decides at discharge
    state, others = await discharge_all(c, txn)
    assert state == Accepted()
    assert others == []
    assert (queue.depth, queue.acquired) == (1, 0), "settled without outcome: the default outcome (released) applies"
    await take_unchanged(c, payloads[0])


async def test_r8_txn_state_without_outcome_on_a_delivery_held_by_no_transaction(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    c = await client(mb)
    payloads = await _fill(c, "q", ["m0"])
    await c.coordinator()
    txn = await c.declare()
    await c.receiver("q", 2)
    await c.credit(2, 1)
    (delivered,) = await c.take(1)
    delivery_id = delivered.performative.delivery_id
    queue = mb.queue("q")
    # unsettled, no outcome: a non-terminal state, nothing changes
    await c.peer.disposition(delivery_id, settled=False, state=TransactionalState(txn_id=txn))
    await c.peer.expect_nothing()
    assert (queue.depth, queue.acquired) == (0, 1)
    assert mb.broker.transactions[0].retirements == 0
    # settled, no outcome, held by no transaction: the source's default outcome (released) at once
    await c.peer.disposition(delivery_id, settled=True, state=TransactionalState(txn_id=txn))
    await c.peer.expect_nothing()
    assert (queue.depth, queue.acquired) == (1, 0), "a settlement without outcome must release the message at once"
    assert await c.discharge(txn) == Accepted()
    await take_unchanged(c, payloads[0])


@pytest.mark.parametrize("settings", [BrokerSettings(transaction_timeout=10)], ids=["timeout-10s"])
@pytest.mark.parametrize("unknown", ["never-declared", "other-connection", "discharged", "timed-out"])
async def test_r8_unknown_txn_id_on_a_delivery_held_by_no_transaction_releases_it(
    mb: MemoryBroker, autojump_clock: MockClock, unknown: str
) -> None:
    c = await client(mb)
    payloads = await _fill(c, "q", ["m0", "m1"])
    await c.coordinator()
    if unknown == "never-declared":
        txn = NEVER_DECLARED
    elif unknown == "other-connection":
        other = await client(mb, "other")
        await other.coordinator()
        txn = await other.declare()
    else:
        txn = await c.declare()
        if unknown == "discharged":
            assert await c.discharge(txn) == Accepted()
        else:
            await trio.sleep(11)
    await c.receiver("q", 2)
    await c.credit(2, 2)
    d0, d1 = (t.performative.delivery_id for t in await c.take(2))
    staged = TransactionalState(txn_id=txn, outcome=Accepted())
    await c.peer.disposition(d0, settled=True, state=staged)
    await c.peer.disposition(d1, settled=False, state=staged)
    got = await gather(c.peer)
    # the outcome is not applied; the broker says what it did with the one the client left unsettled
    assert [f.performative for f in got] == [released(d1)], got
    queue = mb.queue("q")
    assert (queue.depth, queue.acquired) == (2, 0)
    again = await take_and_accept(c, 2, 2)
    assert [t.payload for t in again] == payloads  # released: delivery-count unchanged
    if unknown == "other-connection":
        assert await other.discharge(txn) == Accepted()


async def test_r8_unknown_txn_id_on_a_delivery_held_by_t_leaves_the_decision_to_t(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    c = await client(mb)
    payloads = await _fill(c, "q", ["m0", "m1"])
    await c.coordinator()
    txn = await c.declare()
    await c.receiver("q", 2)
    await c.credit(2, 2, properties={TXN_ID: txn})
    d0, d1 = (t.performative.delivery_id for t in await c.take(2))
    staged = TransactionalState(txn_id=NEVER_DECLARED, outcome=Accepted())
    await c.peer.disposition(d0, settled=True, state=staged)
    await c.peer.disposition(d1, settled=False, state=staged)
    await c.peer.expect_nothing()
    queue = mb.queue("q")
    assert (queue.depth, queue.acquired) == (0, 2)
    assert mb.broker.transactions[0].retirements == 0  # the outcome is ignored
    state, others = await discharge_all(c, txn)
    assert state == Accepted()
    assert others == []
    # m0 was settled by the client: the default outcome (released); m1 stays acquired, an ordinary delivery
    assert (queue.depth, queue.acquired) == (1, 1), "the settled delivery must go back at commit (R2)"
    await c.peer.disposition(d1, state=Accepted())
    (again,) = await take_and_accept(c, 2, 1)
    assert again.payload == payloads[0]


async def test_r8_settled_outcome_naming_a_second_transaction_rolls_back_both(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    c = await client(mb)
    await _fill(c, "q", ["m0"])
    await c.coordinator(handle=0)
    await c.coordinator(handle=1)
    first = await c.declare(handle=0)
    second = await c.declare(handle=1)
    await c.receiver("q", 2)
    await c.credit(2, 1, properties={TXN_ID: first})
    (delivered,) = await c.take(1)
    staged = TransactionalState(txn_id=second, outcome=Accepted())
    await c.peer.disposition(delivered.performative.delivery_id, settled=True, state=staged)
    got = await gather(c.peer)
    # both controllers detached; no disposition for the delivery, which the client settled (D5)
    assert kinds(got) == ["Detach", "Detach"], got
    assert_detached(got, {c.handles[0], c.handles[1]}, Condition.TRANSACTION_ROLLBACK)
    await answer_detach(c, 0, 1)
    assert mb.broker.transactions == []
    assert mb.broker.txn_stats.rolled_back == 2
    queue = mb.queue("q")
    assert (queue.depth, queue.acquired) == (1, 0)


# -- R9: cost of declare, controller detach, connection close and time-out pass ----------------------------
def _count_lines(action: Callable[[], object]) -> int:
    """Python line events executed by ``action`` (all frames, all modules)."""
    count = 0

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return local

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        return local

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        action()
    finally:
        sys.settrace(previous)
    return count


_OTHER_CONNECTIONS = 4


def _world(others: int) -> tuple[World, Peer]:
    """A broker with ``others`` open transactions on other connections, and a measured connection with one
    transaction of its own, declared 100 s before the others (so a time-out pass at 301 s expires only it)."""
    world = World(Broker(BrokerSettings(transaction_timeout=300, max_transactions_per_connection=others)))
    measured = world.connect("measured")
    measured.attach_controller("controller")
    world.settle()
    measured.declare("controller")
    world.settle()
    world.now = 100.0
    for k in range(_OTHER_CONNECTIONS):
        peer = world.connect(f"other-{k}")
        peer.attach_controller("controller")
        for _ in range(others // _OTHER_CONNECTIONS):
            peer.declare("controller")
        world.settle()
    assert len(world.broker.transactions) == others // _OTHER_CONNECTIONS * _OTHER_CONNECTIONS + 1
    return world, measured


def _operation(world: World, measured: Peer, operation: str) -> Callable[[], object]:
    if operation == "declare":
        return lambda: measured.declare("controller")
    if operation == "controller-detach":
        return lambda: measured.detach("controller")
    if operation == "connection-close":
        return measured.close
    world.now = 301.0
    return lambda: world.broker.handle_timeout(301.0)


@pytest.mark.parametrize("operation", ["declare", "controller-detach", "connection-close", "time-out-pass"])
def test_r9_cost_does_not_grow_with_other_connections_transactions(operation: str) -> None:
    counts = {}
    for others in (12, 2000):
        world, measured = _world(others)
        rolled_back = world.broker.txn_stats.rolled_back
        counts[others] = _count_lines(_operation(world, measured, operation))
        seen = world.settle()
        # the operation did what it should
        open_after = len(world.broker.transactions)
        if operation == "declare":
            (answer,) = seen[measured].answers.values()
            assert isinstance(answer[0], Declared)
            assert open_after == others + 2
        else:
            assert open_after == others
            assert world.broker.txn_stats.rolled_back == rolled_back + 1
    few, many = counts[12], counts[2000]
    # O(1) (or a log factor of a sorted structure) stays within the slack; O(N) adds thousands of lines
    assert many <= few + max(50, few // 5), f"{operation}: {few} lines with 12 other transactions, {many} with 2000"


# -- R10: timed-out ids count toward the per-connection limit ---------------------------------------------
@pytest.mark.parametrize(
    "settings", [BrokerSettings(transaction_timeout=10, max_transactions_per_connection=3)], ids=["limit-3"]
)
async def test_r10_timed_out_ids_count_toward_the_transaction_limit(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    c = await client(mb)
    await c.coordinator()
    first, second = await c.declare(), await c.declare()
    await trio.sleep(5)
    live = await c.declare()
    await trio.sleep(6)  # first and second timed out, live is 6 s old
    assert [i.txn_id for i in mb.broker.transactions] == [live]
    assert mb.broker.txn_stats.timed_out == 2

    async def refused(open_: int, timed_out: int) -> None:
        delivery_id = await c.control(Declare())
        answer = await c.peer.expect(Disposition)
        assert answer.first == delivery_id
        assert isinstance(answer.state, Rejected), f"declare beyond the limit must be refused, got {answer.state}"
        assert condition(answer.state) == Condition.RESOURCE_LIMIT_EXCEEDED
        numbers = set(re.findall(r"\d+", answer.state.error.description or ""))
        assert {str(open_), str(timed_out)} <= numbers, answer.state.error.description

    await refused(open_=1, timed_out=2)
    # discharging a timed-out id forgets it and frees a slot
    assert condition(await c.discharge(first)) == Condition.TRANSACTION_TIMEOUT
    fourth = await c.declare()
    await refused(open_=2, timed_out=1)
    assert condition(await c.discharge(second)) == Condition.TRANSACTION_TIMEOUT
    fifth = await c.declare()
    for txn in (live, fourth, fifth):
        assert await c.discharge(txn) == Accepted()
    assert mb.broker.txn_stats.timed_out == 2


# -- D1: a multi-frame post naming two transactions -------------------------------------------------------
async def test_d1_multi_frame_post_naming_two_transactions_rolls_back_both(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    q_watcher = await watcher(mb, "q")
    side_watcher = await watcher(mb, "side")
    c = await client(mb)
    await c.coordinator(handle=0)
    await c.coordinator(handle=1)
    await c.sender("q", 3)
    await c.sender("side", 4)
    first = await c.declare(handle=0)
    second = await c.declare(handle=1)
    await post_ok(c, 4, "staged under the first", first)
    await post_ok(c, 4, "staged under the second", second)
    delivery_id = c.next_id()
    chunks = [BIG[:1000], BIG[1000:2000], BIG[2000:]]
    await c.peer.transfer(3, delivery_id, chunks[0], state=TransactionalState(txn_id=first), more=True)
    await c.peer.transfer(3, None, chunks[1], more=True)  # no state: inherits the first frame's
    await c.peer.transfer(3, None, chunks[2], state=TransactionalState(txn_id=second), more=False)
    got = await gather(c.peer)
    (answer,) = answers_to(got, delivery_id)
    assert isinstance(answer.state, Rejected), f"the post must be rejected, got {answer.state}"
    assert condition(answer.state) == Condition.TRANSACTION_ROLLBACK
    assert_detached(
        [f for f in got if f.performative is not answer], {c.handles[0], c.handles[1]}, Condition.TRANSACTION_ROLLBACK
    )
    await answer_detach(c, 0, 1)
    assert mb.broker.transactions == []
    assert mb.broker.txn_stats.rolled_back == 2
    for address, w in (("q", q_watcher), ("side", side_watcher)):
        await w.peer.expect_nothing()
        assert (mb.queue(address).depth, mb.queue(address).staged) == (0, 0)


# -- D2: discharge whose fail is not a boolean ------------------------------------------------------------
@pytest.mark.parametrize(
    "outcomes", [[ACCEPTED_LIST, REJECTED_LIST], [ACCEPTED_LIST]], ids=["rejected", "accepted-only"]
)
async def test_d2_discharge_with_non_boolean_fail_is_a_decode_error(
    mb: MemoryBroker, autojump_clock: MockClock, outcomes: list[str]
) -> None:
    c = await client(mb)
    await c.coordinator(handle=0, outcomes=outcomes)
    await c.coordinator(handle=1)  # holds the transaction, so that a detach of handle 0 leaves it alone
    await c.sender("q", 3)
    txn = await c.declare(handle=1)
    await post_ok(c, 3, "staged", txn)
    bad = frames.message(AmqpValue(Described(ULong(0x32), [txn, "true"])))  # discharge(txn, fail="true")
    delivery_id = c.next_id()
    await c.peer.transfer(0, delivery_id, bad)
    got = await gather(c.peer)
    if REJECTED_LIST in outcomes:
        (answer,) = answers_to(got, delivery_id)
        assert isinstance(answer.state, Rejected)
        assert condition(answer.state) == Condition.DECODE_ERROR
        assert len(got) == 1, got
    else:
        assert kinds(got) == ["Detach"], got
        assert_detached(got, {c.handles[0]}, Condition.DECODE_ERROR)
        await answer_detach(c, 0)
    assert [i.txn_id for i in mb.broker.transactions] == [txn]  # the transaction stays open
    assert mb.queue("q").staged == 1
    assert await c.discharge(txn, handle=1) == Accepted()
    assert mb.queue("q").depth == 1


# -- D3: a control message that itself carries transactional-state ---------------------------------------
@pytest.mark.parametrize(
    "outcomes", [[ACCEPTED_LIST, REJECTED_LIST], [ACCEPTED_LIST]], ids=["rejected", "accepted-only"]
)
@pytest.mark.parametrize("control", ["declare", "discharge"])
async def test_d3_transactional_work_on_the_control_link_is_refused(
    mb: MemoryBroker, autojump_clock: MockClock, control: str, outcomes: list[str]
) -> None:
    c = await client(mb)
    await c.coordinator(handle=0, outcomes=outcomes)
    await c.coordinator(handle=1)
    await c.sender("q", 3)
    txn = await c.declare(handle=1)
    await post_ok(c, 3, "staged", txn)
    body_ = Declare() if control == "declare" else Discharge(txn_id=txn, fail=False)
    delivery_id = c.next_id()
    await c.peer.transfer(0, delivery_id, frames.message(AmqpValue(body_)), state=TransactionalState(txn_id=txn))
    got = await gather(c.peer)
    if REJECTED_LIST in outcomes:
        assert len(got) == 1, got
        (answer,) = answers_to(got, delivery_id)
        assert isinstance(answer.state, Rejected), f"expected rejected not-allowed, got {answer.state}"
        assert condition(answer.state) == Condition.NOT_ALLOWED
    else:
        assert kinds(got) == ["Detach"], got
        assert_detached(got, {c.handles[0]}, Condition.NOT_ALLOWED)
        await answer_detach(c, 0)
    # nothing declared, nothing discharged
    assert [i.txn_id for i in mb.broker.transactions] == [txn]
    assert mb.broker.txn_stats.declared == 1
    assert (mb.queue("q").depth, mb.queue("q").staged) == (0, 1)
    assert await c.discharge(txn, handle=1) == Accepted()
    assert mb.queue("q").depth == 1


# -- D4: an anonymous-relay post under T to an address with no node ---------------------------------------
@pytest.mark.parametrize("ending", ["commit", "rollback", "failed-commit"])
async def test_d4_relay_post_under_t_creates_its_node_only_at_commit(
    mb: MemoryBroker, autojump_clock: MockClock, ending: str
) -> None:
    c = await client(mb)
    await c.coordinator()
    await c.sender(None, 1)
    txn = await c.declare()
    delivery_id = await c.post(1, frames.message("first of its node", to("fresh")), txn=txn)
    answer = await c.peer.expect(Disposition)
    assert (answer.first, answer.state) == (delivery_id, TransactionalState(txn_id=txn, outcome=Accepted()))
    assert not mb.queue("fresh").exists, "the node must not exist before the commit"
    if ending == "commit":
        assert await c.discharge(txn) == Accepted()
        assert mb.queue("fresh").depth == 1
        await c.receiver("fresh", 5)
        (delivered,) = await take_and_accept(c, 5, 1)
        assert body(delivered.payload) == "first of its node"
    elif ending == "rollback":
        assert await c.discharge(txn, fail=True) == Accepted()
        assert not mb.queue("fresh").exists
    else:
        await c.post(1, frames.message("no to: unroutable"), txn=txn)
        assert isinstance((await c.peer.expect(Disposition)).state.outcome, Rejected)
        state = await c.discharge(txn)
        assert isinstance(state, Rejected)
        assert condition(state) == Condition.TRANSACTION_ROLLBACK
        assert not mb.queue("fresh").exists
    # a plain relay post still creates its node at once
    await post_ok_to(c, 1, "plain", "fresh-plain")
    assert mb.queue("fresh-plain").depth == 1


# -- D5: no disposition for a delivery the client already settled ----------------------------------------
@pytest.mark.parametrize("settings", [BrokerSettings(transaction_timeout=30)], ids=["timeout-30s"])
@pytest.mark.parametrize(
    "scenario",
    [
        "rollback-after-settle-without-outcome",
        "rollback-after-settled-txn-accept",
        "commit-after-settled-txn-accept",
        "time-out-after-settle-without-outcome",
        "outcome-naming-a-second-transaction",
    ],
)
async def test_d5_no_disposition_for_a_delivery_the_client_settled(
    mb: MemoryBroker, autojump_clock: MockClock, scenario: str
) -> None:
    c = await client(mb)
    await _fill(c, "q", ["m0"])
    await c.coordinator(handle=0)
    await c.coordinator(handle=1)
    txn = await c.declare(handle=0)
    await c.receiver("q", 2)
    await c.credit(2, 1, properties={TXN_ID: txn})
    (delivered,) = await c.take(1)
    delivery_id = delivered.performative.delivery_id
    if scenario.endswith("settle-without-outcome"):
        await c.peer.disposition(delivery_id, settled=True)
    elif scenario.endswith("settled-txn-accept"):
        await c.peer.disposition(delivery_id, settled=True, state=TransactionalState(txn_id=txn, outcome=Accepted()))
    await c.peer.expect_nothing()
    queue = mb.queue("q")
    if scenario.startswith(("rollback", "commit")):
        state, others = await discharge_all(c, txn, fail=scenario.startswith("rollback"))
        assert state == Accepted()
        assert others == [], f"no disposition may follow for a settled delivery, got {others}"
        assert (queue.depth, queue.acquired) == ((0, 0) if scenario.startswith("commit") else (1, 0))
    elif scenario.startswith("time-out"):
        await trio.sleep(31)
        assert await gather(c.peer) == []
        assert (queue.depth, queue.acquired) == (1, 0)
    else:
        second = await c.declare(handle=1)
        staged = TransactionalState(txn_id=second, outcome=Accepted())
        await c.peer.disposition(delivery_id, settled=True, state=staged)
        got = await gather(c.peer)
        assert kinds(got) == ["Detach", "Detach"], f"only the two controllers' detaches may come, got {got}"
        await answer_detach(c, 0, 1)
        assert (queue.depth, queue.acquired) == (1, 0)


# -- D6: the broker says what it did with an unsettled delivery whose disposition named an unknown id -----
async def test_d6_unknown_txn_id_on_an_unsettled_delivery_is_settled_released(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    c = await client(mb)
    payloads = await _fill(c, "q", ["m0"])
    await c.receiver("q", 2)
    await c.credit(2, 1)
    (delivered,) = await c.take(1)
    delivery_id = delivered.performative.delivery_id
    await c.peer.disposition(delivery_id, settled=False, state=TransactionalState(txn_id=NEVER_DECLARED))
    got = await gather(c.peer)
    assert [f.performative for f in got] == [released(delivery_id)], got
    queue = mb.queue("q")
    assert (queue.depth, queue.acquired) == (1, 0)
    (again,) = await take_and_accept(c, 2, 1)
    assert again.payload == payloads[0]
