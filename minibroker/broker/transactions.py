"""Transactions (Part 4): what one transaction has staged, and the records that describe transactions.

Theory of operation
-------------------
A ``Transaction`` belongs to one connection and is usable from every session of it (§4.1: the txn-id is
scoped to the connection here; we advertise ``amqp:multi-ssns-per-txn``). It stages three kinds of work,
applied all together by a commit and undone by a rollback (``coordinator.py``, the only code that changes a
``Transaction``):

- *posts* (§4.4.1): messages received with ``transactional-state``; invisible until commit, when they reach
  their nodes in the order they were posted. A post through the anonymous relay to an address with no node
  is staged against a ``Deferred`` node, created only by the commit;
- *acquisitions* (§4.4.3): deliveries sent on a link whose flow named the transaction;
- *outcomes* (§4.4.2): outcomes a consumer gave, with ``transactional-state``, to deliveries we sent.

A transaction fails (``failed`` holds the error) when some staged work could not be accepted, such as a post
to a node that is full; its commit then rolls back with ``amqp:transaction:rollback``. Ids come from an
injected generator, so they are unique for the broker's lifetime without this module drawing randomness of
its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import count
from typing import Any, NamedTuple

from minibroker.amqp.definitions import Accepted, Error, TransactionalState
from minibroker.amqp.fastpath import control_value
from minibroker.amqp.states import Outcome
from minibroker.broker.exchanges import Route
from minibroker.broker.links import Consumer, Controller, Dispatched
from minibroker.broker.message import Message
from minibroker.broker.namespace import Namespace, Node
from minibroker.engine.connection import ServerConnection

MAX_TXN_ID = 32  # DESIGN §4: txn-ids are short opaque binaries, at most 32 bytes
_ACCEPTED = Accepted()  # field-less, never changed: every transaction's provisional outcome shares it (issue 19)


def counter_ids(prefix: bytes = b"") -> Iterator[bytes]:
    """Deterministic txn-ids: ``prefix`` followed by a big-endian counter (never reused)."""
    for n in count(1):
        yield prefix + n.to_bytes(8, "big")


class Deferred(NamedTuple):
    """An address with no node yet, named by a transactional anonymous-relay post: created at commit."""

    namespace: Namespace
    name: str
    kind: str | None


class Post(NamedTuple):
    """A message posted under a transaction, and where it goes."""

    target: Node | Route | Deferred
    """Its node, its way into an exchange (routed at commit, as RabbitMQ routes in tx.commit), or a node to make."""
    message: Message

    @property
    def address(self) -> str:
        return self.target.name


class Transaction:
    """One open transaction and its staged work."""

    __slots__ = (
        "accepted_state",
        "acquired",
        "check_back",
        "conn",
        "consumers",
        "controller",
        "created",
        "deadline",
        "delayed",
        "entity",
        "failed",
        "id",
        "outcomes",
        "posts",
        "staged_bytes",
        "state",
    )

    def __init__(self, txn_id: bytes, conn: ServerConnection, controller: Controller, created: float) -> None:
        self.id = txn_id
        self.conn = conn
        self.controller = controller
        self.created = created
        self.delayed = 0
        """Posts in it that a ``delay`` fault holds back (``Coordinator.hold_post``): a commit meanwhile fails."""
        self.deadline: float | None = None
        """When it times out (None: not yet timed: never, or from its first operation)."""
        self.entity: str | None = None
        """The Service Bus entity its work is on, the first it touched (``Personality.one_entity``)."""
        # state: what transfers acquired under it carry (§4.4.3), made when a link first acquires under it;
        # accepted_state: the provisional outcome of its posts, one object so their answers merge into ranges
        self.state: TransactionalState | None = None
        self.accepted_state = TransactionalState(txn_id=txn_id, outcome=_ACCEPTED)
        self.posts: list[Post] = []
        self.staged_bytes = 0
        # acquired: deliveries sent under it, in the order sent (an ordered set); outcomes: deliveries it holds
        # an outcome for, with the outcome its commit applies; consumers: links whose flow named it
        self.acquired: dict[Dispatched, None] = {}
        self.outcomes: dict[Dispatched, Outcome] = {}
        self.consumers: dict[Consumer, None] = {}  # (an ordered set: they stop and start again in this order)
        self.failed: Error | None = None
        self.check_back = controller.check_back
        """Held in doubt when its connection is lost, and its outcome remembered (``checkback.py``)."""

    def held(self) -> list[Dispatched]:
        """Every delivery whose fate it decides, acquired ones first."""
        acquired = self.acquired
        if not acquired:  # the usual case, one or the other: no generator to sift (issue 19)
            return list(self.outcomes)
        if not self.outcomes:
            return list(acquired)
        return [*acquired, *(d for d in self.outcomes if d not in acquired)]

    def __repr__(self) -> str:
        return (
            f"Transaction({self.id.hex()}, posts={len(self.posts)}, acquired={len(self.acquired)}, "
            f"outcomes={len(self.outcomes)})"
        )


@dataclass(frozen=True)
class TransactionInfo:
    """A snapshot of one open or in-doubt transaction, for tests and introspection."""

    txn_id: bytes
    connection: str
    """The container-id of the connection that declared it."""
    age: float
    posts: int
    retirements: int
    """Deliveries it holds an outcome for (§4.4.2)."""
    acquisitions: int
    """Deliveries sent under it (§4.4.3)."""
    failed: str | None
    staged_addresses: tuple[str, ...]
    state: str = "open"
    """"open", or "in-doubt": its connection was lost and it waits for a resolution (``checkback.py``)."""


@dataclass(frozen=True)
class TransactionStats:
    """The transaction counters over the broker's lifetime, at one moment (a snapshot: it never changes)."""

    declared: int = 0
    committed: int = 0
    rolled_back: int = 0
    timed_out: int = 0
    """Rolled back because they outlived ``[broker] transaction_timeout`` (counted in ``rolled_back`` too)."""
    failed_commits: int = 0
    """Discharges with fail=false that rolled back instead (§4.4.4: ``amqp:transaction:rollback``)."""
    in_doubt: int = 0
    """Held in doubt when their connection was lost (``checkback.py``)."""
    abandoned: int = 0
    """In-doubt ones rolled back after ``check_max`` unanswered checks (counted in ``rolled_back`` too)."""


