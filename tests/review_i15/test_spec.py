"""Review of issue 15: specification clauses under each personality: §4.3 (how a declare or discharge error
travels), §4.4.3 (refused transactional acquisition), §2.6.3 (the shape of a refused attach) for every refusal a
personality adds, §2.8.3 (rcv-settle-mode: what we answer is what we do), and strict's Proton declare rule when a
settled transfer and a declare come in one read."""

from __future__ import annotations

from typing import Any

import pytest

from minibroker.amqp.definitions import (
    Accepted,
    AmqpValue,
    Attach,
    Coordinator,
    Declare,
    Declared,
    Detach,
    Disposition,
    Rejected,
    Source,
    TransactionalState,
)
from minibroker.amqp.framing import encode_frame
from minibroker.amqp.types import Symbol, UInt
from minibroker.broker.policy import NodePolicy
from minibroker.testing import frames
from tests.broker.txn_driver import ACCEPTED_LIST, REJECTED_LIST, TXN_ID, BrokerView, Observed, Peer, census, payload
from tests.personalities.harness import answer, declare, peer, seed, world

UNKNOWN = b"\x07" * 4


def controller(p: Peer, outcomes: list[Symbol] | None) -> None:
    """Attach coordinator link "ctl" whose source lists ``outcomes`` (None: no outcomes field)."""
    target = Coordinator(capabilities=[Symbol("amqp:local-transactions")])
    p.send(frames.attach_sender(None, p.new_handle("ctl"), "ctl", target=target, source=Source(outcomes=outcomes)))


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("minibroker", {"accepted-only": "detach", "with-rejected": "rejected", "none": "rejected"}),
        ("broker-j", {"accepted-only": "detach", "with-rejected": "rejected", "none": "detach"}),
        ("strict", {"accepted-only": "detach", "with-rejected": "rejected", "none": "refused"}),
        ("proton", {"accepted-only": "rejected", "with-rejected": "rejected", "none": "rejected"}),
        ("artemis", {"accepted-only": "rejected", "with-rejected": "rejected", "none": "rejected"}),
        ("activemq", {"accepted-only": "rejected", "with-rejected": "rejected", "none": "rejected"}),
    ],
)
def test_error_transport_follows_the_errors_mode(name: str, expected: dict[str, str]) -> None:
    """§4.3: a discharge of an unknown id is answered ``rejected`` or by detaching the coordinator link, as the
    personality's ``errors`` mode reads the controller's source outcomes (strict refuses a source listing none).
    Artemis (ProtonTransactionHandler.txError) and ActiveMQ (AmqpTransactionCoordinator.processDelivery) send a
    ``Rejected`` disposition whatever the source lists, as Proton's example broker does."""
    seen: dict[str, str] = {}
    for case, outcomes in [
        ("accepted-only", [ACCEPTED_LIST]),
        ("with-rejected", [ACCEPTED_LIST, REJECTED_LIST]),
        ("none", None),
    ]:
        w = world(name)
        p = peer(w)
        controller(p, outcomes)
        attached = w.settle()[p]
        if attached.detached:
            assert attached.attached["ctl"].target is None
            seen[case] = "refused"
            continue
        delivery = p.discharge("ctl", UNKNOWN, fail=False)
        obs = w.settle()[p]
        if delivery in obs.answers:
            state, settled = obs.answers[delivery]
            assert isinstance(state, Rejected)
            assert settled
            seen[case] = "rejected"
        else:
            assert [link for link, _ in obs.detached] == ["ctl"]
            seen[case] = "detach"
        assert w.broker.internal_errors == 0
    assert seen == expected


