"""In-doubt transactions with check-back (issue 16 §4; ``minibroker/broker/checkback.py``) on the pure core.

Every test drives the real broker core and engine through ``txn_driver``'s in-memory peers, on a clock that moves
only when told (``World.advance`` runs the broker's timers at the broker's ``now``), and reads the broker through
its public handles (``BrokerView``). Each resolution path is here: (a) the same container-id discharges, (b) the
embedder resolves, (c) check-back answered commit, rollback, or unknown until abandoned; and the outcome query.
"""

from __future__ import annotations

from typing import Any

import pytest

from minibroker.amqp import codec
from minibroker.amqp.definitions import (
    Accepted,
    ApplicationProperties,
    Declared,
    Properties,
    Rejected,
    TransactionalState,
)
from minibroker.amqp.errors import Condition
from minibroker.amqp.types import Symbol
from minibroker.broker import checkback
from minibroker.broker.checkback import CHECK_ADDRESS, CHECK_BACK, CheckBackSettings
from minibroker.broker.core import Broker
from minibroker.broker.personality import STRICT, Personality
from minibroker.broker.settings import BrokerSettings
from minibroker.testing import frames
from tests.broker.txn_driver import BrokerView, Peer, World, census, payload

PRODUCER = "orders-app"


def make_world(personality: Personality | None = None, **check: Any) -> World:
    settings = BrokerSettings(check_back=CheckBackSettings(**check))
    if personality is not None:
        settings = BrokerSettings(personality=personality, check_back=settings.check_back)
    return World(Broker(settings))


def producer(world: World, container: str = PRODUCER, *, capability: bool = True) -> Peer:
    """A connection with a coordinator (asking for check-back, or not) and a sender to ``q``."""
    peer = world.connect(container)
    peer.attach_controller("ctl", capabilities=(CHECK_BACK,) if capability else ())
    peer.attach_producer("out", "q")
    world.settle()
    return peer


def declare(world: World, peer: Peer) -> bytes:
    delivery_id = peer.declare("ctl")
    state = world.settle()[peer].answers[delivery_id][0]
    assert isinstance(state, Declared), state
    txn_id: bytes = state.txn_id
    return txn_id


def lost(world: World, *, capability: bool = True, close: bool = False, posts: tuple[str, ...] = ("m1",)) -> bytes:
    """A producer declares, posts ``posts`` to ``q`` in the transaction, and its connection is lost."""
    peer = producer(world, capability=capability)
    txn_id = declare(world, peer)
    for name in posts:
        peer.transfer("out", payload(name), state=TransactionalState(txn_id=txn_id))
    world.settle()
    if close:
        peer.close()
    else:
        peer.eof()
    world.settle()
    return txn_id


def ready(world: World, queue: str = "q") -> list[str | None]:
    found = census(BrokerView(world)).get(queue)
    return [name for name, _ in found.ready] if found is not None else []


def states(world: World) -> list[tuple[bytes, str]]:
    return [(t.txn_id, t.state) for t in BrokerView(world).transactions]


def checker(world: World, container: str = PRODUCER) -> Peer:
    """A connection of ``container`` that listens on ``$txn-check`` and can send to it."""
    peer = world.connect(container)
    peer.attach_consumer("checks", CHECK_ADDRESS, presettled=False, default_outcome=None)
    peer.flow("checks", 100)
    peer.attach_producer("answers", CHECK_ADDRESS)
    world.settle()
    return peer


def sections(data: bytes) -> tuple[Any, dict[str, Any]]:
    """(correlation-id, application-properties) of an encoded message."""
    correlation: Any = None
    props: dict[str, Any] = {}
    for section in codec.decode_all(data):
        if isinstance(section, Properties):
            correlation = section.correlation_id
        elif isinstance(section, ApplicationProperties):
            props = dict(section.value)
    return correlation, props


def received(seen: Any, peer: Peer) -> list[tuple[Any, dict[str, Any]]]:
    return [sections(c.payload) for c in seen[peer].completed if c.link == "checks"]


def tell(world: World, peer: Peer, **props: Any) -> Any:
    """Send a message with application-properties ``props`` (``txn_id`` as ``txn-id``) to ``$txn-check``; the
    broker's answer."""
    values = {key.replace("_", "-"): value for key, value in props.items()}
    delivery_id = peer.transfer("answers", frames.message(None, ApplicationProperties(values)))
    seen = world.settle()
    return seen[peer].answers[delivery_id][0], seen


