"""Service Bus sessions frame by frame (the in-memory driver, no sockets): the broker's attach echoing the session
filter with the session chosen and ``com.microsoft:locked-until-utc``, the refusals and their conditions, the
session lock on the broker clock, and the session operations of ``ENTITY/$management``; attacker cases (bad ids,
two receivers racing for one session, settling after the lock ran out, bad request fields)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from minibroker.amqp import codec
from minibroker.amqp.definitions import Accepted, AmqpValue, Properties, Rejected, Source
from minibroker.amqp.types import Int, Symbol, Timestamp, UInt
from minibroker.servicebus.entities import EntityProperties, key
from minibroker.testing import frames
from tests.broker.txn_driver import Peer, World
from tests.personalities.harness import peer, world
from tests.servicebus.test_management_frames import _answers, _request

pytestmark = pytest.mark.timeout(30)

QUEUE = "amqps://127.0.0.1:5672/orders"
SESSION_FILTER = Symbol("com.microsoft:session-filter")
LOCKED_UNTIL = Symbol("com.microsoft:locked-until-utc")
DOTNET_EPOCH_TICKS = 621355968000000000


def _message(name: str, session: str | None = None) -> bytes:
    return codec.encode(Properties(group_id=session)) + codec.encode(AmqpValue(f"<<{name}>>"))


def _world(**entities: EntityProperties) -> tuple[World, Peer]:
    w = world("servicebus")
    for path, properties in entities.items():
        w.broker.nodes.default.servicebus_entities[key(path)] = properties
    p = peer(w)
    p.attach_producer("in", QUEUE)
    w.settle()
    return w, p


def _send(w: World, p: Peer, *messages: tuple[str, str | None]) -> list[Any]:
    ids = [p.transfer("in", _message(name, session)) for name, session in messages]
    answers = w.settle()[p].answers
    return [answers[i][0] for i in ids]


def _attach(w: World, p: Peer, link: str, session: Any, *, credit: int = 0) -> Any:
    """A session receiver (``session``: the filter's value) on the queue; the broker's attach."""
    p.attach_consumer(link, QUEUE, presettled=False, default_outcome=None, source_filter={SESSION_FILTER: session})
    if credit:
        p.flow(link, credit)
    return w.settle()[p].attached.get(link)


def _refusal(w: World, p: Peer, link: str, session: Any) -> tuple[str, str | None]:
    """The error a session receiver's attach is refused with (answered with a null source, then detached)."""
    p.attach_consumer(link, QUEUE, presettled=False, default_outcome=None, source_filter={SESSION_FILTER: session})
    observed = w.settle()[p]
    assert observed.attached[link].source is None
    ((name, err),) = observed.detached
    assert name == link
    assert err is not None
    return str(err.condition), err.description


def _ticks(w: World, at: float) -> int:
    return DOTNET_EPOCH_TICKS + w.broker.clock.wall_ms(at) * 10_000


def test_attach_echoes_the_session_and_its_lock() -> None:
    w, p = _world()
    attach = _attach(w, p, "r", "s1")
    assert attach.source.filter == {SESSION_FILTER: "s1"}
    assert attach.source.address == QUEUE
    assert attach.properties == {LOCKED_UNTIL: _ticks(w, w.broker.clock.now + 60)}


def test_null_filter_takes_the_first_unlocked_session_with_messages() -> None:
    w, p = _world()
    _send(w, p, ("plain", None), ("b1", "b"), ("a1", "a"), ("b2", "b"))
    assert _attach(w, p, "first", None).source.filter == {SESSION_FILTER: "b"}
    assert _attach(w, p, "second", None).source.filter == {SESSION_FILTER: "a"}
    # none left: refused at once with com.microsoft:timeout (the SDK raises OperationTimeoutError)
    assert _refusal(w, p, "third", None)[0] == "com.microsoft:timeout"
    p.flow("first", 10)
    p.flow("second", 10)
    got = [(c.link, c.name) for c in w.settle()[p].completed]
    assert sorted(got) == [("first", "b1"), ("first", "b2"), ("second", "a1")]


def test_a_held_session_cannot_be_locked_again() -> None:
    w, p = _world()
    _attach(w, p, "holder", "s")
    condition, _ = _refusal(w, p, "intruder", "s")
    assert condition == "com.microsoft:session-cannot-be-locked"
    assert p.attached("holder")


def test_two_receivers_racing_for_one_session() -> None:
    w, first = _world()
    second = peer(w)
    for p in (first, second):
        p.attach_consumer("r", QUEUE, presettled=False, default_outcome=None, source_filter={SESSION_FILTER: "race"})
    seen = w.settle()
    granted = [p for p in (first, second) if seen[p].attached["r"].source is not None]
    refused = [p for p in (first, second) if seen[p].detached]
    assert len(granted) == 1
    assert len(refused) == 1
    assert str(seen[refused[0]].detached[0][1].condition) == "com.microsoft:session-cannot-be-locked"


@pytest.mark.parametrize(
    ("session", "why"),
    [(Int(5), "not Int"), ("", "not 0"), ("x" * 129, "not 129"), (b"bytes", "not bytes")],
)
def test_malformed_session_ids_are_refused(session: Any, why: str) -> None:
    w, p = _world()
    condition, description = _refusal(w, p, "r", session)
    assert condition == "amqp:invalid-field"
    assert description is not None
    assert why in description


def test_session_ids_are_exact_strings() -> None:
    """A NUL inside an id is a character like any other: ``a\\x00b`` is not ``a``; 128 characters are fine."""
    w, p = _world()
    long_id = "L" * 128
    _send(w, p, ("for-a", "a"), ("for-nul", "a\x00b"), ("for-long", long_id))
    assert _attach(w, p, "nul", "a\x00b").source.filter == {SESSION_FILTER: "a\x00b"}
    assert _attach(w, p, "long", long_id).source.filter == {SESSION_FILTER: long_id}
    p.flow("nul", 5)
    p.flow("long", 5)
    assert sorted((c.link, c.name) for c in w.settle()[p].completed) == [("long", "for-long"), ("nul", "for-nul")]


def test_plain_receivers_of_an_unconfigured_entity_get_messages_without_session() -> None:
    w, p = _world()
    _send(w, p, ("tagged", "s"), ("plain", None))
    p.attach_consumer("plain", QUEUE, presettled=False, default_outcome=None)
    p.flow("plain", 5)
    assert [c.name for c in w.settle()[p].completed] == ["plain"]


def test_the_lock_runs_out_the_link_is_detached_and_the_messages_go_back() -> None:
    w, p = _world()
    _send(w, p, ("m", "s"))
    _attach(w, p, "r", "s", credit=5)
    w.advance(59)
    assert not w.settle()[p].detached
    w.advance(2)
    observed = w.settle()[p]
    ((name, err),) = observed.detached
    assert name == "r"
    assert err is not None
    assert str(err.condition) == "com.microsoft:session-lock-lost"
    _attach(w, p, "again", "s")
    (delivery,) = _completed_after_flow(w, p, "again")
    assert (delivery.name, delivery.delivery_count) == ("m", 1)


def _completed_after_flow(w: World, p: Peer, link: str) -> list[Any]:
    p.flow(link, 5)
    return w.settle()[p].completed


def test_detaching_releases_the_session_at_once() -> None:
    w, p = _world()
    _send(w, p, ("m", "s"))
    _attach(w, p, "r", "s", credit=5)
    p.detach("r")  # its delivery left unsettled: released
    w.settle()
    assert _attach(w, p, "next", "s") is not None
    (delivery,) = _completed_after_flow(w, p, "next")
    assert (delivery.name, delivery.delivery_count) == ("m", 0)


def test_renewed_lock_outlives_the_first() -> None:
    w, p = _mgmt(_world())
    _attach(w, p, "r", "s")
    w.advance(50)
    ((_, status, body),) = _ask(w, p, "com.microsoft:renew-session-lock", {"session-id": "s"})
    assert status["statusCode"] == 200
    assert body == {"expiration": Timestamp(w.broker.clock.wall_ms(w.broker.clock.now + 60))}
    w.advance(50)
    assert not w.settle()[p].detached
    w.advance(11)
    assert [name for name, _ in w.settle()[p].detached] == ["r"]
    ((_, status, _),) = _ask(w, p, "com.microsoft:renew-session-lock", {"session-id": "s"})
    assert (status["statusCode"], status["errorCondition"]) == (410, "com.microsoft:session-lock-lost")


def _mgmt(wp: tuple[World, Peer]) -> tuple[World, Peer]:
    w, p = wp
    node = f"{QUEUE}/$management"
    p.attach_producer("mgmt-req", node)
    p.attach_consumer("mgmt-resp", node, presettled=False, default_outcome=None)
    w.settle()
    p.flow("mgmt-resp", 100)
    w.settle()
    return w, p


def _ask(w: World, p: Peer, operation: str, body: dict[str, Any]) -> list[tuple[Any, dict[Any, Any], Any]]:
    message_id = uuid.uuid4()
    p.transfer("mgmt-req", _request(message_id, operation, body))
    w.settle()
    answers = _answers(p)
    assert [a[0] for a in answers] == [message_id]
    return answers


def test_session_state_operations() -> None:
    w, p = _mgmt(_world())
    _attach(w, p, "r", "s")
    ((_, status, body),) = _ask(w, p, "com.microsoft:get-session-state", {"session-id": "s"})
    assert (status["statusCode"], body) == (200, {"session-state": None})
    ((_, status, _),) = _ask(w, p, "com.microsoft:set-session-state", {"session-id": "s", "session-state": b"\x00\x01"})
    assert status["statusCode"] == 200
    ((_, status, body),) = _ask(w, p, "com.microsoft:get-session-state", {"session-id": "s"})
    assert body == {"session-state": b"\x00\x01"}
    for bad in ("text", 7, [b"x"]):
        ((_, status, _),) = _ask(w, p, "com.microsoft:set-session-state", {"session-id": "s", "session-state": bad})
        assert (status["statusCode"], status["errorCondition"]) == (400, "com.microsoft:argument-error")
    for bad_id in (None, 3, "", "y" * 129):
        ((_, status, _),) = _ask(w, p, "com.microsoft:get-session-state", {"session-id": bad_id})
        assert (status["statusCode"], status["errorCondition"]) == (400, "com.microsoft:argument-error")
    ((_, status, body),) = _ask(w, p, "com.microsoft:get-session-state", {"session-id": "s"})
    assert body == {"session-state": b"\x00\x01"}  # (the bad requests changed nothing)


def test_session_operations_need_the_session_locked_by_the_caller() -> None:
    w, holder = _world()
    _attach(w, holder, "r", "s")
    _, other = _mgmt((w, peer(w)))
    for operation in ("get-session-state", "set-session-state", "renew-session-lock"):
        body = {"session-id": "s", "session-state": b"x"}
        ((_, status, _),) = _ask(w, other, f"com.microsoft:{operation}", body)
        assert (status["statusCode"], status["errorCondition"]) == (410, "com.microsoft:session-lock-lost")
    ((_, status, _),) = _ask(w, other, "com.microsoft:get-session-state", {"session-id": "unlocked"})
    assert status["statusCode"] == 410


def test_get_message_sessions_pages() -> None:
    w, p = _mgmt(_world())
    ((_, status, body),) = _ask(w, p, "com.microsoft:get-message-sessions", {"skip": Int(0), "top": Int(100)})
    assert (status["statusCode"], body) == (204, None)
    _send(w, p, ("1", "b"), ("2", "a"), ("3", "c"), ("4", None))
    ((_, status, body),) = _ask(w, p, "com.microsoft:get-message-sessions", {"skip": Int(0), "top": Int(2)})
    assert status["statusCode"] == 200
    assert (body["skip"], list(body["sessions-ids"].items)) == (2, ["a", "b"])
    ((_, status, body),) = _ask(w, p, "com.microsoft:get-message-sessions", {"skip": Int(2), "top": Int(10**6)})
    assert list(body["sessions-ids"].items) == ["c"]
    for bad in ({"skip": Int(-1)}, {"top": "ten"}, {"skip": True}):
        ((_, status, _),) = _ask(w, p, "com.microsoft:get-message-sessions", bad)
        assert (status["statusCode"], status["errorCondition"]) == (400, "com.microsoft:argument-error")


def test_requires_session_refusals() -> None:
    w, p = _world(orders=EntityProperties(requires_session=True))
    (refused, accepted) = _send(w, p, ("plain", None), ("tagged", "s"))
    assert accepted == Accepted()
    assert isinstance(refused, Rejected)
    assert refused.error is not None
    assert str(refused.error.condition) == "amqp:not-allowed"
    assert refused.error.info is None  # on the wire a null field, not trimmed (test_refusals.py: every field)
    p.attach_consumer("plain", QUEUE, presettled=False, default_outcome=None)
    observed = w.settle()[p]
    ((_, err),) = observed.detached
    assert err is not None
    assert str(err.condition) == "amqp:not-allowed"


def test_an_entity_configured_without_sessions_refuses_session_receivers() -> None:
    w, p = _world(orders=EntityProperties(requires_session=False))
    assert _refusal(w, p, "r", "s")[0] == "amqp:not-allowed"


def test_a_vanished_connection_releases_its_sessions_and_messages() -> None:
    w, p = _world()
    _send(w, p, ("m", "s"))
    gone = peer(w, "gone")
    _attach(w, gone, "r", "s", credit=5)
    gone.eof()
    w.settle()
    assert _attach(w, p, "next", "s") is not None
    (delivery,) = _completed_after_flow(w, p, "next")
    assert delivery.name == "m"


def _wait_for_session(p: Peer, link: str, timeout_ms: int) -> None:
    """A receiver asking for the next available session, waiting ``timeout_ms`` for one (the attach property
    ``com.microsoft:timeout``, as azure-servicebus sends its ``max_wait_time``)."""
    source = Source(address=QUEUE, filter={SESSION_FILTER: None})
    properties = {Symbol("com.microsoft:timeout"): UInt(timeout_ms)}
    p.send(frames.attach_receiver(QUEUE, p.new_handle(link), link, source=source, properties=properties))


def test_next_available_waits_for_a_session_to_arrive() -> None:
    w, p = _world()
    _wait_for_session(p, "r", 5000)
    assert "r" not in w.settle()[p].attached  # not answered yet
    w.advance(3)
    _send(w, p, ("plain", None))
    assert "r" not in w.settle()[p].attached  # a message without a session is none
    p.transfer("in", _message("late", "s"))
    observed = w.settle()[p]
    assert observed.attached["r"].source.filter == {SESSION_FILTER: "s"}
    assert observed.attached["r"].properties == {LOCKED_UNTIL: _ticks(w, w.broker.clock.now + 60)}
    assert [c.name for c in _completed_after_flow(w, p, "r")] == ["late"]
    assert not observed.violations


def test_waiting_in_vain_is_refused_with_timeout() -> None:
    w, p = _world()
    _wait_for_session(p, "r", 5000)
    w.advance(4.9)
    assert not w.settle()[p].detached
    w.advance(0.2)
    observed = w.settle()[p]
    assert observed.attached["r"].source is None
    ((name, err),) = observed.detached
    assert (name, str(err.condition) if err else None) == ("r", "com.microsoft:timeout")


def test_a_very_long_wait_is_cut_to_a_minute() -> None:
    w, p = _world()
    _wait_for_session(p, "r", 4_000_000_000)
    w.advance(59)
    assert not w.settle()[p].detached
    w.advance(2)
    assert [name for name, _ in w.settle()[p].detached] == ["r"]


def test_waiters_are_served_in_turn_and_a_departed_one_is_skipped() -> None:
    w, p = _world()
    _wait_for_session(p, "gone", 5000)
    _wait_for_session(p, "first", 5000)
    _wait_for_session(p, "second", 5000)
    w.settle()
    p.detach("gone")  # before it was answered
    w.settle()
    p.transfer("in", _message("a1", "a"))
    p.transfer("in", _message("b1", "b"))
    observed = w.settle()[p]
    assert observed.attached["first"].source.filter == {SESSION_FILTER: "a"}
    assert observed.attached["second"].source.filter == {SESSION_FILTER: "b"}
    assert not observed.violations
    w.advance(10)  # the departed one's wait is over: nothing more is sent for it
    assert not w.settle()[p].performatives


def test_a_waiter_whose_connection_vanished_gets_nothing() -> None:
    w, p = _world()
    gone = peer(w, "gone")
    _wait_for_session(gone, "r", 5000)
    w.settle()
    gone.eof()
    w.settle()
    _send(w, p, ("m", "s"))
    assert _attach(w, p, "next", "s") is not None
    (delivery,) = _completed_after_flow(w, p, "next")
    assert (delivery.name, delivery.delivery_count) == ("m", 0)
    w.advance(10)
    w.settle()


def test_get_message_sessions_by_the_time_their_state_was_set() -> None:
    w, p = _mgmt(_world())
    _send(w, p, ("1", "with-messages"))
    _attach(w, p, "r", "with-state")
    _ask(w, p, "com.microsoft:set-session-state", {"session-id": "with-state", "session-state": b"x"})
    clock = w.broker.clock
    before, after = Timestamp(clock.wall_ms(clock.now - 1)), Timestamp(clock.wall_ms(clock.now + 1))
    ((_, status, body),) = _ask(w, p, "com.microsoft:get-message-sessions", {"last-updated-time": before})
    assert (status["statusCode"], list(body["sessions-ids"].items)) == (200, ["with-state"])
    ((_, status, _),) = _ask(w, p, "com.microsoft:get-message-sessions", {"last-updated-time": after})
    assert status["statusCode"] == 204
    max_value = Timestamp(253402300799999)  # DateTime.MaxValue: no filter (``_session_browser.py``)
    ((_, status, body),) = _ask(w, p, "com.microsoft:get-message-sessions", {"last-updated-time": max_value})
    assert list(body["sessions-ids"].items) == ["with-messages", "with-state"]
