"""The JavaScript Service Bus SDK, ``@azure/service-bus`` 7.9 (installed from npm by the ``js_sdk`` fixture), run
with node against a ``servicebus`` broker on the virtual clock (issue 17).

All scenarios of ``js/scenarios.js`` play in one node process (one client, one connection), each on its own
entities; each test below asserts on the JSON lines of one scenario. Time-dependent steps (lock renewal and
expiry, scheduled messages) ask this side to advance the broker's clock between SDK calls.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from minibroker.testing.thread import ThreadedBroker, run_in_thread
from tests.servicebus.conftest import connection_string
from tests.servicebus.node_sdk import Line, NodeSdk

pytestmark = pytest.mark.timeout(60, func_only=True)  # the one-time npm install is outside this bound

SCENARIOS = [
    "send_kinds",
    "fields",
    "abandon",
    "dead_letter",
    "defer",
    "schedule",
    "peek",
    "renew_and_expire",
    "receive_and_delete",
    "max_delivery",
    "topic",
    "subscription_dead_letter",
    "rules",
    "sessions",
]


@pytest.fixture(scope="module")
def played(js_sdk: NodeSdk) -> Iterator[dict[str, list[Line]]]:
    """Every scenario's lines, from one node run against one broker on the virtual clock."""
    config = {"server": {"port": 0}, "broker": {"personality": "servicebus", "clock": "virtual"}}
    with run_in_thread(config) as broker:
        now = datetime.fromtimestamp(broker.clock.now, UTC).isoformat()
        steps = {"advance": lambda line: _advance(broker, line)}
        yield js_sdk.play(connection_string(broker.port), SCENARIOS, steps, now=now)


def _advance(broker: ThreadedBroker, line: Line) -> None:
    broker.clock.advance(float(line["seconds"]))


def lines_of(played: dict[str, list[Line]], scenario: str) -> dict[str, Any]:
    """One scenario's lines merged into one dict (each key printed once); fails on a scenario's error."""
    merged: dict[str, Any] = {}
    for line in played.get(scenario, []):
        assert "error" not in line, f"{scenario}: {line}"
        for key, value in line.items():
            assert key not in merged, f"{scenario} printed {key!r} twice"
            merged[key] = value
    assert merged, f"{scenario} printed nothing"
    return merged


def when(text: str) -> datetime:
    return datetime.fromisoformat(text)


def test_send_one_list_and_batch(played: dict[str, list[Line]]) -> None:
    """``sendMessages`` of one message, of a list and of a ``createMessageBatch`` batch filled with
    ``tryAddMessage``; received in peek-lock and each settled with ``completeMessage``: nothing is left."""
    got = lines_of(played, "send_kinds")
    assert got["bodies"] == ["one", "list-a", "list-b", "batch-a", "batch-b", "batch-c"]
    assert got["after"] == 0


def test_message_fields(played: dict[str, list[Line]]) -> None:
    """A message-id stamped, sequence numbers, enqueued time and a 60 s lock, application properties, and
    bodies of three types (string, object, bytes) as the SDK encodes them."""
    messages = [line["message"] for line in played["fields"]]
    buffers = [line["bodyIsBuffer"] for line in played["fields"]]
    assert [m["body"] for m in messages] == [
        "text",
        {"nested": [1, 2, "three"]},
        {"bytes": base64.b64encode(bytes([0, 1, 2, 255])).decode()},
    ]
    assert buffers == [False, False, True]
    assert messages[0]["applicationProperties"] == {"color": "red", "n": 7, "ok": True}
    assert messages[1]["contentType"] == "application/json"
    sequence = [int(m["sequenceNumber"]) for m in messages]
    assert sequence == sorted(sequence)
    assert len(set(sequence)) == 3
    assert all(m["messageId"] for m in messages)
    assert len({m["messageId"] for m in messages}) == 3
    assert len({m["lockToken"] for m in messages}) == 3
    for m in messages:
        assert m["deliveryCount"] == 0
        assert m["state"] == "active"
        assert when(m["lockedUntilUtc"]) - when(m["enqueuedTimeUtc"]) == timedelta(seconds=60)


def test_abandon_redelivers_with_count(played: dict[str, list[Line]]) -> None:
    got = lines_of(played, "abandon")
    first, second = got["first"], got["second"]
    assert second["sequenceNumber"] == first["sequenceNumber"]
    assert second["body"] == "again"
    assert (first["deliveryCount"], second["deliveryCount"]) == (0, 1)
    assert second["lockToken"] != first["lockToken"]


