"""Review of issue 17 (subscription rules) at the frame level (the in-memory driver of
tests/servicebus/test_rules_frames.py): what filters read of a message as it is published, a rule action next to
another rule, and enumerate-rules paging at and beyond its bounds."""

from __future__ import annotations

from typing import Any

import pytest

from tests.servicebus.test_rules_frames import _add, _ask, _message, _names, _properties_delivered, _rules_world, _sql

pytestmark = pytest.mark.timeout(30)


def test_17b_a_filter_on_the_sequence_number_sees_the_messages_number() -> None:
    """Every message a topic takes has a sequence number (1 and up), and ``sys.SequenceNumber`` reads it."""
    w, p = _rules_world()
    assert _ask(w, p, "com.microsoft:remove-rule", {"rule-name": "$Default"})[0]["statusCode"] == 200
    assert _add(w, p, "numbered", _sql("sys.SequenceNumber > 0"))["statusCode"] == 200
    assert _properties_delivered(w, p, "audit", _message("m", n=1)) == [{"n": 1}]


def test_17b_a_rule_with_an_action_and_a_sequence_number_filter_make_two_copies() -> None:
    w, p = _rules_world()
    assert _ask(w, p, "com.microsoft:remove-rule", {"rule-name": "$Default"})[0]["statusCode"] == 200
    assert _add(w, p, "numbered", _sql("sys.SequenceNumber >= 1"))["statusCode"] == 200
    action = {"sql-filter": {"expression": "1 = 1"}, "sql-rule-action": {"expression": "SET tagged = TRUE"}}
    assert _add(w, p, "tag", action)["statusCode"] == 200
    assert _properties_delivered(w, p, "audit", _message("m", n=1)) == [
        {"n": 1},
        {"n": 1, "tagged": True, "RuleName": "tag"},
    ]


def test_17b_each_rule_reads_the_message_as_published_not_another_rules_copy() -> None:
    """Rule ``a`` sets ``n`` = 2; rule ``b`` matches ``n = 2`` only: the message was published with ``n`` = 1,
    so ``b`` does not match (each rule's filter reads the message, not what another rule's action made)."""
    w, p = _rules_world()
    assert _ask(w, p, "com.microsoft:remove-rule", {"rule-name": "$Default"})[0]["statusCode"] == 200
    set_two = {"sql-filter": {"expression": "n = 1"}, "sql-rule-action": {"expression": "SET n = 2"}}
    assert _add(w, p, "a", set_two)["statusCode"] == 200
    mark = {"sql-filter": {"expression": "n = 2"}, "sql-rule-action": {"expression": "SET seen = 'b'"}}
    assert _add(w, p, "b", mark)["statusCode"] == 200
    assert _properties_delivered(w, p, "audit", _message("m", n=1)) == [{"n": 2, "RuleName": "a"}]


@pytest.mark.parametrize(
    ("skip", "top", "expected"),
    [
        (0, 1, ["$Default"]),
        (1, 2, ["r0", "r1"]),
        (4, 100, ["r3"]),
        (0, 2**31 - 1, ["$Default", "r0", "r1", "r2", "r3"]),
    ],
)
def test_17b_enumerate_rules_pages(skip: int, top: int, expected: list[str]) -> None:
    w, p = _rules_world()
    for i in range(4):
        assert _add(w, p, f"r{i}", _sql(f"n = {i}"))["statusCode"] == 200
    status, value = _ask(w, p, "com.microsoft:enumerate-rules", {"skip": skip, "top": top})
    assert status["statusCode"] == 200, status
    assert _names(value) == expected


@pytest.mark.parametrize(("skip", "top"), [(5, 10), (2**31 - 1, 10)])
def test_17b_enumerate_rules_beyond_the_end_is_204(skip: int, top: int) -> None:
    w, p = _rules_world()
    for i in range(4):
        assert _add(w, p, f"r{i}", _sql(f"n = {i}"))["statusCode"] == 200
    status, _ = _ask(w, p, "com.microsoft:enumerate-rules", {"skip": skip, "top": top})
    assert status["statusCode"] == 204, status


@pytest.mark.parametrize(("skip", "top"), [(-1, 10), (0, -1), ("1", 10), (0, 1.5)])
def test_17b_enumerate_rules_with_a_bad_count_is_400(skip: Any, top: Any) -> None:
    """A negative or non-integer skip or top is a bad request (as get-message-sessions answers it), not read as
    "all rules"."""
    w, p = _rules_world()
    status, _ = _ask(w, p, "com.microsoft:enumerate-rules", {"skip": skip, "top": top})
    assert status["statusCode"] == 400, status
