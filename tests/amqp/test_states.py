"""Delivery states and outcomes (``minibroker.amqp.states``; Part 3 §3.4, Part 4 §4.5)."""

from __future__ import annotations

import pytest

from minibroker.amqp.definitions import (
    Accepted,
    Declared,
    Modified,
    Open,
    Received,
    Rejected,
    Released,
    TransactionalState,
)
from minibroker.amqp.states import as_delivery_state, is_outcome

OUTCOMES = [Accepted(), Rejected(), Released(), Modified(delivery_failed=True)]
OTHER_STATES = [Received(section_number=0, section_offset=0), Declared(txn_id=b"t"), TransactionalState(txn_id=b"t")]
NOT_STATES = [None, Open(container_id="c"), "accepted", 0]


@pytest.mark.parametrize("state", OUTCOMES, ids=lambda s: type(s).__name__)
def test_the_four_outcomes_are_terminal(state: object) -> None:
    assert is_outcome(state)
    assert as_delivery_state(state) is state


@pytest.mark.parametrize("state", OTHER_STATES, ids=lambda s: type(s).__name__)
def test_received_declared_and_transactional_state_are_states_but_no_outcome(state: object) -> None:
    assert not is_outcome(state)
    assert as_delivery_state(state) is state


@pytest.mark.parametrize("value", NOT_STATES, ids=repr)
def test_anything_else_a_peer_may_send_is_no_state(value: object) -> None:
    assert not is_outcome(value)
    assert as_delivery_state(value) is None
