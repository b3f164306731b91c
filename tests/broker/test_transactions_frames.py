"""Transactions (AMQP 1.0 Part 4, DESIGN §4) frame by frame: what a client library cannot express.

Every test runs the real broker core, engine and connection tasks over in-memory streams
(``minibroker.testing.memory``) under ``MockClock(autojump_threshold=0)``: no sockets, and every wait, the
transaction time-out included, passes in virtual time. The ``mb`` fixture checks after each test that no
transaction is left open and that no queue holds staged or acquired messages. One test at the end repeats a
rule over TCP with ``ScriptedPeer`` against the real server in a thread, with the server's own txn-ids.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from minibroker.amqp import codec
from minibroker.amqp.definitions import (
    Accepted,
    AmqpValue,
    Attach,
    Coordinator,
    Declare,
    Declared,
    Detach,
    Discharge,
    Disposition,
    End,
    Flow,
    Header,
    Modified,
    Properties,
    Rejected,
    Released,
    Source,
    TransactionalState,
    Transfer,
)
from minibroker.amqp.errors import Condition
from minibroker.amqp.types import Symbol, UInt
from minibroker.broker.core import BrokerSettings
from minibroker.broker.personality import TXN_CAPABILITIES
from minibroker.broker.transactions import MAX_TXN_ID
from minibroker.testing import frames
from minibroker.testing.client import Frame
from minibroker.testing.memory import MemoryBroker, MemoryPeer, memory_broker
from minibroker.testing.peer import ScriptedPeer
from minibroker.testing.thread import ThreadedBroker

COORD = 0  # our handle for the coordinator link, unless a test says otherwise
TXN_ID = Symbol("txn-id")
ACCEPTED_LIST = Symbol("amqp:accepted:list")
REJECTED_LIST = Symbol("amqp:rejected:list")


# -- fixtures and helpers ---------------------------------------------------------------------------------
@pytest.fixture
def settings() -> BrokerSettings:
    """Broker settings; a test overrides them with ``@pytest.mark.parametrize("settings", [...])``."""
    return BrokerSettings()


def assert_clean(mb: MemoryBroker) -> None:
    """No open transaction, nothing staged, nothing acquired."""
    assert mb.broker.transactions == []
    counts = {name: (q.staged, q.acquired) for name in mb.queues for q in [mb.queue(name).stats()]}
    leftovers = {name: count for name, count in counts.items() if any(count)}
    assert leftovers == {}, "queues with (staged, acquired) messages left"


@pytest.fixture
async def mb(settings: BrokerSettings) -> AsyncIterator[MemoryBroker]:
    async with memory_broker(settings, receive_timeout=5.0) as running:
        yield running
        await running.settle()
        assert_clean(running)


class Client:
    """A ``MemoryPeer`` that numbers its deliveries per session and speaks the controller's part."""

    def __init__(self, peer: MemoryPeer) -> None:
        self.peer = peer
        self.handles: dict[int, int | None] = {}
        """Our handle -> the broker's handle for the same link (from its attach)."""
        self._next_ids: dict[int, int] = {}

    def next_id(self, channel: int = 0) -> int:
        delivery_id = self._next_ids.get(channel, 0)
        self._next_ids[channel] = delivery_id + 1
        return delivery_id

    async def start(self, container_id: str = "test-peer") -> Client:
        await self.peer.open(container_id=container_id)
        await self.peer.begin()
        return self

    # -- controller --------------------------------------------------------------------------------------
    async def coordinator(
        self, handle: int = COORD, *, outcomes: list[str] | None = None, channel: int = 0, **fields: Any
    ) -> tuple[Attach, Flow]:
        """Attach a controller link; return the broker's attach and the flow granting credit."""
        attach = await self.peer.attach_sender(
            None,
            handle,
            name=f"txn-controller-{handle}",
            source=Source(outcomes=outcomes),
            target=Coordinator(capabilities=[Symbol("amqp:local-transactions")]),
            channel=channel,
            **fields,
        )
        self.handles[handle] = attach.handle
        return attach, await self.peer.expect(Flow)

    async def control(self, body: Any, *, handle: int = COORD, settled: bool = False, channel: int = 0) -> int:
        """Send a declare or discharge; return its delivery id."""
        delivery_id = self.next_id(channel)
        payload = frames.message(AmqpValue(body))
        await self.peer.transfer(handle, delivery_id, payload, settled=settled or None, channel=channel)
        return delivery_id

    async def declare(self, handle: int = COORD, *, channel: int = 0) -> bytes:
        delivery_id = await self.control(Declare(), handle=handle, channel=channel)
        answer = await self.peer.expect(Disposition)
        assert answer.first == delivery_id
        assert isinstance(answer.state, Declared), answer
        txn_id: bytes = answer.state.txn_id
        return txn_id

    async def discharge(self, txn_id: Any, *, fail: bool = False, handle: int = COORD, channel: int = 0) -> Any:
        """Discharge and return the state of the broker's answer (only that frame may come)."""
        delivery_id = await self.control(Discharge(txn_id=txn_id, fail=fail), handle=handle, channel=channel)
        answer = await self.peer.expect(Disposition)
        assert answer.first == delivery_id
        assert answer.settled
        return answer.state

    # -- producers and consumers -------------------------------------------------------------------------
    async def sender(self, address: str | None, handle: int) -> None:
        attach = await self.peer.attach_sender(address, handle)
        self.handles[handle] = attach.handle
        assert (await self.peer.expect(Flow)).link_credit

    async def post(
        self, handle: int, payload: bytes, *, txn: bytes | None = None, settled: bool = False, **fields: Any
    ) -> int:
        delivery_id = self.next_id()
        state = TransactionalState(txn_id=txn) if txn is not None else None
        await self.peer.transfer(handle, delivery_id, payload, settled=settled or None, state=state, **fields)
        return delivery_id

    async def receiver(self, address: str, handle: int, **fields: Any) -> None:
        attach = await self.peer.attach_receiver(address, handle, **fields)
        self.handles[handle] = attach.handle

    async def credit(self, handle: int, credit: int, *, properties: dict[Any, Any] | None = None) -> None:
        await self.peer.flow(handle, credit, properties=properties)

    async def take(self, n: int) -> list[Frame]:
        """The next ``n`` frames, which must all be transfers."""
        return [await self.peer.expect_frame(Transfer) for _ in range(n)]