# -- opting in ----------------------------------------------------------------------------------------------
def test_the_capability_is_echoed_when_granted() -> None:
    world = make_world()
    peer = world.connect(PRODUCER)
    peer.attach_controller("ctl", capabilities=(CHECK_BACK,))
    peer.attach_controller("plain")
    world.settle()
    granted = peer.observed.attached["ctl"].target.capabilities
    assert Symbol(CHECK_BACK) in granted
    assert Symbol(CHECK_BACK) not in (peer.observed.attached["plain"].target.capabilities or [])


def test_strict_never_grants_nor_holds() -> None:
    world = make_world(STRICT, orphaned="hold")
    peer = world.connect(PRODUCER)
    peer.attach_controller("ctl", capabilities=(CHECK_BACK,))
    world.settle()
    assert Symbol(CHECK_BACK) not in (peer.observed.attached["ctl"].target.capabilities or [])
    peer.attach_consumer("checks", CHECK_ADDRESS, presettled=False, default_outcome=None)
    world.settle()
    assert CHECK_ADDRESS in BrokerView(world).queues  # an ordinary address under strict
    world.peers.remove(peer)
    lost(world)
    assert states(world) == []
    assert BrokerView(world).txn_stats.rolled_back == 1
    assert BrokerView(world).txn_stats.in_doubt == 0


def test_without_the_capability_a_lost_connection_rolls_back_as_before() -> None:
    world = make_world()
    lost(world, capability=False)
    assert states(world) == []
    assert census(BrokerView(world))["q"].staged == 0
    assert BrokerView(world).txn_stats.rolled_back == 1


@pytest.mark.parametrize("close", [False, True], ids=["drop", "close"])
def test_a_lost_connection_holds_the_transaction_in_doubt(close: bool) -> None:
    world = make_world()
    txn_id = lost(world, close=close, posts=("m1", "m2"))
    assert states(world) == [(txn_id, "in-doubt")]
    (held,) = BrokerView(world).transactions
    assert (held.posts, held.connection) == (2, PRODUCER)
    assert ready(world) == []  # invisible
    assert census(BrokerView(world))["q"].staged == 2
    assert BrokerView(world).txn_stats.in_doubt == 1


def test_broker_wide_hold_needs_no_capability() -> None:
    world = make_world(orphaned="hold")
    txn_id = lost(world, capability=False)
    assert states(world) == [(txn_id, "in-doubt")]


def test_a_controller_detach_rolls_back() -> None:
    world = make_world()
    peer = producer(world)
    txn_id = declare(world, peer)
    peer.transfer("out", payload("m1"), state=TransactionalState(txn_id=txn_id))
    peer.detach("ctl")
    world.settle()
    peer.eof()
    world.settle()
    assert states(world) == []
    assert census(BrokerView(world))["q"].staged == 0


def test_an_in_doubt_transaction_does_not_time_out() -> None:
    world = World(Broker(BrokerSettings(transaction_timeout=10, check_back=CheckBackSettings(check_immunity=1000))))
    txn_id = lost(world)
    world.advance(500)
    assert states(world) == [(txn_id, "in-doubt")]


def test_a_timed_out_transaction_is_not_held() -> None:
    world = World(Broker(BrokerSettings(transaction_timeout=10)))
    peer = producer(world)
    declare(world, peer)
    world.advance(11)
    peer.eof()
    world.settle()
    assert states(world) == []


# -- (a) the same container-id discharges -------------------------------------------------------------------
@pytest.mark.parametrize("fail", [False, True], ids=["commit", "rollback"])
def test_a_connection_of_the_same_container_discharges(fail: bool) -> None:
    world = make_world()
    txn_id = lost(world)
    again = world.connect(PRODUCER)
    again.attach_controller("ctl")  # asking for nothing: discharging needs no capability
    world.settle()
    delivery_id = again.discharge("ctl", txn_id, fail=fail)
    assert isinstance(world.settle()[again].answers[delivery_id][0], Accepted)
    assert states(world) == []
    assert ready(world) == ([] if fail else ["m1"])
    assert census(BrokerView(world))["q"].staged == 0


