"""Fault injection (issue 16 §1): rules that make the broker misbehave on command, at its decision points.

Theory of operation
-------------------
A rule names a *point* (where the broker decides something: an attach, a declare, a discharge, a transactional
post, a transfer arriving, a delivery leaving, a connection opening) and an *action* (what to do instead of the
normal answer). Each matching event is counted: the first ``after`` are let through, then the rule fires ``times``
times (0: on every later match). A rule may be narrowed to an ``address`` (the node, ``"$coordinator"`` for a
coordinator link; at point ``connection``, the hostname the client's open names) and to a ``container_id`` (the
client's). The rules are tried in the order they were added; the
first that fires wins, and the rules after it do not see that event.

This module is the registry only: it validates rules (``FaultSpec``), counts and logs firings (logger
``minibroker.faults``, with the rule's id), and builds the error a rule answers with. The hooks at the decision
points (``endpoints.py``, ``coordinator.py``, ``dispatch.py``, ``core.py``) apply the action; each starts with one
truthiness test of ``Faults.rules`` (a list mutated in place, shared with the hooks), so a broker with no rules pays
nothing more.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from minibroker.amqp.definitions import Error
from minibroker.amqp.errors import Condition
from minibroker.amqp.types import Symbol
from minibroker.engine.connection import ServerConnection

log = logging.getLogger("minibroker.faults")

POINTS: dict[str, tuple[str, ...]] = {
    "attach": ("refuse", "detach"),
    "declare": ("reject", "detach", "delay", "drop-connection"),
    "post": ("reject", "rollback-only"),
    "discharge": ("reject", "delay", "detach", "drop-connection", "lose-outcome"),
    "transfer": ("reject", "release", "modify", "delay", "drop-connection"),
    "deliver": ("delay", "drop-connection"),
    "connection": ("close", "drop"),
}
"""Each point and the actions a rule may take there."""

COORDINATOR_ADDRESS = "$coordinator"
"""The address fault rules use for a coordinator link (points ``attach``, ``declare`` and ``discharge``)."""

SHORT_CONDITIONS: dict[str, str] = {
    "rollback": Condition.TRANSACTION_ROLLBACK.value,
    "timeout": Condition.TRANSACTION_TIMEOUT.value,
    "unknown-id": Condition.UNKNOWN_TXN_ID.value,
}
"""Short names of the transaction conditions (a discharge ``reject`` usually takes one of them)."""

CONDITIONS: tuple[str, ...] = (*SHORT_CONDITIONS, *(c.value for c in Condition))
"""Every condition a rule may name: the short names, then each AMQP condition symbol."""

_DEFAULT_CONDITIONS: dict[str, Condition] = {
    "declare": Condition.RESOURCE_LIMIT_EXCEEDED,
    "post": Condition.TRANSACTION_ROLLBACK,
    "discharge": Condition.TRANSACTION_ROLLBACK,
    "connection": Condition.CONNECTION_FORCED,
    "attach": Condition.NOT_ALLOWED,
    "transfer": Condition.NOT_ALLOWED,
}
"""The condition of a rule that names none, by point."""


@dataclass(frozen=True)
class FaultSpec:
    """One rule as given (``broker.faults.add``, ``POST /api/faults``, a ``[[faults]]`` table), validated.

    ``condition`` is kept as the full symbol (a short name such as ``rollback`` is expanded)."""

    point: str
    action: str
    times: int = 1
    after: int = 0
    condition: str | None = None
    description: str | None = None
    delay: float | None = None
    address: str | None = None
    container_id: str | None = None

    def __post_init__(self) -> None:
        actions = POINTS.get(self.point)
        if actions is None:
            raise ValueError(f"point: unknown fault point {self.point!r} (known points: {', '.join(POINTS)})")
        if self.action not in actions:
            raise ValueError(
                f"action: {self.action!r} is no action of point {self.point!r} (its actions: {', '.join(actions)})"
            )
        for name in ("times", "after"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name}: expected an integer of 0 or more, got {value!r}")
        if self.condition is not None:
            condition = SHORT_CONDITIONS.get(self.condition, self.condition)
            if condition not in CONDITIONS:
                raise ValueError(f"condition: unknown condition {self.condition!r} (known: {', '.join(CONDITIONS)})")
            object.__setattr__(self, "condition", condition)
        if self.delay is not None:
            if isinstance(self.delay, bool) or not isinstance(self.delay, int | float):
                raise ValueError(f"delay: expected a number of seconds, got {self.delay!r}")
            if not math.isfinite(self.delay) or self.delay < 0:
                raise ValueError(f"delay: expected a finite number of seconds of 0 or more, got {self.delay!r}")
        if self.action == "delay" and self.delay is None:
            raise ValueError("delay: the action 'delay' needs a delay in seconds")
        for name in ("description", "address", "container_id"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name}: expected a string, got {value!r}")

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> FaultSpec:
        """A rule from a JSON object or a TOML table (``ValueError`` naming the field on an unknown or bad one)."""
        known = {f.name for f in dataclasses.fields(cls)}
        for key in raw:
            if key not in known:
                raise ValueError(f"{key}: unknown field (known fields: {', '.join(sorted(known))})")
        for key in ("point", "action"):
            if key not in raw:
                raise ValueError(f"{key}: missing (known points and their actions: {_points_shown()})")
            if not isinstance(raw[key], str):
                raise ValueError(f"{key}: expected a string, got {raw[key]!r}")
        return cls(**raw)

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class FaultInfo(FaultSpec):
    """A rule as ``broker.faults.list()`` shows it: its fields, its id, and how often it fired (``hits``)."""

    id: int = 0
    hits: int = 0

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> FaultInfo:
        return cls(**raw)


def _points_shown() -> str:
    return "; ".join(f"{point}: {', '.join(actions)}" for point, actions in POINTS.items())


class FaultRule:
    """A rule in the registry: its spec, its id, and its counts."""

    __slots__ = ("hits", "id", "seen", "spec")

    def __init__(self, rule_id: int, spec: FaultSpec) -> None:
        self.id = rule_id
        self.spec = spec
        self.seen = 0
        """Matching events so far (the first ``after`` are let through)."""
        self.hits = 0
        """Times it fired."""

    @property
    def action(self) -> str:
        return self.spec.action

    @property
    def delay(self) -> float:
        return self.spec.delay or 0.0

    def error(self) -> Error:
        """The error this rule answers with: its condition (by default one that fits its point) and description."""
        spec = self.spec
        condition = spec.condition or _DEFAULT_CONDITIONS.get(spec.point, Condition.INTERNAL_ERROR)
        description = spec.description or f"fault injected by rule {self.id} ({spec.point} {spec.action})"
        return Error(condition=Symbol(condition), description=description)

    def info(self) -> FaultInfo:
        return FaultInfo(**dataclasses.asdict(self.spec), id=self.id, hits=self.hits)


def container_of(conn: ServerConnection) -> str:
    """The container-id ``conn``'s peer gave in its open ("" before it came)."""
    remote = conn.remote_open
    return str(remote.container_id) if remote is not None else ""


