"""Transactions (Part 4): the registry of open transactions and the work each has staged.

Theory of operation
-------------------
A ``Transaction`` belongs to one connection and is usable from every session of it (§4.1: the txn-id
is scoped to the connection here; we advertise ``amqp:multi-ssns-per-txn``). It stages three kinds of
work, each applied by ``commit`` and undone by ``rollback`` in ``core.py``:

- *posts* (§4.4.1): messages received with ``transactional-state``; they are invisible until commit,
  when they reach their nodes in the order they were posted;
- *retirements* (§4.4.2): outcomes a consumer gave, with ``transactional-state``, to messages we
  delivered; the message stays acquired until commit applies the outcome;
- *acquisitions* (§4.4.3): messages sent on a link whose flow carried ``txn-id``; rollback returns them
  to their queue with delivery-count unchanged.

A transaction fails (``failed`` holds the error) when some staged work could not be accepted, such as
a post to an address that does not exist; its commit then rolls back with
``amqp:transaction:rollback``. Ids come from an injected generator, so they are unique for the
broker's lifetime without this module drawing randomness of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import count
from typing import TYPE_CHECKING, Any

from minibroker.amqp import codec
from minibroker.amqp.definitions import Accepted, AmqpValue, Error, TransactionalState
from minibroker.broker.message import Message
from minibroker.engine.connection import ServerConnection
from minibroker.engine.endpoints import Link

if TYPE_CHECKING:
    from minibroker.broker.links import Consumer, Dispatched
    from minibroker.broker.namespace import Node

TXN_CAPABILITIES = ("amqp:local-transactions", "amqp:multi-txns-per-ssn", "amqp:multi-ssns-per-txn")
MAX_TXN_ID = 32  # DESIGN §4: txn-ids are short opaque binaries, at most 32 bytes


def counter_ids(prefix: bytes = b"") -> Iterator[bytes]:
    """Deterministic txn-ids: ``prefix`` followed by a big-endian counter (never reused)."""
    for n in count(1):
        yield prefix + n.to_bytes(8, "big")


class Transaction:
    """One open transaction and its staged work."""

    __slots__ = (
        "accepted_state",
        "acquisitions",
        "conn",
        "consumers",
        "controller",
        "created",
        "failed",
        "id",
        "posts",
        "retirements",
        "staged_bytes",
    )

    def __init__(self, txn_id: bytes, conn: ServerConnection, controller: Link, created: float) -> None:
        self.id = txn_id
        self.conn = conn
        self.controller = controller
        self.created = created
        self.posts: list[tuple[Node, Message]] = []
        self.accepted_state = TransactionalState(txn_id=txn_id, outcome=Accepted())
        """The provisional outcome of its posts, one object so their answers merge into ranges."""
        self.staged_bytes = 0
        self.retirements: list[Dispatched] = []
        self.acquisitions: list[Dispatched] = []
        self.failed: Error | None = None
        self.consumers: set[Consumer] = set()  # links acquiring under this transaction

    def __repr__(self) -> str:
        return (
            f"Transaction({self.id.hex()}, posts={len(self.posts)}, retirements={len(self.retirements)}, "
            f"acquisitions={len(self.acquisitions)})"
        )


@dataclass(frozen=True)
class TransactionInfo:
    """A snapshot of one open transaction, for tests and introspection."""

    txn_id: bytes
    connection: str
    """The container-id of the connection that declared it."""
    age: float
    posts: int
    retirements: int
    acquisitions: int
    failed: str | None
    staged_addresses: tuple[str, ...]


@dataclass
class TransactionStats:
    """Counters over the broker's lifetime."""

    declared: int = 0
    committed: int = 0
    rolled_back: int = 0
    timed_out: int = 0
    failed_commits: int = 0


def info(txn: Transaction, now: float) -> TransactionInfo:
    """Describe ``txn`` as of ``now``."""
    remote = txn.conn.remote_open
    addresses = sorted({node.name for node, _ in txn.posts})
    return TransactionInfo(
        txn_id=txn.id,
        connection=str(remote.container_id) if remote is not None else "",
        age=max(0.0, now - txn.created),
        posts=len(txn.posts),
        retirements=len(txn.retirements),
        acquisitions=len(txn.acquisitions),
        failed=str(txn.failed.condition) if txn.failed is not None else None,
        staged_addresses=tuple(addresses),
    )


def control_body(payload: bytes) -> Any:
    """The value of the amqp-value section of a coordinator message (§4.3), or None."""
    for section in codec.decode_all(payload):
        if isinstance(section, AmqpValue):
            return section.value
    return None
