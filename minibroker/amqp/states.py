"""Delivery states and outcomes, as the types the engine and the broker pass them as (Part 2 §2.7.5-6 ``state``).

A delivery's state is one of the messaging states (Part 3 §3.4: ``received``, and the four outcomes, which are
terminal) or one of the transaction states (Part 4 §4.5: ``declared``, the outcome of a declare, and
``transactional-state``, which wraps an outcome staged in a transaction). The wire type of a ``state`` field is
``*`` (any type providing delivery-state), and the decoder does not narrow it: what the peer sent is an
``object`` until a check such as ``is_outcome`` says more.
"""

from __future__ import annotations

from typing import TypeAlias, TypeGuard

from minibroker.amqp.definitions import (
    Accepted,
    Declared,
    Modified,
    Received,
    Rejected,
    Released,
    TransactionalState,
)

Outcome: TypeAlias = Accepted | Rejected | Released | Modified
"""A terminal delivery state (Part 3 §3.4.2-5): what finally happens to a delivery."""

DeliveryState: TypeAlias = Outcome | Received | Declared | TransactionalState
"""Any delivery state (Part 3 §3.4, Part 4 §4.5.3 and §4.5.5): what a transfer or disposition carries."""


def is_outcome(state: object) -> TypeGuard[Outcome]:
    """True for the terminal delivery states (Part 3 §3.4)."""
    return isinstance(state, Accepted | Rejected | Released | Modified)


def as_delivery_state(value: object) -> DeliveryState | None:
    """``value`` when it is a delivery state, else None (a ``state`` a peer sent, before the broker echoes it)."""
    return (
        value
        if isinstance(value, Accepted | Rejected | Released | Modified | Received | Declared | TransactionalState)
        else None
    )


__all__ = ["DeliveryState", "Outcome", "as_delivery_state", "is_outcome"]
