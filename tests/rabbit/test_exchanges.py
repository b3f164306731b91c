"""Exchange matching (``minibroker.broker.exchanges``) against references: topic keys against a regular
expression built from RabbitMQ's word rules (rabbit_db_topic_exchange.erl ``split_topic_key_binary``: the empty
key has no word, ``a..b`` has an empty middle word), headers against rabbit_exchange_type_headers.erl, and
RabbitMQ 4 addresses (rabbit_amqp_session.erl ``parse_target_v2_string0``)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minibroker.amqp.definitions import Error
from minibroker.broker.exchanges import (
    DEFAULT,
    FANOUT,
    TOPIC,
    Address,
    Exchange,
    binding,
    headers_match,
    parse_v2,
    predeclared,
    route,
    topic_matches,
    x_match_error,
)


def reference(pattern: str, key: str) -> bool:
    """Each word of the key ends with NUL; ``*`` is one such word, ``#`` any number of them."""
    wanted = pattern.split(".") if pattern else []
    parts = [{"*": "[^\0]*\0", "#": "(?:[^\0]*\0)*"}.get(word, re.escape(word) + "\0") for word in wanted]
    subject = "".join(w + "\0" for w in (key.split(".") if key else []))
    return re.fullmatch("".join(parts), subject) is not None


WORD = st.sampled_from(["", "a", "b", "ab"])
PATTERN_WORD = st.sampled_from(["", "a", "b", "*", "#"])
KEYS = st.lists(WORD, max_size=6).map(".".join)
PATTERNS = st.lists(PATTERN_WORD, max_size=6).map(".".join)


@given(PATTERNS, KEYS)
def test_topic_matching_agrees_with_the_reference(pattern: str, key: str) -> None:
    assert topic_matches(pattern, key) == reference(pattern, key)


@given(st.text(alphabet="ab.*#", max_size=12), st.text(alphabet="ab.", max_size=12))
def test_topic_matching_agrees_on_any_text(pattern: str, key: str) -> None:
    assert topic_matches(pattern, key) == reference(pattern, key)


@pytest.mark.parametrize(
    ("pattern", "key", "expected"),
    [
        ("#", "", True),
        ("*", "", False),  # the empty key has no word
        ("", "", True),
        ("*", ".", False),  # "." is two empty words
        ("*.*", ".", True),
        ("a.#", "a", True),
        ("a.*", "a", False),
        ("#.a.#", "b.a", True),
        ("a..b", "a..b", True),
        ("a.*.b", "a..b", True),
        ("#.#.#.#", "a", True),
    ],
)
def test_topic_edges(pattern: str, key: str, expected: bool) -> None:
    assert topic_matches(pattern, key) is expected


def test_many_hashes_stay_cheap() -> None:
    """A pattern of many ``#`` against a long key: no exponential backtracking."""
    assert topic_matches(".".join(["#"] * 200) + ".z", ".".join(["a"] * 200)) is False


@pytest.mark.parametrize(
    ("arguments", "headers", "expected"),
    [
        ({"a": 1}, {"a": 1}, True),
        ({"x-match": "all", "a": 1, "b": 2}, {"a": 1}, False),
        ({"x-match": "any", "a": 1, "b": 2}, {"a": 1}, True),
        ({"x-match": "any"}, {"a": 1}, False),  # nothing to match: any is false
        ({"x-match": "all"}, {}, True),  # nothing to match: all is true
        ({"x-match": "all", "x-k": 1}, {}, True),  # x- arguments skipped
        ({"x-match": "all-with-x", "x-k": 1}, {}, False),
        ({"x-match": "any-with-x", "x-k": 1}, {"x-k": 1}, True),
        ({"a": None}, {"a": "anything"}, True),  # a void argument: presence
        ({"a": None}, {}, False),
        ({"a": 1}, {"a": True}, False),  # a bool is no number
        ({"a": "1"}, {"a": 1}, False),
    ],
)
def test_headers_matching(arguments: dict[str, Any], headers: dict[str, Any], expected: bool) -> None:
    assert headers_match(arguments, headers) is expected


def test_x_match_validation() -> None:
    assert x_match_error({"x-match": "any"}) is None
    assert x_match_error({}) is None
    assert "Invalid x-match field value" in (x_match_error({"x-match": "some"}) or "")
    assert "Invalid x-match field type" in (x_match_error({"x-match": 1}) or "")


def test_route_follows_exchange_bindings_once_and_ends_cycles() -> None:
    exchanges = predeclared()
    exchanges["x1"] = Exchange("x1", FANOUT)
    exchanges["x2"] = Exchange("x2", TOPIC)
    exchanges["amq.topic"].bindings[binding("exchange", "x1", "a.*")] = {}
    exchanges["x1"].bindings[binding("queue", "q1", "")] = {}
    exchanges["x1"].bindings[binding("exchange", "x2", "")] = {}
    exchanges["x2"].bindings[binding("queue", "q2", "#")] = {}
    exchanges["x2"].bindings[binding("queue", "q1", "#")] = {}
    exchanges["x2"].bindings[binding("exchange", "x1", "#")] = {}  # a cycle
    assert route(exchanges, exchanges["amq.topic"], "a.b", dict) == ["q1", "q2"]
    assert route(exchanges, exchanges["amq.topic"], "b", dict) == []
    assert route(exchanges, exchanges[DEFAULT], "orders", dict) == ["orders"]


def test_equal_bindings_are_one() -> None:
    assert binding("queue", "q", "k", {"b": 1, "a": 2}) == binding("queue", "q", "k", {"a": 2, "b": 1})


@pytest.mark.parametrize(
    ("address", "source", "expected"),
    [
        ("/queues/q", True, Address("q")),
        ("/queues/a/b", False, Address("a/b")),
        ("/queues/%2F", False, Address("/")),
        ("/exchanges/amq.topic/a.b", False, Address(None, "amq.topic", "a.b")),
        ("/exchanges/amq.topic", False, Address(None, "amq.topic", None)),
        ("/exchanges/amq.topic/", False, Address(None, "amq.topic", "")),
        ("/exchanges/amq.default/q", False, Address(None, DEFAULT, "q")),
        ("/exchanges/x%2Fy/k%2Fz", False, Address(None, "x/y", "k/z")),
    ],
)
def test_v2_addresses(address: str, source: bool, expected: Address) -> None:
    assert parse_v2(address, source=source) == expected


@pytest.mark.parametrize(
    ("address", "source"),
    [
        ("/queues/", True),
        ("/queues/%zz", False),
        ("/exchanges/amq.topic/a", True),  # a source is a queue
        ("/exchanges//k", False),
        ("/exchanges/x/k/more", False),
        ("/exchanges/x/%g1", False),
        ("/topic/x", False),
    ],
)
def test_bad_v2_addresses_are_invalid_field(address: str, source: bool) -> None:
    found = parse_v2(address, source=source)
    assert isinstance(found, Error)
    assert found.condition == "amqp:invalid-field"
