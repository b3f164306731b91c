"""Service Bus entity properties (issue 17 items 5 and 11): what a queue, topic or subscription is configured with.

The names follow the Service Bus emulator's ``Config.json`` (``LockDuration``, ``MaxDeliveryCount``,
``RequiresSession``, ``DefaultMessageTimeToLive``, ``DeadLetteringOnMessageExpiration``); the defaults are
Service Bus's own. An entity nobody configured has the defaults. Entities are named by their path
(``orders``, ``events/Subscriptions/audit``) and, as in Service Bus, compared without regard to case.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RuleSpec:
    """A subscription rule as configured (the emulator's ``Rules`` entries) or added by ``add-rule``: a filter
    (SQL or correlation; neither is the true filter) and an optional SQL action."""

    name: str
    sql_filter: str | None = None
    """A SQL filter expression (``SqlFilter.SqlExpression``)."""
    correlation_filter: Mapping[str, Any] | None = None
    """A correlation filter's fields by their snake_case names (``correlation_id``, ``message_id``, ``to``,
    ``reply_to``, ``subject``, ``session_id``, ``reply_to_session_id``, ``content_type``) and ``properties``
    (the application-properties to match)."""
    sql_action: str | None = None
    """A SQL rule action (``SqlRuleAction.SqlExpression``), or None."""


DEFAULT_RULE = "$Default"
"""The rule a subscription has when none is configured: the true filter (Service Bus's ``$Default``)."""


@dataclass(frozen=True)
class EntityProperties:
    """How one Service Bus entity behaves."""

    lock_duration: float = 60.0
    """Seconds a peek-lock (or a session lock) lasts, on the broker's clock."""
    max_delivery_count: int = 10
    """Deliveries after which a message is dead-lettered with reason ``MaxDeliveryCountExceeded``."""
    requires_session: bool = False
    """Whether receivers must name a session (``com.microsoft:session-filter``)."""
    default_message_ttl: float | None = None
    """Seconds a message lives when it says nothing itself (None: for ever)."""
    dead_lettering_on_message_expiration: bool = False
    """Whether an expired message goes to the dead-letter queue rather than away."""
    rules: tuple[RuleSpec, ...] | None = field(default=None)
    """A subscription's rules when it is created (None: the ``$Default`` rule, which takes every message)."""


DEFAULT = EntityProperties()


def key(path: str) -> str:
    """The key an entity's properties are kept under: its path, without regard to case."""
    return path.lower()
