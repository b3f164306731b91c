"""Model tests (hypothesis) of exchange routing: ``exchanges.route`` and ``headers_match`` against small
references written from RabbitMQ's rules (rabbit_exchange_type_headers.erl ``match_all``/``match_any``;
rabbit_exchange.erl ``route``: a message reaches each queue once, however many paths lead there), and the broker's
routing of 1.0 posts against the same reference."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.amqp.definitions import Accepted, Released
from minibroker.broker.exchanges import Exchange, binding, headers_match, route, topic_matches
from tests.personalities.harness import answer
from tests.rabbit.helpers import message, peer, rabbit_world, ready

NAMES = st.sampled_from(["a", "b", "x-c"])
VALUES = st.sampled_from([1, 2, "1", True, None])


def reference_headers(arguments: dict[str, Any], headers: dict[str, Any]) -> bool:
    mode = arguments.get("x-match", "all")
    if mode not in ("any", "any-with-x", "all-with-x"):
        mode = "all"
    with_x = mode.endswith("-with-x")
    verdicts = []
    for name, value in arguments.items():
        if name == "x-match" or (name.startswith("x-") and not with_x):
            continue
        if value is None:
            verdicts.append(name in headers)
        else:
            verdicts.append(name in headers and type(headers[name]) is type(value) and headers[name] == value)
    return any(verdicts) if mode.startswith("any") else all(verdicts)


@given(
    st.dictionaries(NAMES, VALUES, max_size=3),
    st.sampled_from([None, "all", "any", "all-with-x", "any-with-x"]),
    st.dictionaries(NAMES, VALUES.filter(lambda v: v is not None), max_size=3),
)
def test_headers_match_agrees_with_the_reference(
    arguments: dict[str, Any], mode: str | None, headers: dict[str, Any]
) -> None:
    if mode is not None:
        arguments = {**arguments, "x-match": mode}
    assert headers_match(arguments, headers) == reference_headers(arguments, headers)


KEYS = st.lists(st.sampled_from(["a", "b", ""]), max_size=3).map(".".join)
PATTERNS = st.lists(st.sampled_from(["a", "b", "*", "#"]), max_size=3).map(".".join)
QUEUES = ["q0", "q1", "q2"]
EXCHANGES = ["x0", "x1", "x2"]
BINDINGS = st.lists(st.tuples(st.sampled_from(EXCHANGES), st.sampled_from(QUEUES + EXCHANGES), PATTERNS), max_size=8)


def reference_route(bindings: list[tuple[str, str, str]], start: str, key: str) -> set[str]:
    """Every queue reachable from ``start`` along matching bindings (each exchange visited once)."""
    reached: set[str] = set()
    seen = {start}
    frontier = [start]
    while frontier:
        source = frontier.pop()
        for exchange, destination, pattern in bindings:
            if exchange != source or not topic_matches(pattern, key):
                continue
            if destination in QUEUES:
                reached.add(destination)
            elif destination not in seen:
                seen.add(destination)
                frontier.append(destination)
    return reached


@given(BINDINGS, KEYS)
def test_route_agrees_with_the_reference(bindings: list[tuple[str, str, str]], key: str) -> None:
    exchanges = {name: Exchange(name, "topic") for name in EXCHANGES}
    for exchange, destination, pattern in bindings:
        kind = "queue" if destination in QUEUES else "exchange"
        exchanges[exchange].bindings[binding(kind, destination, pattern)] = {}
    found = route(exchanges, exchanges["x0"], key, dict)
    assert len(found) == len(set(found))  # each queue once
    assert set(found) == reference_route(bindings, "x0", key)


@settings(max_examples=40, deadline=None)
@given(BINDINGS, st.lists(KEYS, min_size=1, max_size=4))
def test_the_broker_routes_1_0_posts_as_the_reference(bindings: list[tuple[str, str, str]], keys: list[str]) -> None:
    """A 1.0 producer on ``/exchanges/x0`` (routing key: the subject); each message reaches the queues the
    reference reaches, once each, and is released when it reaches none."""
    w = rabbit_world()
    rabbit = w.broker.rabbit
    for name in EXCHANGES:
        rabbit.declare_exchange(None, name, "topic")
    for name in QUEUES:
        rabbit.declare_queue(None, name)
    for exchange, destination, pattern in bindings:
        if destination in QUEUES:
            rabbit.bind_queue(None, destination, exchange, pattern)
        else:
            rabbit.bind_exchange(None, destination, exchange, pattern)
    p = peer(w)
    p.attach_producer("out", "/exchanges/x0")
    w.settle()
    expected: dict[str, list[str]] = {q: [] for q in QUEUES}
    for n, key in enumerate(keys):
        reached = reference_route(bindings, "x0", key)
        state = answer(w, p, p.transfer("out", message(f"m{n}", subject=key)))[0]
        assert isinstance(state, Accepted if reached else Released), (key, reached)
        for name in reached:
            expected[name].append(f"m{n}")
    assert {q: ready(w, q) for q in QUEUES} == expected