MAX_RULES = 1000
"""Rules one broker holds at once (every event walks them): one more is refused."""


class Faults:
    """The fault rules of one broker."""

    def __init__(self) -> None:
        self.rules: list[FaultRule] = []
        """The rules in the order added (mutated in place: the hooks hold this list and test it for emptiness)."""
        self._ids = itertools.count(1)

    def add(self, spec: FaultSpec) -> FaultRule:
        if len(self.rules) >= MAX_RULES:
            raise ValueError(f"at most {MAX_RULES} fault rules at once; remove some first (DELETE /api/faults)")
        rule = FaultRule(next(self._ids), spec)
        self.rules.append(rule)
        log.info("fault rule %d added: %s %s", rule.id, spec.point, spec.action)
        return rule

    def list(self) -> list[FaultInfo]:
        """Every rule with its hits, in the order added (exhausted ones too, until removed)."""
        return [rule.info() for rule in self.rules]

    def remove(self, rule_id: int) -> bool:
        """Remove rule ``rule_id``; whether there was one."""
        for index, rule in enumerate(self.rules):
            if rule.id == rule_id:
                del self.rules[index]
                return True
        return False

    def clear(self) -> None:
        self.rules.clear()

    def fire(self, point: str, conn: ServerConnection | None = None, address: str | None = None) -> FaultRule | None:
        """The rule that fires on this event at ``point`` (for ``conn``'s container, on ``address``), counted and
        logged; None when none does."""
        container: str | None = None
        for rule in self.rules:
            spec = rule.spec
            if spec.point != point or (spec.address is not None and spec.address != address):
                continue
            if spec.container_id is not None:
                if container is None:
                    container = container_of(conn) if conn is not None else ""
                if spec.container_id != container:
                    continue
            rule.seen += 1
            if rule.seen <= spec.after or (spec.times and rule.hits >= spec.times):
                continue
            rule.hits += 1
            log.warning(
                "fault rule %d fired: %s %s (address %r, connection %s, hit %d)",
                rule.id,
                point,
                spec.action,
                address,
                conn.conn_id if conn is not None else "-",
                rule.hits,
            )
            return rule
        return None


__all__ = [
    "CONDITIONS",
    "COORDINATOR_ADDRESS",
    "POINTS",
    "SHORT_CONDITIONS",
    "FaultInfo",
    "FaultRule",
    "FaultSpec",
    "Faults",
]
