"""The clock through the management API (issue 16 §2): ``GET /api/clock``, ``POST /api/clock/advance``, and the
remote handle's ``clock`` over them; a 1-day ttl, a 1-hour schedule and a 2-minute transaction time-out, each
passed in well under a second of real time."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

import minibroker
from minibroker.remote import RemoteError
from minibroker.testing.peer import ScriptedPeer
from minibroker.testing.thread import ThreadedBroker
from tests.http.client import call, http_broker, open_transaction

DAY = 86400
HOUR = 3600


@pytest.fixture
def virtual() -> Iterator[ThreadedBroker]:
    with http_broker(broker={"clock": "virtual", "transaction_timeout": 120}) as running:
        yield running


@pytest.fixture
def real() -> Iterator[ThreadedBroker]:
    with http_broker() as running:
        yield running


def advance(broker: ThreadedBroker, seconds: Any) -> Any:
    started = time.monotonic()
    answer = call(broker, "POST", "/api/clock/advance", {"seconds": seconds})
    assert answer.status == 200, answer.body
    assert time.monotonic() - started < 1.0
    return answer.json


def test_get_clock_tells_the_mode_and_broker_time_as_wall_clock_seconds(virtual: ThreadedBroker) -> None:
    clock = call(virtual, "GET", "/api/clock").json
    assert clock["mode"] == "virtual"
    assert clock["now"] == pytest.approx(time.time(), abs=60)
    moved = advance(virtual, DAY)
    assert moved == {"mode": "virtual", "now": pytest.approx(clock["now"] + DAY)}
    assert call(virtual, "GET", "/api/clock").json == moved
    time.sleep(0.05)  # (real time passing does not move it)
    assert call(virtual, "GET", "/api/clock").json == moved


def test_a_one_day_ttl_and_an_hour_schedule_through_the_api(virtual: ThreadedBroker) -> None:
    post = "/api/queues/orders/messages"
    assert call(virtual, "POST", post, {"body": "perishable", "header": {"ttl": DAY}}).status == 201
    later = {"body": "later", "annotations": {"x-opt-delivery-delay": HOUR * 1000}}
    assert call(virtual, "POST", post, later).status == 201
    assert (virtual.queue("orders").stats().ready, virtual.queue("orders").stats().scheduled) == (1, 1)
    advance(virtual, HOUR - 1)
    assert virtual.queue("orders").stats().scheduled == 1
    advance(virtual, 1)
    assert [m.body for m in virtual.queue("orders").peek()] == ["perishable", "later"]
    advance(virtual, DAY - HOUR)
    assert [m.body for m in virtual.queue("orders").peek()] == ["later"]


def test_a_two_minute_transaction_time_out_through_the_api(virtual: ThreadedBroker) -> None:
    host, port = virtual.url.removeprefix("amqp://").rsplit(":", 1)
    with ScriptedPeer.connect(host, int(port)) as peer:
        open_transaction(peer)
        advance(virtual, 119)
        (txn,) = call(virtual, "GET", "/api/transactions").json
        assert txn["age_s"] == pytest.approx(119)
        advance(virtual, 1)
        stats = call(virtual, "GET", "/api/stats").json["transactions"]
        assert stats["timed_out"] == 1
        assert virtual.queue("staging").depth == 0


def test_the_clock_is_the_whole_brokers_in_every_namespace(virtual: ThreadedBroker) -> None:
    space = virtual.create_namespace("tenant")
    assert call(virtual, "POST", "/api/namespaces/tenant/clock/advance", {"seconds": 10}).status == 200
    assert call(virtual, "GET", "/api/clock").json == call(virtual, "GET", "/api/namespaces/tenant/clock").json
    assert space.clock.now == virtual.clock.now


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"seconds": -1}, "negative"),
        ({"seconds": -0.5}, "negative"),
        ({"seconds": "60"}, "expected a number"),
        ({"seconds": True}, "expected a number"),
        ({"seconds": None}, "expected a number"),
        ({"seconds": [1]}, "expected a number"),
        ({"seconds": 1e300}, "from 0 to"),
        ({"seconds": 10**400}, "from 0 to"),
        ({}, '{"seconds": N}'),
        ({"seconds": 1, "extra": 2}, '{"seconds": N}'),
        ([60], '{"seconds": N}'),
        (60, '{"seconds": N}'),
    ],
)
def test_a_bad_advance_is_400_and_moves_nothing(virtual: ThreadedBroker, body: Any, expected: str) -> None:
    before = call(virtual, "GET", "/api/clock").json
    answer = call(virtual, "POST", "/api/clock/advance", body)
    assert answer.status == 400
    assert expected in answer.json["error"]
    assert call(virtual, "GET", "/api/clock").json == before


@pytest.mark.parametrize("raw", [b"{", b'{"seconds": NaN}', b'{"seconds": Infinity}', b'{"seconds": 1e400}'])
def test_malformed_or_non_finite_json_is_400(virtual: ThreadedBroker, raw: bytes) -> None:
    assert call(virtual, "POST", "/api/clock/advance", raw=raw).status == 400


def test_advancing_a_real_clock_is_409_with_a_clear_message(real: ThreadedBroker) -> None:
    assert call(real, "GET", "/api/clock").json["mode"] == "real"
    answer = call(real, "POST", "/api/clock/advance", {"seconds": 1})
    assert answer.status == 409
    assert "--clock virtual" in answer.json["error"]
    assert call(real, "GET", "/api/clock/advance").status == 405


def test_the_remote_handle_drives_the_clock(virtual: ThreadedBroker, real: ThreadedBroker) -> None:
    assert virtual.http_url is not None
    assert real.http_url is not None
    remote = minibroker.connect(virtual.http_url)
    assert remote.clock.mode == "virtual"
    before = remote.clock.now
    remote.queue("orders").send("perishable")
    call(virtual, "POST", "/api/queues/orders/messages", {"body": "ttl", "header": {"ttl": DAY}})
    assert remote.clock.advance(DAY) == pytest.approx(before + DAY)
    assert remote.clock.now == pytest.approx(before + DAY)
    assert [m.body for m in remote.queue("orders").peek()] == ["perishable"]
    with pytest.raises(RemoteError) as refused:
        remote.clock.advance(-1)
    assert refused.value.status == 400
    with pytest.raises(RemoteError) as real_refused:
        minibroker.connect(real.http_url).clock.advance(1)
    assert real_refused.value.status == 409