async def client(mb: MemoryBroker, container_id: str = "test-peer") -> Client:
    return await Client(await mb.connect()).start(container_id)


async def collect(peer: MemoryPeer, n: int, *, skip: tuple[type, ...] = ()) -> list[Any]:
    """The performatives of the next ``n`` frames, ignoring any of the ``skip`` kinds."""
    got: list[Any] = []
    while len(got) < n:
        performative = (await peer.receive()).performative
        if not isinstance(performative, skip):
            got.append(performative)
    return got


async def discharge_with(
    c: Client, txn: bytes, others: int, *, fail: bool = False, handle: int = COORD
) -> tuple[Any, list[Frame]]:
    """Discharge; return the state of the answer and the ``others`` frames that come with it, in any order."""
    delivery_id = await c.control(Discharge(txn_id=txn, fail=fail), handle=handle)
    got = [await c.peer.receive() for _ in range(others + 1)]
    answers = [
        f
        for f in got
        if isinstance(f.performative, Disposition)
        and f.performative.role is frames.RECEIVER
        and f.performative.first == delivery_id
    ]
    assert len(answers) == 1, got
    return answers[0].performative.state, [f for f in got if f is not answers[0]]


def body(payload: bytes) -> Any:
    """The amqp-value body of an encoded message."""
    return next(s.value for s in codec.decode_all(payload) if isinstance(s, AmqpValue))


def header(payload: bytes) -> Header | None:
    return next((s for s in codec.decode_all(payload) if isinstance(s, Header)), None)


def condition(state: Any) -> str:
    """The error condition of a rejected outcome or of a detach."""
    assert state is not None
    assert state.error is not None, state
    return str(state.error.condition)


def to(address: str) -> Properties:
    return Properties(to=address)


# -- the coordinator link ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("snd", "rcv"),
    [(None, None), (0, 0), (2, 0), (2, 1)],
    ids=["defaults", "unsettled-first", "mixed-first", "mixed-second"],
)
async def test_coordinator_attach_reply(
    mb: MemoryBroker, autojump_clock: MockClock, snd: int | None, rcv: int | None
) -> None:
    c = await client(mb)
    attach, flow = await c.coordinator(
        outcomes=[ACCEPTED_LIST, REJECTED_LIST], snd_settle_mode=snd, rcv_settle_mode=rcv
    )
    assert attach.role is frames.RECEIVER
    assert isinstance(attach.target, Coordinator)
    assert set(attach.target.capabilities or []) == set(TXN_CAPABILITIES)
    # the settle modes the controller asked for come back as they were (clients check this)
    assert (attach.snd_settle_mode, attach.rcv_settle_mode) == (snd, rcv)
    assert flow.handle == attach.handle
    assert flow.link_credit is not None
    assert flow.link_credit >= 50