class TransactionCounters:
    """The coordinator's own, live counters; embedders and tests get ``snapshot()`` copies."""

    __slots__ = ("abandoned", "committed", "declared", "failed_commits", "in_doubt", "rolled_back", "timed_out")

    def __init__(self) -> None:
        self.declared = 0
        self.committed = 0
        self.rolled_back = 0
        self.timed_out = 0
        self.failed_commits = 0
        self.in_doubt = 0
        self.abandoned = 0

    def snapshot(self) -> TransactionStats:
        return TransactionStats(
            declared=self.declared,
            committed=self.committed,
            rolled_back=self.rolled_back,
            timed_out=self.timed_out,
            failed_commits=self.failed_commits,
            in_doubt=self.in_doubt,
            abandoned=self.abandoned,
        )


def info(txn: Transaction, now: float, state: str = "open") -> TransactionInfo:
    """Describe ``txn`` as of ``now`` (``state``: "open" or "in-doubt")."""
    remote = txn.conn.remote_open
    return TransactionInfo(
        txn_id=txn.id,
        connection=str(remote.container_id) if remote is not None else "",
        age=max(0.0, now - txn.created),
        posts=len(txn.posts),
        retirements=len(txn.outcomes),
        acquisitions=len(txn.acquired),
        failed=str(txn.failed.condition) if txn.failed is not None else None,
        staged_addresses=tuple(sorted({post.address for post in txn.posts})),
        state=state,
    )


def control_body(payload: bytes) -> Any:
    """The value of the amqp-value section of a coordinator message (§4.3), or None. Only that section is
    decoded; ``DecodeError`` when it does not decode, or the sections before it cannot be told apart."""
    # declare and discharge in their usual encodings skip the general codec (issue 19: 2 of a transaction's 3)
    return control_value(payload)
