"""What every part of the broker core shares: settings, state, and the calls one part makes on another.

The core is one object (``core.Broker``) assembled from parts that each own one concern:
``delivery.py`` (messages into nodes and out to consumers, outcomes, dead-lettering, expiry, timers),
``coordinator.py`` (transactions, Part 4) and ``core.py`` (connections, links, credit, namespaces). This
base declares the state they share and the methods one part calls on another, so each module reads on its
own and type-checks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from minibroker.amqp.definitions import Error
from minibroker.broker.clock import WallClock
from minibroker.broker.links import Consumer, Dispatched
from minibroker.broker.message import Message
from minibroker.broker.namespace import Namespace, Node
from minibroker.broker.permissions import Permissions
from minibroker.broker.policy import NodePolicy
from minibroker.broker.queue import Queue
from minibroker.broker.timers import Timers
from minibroker.broker.transactions import Transaction, TransactionStats
from minibroker.engine.connection import ServerConnection
from minibroker.engine.endpoints import IncomingDelivery


@dataclass(frozen=True)
class BrokerSettings:
    """Policies of the broker core."""

    auto_create: bool = True
    """Create a node for an unknown address on attach (else refuse with amqp:not-found)."""
    link_credit: int = 1000
    """Credit granted to each producer link, topped up when half is used."""
    transaction_timeout: float = 300.0
    """Seconds after which an open transaction is rolled back; 0 means never."""
    node_defaults: NodePolicy = field(default_factory=NodePolicy)
    """Policy of nodes created on demand."""
    queues: dict[str, NodePolicy] = field(default_factory=dict)
    """Queues that exist from the start in every namespace, with their policies."""
    topics: dict[str, NodePolicy] = field(default_factory=dict)
    """Topics that exist from the start in every namespace, with their policies."""
    permissions: dict[str, Permissions] = field(default_factory=dict)
    """What each authenticated user may do; a user without an entry may do everything."""
    max_transactions_per_connection: int = 100
    """Open transactions at once on one connection."""
    max_staged_bytes: int = 64 * 1024 * 1024
    """Bytes of messages one transaction may post."""

    def permits(self, user: str | None, action: str, address: str) -> bool:
        """Whether ``user`` may ``action`` ("send", "receive", "transactions") on ``address``."""
        permissions = self.permissions.get(user) if user is not None else None
        if permissions is None:
            return True
        if action == "send":
            return permissions.may_send(address)
        if action == "receive":
            return permissions.may_receive(address)
        return permissions.transactions


class BrokerState:
    """State shared by the parts of the broker core."""

    settings: BrokerSettings
    clock: WallClock
    default: Namespace
    namespaces: dict[str, Namespace]
    connections: set[ServerConnection]
    dirty: set[ServerConnection]
    timers: Timers
    txn_stats: TransactionStats
    on_change: Callable[[], None] | None
    on_new_deadline: Callable[[], None] | None
    _namespace_of: dict[ServerConnection, Namespace]
    _txns: dict[bytes, Transaction]
    _expired: dict[ServerConnection, set[bytes]]
    _txn_ids: Iterator[bytes]
    _seq: int
    _now: float

    # -- provided by delivery.py ------------------------------------------------------------------------
    def _dispatch(self, queue: Queue) -> None:
        raise NotImplementedError

    def _finish_delivery(self, dispatched: Dispatched, outcome: Any) -> None:
        raise NotImplementedError

    def _admit(self, node: Node, message: Message, origin: ServerConnection | None) -> Error | None:
        raise NotImplementedError

    def _post(self, node: Node, message: Message, origin: ServerConnection | None) -> list[Queue]:
        raise NotImplementedError

    # -- provided by coordinator.py ---------------------------------------------------------------------
    def _rollback(self, txn: Transaction, *, dispatch: bool = True) -> set[Queue]:
        raise NotImplementedError

    def _rollback_all(self, txns: list[Transaction]) -> None:
        raise NotImplementedError

    # -- provided by core.py ----------------------------------------------------------------------------
    def namespace(self, name: str) -> Namespace:
        raise NotImplementedError

    def _create_node(self, namespace: Namespace, name: str, kind: str | None) -> Node:
        raise NotImplementedError

    def _lookup(self, conn: ServerConnection, address: Any, capabilities: Any = None) -> Node | None:
        raise NotImplementedError

    def _settle_incoming(self, conn: ServerConnection, delivery: IncomingDelivery, state: Any) -> None:
        raise NotImplementedError

    _answers: dict[int, tuple[Any, list[IncomingDelivery]]]

    def _flush_accepts(self, conn: ServerConnection) -> None:
        raise NotImplementedError

    def _answer_later(self, conn: ServerConnection, delivery: IncomingDelivery, state: Any) -> None:
        """Settle ``delivery`` with ``state`` at the end of this batch of events, merged into ranges.

        ``state`` should be one shared object per outcome: the batch groups deliveries by its identity.
        """
        if delivery.settled:
            return
        if delivery.link.rcv_settle_mode == 1:  # rcv-settle-mode second: answered unsettled, at once
            self._settle_incoming(conn, delivery, state)
            return
        self._answers.setdefault(id(state), (state, []))[1].append(delivery)

    def _release_consumer(self, consumer: Consumer) -> None:
        raise NotImplementedError
