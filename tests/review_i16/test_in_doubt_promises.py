"""Review of issue 16 §4, promise by promise, on the pure core: outcome retention, the embedder's resolution with
bad ids, and the check message's exact format."""

from __future__ import annotations

from typing import Any

import pytest

from minibroker.amqp.definitions import TransactionalState
from minibroker.broker.checkback import CheckBackSettings
from minibroker.broker.core import Broker
from minibroker.broker.settings import BrokerSettings
from tests.broker.test_in_doubt import checker, declare, lost, producer, ready, received, tell
from tests.broker.txn_driver import BrokerView, World, payload


def world(**check: Any) -> World:
    return World(Broker(BrokerSettings(check_back=CheckBackSettings(**check))))


def test_outcomes_are_forgotten_after_outcome_retention() -> None:
    """A committed check-back transaction is ``committed`` to a query within ``outcome_retention``, ``unknown``
    after it (the clock moved by the broker's timer path only)."""
    w = world(outcome_retention=600)
    peer = producer(w)
    txn = declare(w, peer)
    peer.transfer("out", payload("m1"), state=TransactionalState(txn_id=txn))
    peer.discharge("ctl", txn, fail=False)
    w.settle()
    assert ready(w) == ["m1"]
    back = checker(w)
    w.advance(599)
    _, seen = tell(w, back, txn_id=txn.hex(), query=True)
    assert [p["state"] for _, p in received(seen, back)] == ["committed"]
    w.advance(2)
    _, seen = tell(w, back, txn_id=txn.hex(), query=True)
    assert [p["state"] for _, p in received(seen, back)] == ["unknown"]
    assert w.broker.internal_errors == 0


@pytest.mark.parametrize("bad", [123, None, 1.5, ["00"]])
def test_resolving_with_an_id_of_the_wrong_type_is_a_clear_error(bad: Any) -> None:
    """``broker.resolve_transaction`` with something that is neither bytes nor hex text: a ``TypeError`` or
    ``ValueError`` or ``LookupError`` naming the problem, never an ``AttributeError`` from deep inside, and the
    in-doubt transaction stays as it was."""
    w = world()
    txn = lost(w)
    view = BrokerView(w)
    with pytest.raises((TypeError, ValueError, LookupError)):
        view.resolve_transaction(bad)
    assert [(t.txn_id, t.state) for t in view.transactions] == [(txn, "in-doubt")]
    assert w.broker.internal_errors == 0


def test_the_check_message_format_is_exactly_the_promised_one() -> None:
    """correlation-id = txn-id (binary), application-properties exactly {"txn-id": hex, "posts": N, "check": k}."""
    w2 = world(check_immunity=60, check_interval=30)
    txn = lost(w2, posts=("a", "b"))
    back = checker(w2)
    w2.advance(60)
    first = received(w2.settle(), back)
    w2.advance(30)
    second = received(w2.settle(), back)
    assert first == [(txn, {"txn-id": txn.hex(), "posts": 2, "check": 1})]
    assert second == [(txn, {"txn-id": txn.hex(), "posts": 2, "check": 2})]