def test_servicebus_refused_acquisition_detaches_closed_and_keeps_the_message() -> None:
    """§4.4.3: "If the link endpoint does not support transactional acquisition, the link MUST be terminated with a
    not-implemented error": servicebus detaches (closed) with amqp:not-implemented; the message the link held
    unsettled goes back to the queue once."""
    w = world("servicebus")
    p = peer(w)
    txn = declare(w, p)
    seed(w, p, "q", "m1", "m2")
    p.attach_consumer("c", "q", presettled=False, default_outcome=None)
    p.flow("c", 1)
    (first,) = w.settle()[p].started
    p.flow("c", 1, properties={TXN_ID: txn})
    obs = w.settle()[p]
    detaches = [perf for perf in obs.performatives if isinstance(perf, Detach)]
    assert len(detaches) == 1
    assert detaches[0].closed is True
    assert detaches[0].error is not None
    assert detaches[0].error.condition == Symbol("amqp:not-implemented")
    assert sorted(n for n, _ in census(BrokerView(w))["q"].ready) == ["m1", "m2"]
    assert first.name == "m1"
    assert w.broker.internal_errors == 0


def refusals() -> list[tuple[str, str, Any]]:
    """(personality, what, a function of a peer that sends the refused attach, returning the link's name)."""

    def coordinator(p: Peer) -> str:
        p.attach_controller("ctl")
        return "ctl"

    def second(p: Peer) -> str:
        p.send(frames.attach_sender("/queues/q", p.new_handle("s"), "s", rcv_settle_mode=UInt(1)))
        return "s"

    def second_consumer(p: Peer) -> str:
        p.send(frames.attach_receiver("/queues/q", p.new_handle("c2"), "c2", rcv_settle_mode=UInt(1)))
        return "c2"

    def bad_address(p: Peer) -> str:
        p.attach_producer("b", "q")
        return "b"

    def missing(p: Peer) -> str:
        p.attach_consumer("m", "/queues/none", presettled=False, default_outcome=None)
        return "m"

    def unknown_exchange(p: Peer) -> str:
        p.attach_producer("x", "/exchanges/mine/k")
        return "x"

    def no_outcomes(p: Peer) -> str:
        controller(p, None)
        return "ctl"

    def string_key(p: Peer) -> str:
        attach = frames.attach_sender("q", p.new_handle("k"), "k", properties={"x-key": 1})
        data = encode_frame(0, attach)
        symbol = b"\xa3\x05x-key"
        p.send_encoded(data.replace(symbol, b"\xa1\x05x-key"), attach)
        return "k"

    return [
        ("rabbitmq", "coordinator", coordinator),
        ("rabbitmq", "rcv-second producer", second),
        ("rabbitmq", "rcv-second consumer", second_consumer),
        ("rabbitmq", "bad address", bad_address),
        ("rabbitmq", "missing queue", missing),
        ("rabbitmq", "unknown exchange", unknown_exchange),
        ("strict", "coordinator without outcomes", no_outcomes),
        ("strict", "attach properties with a string key", string_key),
    ]


@pytest.mark.parametrize(("name", "what", "steps"), refusals(), ids=[f"{n}-{w}" for n, w, _ in refusals()])
def test_every_refusal_a_personality_adds_has_the_2_6_3_shape(name: str, what: str, steps: Any) -> None:
    """§2.6.3: a refused attach is answered with an attach whose terminus on our side is null, then a detach with
    closed=true and the error; nothing else is sent on the link."""
    w = world(name)
    w.broker.declare_queue("q")
    p = peer(w)
    link = steps(p)
    obs: Observed = w.settle()[p]
    mine = [perf for perf in obs.performatives if isinstance(perf, Attach | Detach)]
    assert len(mine) == 2, (what, mine)
    reply, detach = mine
    assert isinstance(reply, Attach)
    assert reply.name == link
    ours = reply.source if reply.role is False else reply.target  # role sender: we send, the source is ours
    assert ours is None, (what, reply)
    assert isinstance(detach, Detach)
    assert detach.closed is True
    assert detach.error is not None
    assert w.broker.internal_errors == 0