def test_another_container_cannot_discharge_it() -> None:
    world = make_world()
    txn_id = lost(world)
    other = world.connect("someone-else")
    other.attach_controller("ctl")
    world.settle()
    delivery_id = other.discharge("ctl", txn_id, fail=False)
    answer = world.settle()[other].answers[delivery_id][0]
    assert isinstance(answer, Rejected)
    assert answer.error.condition == Condition.UNKNOWN_TXN_ID
    assert states(world) == [(txn_id, "in-doubt")]


# -- (b) the embedder resolves ------------------------------------------------------------------------------
@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_the_embedder_resolves(commit: bool) -> None:
    world = make_world()
    txn_id = lost(world)
    view = BrokerView(world)
    assert view.resolve_transaction(txn_id.hex(), commit=commit) == ("committed" if commit else "rolled-back")
    assert states(world) == []
    assert ready(world) == (["m1"] if commit else [])
    with pytest.raises(LookupError, match="is in doubt"):
        view.resolve_transaction(txn_id)


def test_resolving_an_unknown_or_malformed_id_is_a_clear_error() -> None:
    view = BrokerView(make_world())
    with pytest.raises(LookupError, match="no transaction 00ff is in doubt"):
        view.resolve_transaction(b"\x00\xff")
    with pytest.raises(ValueError, match="not hex"):
        view.resolve_transaction("xyz")


# -- (c) check-back -----------------------------------------------------------------------------------------
def test_check_back_after_the_immunity_then_commit() -> None:
    world = make_world(check_immunity=60)
    txn_id = lost(world, posts=("m1", "m2"))
    peer = checker(world)
    bystander = checker(world, "another-app")
    world.advance(59.9)
    assert received(world.settle(), peer) == []
    world.advance(0.1)
    seen = world.settle()
    assert received(seen, peer) == [(txn_id, {"txn-id": txn_id.hex(), "posts": 2, "check": 1})]
    assert received(seen, bystander) == []  # only the producer group's own links
    answer, _ = tell(world, peer, txn_id=txn_id.hex(), outcome="commit")
    assert isinstance(answer, Accepted)
    assert states(world) == []
    assert ready(world) == ["m1", "m2"]


def test_check_back_answered_rollback() -> None:
    world = make_world(check_immunity=5)
    txn_id = lost(world)
    peer = checker(world)
    world.advance(5)
    assert len(received(world.settle(), peer)) == 1
    answer, _ = tell(world, peer, txn_id=txn_id.hex(), outcome="rollback")
    assert isinstance(answer, Accepted)
    assert states(world) == []
    assert ready(world) == []
    assert census(BrokerView(world))["q"].staged == 0


def test_unknown_then_silence_is_checked_again_until_abandoned() -> None:
    world = make_world(check_immunity=60, check_interval=30, check_max=3)
    txn_id = lost(world)
    peer = checker(world)
    checks = []
    for step in (60, 30, 30):
        world.advance(step)
        got = received(world.settle(), peer)
        checks += [props["check"] for _, props in got]
        answer, _ = tell(world, peer, txn_id=txn_id.hex(), outcome="unknown")
        assert isinstance(answer, Accepted)
    assert checks == [1, 2, 3]
    world.advance(29)
    assert states(world) == [(txn_id, "in-doubt")]
    world.advance(1)
    assert received(world.settle(), peer) == []
    assert states(world) == []
    stats = BrokerView(world).txn_stats
    assert (stats.abandoned, stats.rolled_back) == (1, 1)
    assert census(BrokerView(world))["q"].staged == 0


def test_a_check_waits_for_credit() -> None:
    world = make_world(check_immunity=1)
    txn_id = lost(world)
    peer = world.connect(PRODUCER)
    peer.attach_consumer("checks", CHECK_ADDRESS, presettled=False, default_outcome=None)
    world.advance(1)
    assert received(world.settle(), peer) == []
    peer.flow("checks", 1)
    assert [c for c, _ in received(world.settle(), peer)] == [txn_id]


def test_a_discharge_answers_a_check() -> None:
    world = make_world(check_immunity=1, check_interval=1, check_max=2)
    txn_id = lost(world)
    peer = checker(world)
    peer.attach_controller("ctl")
    world.advance(1)
    world.settle()
    peer.discharge("ctl", txn_id, fail=False)
    world.settle()
    world.advance(10)
    assert ready(world) == ["m1"]
    assert BrokerView(world).txn_stats.abandoned == 0


