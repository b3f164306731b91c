"""Review of issue 16: ``$txn-check`` messages with garbage, on the pure core; never a crash, a hang or a frame
the peer's max-frame-size cannot take."""

from __future__ import annotations

from typing import Any

import pytest

from minibroker.amqp.definitions import Accepted, Rejected, TransactionalState
from minibroker.amqp.types import Symbol
from minibroker.broker.checkback import CHECK_ADDRESS, CheckBackSettings
from minibroker.broker.core import Broker
from minibroker.broker.settings import BrokerSettings
from tests.broker.test_in_doubt import PRODUCER, checker, declare, producer, received, states, tell
from tests.broker.txn_driver import Peer, World, payload


def world(**check: Any) -> World:
    return World(Broker(BrokerSettings(check_back=CheckBackSettings(**check))))


def small_checker(w: World) -> Peer:
    """A ``$txn-check`` sender and receiver on a connection announcing the smallest max-frame-size (512)."""
    peer = w.connect(PRODUCER, max_frame_size=512)
    peer.attach_consumer("checks", CHECK_ADDRESS, presettled=False, default_outcome=None)
    peer.flow("checks", 100)
    peer.attach_producer("answers", CHECK_ADDRESS)
    w.settle()
    return peer


@pytest.mark.parametrize(
    "props",
    [
        {"txn-id": "zz"},
        {"txn-id": "abc"},  # odd length
        {"txn-id": ""},
        {"txn-id": 12},
        {"txn-id": "00", "outcome": "COMMIT"},
        {"txn-id": "00", "outcome": 1},
        {"txn-id": "00", "query": "true"},
        {"txn-id": "00", "query": True, "outcome": "commit"},
        {"txn-id": "00", "query": False},
        {"txn-id": "00", "outcome": None},
        {"txn-id": "00", "outcome": "unknown"},
        {"txn-id": " 00 "},
        {"other": 1},
    ],
)
def test_garbage_check_messages_are_answered_and_change_nothing(props: dict[str, Any]) -> None:
    """Every malformed or pointless ``$txn-check`` message is answered (accepted or rejected), the broker keeps
    serving, and a transaction in doubt stays in doubt."""
    w = world()
    peer = producer(w)
    txn = declare(w, peer)
    peer.transfer("out", payload("m1"), state=TransactionalState(txn_id=txn))
    w.settle()
    peer.eof()
    w.settle()
    back = checker(w)
    state, _ = tell(w, back, **{k.replace("-", "_"): v for k, v in props.items()})
    assert isinstance(state, Rejected | Accepted)
    assert states(w) == [(txn, "in-doubt")]
    assert w.broker.internal_errors == 0


@pytest.mark.parametrize("hexed", [True, False])
def test_a_huge_txn_id_does_not_make_an_oversized_disposition(hexed: bool) -> None:
    """A long txn-id (valid hex, unknown; or not hex at all) is rejected; the rejection's description must not
    echo the whole value into a disposition larger than the peer's max-frame-size (a disposition cannot be
    split): the connection stays up and the next message is answered."""
    w = world()
    back = small_checker(w)
    value = ("ab" if hexed else "zz") * 400
    state, seen = tell(w, back, txn_id=value, outcome="commit")
    assert isinstance(state, Rejected)
    assert not back.conn.finished
    assert seen[back].closed is None or not seen[back].closed
    state, _ = tell(w, back, txn_id="00", outcome="rollback")
    assert isinstance(state, Rejected)
    assert w.broker.internal_errors == 0


def test_a_huge_query_is_answered_or_refused_cleanly() -> None:
    """A query for a long txn-id is answered ``unknown`` on the check link (a transfer, may be split)."""
    w = world()
    back = small_checker(w)
    value = "ab" * 400
    state, seen = tell(w, back, txn_id=value, query=True)
    assert isinstance(state, Accepted | Rejected)
    if isinstance(state, Accepted):
        got = received(seen, back)
        assert [p["state"] for _, p in got] == ["unknown"]
    assert not back.conn.finished
    assert w.broker.internal_errors == 0


def test_symbol_valued_outcome_is_refused_not_crashed() -> None:
    """Application-properties values of other AMQP types (a symbol ``commit``) are refused or taken, never a
    crash."""
    w = world()
    back = checker(w)
    state, _ = tell(w, back, txn_id="00", outcome=Symbol("commit"))
    assert isinstance(state, Rejected)
    assert w.broker.internal_errors == 0