def post_answers(name: str, asked: int, settings: dict[str, Any] | None = None) -> tuple[int, list[Disposition]]:
    """A producer asking rcv-settle-mode ``asked`` posts plainly, in a transaction, into a full queue in a
    transaction, and plainly into the full queue: the mode the broker answered and its dispositions of our posts."""
    w = world(name, queues={"full": NodePolicy(max_messages=0)}, **(settings or {}))
    p = peer(w)
    txn = declare(w, p)
    p.send(frames.attach_sender("q", p.new_handle("p"), "p", rcv_settle_mode=UInt(asked)))
    p.send(frames.attach_sender("full", p.new_handle("f"), "f", rcv_settle_mode=UInt(asked)))
    mode = w.settle()[p].attached["p"].rcv_settle_mode
    dispositions: list[Disposition] = []
    for link, state in [("p", None), ("p", TransactionalState(txn_id=txn)), ("f", TransactionalState(txn_id=txn))]:
        p.transfer(link, payload("m"), state=state)
        obs = w.settle()[p]
        dispositions += [d for d in obs.performatives if isinstance(d, Disposition) and d.role is True]
    assert w.broker.internal_errors == 0
    return int(mode or 0), dispositions


@pytest.mark.parametrize("name", ["artemis", "rabbitmq-settled", "minibroker", "servicebus", "activemq", "proton"])
def test_a_link_answered_first_never_gets_an_unsettled_disposition(name: str) -> None:
    """§2.8.3: with rcv-settle-mode first we settle as we answer. Every link the broker answered ``first`` (artemis
    answers first to a producer asking second) gets only settled dispositions; a link answered ``second`` gets its
    outcomes unsettled, except under servicebus, which answers second and settles at once (its quirk: the Azure SDK
    waits for settled dispositions); that departs from §2.8.3, which a client in mode second may treat as the
    receiver settling before it did."""
    if name == "rabbitmq-settled":
        return  # (rabbitmq refuses second unless the producer sends settled: nothing of ours to settle)
    mode, dispositions = post_answers(name, asked=1)
    assert dispositions, name
    if mode == 0:
        assert all(d.settled for d in dispositions), (name, dispositions)
    elif name == "servicebus":
        assert all(d.settled for d in dispositions), dispositions
    else:
        assert not any(d.settled for d in dispositions), (name, dispositions)
    expected_mode = {"artemis": 0}.get(name, 1)
    assert mode == expected_mode


@pytest.mark.parametrize("settled", [True, False])
def test_strict_declare_after_a_transfer_in_one_read(settled: bool) -> None:
    """strict refuses a declare while the controller's session has unsettled transfers of its own (Proton's rule):
    a pre-settled transfer sent in the same read as the declare is not one, so that declare is answered declared;
    an unsettled one makes it illegal-state."""
    w = world("strict")
    p = peer(w)
    p.attach_producer("p", "q")
    p.attach_controller("ctl")
    w.settle()
    transfer = p.client.next_delivery_id()
    p.send_together(
        (frames.transfer(p.handle("p"), transfer, settled=settled), payload("m")),
        (frames.transfer(p.handle("ctl"), transfer + 1), frames.message(AmqpValue(Declare()))),
    )
    state, _ = w.settle()[p].answers[transfer + 1]
    if settled:
        assert isinstance(state, Declared), state
    else:
        assert isinstance(state, Rejected), state
        assert state.error is not None
        assert state.error.condition == Symbol("amqp:illegal-state")
    assert w.broker.internal_errors == 0


def test_strict_presettled_multi_frame_transfer_in_progress_then_declare() -> None:
    """strict: a pre-settled transfer whose last frame has not come yet, then a declare: the partial delivery is
    settled by its sender, so it is no unsettled transfer; the declare is declared, and the transfer completes."""
    w = world("strict")
    p = peer(w)
    p.attach_producer("p", "q")
    p.attach_controller("ctl")
    w.settle()
    data = payload("big", big=True)
    p.begin_transfer("p", data[:200], settled=True)
    delivery = p.declare("ctl")
    state, _ = w.settle()[p].answers[delivery]
    assert isinstance(state, Declared), state
    p.end_transfer("p", data[200:])
    w.settle()
    assert [n for n, _ in census(BrokerView(w))["q"].ready] == ["big"]
    assert w.broker.internal_errors == 0