async def test_rcv_settle_mode_second_leaves_control_outcomes_unsettled(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    """§2.8.3: with rcv-settle-mode second (echoed) the broker settles only after the controller did."""
    c = await client(mb)
    await c.coordinator(rcv_settle_mode=1)
    delivery_id = await c.control(Declare())
    answer = await c.peer.expect(Disposition)
    assert isinstance(answer.state, Declared)
    assert not answer.settled
    await c.peer.disposition(delivery_id, role=frames.SENDER, settled=True, state=answer.state)
    delivery_id = await c.control(Discharge(txn_id=answer.state.txn_id))
    answer = await c.peer.expect(Disposition)
    assert answer.state == Accepted()
    assert not answer.settled
    await c.peer.disposition(delivery_id, role=frames.SENDER, settled=True, state=answer.state)
    await mb.settle()
    assert mb.broker.txn_stats.committed == 1


async def test_pipelined_declares_and_discharges(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    """50 declares in a row without waiting, then their discharges; credit keeps up, ids never repeat."""
    c = await client(mb)
    await c.coordinator()
    seen: set[bytes] = set()
    for _round in range(3):
        ids = [await c.control(Declare()) for _ in range(50)]
        answers = await collect(c.peer, 50, skip=(Flow,))
        assert [a.first for a in answers] == ids
        txns = [a.state.txn_id for a in answers if isinstance(a.state, Declared)]
        assert len(txns) == 50
        assert all(isinstance(t, bytes) and 0 < len(t) <= MAX_TXN_ID for t in txns)
        assert seen.isdisjoint(txns)
        assert len(set(txns)) == 50
        seen.update(txns)
        assert len(mb.broker.transactions) == 50
        for i, txn in enumerate(txns):
            await c.control(Discharge(txn_id=txn, fail=i % 2 == 1))
        answers = await collect(c.peer, 50, skip=(Flow,))
        assert all(a.state == Accepted() for a in answers)  # a Detach here would be transfer-limit-exceeded
    assert mb.broker.txn_stats.declared == 150
    assert mb.broker.txn_stats.committed == 75
    assert mb.broker.txn_stats.rolled_back == 75


# -- control errors and how they travel (§4.3) ------------------------------------------------------------
async def _provoke(c: Client, kind: str) -> None:
    """Send a declare or discharge that the coordinator must refuse."""
    if kind == "global-id":
        await c.control(Declare(global_id=b"xid-1"))
    elif kind == "never-declared":
        await c.control(Discharge(txn_id=b"no-such-txn"))
    elif kind == "not-binary":
        await c.control(Discharge(txn_id="a string"))
    elif kind == "failed-commit":
        await c.sender(None, 5)  # anonymous relay
        txn = await c.declare()
        await c.post(5, frames.message("no to: unroutable"), txn=txn)
        assert isinstance((await c.peer.expect(Disposition)).state.outcome, Rejected)
        await c.control(Discharge(txn_id=txn))
    elif kind == "timed-out":
        txn = await c.declare()
        await trio.sleep(BrokerSettings().transaction_timeout + 1)  # virtual time
        await c.control(Discharge(txn_id=txn))
    else:
        txn = await c.declare()
        assert await c.discharge(txn, fail=kind == "rolled-back") == Accepted()
        await c.control(Discharge(txn_id=txn))  # a second time


ERROR_KINDS = {
    "global-id": Condition.NOT_IMPLEMENTED,
    "never-declared": Condition.UNKNOWN_TXN_ID,
    "not-binary": Condition.UNKNOWN_TXN_ID,
    "committed": Condition.UNKNOWN_TXN_ID,
    "rolled-back": Condition.UNKNOWN_TXN_ID,
    "failed-commit": Condition.TRANSACTION_ROLLBACK,
    "timed-out": Condition.TRANSACTION_TIMEOUT,
}


@pytest.mark.parametrize("kind", list(ERROR_KINDS))
@pytest.mark.parametrize(
    "outcomes",
    [None, [ACCEPTED_LIST, REJECTED_LIST], [REJECTED_LIST]],
    ids=["no-outcomes", "accepted-rejected", "rejected-only"],
)
async def test_control_error_travels_as_rejected(
    mb: MemoryBroker, autojump_clock: MockClock, outcomes: list[str] | None, kind: str
) -> None:
    c = await client(mb)
    await c.coordinator(outcomes=outcomes)
    await _provoke(c, kind)
    answer = await c.peer.expect(Disposition)
    assert answer.settled
    assert isinstance(answer.state, Rejected)
    assert condition(answer.state) == ERROR_KINDS[kind]
    # the coordinator link is still usable
    txn = await c.declare()
    assert await c.discharge(txn) == Accepted()


@pytest.mark.parametrize("kind", list(ERROR_KINDS))
async def test_control_error_detaches_when_rejected_is_not_offered(
    mb: MemoryBroker, autojump_clock: MockClock, kind: str
) -> None:
    c = await client(mb)
    await c.coordinator(outcomes=[ACCEPTED_LIST])
    await _provoke(c, kind)
    detach = await c.peer.expect(Detach)
    assert detach.handle == c.handles[COORD]
    assert detach.closed
    assert condition(detach) == ERROR_KINDS[kind]
    await c.peer.send(Detach(handle=UInt(COORD), closed=True))
    # the connection survives: a new controller works
    await c.coordinator(handle=1, outcomes=[ACCEPTED_LIST])
    txn = await c.declare(handle=1)
    assert await c.discharge(txn, handle=1) == Accepted()


@pytest.mark.parametrize("outcomes", [None, [ACCEPTED_LIST, REJECTED_LIST]], ids=["no-outcomes", "rejected"])
@pytest.mark.parametrize("body", [Declare(), Discharge(txn_id=b"no-such-txn")], ids=["declare", "discharge"])
async def test_presettled_control_message_detaches_the_coordinator(
    mb: MemoryBroker, autojump_clock: MockClock, outcomes: list[str] | None, body: Any
) -> None:
    """§4.3: declare and discharge "MUST NOT be sent settled": the coordinator link is detached with
    amqp:not-allowed, whatever the outcomes, and a settled declare creates no transaction."""
    c = await client(mb)
    await c.coordinator(outcomes=outcomes)
    await c.control(body, settled=True)
    detach = await c.peer.expect(Detach)
    assert condition(detach) == Condition.NOT_ALLOWED
    assert mb.broker.transactions == []
    assert mb.broker.txn_stats.declared == 0


async def test_txn_stats_are_frozen_snapshots(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    """``txn_stats`` gives a frozen copy of the counters as they were: later work changes the next one only."""
    c = await client(mb)
    await c.coordinator()
    txn = await c.declare()
    before = mb.broker.txn_stats
    assert await c.discharge(txn) == Accepted()
    assert (before.declared, before.committed) == (1, 0)
    assert (mb.broker.txn_stats.declared, mb.broker.txn_stats.committed) == (1, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.committed = 5  # type: ignore[misc]


# -- posting (§4.4.1) -------------------------------------------------------------------------------------
async def test_transactional_post_is_staged_until_commit(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    c = await client(mb, "poster")
    await c.coordinator()
    await c.sender("q", 1)
    await c.receiver("q", 2)
    await c.credit(2, 10)
    txn = await c.declare()
    first = await c.post(1, frames.message("one"), txn=txn)
    provisional = await c.peer.expect(Disposition)
    assert provisional.first == first
    assert provisional.role is frames.RECEIVER
    assert provisional.state == TransactionalState(txn_id=txn, outcome=Accepted())
    await c.post(1, frames.message("two"), txn=txn, settled=True)  # pre-settled: staged, no answer
    await c.peer.expect_nothing()  # the consumer with credit sees nothing
    queue = mb.queue("q")
    assert (queue.depth, queue.staged, queue.acquired) == (0, 2, 0)
    (info,) = mb.broker.transactions
    assert (info.txn_id, info.connection, info.posts, info.staged_addresses) == (txn, "poster", 2, ("q",))
    answer, delivered = await discharge_with(c, txn, 2)  # the consumer may see them before the answer
    assert answer == Accepted()
    assert all(isinstance(t.performative, Transfer) for t in delivered)
    assert [body(t.payload) for t in delivered] == ["one", "two"]
    assert all(t.performative.state is None for t in delivered)
    await c.peer.disposition(
        delivered[0].performative.delivery_id, delivered[1].performative.delivery_id, state=Accepted()
    )
    await mb.settle()
    assert (queue.depth, queue.staged, queue.acquired) == (0, 0, 0)
    assert mb.broker.txn_stats.committed == 1


async def test_transactional_post_rolled_back_is_dropped(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    c = await client(mb)
    await c.coordinator()
    await c.sender("q", 1)
    await c.receiver("q", 2)
    await c.credit(2, 10)
    txn = await c.declare()
    for text in ("a", "b"):
        await c.post(1, frames.message(text), txn=txn)
        assert isinstance((await c.peer.expect(Disposition)).state, TransactionalState)
    assert mb.queue("q").staged == 2
    assert await c.discharge(txn, fail=True) == Accepted()
    await c.peer.expect_nothing()
    queue = mb.queue("q").stats()
    assert (queue.depth, queue.staged, queue.enqueued_total) == (0, 0, 0)
    assert mb.broker.txn_stats.rolled_back == 1


async def test_committed_posts_keep_posted_order_across_queues(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    c = await client(mb)
    await c.coordinator()
    await c.sender("q1", 1)
    await c.sender("q2", 2)
    txn = await c.declare()
    posted = [(1, "q1-a"), (2, "q2-a"), (1, "q1-b"), (2, "q2-b"), (1, "q1-c")]
    for handle, text in posted:
        await c.post(handle, frames.message(text), txn=txn)
    covered = 0  # provisional outcomes may come as ranges: count the deliveries they cover
    while covered < len(posted):
        answer = (await c.peer.receive()).performative
        assert isinstance(answer, Disposition)
        assert answer.state == TransactionalState(txn_id=txn, outcome=Accepted())
        covered += (answer.first if answer.last is None else answer.last) - answer.first + 1
    assert [i.staged_addresses for i in mb.broker.transactions] == [("q1", "q2")]
    assert await c.discharge(txn) == Accepted()
    for handle, address in ((3, "q1"), (4, "q2")):
        await c.receiver(address, handle)
        await c.credit(handle, 10)
        expected = [text for _, text in posted if text.startswith(address)]
        delivered = await c.take(len(expected))
        assert [body(t.payload) for t in delivered] == expected
        ids = [t.performative.delivery_id for t in delivered]
        await c.peer.disposition(ids[0], ids[-1], state=Accepted())
    # and globally: the broker's arrival sequence follows the posting order
    assert mb.queue("q1").stats().enqueued_total == 3


async def test_transactional_anonymous_relay_post(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    c = await client(mb)
    await c.coordinator()
    await c.sender(None, 1)  # null target: the anonymous relay
    txn = await c.declare()
    await c.post(1, frames.message("relayed", to("relay-q")), txn=txn)
    assert (await c.peer.expect(Disposition)).state == TransactionalState(txn_id=txn, outcome=Accepted())
    assert not mb.queue("relay-q").exists  # created by the commit, so a rollback leaves nothing behind
    assert await c.discharge(txn) == Accepted()
    queue = mb.queue("relay-q")
    assert (queue.depth, queue.staged) == (1, 0)


@pytest.mark.parametrize("state_on", ["first", "last", "every"])
async def test_multi_frame_transactional_post(mb: MemoryBroker, autojump_clock: MockClock, state_on: str) -> None:
    c = await client(mb)
    await c.coordinator()
    await c.sender("big", 1)
    await c.receiver("big", 2)
    await c.credit(2, 1)
    txn = await c.declare()
    payload = frames.message("x" * 3000)
    chunks = [payload[i : i + 1000] for i in range(0, len(payload), 1000)]
    state = TransactionalState(txn_id=txn)
    delivery_id = c.next_id()
    for i, chunk in enumerate(chunks):
        first, last = i == 0, i == len(chunks) - 1
        carries = state_on == "every" or (state_on == "first" and first) or (state_on == "last" and last)
        await c.peer.transfer(
            1,
            delivery_id if first else None,
            chunk,
            state=state if carries else None,
            more=not last,
        )
    provisional = await c.peer.expect(Disposition)
    assert provisional.first == delivery_id
    assert provisional.state == TransactionalState(txn_id=txn, outcome=Accepted())
    await c.peer.expect_nothing()
    assert mb.queue("big").staged == 1
    answer, (delivered,) = await discharge_with(c, txn, 1)
    assert answer == Accepted()
    assert isinstance(delivered.performative, Transfer)
    assert delivered.payload == payload
    await c.peer.disposition(delivered.performative.delivery_id or 0, state=Accepted())


@pytest.mark.parametrize("settings", [BrokerSettings(auto_create=False)], ids=["no-auto-create"])
async def test_post_to_unknown_address_fails_the_commit(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    mb.broker.declare_queue("known")
    c = await client(mb)
    await c.coordinator()
    await c.sender(None, 1)
    await c.receiver("known", 2)
    await c.credit(2, 10)
    txn = await c.declare()
    await c.post(1, frames.message("fine", to("known")), txn=txn)
    assert (await c.peer.expect(Disposition)).state == TransactionalState(txn_id=txn, outcome=Accepted())
    await c.post(1, frames.message("lost", to("nowhere")), txn=txn)
    provisional = (await c.peer.expect(Disposition)).state
    assert isinstance(provisional, TransactionalState)
    assert provisional.txn_id == txn
    assert condition(provisional.outcome) == Condition.NOT_FOUND
    assert [i.failed for i in mb.broker.transactions] == [Condition.NOT_FOUND]
    answer = await c.discharge(txn)
    assert isinstance(answer, Rejected)
    assert condition(answer) == Condition.TRANSACTION_ROLLBACK
    await c.peer.expect_nothing()  # nothing was delivered
    assert not mb.queue("nowhere").exists
    assert mb.queue("known").exists
    known = mb.queue("known").stats()
    assert (known.depth, known.staged, known.enqueued_total) == (0, 0, 0)
    stats = mb.broker.txn_stats
    assert (stats.failed_commits, stats.rolled_back, stats.committed) == (1, 1, 0)
    # the transaction is over: discharging it again is an unknown id
    assert condition(await c.discharge(txn)) == Condition.UNKNOWN_TXN_ID


@pytest.mark.parametrize("settled", [False, True], ids=["unsettled", "presettled"])
async def test_unknown_txn_id_on_transfer_rejects_that_delivery(
    mb: MemoryBroker, autojump_clock: MockClock, settled: bool
) -> None:
    c = await client(mb)
    await c.sender("q", 1)
    delivery_id = await c.post(1, frames.message("orphan"), txn=b"no-such-txn", settled=settled)
    if not settled:
        answer = await c.peer.expect(Disposition)
        assert answer.first == delivery_id
        assert isinstance(answer.state, Rejected)
        assert condition(answer.state) == Condition.UNKNOWN_TXN_ID
    # the connection survives and the message went nowhere
    await c.post(1, frames.message("plain"))
    assert (await c.peer.expect(Disposition)).state == Accepted()
    assert mb.queue("q").depth == 1


# -- acquiring (§4.4.3) -----------------------------------------------------------------------------------
async def _fill(c: Client, address: str, texts: list[str], handle: int = 9) -> list[bytes]:
    """Post ``texts`` to ``address`` outside any transaction; return the payloads."""
    await c.sender(address, handle)
    payloads = [frames.message(text) for text in texts]
    for payload in payloads:
        await c.post(handle, payload)
        assert (await c.peer.expect(Disposition)).state == Accepted()
    return payloads


async def test_acquisition_committed_with_accepted_outcome(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    c = await client(mb)
    await _fill(c, "q", ["m0", "m1", "m2"])
    await c.coordinator()
    txn = await c.declare()
    await c.receiver("q", 2)
    await c.credit(2, 3, properties={TXN_ID: txn})
    delivered = await c.take(3)
    assert [t.performative.state for t in delivered] == [TransactionalState(txn_id=txn)] * 3
    queue = mb.queue("q")
    assert (queue.depth, queue.acquired) == (0, 3)
    assert mb.broker.transactions[0].acquisitions == 3
    ids = [t.performative.delivery_id for t in delivered]
    staged = TransactionalState(txn_id=txn, outcome=Accepted())
    await c.peer.disposition(ids[0], ids[1], settled=True, state=staged)
    await c.peer.disposition(ids[2], settled=False, state=staged)
    await c.peer.expect_nothing()
    assert (queue.depth, queue.acquired) == (0, 3)  # nothing applied before the commit
    # after commit the broker settles what it still held unsettled (ids[2])
    answer, (settled,) = await discharge_with(c, txn, 1)
    assert answer == Accepted()
    assert settled.performative == frames.disposition(ids[2], role=frames.SENDER, state=Accepted())
    assert (queue.depth, queue.acquired) == (0, 0)


async def test_acquisition_rolled_back_returns_messages_unchanged(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    c = await client(mb)
    await c.sender("q", 9)
    payloads = [frames.message("m0", Header(durable=True)), frames.message("m1")]
    for payload in payloads:
        await c.post(9, payload)
        await c.peer.expect(Disposition)
    await c.coordinator()
    txn = await c.declare()
    await c.receiver("q", 2)
    await c.credit(2, 2, properties={TXN_ID: txn})
    delivered = await c.take(2)
    ids = [t.performative.delivery_id for t in delivered]
    answer, settled = await discharge_with(c, txn, 1, fail=True)
    assert answer == Accepted()
    # the broker settles the acquired deliveries released, in one ranged disposition
    assert [f.performative for f in settled] == [
        frames.disposition(ids[0], ids[1], role=frames.SENDER, state=Released())
    ]
    queue = mb.queue("q")
    assert (queue.depth, queue.acquired) == (2, 0)
    # the link acquires outside the transaction now; delivery-count is unchanged (byte-identical messages)
    await c.credit(2, 2)
    again = await c.take(2)
    assert [t.payload for t in again] == payloads
    assert all(t.performative.state is None for t in again)
    assert header(again[0].payload) == Header(durable=True)
    await c.peer.disposition(again[0].performative.delivery_id, again[1].performative.delivery_id, state=Accepted())


async def test_flow_properties_start_and_end_transactional_acquisition(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    c = await client(mb)
    await _fill(c, "q", ["m0", "m1", "m2"])
    await c.coordinator()
    txn = await c.declare()
    await c.receiver("q", 2)
    await c.credit(2, 1, properties={TXN_ID: txn})
    (first,) = await c.take(1)
    await c.credit(2, 1)  # no properties: still acquiring under the transaction
    (second,) = await c.take(1)
    await c.credit(2, 1, properties={Symbol("other"): 1})  # properties without txn-id: that ends it
    (third,) = await c.take(1)
    assert first.performative.state == TransactionalState(txn_id=txn)
    assert second.performative.state == TransactionalState(txn_id=txn)
    assert third.performative.state is None
    assert mb.broker.transactions[0].acquisitions == 2
    staged = TransactionalState(txn_id=txn, outcome=Accepted())
    await c.peer.disposition(first.performative.delivery_id, second.performative.delivery_id, state=staged)
    await c.peer.disposition(third.performative.delivery_id, state=Accepted())
    assert await c.discharge(txn) == Accepted()
    assert mb.queue("q").depth == 0


@pytest.mark.parametrize("fail", [False, True], ids=["commit", "rollback"])
async def test_plain_outcome_on_a_transactionally_acquired_delivery_is_staged(
    mb: MemoryBroker, autojump_clock: MockClock, fail: bool
) -> None:
    c = await client(mb)
    await _fill(c, "q", ["m0"])
    await c.coordinator()
    txn = await c.declare()
    await c.receiver("q", 2)
    await c.credit(2, 1, properties={TXN_ID: txn})
    (delivered,) = await c.take(1)
    await c.peer.disposition(delivered.performative.delivery_id, state=Accepted())
    await c.peer.expect_nothing()
    queue = mb.queue("q")
    assert (queue.depth, queue.acquired) == (0, 1)  # the transaction decides
    assert mb.broker.transactions[0].retirements == 1
    assert await c.discharge(txn, fail=fail) == Accepted()
    assert (queue.depth, queue.acquired) == ((1, 0) if fail else (0, 0))


@pytest.mark.parametrize("fail", [False, True], ids=["commit", "rollback"])
async def test_presettled_transactional_acquisition(mb: MemoryBroker, autojump_clock: MockClock, fail: bool) -> None:
    """A consumer asking for settled deliveries: commit consumes them, rollback puts them back."""
    c = await client(mb)
    await _fill(c, "q", ["m0", "m1"])
    await c.coordinator()
    txn = await c.declare()
    await c.receiver("q", 2, snd_settle_mode=1)
    await c.credit(2, 2, properties={TXN_ID: txn})
    delivered = await c.take(2)
    assert all(t.performative.settled for t in delivered)
    assert all(t.performative.state == TransactionalState(txn_id=txn) for t in delivered)
    queue = mb.queue("q")
    assert (queue.depth, queue.acquired) == (0, 2)
    assert await c.discharge(txn, fail=fail) == Accepted()  # no disposition for settled deliveries
    assert (queue.depth, queue.acquired) == ((2, 0) if fail else (0, 0))


async def test_acquisition_committed_without_outcome_stays_acquired(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    c = await client(mb)
    await _fill(c, "q", ["m0"])
    await c.coordinator()
    txn = await c.declare()
    await c.receiver("q", 2)
    await c.credit(2, 1, properties={TXN_ID: txn})
    (delivered,) = await c.take(1)
    assert await c.discharge(txn) == Accepted()
    queue = mb.queue("q")
    assert (queue.depth, queue.acquired) == (0, 1)  # an ordinary unsettled delivery now
    await c.peer.disposition(delivered.performative.delivery_id, state=Accepted())
    await mb.settle()
    assert (queue.depth, queue.acquired) == (0, 0)


@pytest.mark.parametrize("fail", [False, True], ids=["commit", "rollback"])
@pytest.mark.parametrize("use", ["acquired", "retired"])
async def test_consumer_detached_while_its_delivery_is_in_a_transaction(
    mb: MemoryBroker, autojump_clock: MockClock, use: str, fail: bool
) -> None:
    """The link's default outcome does not apply while a transaction holds the delivery: discharge decides."""
    c = await client(mb)
    await _fill(c, "q", ["m0"])
    await c.coordinator()
    txn = await c.declare()
    await c.receiver("q", 2)
    if use == "acquired":
        await c.credit(2, 1, properties={TXN_ID: txn})
        await c.take(1)
    else:
        await c.credit(2, 1)
        (delivered,) = await c.take(1)
        staged = TransactionalState(txn_id=txn, outcome=Accepted())
        await c.peer.disposition(delivered.performative.delivery_id, settled=False, state=staged)
    await c.peer.send(Detach(handle=UInt(2), closed=True))
    assert (await c.peer.expect(Detach)).handle == c.handles[2]
    queue = mb.queue("q")
    assert (queue.depth, queue.acquired) == (0, 1)
    assert await c.discharge(txn, fail=fail) == Accepted()
    # a committed accept removes it; otherwise the source's default outcome (released) puts it back
    consumed = use == "retired" and not fail
    assert (queue.depth, queue.acquired) == ((0, 0) if consumed else (1, 0))


# -- retiring (§4.4.2) ------------------------------------------------------------------------------------
@pytest.mark.parametrize("settled", [True, False], ids=["settled", "unsettled"])
async def test_retirement_rolled_back(mb: MemoryBroker, autojump_clock: MockClock, settled: bool) -> None:
    c = await client(mb)
    await _fill(c, "q", ["m0"])
    await c.coordinator()
    await c.receiver("q", 2)
    await c.credit(2, 1)
    (delivered,) = await c.take(1)
    delivery_id = delivered.performative.delivery_id
    txn = await c.declare()
    await c.peer.disposition(delivery_id, settled=settled, state=TransactionalState(txn_id=txn, outcome=Accepted()))
    await c.peer.expect_nothing()
    assert mb.broker.transactions[0].retirements == 1
    queue = mb.queue("q")
    assert (queue.depth, queue.acquired) == (0, 1)
    assert await c.discharge(txn, fail=True) == Accepted()
    await c.peer.expect_nothing()  # no credit left, and nothing to settle
    if settled:
        # the client forgot the delivery: the source's default outcome (released) puts it back
        assert (queue.depth, queue.acquired) == (1, 0)
    else:
        # back to the state it had: still acquired by the link, and the client may settle it again
        assert (queue.depth, queue.acquired) == (0, 1)
        await c.peer.disposition(delivery_id, state=Accepted())
        await mb.settle()
        assert (queue.depth, queue.acquired) == (0, 0)


async def test_retirement_with_released_and_modified_committed(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    c = await client(mb)
    payloads = await _fill(c, "q", ["m0", "m1"])
    await c.coordinator()
    await c.receiver("q", 2)
    await c.credit(2, 2)
    delivered = await c.take(2)
    ids = [t.performative.delivery_id for t in delivered]
    txn = await c.declare()
    modified = Modified(delivery_failed=True)
    await c.peer.disposition(ids[0], settled=True, state=TransactionalState(txn_id=txn, outcome=Released()))
    await c.peer.disposition(ids[1], settled=False, state=TransactionalState(txn_id=txn, outcome=modified))
    answer, (settled,) = await discharge_with(c, txn, 1)
    assert answer == Accepted()
    assert settled.performative == frames.disposition(ids[1], role=frames.SENDER, state=modified)
    queue = mb.queue("q")
    assert (queue.depth, queue.acquired) == (2, 0)
    await c.credit(2, 2)
    again = await c.take(2)
    assert again[0].payload == payloads[0]  # released: delivery-count unchanged
    assert body(again[1].payload) == "m1"
    modified_header = header(again[1].payload)
    assert modified_header is not None
    assert modified_header.delivery_count == 1
    await c.peer.disposition(again[0].performative.delivery_id, again[1].performative.delivery_id, state=Accepted())


@pytest.mark.parametrize("settled", [True, False], ids=["settled", "unsettled"])
async def test_unknown_txn_id_on_disposition_returns_the_message(
    mb: MemoryBroker, autojump_clock: MockClock, settled: bool
) -> None:
    c = await client(mb)
    await _fill(c, "q", ["m0"])
    await c.receiver("q", 2)
    await c.credit(2, 1)
    (delivered,) = await c.take(1)
    delivery_id = delivered.performative.delivery_id
    staged = TransactionalState(txn_id=b"no-such-txn", outcome=Accepted())
    await c.peer.disposition(delivery_id, settled=settled, state=staged)
    if settled:
        await c.peer.expect_nothing()
    else:
        # the outcome names no transaction, so it cannot apply: the message goes back, and the broker says so
        answer = await c.peer.expect(Disposition)
        assert (answer.role, answer.first, answer.settled) == (frames.SENDER, delivery_id, True)
        assert answer.state == Released()
    queue = mb.queue("q")
    assert (queue.depth, queue.acquired) == (1, 0)


# -- one delivery, two transactions; controllers that go away -------------------------------------------
async def test_delivery_acquired_under_one_transaction_whose_outcome_names_another_rolls_back_both(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    """§4.4.2: "the delivery MUST NOT be associated with a different non discharged transaction than the outcome.
    If this happens then the control link MUST be terminated with the transaction-rollback error"."""
    c = await client(mb)
    await _fill(c, "q", ["m0"])
    await c.coordinator(handle=0)
    await c.coordinator(handle=1)
    await c.sender("other", 3)
    txn_a = await c.declare(handle=0)
    txn_b = await c.declare(handle=1)
    await c.post(3, frames.message("staged under B"), txn=txn_b)
    await c.peer.expect(Disposition)
    await c.receiver("q", 2)
    await c.credit(2, 1, properties={TXN_ID: txn_a})
    (delivered,) = await c.take(1)
    delivery_id = delivered.performative.delivery_id
    await c.peer.disposition(delivery_id, settled=False, state=TransactionalState(txn_id=txn_b, outcome=Accepted()))
    got = await collect(c.peer, 3)  # an acquisition rolled back is also settled released
    detaches = [p for p in got if isinstance(p, Detach)]
    assert len(detaches) == 2
    assert {d.handle for d in detaches} == {c.handles[0], c.handles[1]}
    assert all(condition(d) == Condition.TRANSACTION_ROLLBACK for d in detaches)
    assert mb.broker.transactions == []
    assert mb.broker.txn_stats.rolled_back == 2
    assert mb.queue("other").staged == 0
    (released,) = [p for p in got if isinstance(p, Disposition)]
    assert (released.first, released.state) == (delivery_id, Released())
    queue = mb.queue("q")
    assert (queue.depth, queue.acquired) == (1, 0)
    for handle in (0, 1):
        await c.peer.send(Detach(handle=UInt(handle), closed=True))


async def test_outcome_staged_again_under_another_transaction_moves_there(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    """A delivery acquired outside any transaction is associated with none (§4.4.2: it "need not be associated
    with the same transaction as the outcome, or indeed with any transaction at all"): its outcome, staged under
    A and then under B, is B's; no controller is detached."""
    c = await client(mb)
    await _fill(c, "q", ["m0"])
    await c.coordinator(handle=0)
    await c.coordinator(handle=1)
    txn_a = await c.declare(handle=0)
    txn_b = await c.declare(handle=1)
    await c.receiver("q", 2)
    await c.credit(2, 1)
    (delivered,) = await c.take(1)
    delivery_id = delivered.performative.delivery_id
    await c.peer.disposition(delivery_id, settled=False, state=TransactionalState(txn_id=txn_a, outcome=Accepted()))
    await c.peer.disposition(delivery_id, settled=False, state=TransactionalState(txn_id=txn_b, outcome=Released()))
    await c.peer.expect_nothing()
    assert [(i.txn_id, i.retirements) for i in mb.broker.transactions] == [(txn_a, 0), (txn_b, 1)]
    assert await c.discharge(txn_a, handle=0) == Accepted()
    queue = mb.queue("q")
    assert (queue.depth, queue.acquired) == (0, 1)  # A holds nothing of it any more
    answer, others = await discharge_with(c, txn_b, 1, handle=1)
    assert answer == Accepted()
    assert [f.performative.state for f in others] == [Released()]  # B applies its outcome and settles it
    assert (queue.depth, queue.acquired) == (1, 0)


async def test_coordinator_detach_rolls_back_its_transactions(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    c = await client(mb)
    await _fill(c, "q", ["m0"])
    await c.coordinator(handle=0)
    await c.coordinator(handle=1)  # a second controller whose transaction must survive
    await c.sender("posts", 3)
    await c.receiver("q", 2)
    await c.credit(2, 1)
    (delivered,) = await c.take(1)
    delivery_id = delivered.performative.delivery_id
    txn_post = await c.declare()
    txn_retire = await c.declare()
    survivor = await c.declare(handle=1)
    await c.post(3, frames.message("staged"), txn=txn_post)
    await c.peer.expect(Disposition)
    staged = TransactionalState(txn_id=txn_retire, outcome=Accepted())
    await c.peer.disposition(delivery_id, settled=False, state=staged)
    await c.peer.send(Detach(handle=UInt(0), closed=True))
    assert (await c.peer.expect(Detach)).handle == c.handles[0]
    await mb.settle()
    assert [i.txn_id for i in mb.broker.transactions] == [survivor]
    assert mb.broker.txn_stats.rolled_back == 2
    assert mb.queue("posts").staged == 0
    assert mb.queue("q").acquired == 1  # the unsettled retirement is back to plain acquired
    await c.peer.disposition(delivery_id, state=Accepted())
    assert await c.discharge(survivor, handle=1) == Accepted()
    assert mb.queue("q").depth == 0


async def test_session_end_rolls_back_the_transactions_of_its_controller(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    c = await client(mb)
    await c.sender("q", 1)
    await c.peer.begin(channel=1)
    await c.coordinator(channel=1)
    txn = await c.declare(channel=1)
    await c.post(1, frames.message("staged"), txn=txn)  # posted on session 0
    await c.peer.expect(Disposition)
    await c.peer.send(End(), channel=1)
    await c.peer.expect(End)
    await mb.settle()
    assert mb.broker.transactions == []
    assert mb.queue("q").staged == 0
    assert mb.broker.txn_stats.rolled_back == 1


async def test_failed_transaction_can_still_be_rolled_back(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    c = await client(mb)
    await c.coordinator()
    await c.sender(None, 1)
    txn = await c.declare()
    await c.post(1, frames.message("unroutable"), txn=txn)
    assert isinstance((await c.peer.expect(Disposition)).state.outcome, Rejected)
    assert await c.discharge(txn, fail=True) == Accepted()  # rolled back as asked: no error
    assert mb.broker.txn_stats.failed_commits == 0


async def test_connection_drop_rolls_back_its_transactions(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    c = await client(mb)
    await _fill(c, "q", ["m0", "m1"])
    await c.coordinator()
    await c.sender("posts", 3)
    txn = await c.declare()
    await c.post(3, frames.message("staged"), txn=txn)
    await c.peer.expect(Disposition)
    await c.receiver("q", 2)
    await c.credit(2, 2, properties={TXN_ID: txn})
    await c.take(2)
    assert mb.queue("q").acquired == 2
    await c.peer.aclose()
    await mb.settle()
    assert mb.broker.transactions == []
    assert mb.broker.txn_stats.rolled_back == 1
    assert mb.queue("posts").staged == 0
    assert (mb.queue("q").depth, mb.queue("q").acquired) == (2, 0)


async def test_txn_id_of_another_connection_is_unknown(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    owner = await client(mb, "owner")
    await owner.coordinator()
    txn = await owner.declare()
    other = await client(mb, "other")
    await other.coordinator()
    await other.sender("q", 1)
    assert condition(await other.discharge(txn)) == Condition.UNKNOWN_TXN_ID
    await other.post(1, frames.message("intruder"), txn=txn)
    answer = (await other.peer.expect(Disposition)).state
    assert isinstance(answer, Rejected)
    assert condition(answer) == Condition.UNKNOWN_TXN_ID
    (info,) = mb.broker.transactions
    assert (info.txn_id, info.connection, info.posts) == (txn, "owner", 0)
    assert await owner.discharge(txn) == Accepted()
    assert mb.queue("q").depth == 0


async def test_txn_id_works_from_every_session_of_its_connection(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    c = await client(mb)
    await c.coordinator()
    txn = await c.declare()
    await c.peer.begin(channel=1)
    await c.peer.attach_sender("q", 0, channel=1)
    await c.peer.expect(Flow)
    await c.peer.transfer(
        0, c.next_id(1), frames.message("other session"), state=TransactionalState(txn_id=txn), channel=1
    )
    assert (await c.peer.expect(Disposition)).state == TransactionalState(txn_id=txn, outcome=Accepted())
    # and a controller on the other session may discharge it
    await c.coordinator(handle=1, channel=1)
    assert await c.discharge(txn, handle=1, channel=1) == Accepted()
    assert mb.queue("q").depth == 1


# -- transaction time-out (MockClock: no real waiting) ----------------------------------------------------
@pytest.mark.parametrize("settings", [BrokerSettings(transaction_timeout=10)], ids=["timeout-10s"])
async def test_transaction_timeout_rolls_back(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    started = time.monotonic()
    c = await client(mb)
    await c.coordinator()
    await c.sender("q", 1)
    old = await c.declare()
    await c.post(1, frames.message("too late"), txn=old)
    await c.peer.expect(Disposition)
    await trio.sleep(5)
    young = await c.declare()
    assert [round(i.age) for i in mb.broker.transactions_at(trio.current_time())] == [5, 0]
    await trio.sleep(6)  # the old one is 11 s old now, the young one 6 s
    assert [i.txn_id for i in mb.broker.transactions] == [young]
    assert mb.queue("q").staged == 0
    stats = mb.broker.txn_stats
    assert (stats.timed_out, stats.rolled_back) == (1, 1)
    assert condition(await c.discharge(old)) == Condition.TRANSACTION_TIMEOUT
    assert condition(await c.discharge(old)) == Condition.UNKNOWN_TXN_ID  # reported once; then it is unknown
    assert await c.discharge(young) == Accepted()
    assert mb.queue("q").depth == 0
    assert trio.current_time() >= 11
    assert time.monotonic() - started < 2  # virtual time only


@pytest.mark.parametrize("settings", [BrokerSettings(transaction_timeout=10)], ids=["timeout-10s"])
async def test_work_on_a_timed_out_transaction_still_leaves_its_discharge_a_timeout(
    mb: MemoryBroker, autojump_clock: MockClock
) -> None:
    """A client unaware of the time-out keeps posting, then commits: the commit must say timeout."""
    c = await client(mb)
    await c.coordinator()
    await c.sender("q", 1)
    txn = await c.declare()
    await trio.sleep(11)
    await c.post(1, frames.message("after the time-out"), txn=txn)
    answer = (await c.peer.expect(Disposition)).state
    assert isinstance(answer, Rejected)
    assert condition(answer) == Condition.TRANSACTION_TIMEOUT
    assert condition(await c.discharge(["not", "binary"])) == Condition.UNKNOWN_TXN_ID
    assert condition(await c.discharge(txn)) == Condition.TRANSACTION_TIMEOUT
    assert mb.queue("q").depth == 0


@pytest.mark.parametrize("settings", [BrokerSettings(transaction_timeout=0)], ids=["no-timeout"])
async def test_transaction_timeout_zero_means_none(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    c = await client(mb)
    await c.coordinator()
    txn = await c.declare()
    assert mb.broker.next_deadline() is None
    await trio.sleep(86_400)  # a day, in virtual time
    assert [i.txn_id for i in mb.broker.transactions] == [txn]
    assert await c.discharge(txn) == Accepted()
    assert mb.broker.txn_stats.timed_out == 0


@pytest.mark.parametrize("settings", [BrokerSettings(transaction_timeout=10)], ids=["timeout-10s"])
async def test_timed_out_acquisition_and_retirement_go_back(mb: MemoryBroker, autojump_clock: MockClock) -> None:
    c = await client(mb)
    await _fill(c, "q", ["m0", "m1"])
    await c.coordinator()
    txn = await c.declare()
    await c.receiver("q", 2)
    await c.credit(2, 1, properties={TXN_ID: txn})
    (acquired,) = await c.take(1)
    await c.credit(2, 1, properties={Symbol("other"): 1})
    (plain,) = await c.take(1)
    await c.peer.disposition(
        plain.performative.delivery_id, settled=True, state=TransactionalState(txn_id=txn, outcome=Accepted())
    )
    await trio.sleep(11)
    released = await c.peer.expect(Disposition)  # the broker settles the acquired delivery released
    assert (released.first, released.role, released.state) == (acquired.performative.delivery_id, False, Released())
    assert mb.broker.txn_stats.timed_out == 1
    queue = mb.queue("q")
    assert (queue.depth, queue.acquired) == (2, 0)
    assert condition(await c.discharge(txn)) == Condition.TRANSACTION_TIMEOUT


# -- the same rules over TCP, against the real server (ScriptedPeer, broker in a thread) -----------------
def _scripted_controller(peer: ScriptedPeer, container_id: str) -> None:
    peer.open(container_id=container_id)
    peer.begin()
    peer.attach_sender(None, COORD, name="controller", source=Source(), target=Coordinator())
    assert peer.expect(Flow).link_credit


def test_over_tcp_a_txn_id_is_unknown_to_another_connection(broker: ThreadedBroker) -> None:
    with (
        ScriptedPeer.connect("127.0.0.1", broker.port) as owner,
        ScriptedPeer.connect("127.0.0.1", broker.port) as other,
    ):
        _scripted_controller(owner, "owner")
        _scripted_controller(other, "other")
        owner.transfer(COORD, 0, frames.message(AmqpValue(Declare())))
        declared = owner.expect(Disposition).state
        assert isinstance(declared, Declared)
        txn = declared.txn_id
        assert isinstance(txn, bytes)
        assert 0 < len(txn) <= MAX_TXN_ID
        other.transfer(COORD, 0, frames.message(AmqpValue(Discharge(txn_id=txn))))
        refused = other.expect(Disposition).state
        assert isinstance(refused, Rejected)
        assert condition(refused) == Condition.UNKNOWN_TXN_ID
        assert [i.txn_id for i in broker.call(lambda running: running.broker.transactions)] == [txn]
        owner.transfer(COORD, 1, frames.message(AmqpValue(Discharge(txn_id=txn))))
        assert owner.expect(Disposition).state == Accepted()
        assert broker.call(lambda running: running.broker.transactions) == []