def test_dead_letter_with_reason(played: dict[str, list[Line]]) -> None:
    """``deadLetterMessage`` with reason and description; the message is read back from the dead-letter
    sub-queue (``subQueueType: "deadLetter"``) with reason, description and source."""
    got = lines_of(played, "dead_letter")
    assert got["left"] == 0
    dead = got["dead"]
    assert (dead["messageId"], dead["body"]) == ("dl-1", "poison")
    assert dead["deadLetterReason"] == "bad-input"
    assert dead["deadLetterErrorDescription"] == "cannot parse"
    assert dead["deadLetterSource"] == "js-dead_letter"


def test_defer_and_receive_deferred(played: dict[str, list[Line]]) -> None:
    """``deferMessage`` sets it aside (not redelivered); ``receiveDeferredMessages`` gets it by sequence number,
    locked, and ``completeMessage`` settles it: asked again it is not found."""
    got = lines_of(played, "defer")
    assert got["redelivered"] == 0
    (deferred,) = got["deferred"]
    assert deferred["sequenceNumber"] == got["original"]["sequenceNumber"]
    assert (deferred["body"], deferred["state"]) == ("later", "deferred")
    assert deferred["lockToken"]
    assert got["again"] == "MessageNotFound"


def test_schedule_and_cancel(played: dict[str, list[Line]]) -> None:
    """``scheduleMessages`` answers sequence numbers and the messages peek as scheduled;
    ``cancelScheduledMessages`` removes one; the other arrives once the broker's clock reaches its time."""
    got = lines_of(played, "schedule")
    first, second = got["scheduled"]
    assert [m["sequenceNumber"] for m in got["peeked"]] == [first, second]
    assert {m["state"] for m in got["peeked"]} == {"scheduled"}
    assert [m["sequenceNumber"] for m in got["afterCancel"]] == [second]
    (due,) = got["due"]
    assert (due["sequenceNumber"], due["body"]) == (second, "s-2")
    assert when(due["scheduledEnqueueTimeUtc"]) == when(got["peeked"][1]["scheduledEnqueueTimeUtc"])


def test_peek(played: dict[str, list[Line]]) -> None:
    """``peekMessages``: none on an empty queue; then the SDK's cursor goes on from the last peeked message,
    ``fromSequenceNumber`` starts over; peeked messages carry no lock and stay available."""
    got = lines_of(played, "peek")
    assert got["empty"] == 0
    assert [m["body"] for m in got["peeked"]] == ["p-1", "p-2"]
    assert [m["body"] for m in got["rest"]] == ["p-3"]
    assert [m["body"] for m in got["fromStart"]] == ["p-1", "p-2", "p-3"]
    for m in got["peeked"] + got["rest"] + got["fromStart"]:
        assert "lockToken" not in m
        assert "lockedUntilUtc" not in m, m  # a peeked message is not locked (it said 1970-01-01)
    assert got["received"] == ["p-1", "p-2", "p-3"]


def test_renew_lock_and_lock_expiry(played: dict[str, list[Line]]) -> None:
    """``renewMessageLock`` 30 s into the lock gives 60 s from then, and the message completes 75 s after its
    delivery; a lock left to run out (61 s) loses the message: settling and renewing fail with
    ``MessageLockLost`` and it comes back with delivery count 1 under a new lock token."""
    got = lines_of(played, "renew_and_expire")
    assert when(got["renewed"]) - when(got["before"]) == timedelta(seconds=30)
    assert got["messageLockedUntil"] == got["renewed"]
    assert got["completedAfterRenew"] is True
    assert got["settleError"] == {"name": "ServiceBusError", "code": "MessageLockLost"}
    assert got["renewError"] == {"name": "ServiceBusError", "code": "MessageLockLost"}
    first, again = got["first"], got["again"]
    assert again["sequenceNumber"] == first["sequenceNumber"]
    assert (first["deliveryCount"], again["deliveryCount"]) == (0, 1)
    assert again["lockToken"] != first["lockToken"]


def test_receive_and_delete(played: dict[str, list[Line]]) -> None:
    got = lines_of(played, "receive_and_delete")
    assert [m["body"] for m in got["received"]] == ["gone-1", "gone-2"]
    assert all("lockToken" not in m for m in got["received"])
    assert got["after"] == 0