def test_servicebus_53_octet_ids_work_end_to_end() -> None:
    """servicebus's 53-octet ASCII txn-ids (longer than §4.5.4's 32) travel in posts, retirements and the discharge,
    show in ``broker.transactions``, and commit."""
    w = world("servicebus")
    p = peer(w)
    txn = declare(w, p)
    assert len(txn) == 53
    assert txn.isascii()
    seed(w, p, "q", "old")
    p.attach_producer("in", "q")
    p.attach_consumer("c", "q", presettled=False, default_outcome=None)
    p.flow("c", 1)
    (d,) = w.settle()[p].started
    assert answer(w, p, p.transfer("in", payload("new"), state=TransactionalState(txn_id=txn)))[0] == Accepted()
    p.dispose(d.delivery_id, TransactionalState(txn_id=txn, outcome=Accepted()), settled=True)
    w.settle()
    assert [t.txn_id for t in w.broker.transactions] == [txn]
    assert answer(w, p, p.discharge("ctl", txn, fail=False))[0] == Accepted()
    assert [n for n, _ in census(BrokerView(w))["q"].ready] == ["new"]
    assert w.broker.internal_errors == 0


@pytest.mark.parametrize("name", ["activemq", "artemis"])
def test_answered_retirement_waits_for_a_delivery_the_window_holds_back(name: str) -> None:
    """activemq and artemis answer a transactional accept at once with an unsettled transactional-state. A consumer
    may accept a delivery from its first frame while the session window holds its last frames back; the broker
    must not send a disposition for a delivery the peer has not completely received (the test peer's violation
    check). The commit still consumes the message once the rest has arrived."""
    w = world(name)
    p = w.connect("c", window=1, max_frame_size=512)
    w.settle()
    txn = declare(w, p)
    p.attach_producer("in", "q")
    w.settle()
    p.transfer("in", payload("big", big=True))
    w.settle()
    p.attach_consumer("c", "q", presettled=False, default_outcome=None)
    p.flow("c", 1)
    (started,) = w.settle()[p].started
    assert p.receiving
    p.dispose(started.delivery_id, TransactionalState(txn_id=txn, outcome=Accepted()), settled=False)
    assert w.settle()[p].violations == []
    p.open_window(10)
    obs = w.settle()[p]
    assert [c.name for c in obs.completed] == ["big"]
    assert obs.violations == []
    assert answer(w, p, p.discharge("ctl", txn, fail=False))[0] == Accepted()
    q = census(BrokerView(w))["q"]
    assert (q.ready, q.acquired) == ((), 0)
    assert w.broker.internal_errors == 0


def test_servicebus_client_settling_after_our_settled_answer_is_harmless() -> None:
    """servicebus settles its answers on a producer that asked second; a client following §2.8.3 then settles
    those deliveries itself: the broker ignores that (no error, no close), and the transactional post commits."""
    w = world("servicebus")
    p = peer(w)
    txn = declare(w, p)
    p.send(frames.attach_sender("q", p.new_handle("p"), "p", rcv_settle_mode=UInt(1)))
    w.settle()
    d1 = p.transfer("p", payload("m1"))
    d2 = p.transfer("p", payload("m2"), state=TransactionalState(txn_id=txn))
    assert {d: a[1] for d, a in w.settle()[p].answers.items()} == {d1: True, d2: True}
    p.send(frames.disposition(d1, d2, role=False, settled=True))
    obs = w.settle()[p]
    assert not obs.closed
    assert obs.detached == []
    assert answer(w, p, p.discharge("ctl", txn, fail=False))[0] == Accepted()
    assert [n for n, _ in census(BrokerView(w))["q"].ready] == ["m1", "m2"]
    assert w.broker.internal_errors == 0