# -- the outcome query --------------------------------------------------------------------------------------
def test_outcome_query_for_each_state() -> None:
    world = make_world(outcome_retention=600)
    peer = checker(world)
    unknown = b"\x01\x02"

    def query(txn_id: bytes) -> str:
        answer, seen = tell(world, peer, txn_id=txn_id.hex(), query=True)
        assert isinstance(answer, Accepted), answer
        ((correlation, props),) = received(seen, peer)
        assert correlation == txn_id
        assert props["txn-id"] == txn_id.hex()
        return str(props["state"])

    doubtful = lost(world)
    assert query(doubtful) == "in-doubt"
    assert query(unknown) == "unknown"
    committed = lost(world)
    BrokerView(world).resolve_transaction(committed)
    assert query(committed) == "committed"
    BrokerView(world).resolve_transaction(doubtful, commit=False)
    assert query(doubtful) == "rolled-back"
    # an ordinary discharge of a check-back transaction is remembered too (the lost-answer case)
    live = producer(world)
    txn_id = declare(world, live)
    live.discharge("ctl", txn_id, fail=False)
    world.settle()
    assert query(txn_id) == "committed"
    world.advance(601)
    assert query(committed) == "unknown"  # past outcome_retention


def test_outcomes_of_transactions_without_check_back_are_not_kept() -> None:
    world = make_world()
    plain = producer(world, capability=False)
    txn_id = declare(world, plain)
    plain.discharge("ctl", txn_id, fail=False)
    world.settle()
    peer = checker(world)
    _, seen = tell(world, peer, txn_id=txn_id.hex(), query=True)
    assert received(seen, peer)[0][1]["state"] == "unknown"


@pytest.mark.parametrize(
    ("props", "condition"),
    [
        ({}, Condition.INVALID_FIELD),
        ({"txn_id": "zz", "outcome": "commit"}, Condition.INVALID_FIELD),
        ({"txn_id": "00ff", "outcome": "maybe"}, Condition.INVALID_FIELD),
        ({"txn_id": "00ff", "query": "yes"}, Condition.INVALID_FIELD),
        ({"txn_id": "00ff", "outcome": "commit"}, Condition.UNKNOWN_TXN_ID),
    ],
)
def test_bad_check_messages_are_rejected(props: dict[str, Any], condition: str) -> None:
    world = make_world()
    peer = checker(world)
    answer, _ = tell(world, peer, **props)
    assert isinstance(answer, Rejected)
    assert answer.error.condition == condition


def test_a_query_needs_a_check_source() -> None:
    world = make_world()
    peer = world.connect(PRODUCER)
    peer.attach_producer("answers", CHECK_ADDRESS)
    world.settle()
    answer, _ = tell(world, peer, txn_id="00ff", query=True)
    assert isinstance(answer, Rejected)
    assert answer.error.condition == Condition.PRECONDITION_FAILED


# -- deliveries an in-doubt transaction holds ---------------------------------------------------------------
@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_a_retired_delivery_is_held_then_settled_once(commit: bool) -> None:
    world = make_world()
    view = BrokerView(world)
    view.post("jobs", payload("job"))
    peer = producer(world)
    txn_id = declare(world, peer)
    peer.attach_consumer("in", "jobs", presettled=False, default_outcome=None)
    peer.flow("in", 1)
    (job,) = world.settle()[peer].completed
    peer.dispose(job.delivery_id, TransactionalState(txn_id=txn_id, outcome=Accepted()), settled=False)
    peer.eof()
    world.settle()
    worker = world.connect("worker")
    worker.attach_consumer("in", "jobs", presettled=False, default_outcome=None)
    worker.flow("in", 10)
    assert world.settle()[worker].completed == []  # held: not redelivered while in doubt
    assert census(view)["jobs"].acquired == 1
    view.resolve_transaction(txn_id, commit=commit)
    got = [c.name for c in world.settle()[worker].completed]
    assert got == ([] if commit else ["job"])
    assert census(view)["jobs"].acquired == (0 if commit else 1)


def test_in_doubt_transactions_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checkback, "MAX_IN_DOUBT", 1)
    world = make_world()
    first = lost(world)
    lost(world)
    assert states(world) == [(first, "in-doubt")]
    assert BrokerView(world).txn_stats.rolled_back == 1


def test_reset_drops_in_doubt_transactions() -> None:
    world = make_world()
    lost(world)
    world.broker.reset()
    assert states(world) == []
    assert world.broker.txn_stats.rolled_back == 1