def test_max_delivery_count_dead_letters(played: dict[str, list[Line]]) -> None:
    """Ten ``abandonMessage`` calls: delivery counts 0..9, then the message is in the dead-letter sub-queue
    with reason ``MaxDeliveryCountExceeded``."""
    got = lines_of(played, "max_delivery")
    assert got["counts"] == list(range(10))
    assert got["left"] == 0
    dead = got["dead"]
    assert dead is not None
    assert dead["body"] == "hopeless"
    assert dead["deadLetterReason"] == "MaxDeliveryCountExceeded"


def test_topic_subscriptions(played: dict[str, list[Line]]) -> None:
    """Two subscription receivers (``createReceiver(topic, subscription)``) each get every message sent to the
    topic."""
    got = played["topic"]
    assert [line.get("error") for line in got] == [None, None]
    assert {line["subscription"]: line["bodies"] for line in got} == {"one": ["t-1", "t-2"], "two": ["t-1", "t-2"]}


def test_subscription_dead_letter_queue(played: dict[str, list[Line]]) -> None:
    """A message dead-lettered from a subscription is in that subscription's dead-letter sub-queue: peeked there
    (``TOPIC/Subscriptions/NAME/$DeadLetterQueue/$management``) and received there, with its reason."""
    got = lines_of(played, "subscription_dead_letter")
    assert got["peekedSubscription"] == 0
    ((peeked,), dead) = got["peekedDeadLetters"], got["dead"]
    assert peeked["messageId"] == dead["messageId"] == "sub-dl-1"
    assert dead["deadLetterReason"] == "audit-failed"
    assert dead["deadLetterSource"] == "js-subscription_dead_letter/Subscriptions/audit"


def test_rule_manager(played: dict[str, list[Line]]) -> None:
    """``createRuleManager(topic, subscription)``: ``createRule`` with a SQL filter, a correlation filter with
    application properties, and a SQL filter with an action; ``deleteRule("$Default")``; ``listRules`` reads them
    back; a message sent afterwards reaches exactly the subscriptions whose rules match (the action's copy
    rewritten, named by ``RuleName``). Deleting an unknown rule and creating a taken name fail with the SDK's
    ``MessagingEntityNotFound`` and ``MessagingEntityAlreadyExists``."""
    got = lines_of(played, "rules")
    listed = got["listed"]
    assert [(r["name"], r["filter"]["sqlExpression"]) for r in listed["sql"]] == [("red", "color = 'red' AND n > 1")]
    ((eu,),) = [listed["corr"]]
    assert (eu["name"], eu["filter"]["correlationId"], eu["filter"]["applicationProperties"]) == (
        "eu",
        "order",
        {"region": "eu"},
    )
    ((tag,),) = [listed["act"]]
    assert (tag["name"], tag["filter"]["sqlExpression"], tag["action"]["sqlExpression"]) == (
        "tag",
        "n > 1",
        "SET tagged = 'yes'",
    )
    # no rules: enumerate-rules answers 204, ``getRules`` gives [], and the SDK's pager (``listRules`` ``getPage``
    # returning undefined for an empty page) yields one undefined: the SDK's own doing, as against Service Bus
    assert listed["none"] == [None]
    assert got["deleteUnknown"] == {"name": "ServiceBusError", "code": "MessagingEntityNotFound"}
    assert got["createDuplicate"] == {"name": "ServiceBusError", "code": "MessagingEntityAlreadyExists"}
    assert got["createBad"] is not None
    received = got["received"]
    assert received["sql"] == [{"body": "a", "applicationProperties": {"color": "red", "n": 2}}]
    assert [m["body"] for m in received["corr"]] == ["b"]
    assert received["act"] == [
        {"body": "a", "applicationProperties": {"color": "red", "n": 2, "tagged": "yes", "RuleName": "tag"}}
    ]
    assert received["none"] == []


def test_sessions(played: dict[str, list[Line]]) -> None:
    """``acceptSession(queue, "s1")`` gets s1's messages only, in order; ``setSessionState`` / ``getSessionState``
    keep a state that the next receiver of s1 reads; ``renewSessionLock`` 30 s of broker time later moves the lock
    on by those 30 s; ``acceptNextSession`` takes the session that still has a message (s2)."""
    got = lines_of(played, "sessions")
    assert got["s1"] == [["s1-a", "s1"], ["s1-b", "s1"]]
    assert (got["sessionId"], got["locked"]) == ("s1", True)
    assert got["state"] == {"step": 2}
    assert got["renewedBy"] == 30
    assert (got["next"], got["body"]) == ("s2", "s2-a")
    assert (got["stateAgain"], got["left"]) == ({"step": 2}, 0)
