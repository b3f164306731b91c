"""The policies of the broker core, set once when it starts (from ``[broker]``, ``[node_defaults]``,
``[queues.X]``, ``[topics.X]`` and ``[auth.permissions]``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from minibroker.broker.checkback import CheckBackSettings
from minibroker.broker.permissions import Permissions
from minibroker.broker.personality import MINIBROKER, Personality
from minibroker.broker.policy import NodePolicy
from minibroker.servicebus.declarations import Declarations


@dataclass(frozen=True)
class BrokerSettings:
    """Policies of the broker core."""

    personality: Personality = MINIBROKER
    """How the broker behaves where deployed brokers differ (``personality.py``), in namespaces not given one."""
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
    """Transactions one connection may hold at once: open ones, and timed-out ones not yet discharged."""
    max_staged_bytes: int = 64 * 1024 * 1024
    """Bytes of messages one transaction may post."""
    max_total_staged_bytes: int = 1024 * 1024 * 1024
    """Bytes of messages all open transactions together may post (past it a post is rejected, as past
    ``max_staged_bytes``)."""
    max_nodes: int = 10000
    """Nodes (queues and topics, every namespace together) beyond which no node is created for a peer: the attach
    (or anonymous-relay post) that would create one is refused with amqp:resource-limit-exceeded. Configured
    nodes, nodes an embedder declares and dead-letter or expiry addresses are created regardless."""
    max_links: int = 65536
    """Links attached at once on the whole broker; an attach beyond is refused (amqp:resource-limit-exceeded)."""
    max_subscriptions_per_topic: int = 1000
    """Subscriptions one topic holds at once (durable ones while detached too); a receiver link that would
    create one more is refused (amqp:resource-limit-exceeded). Joining an existing shared one is not counted."""
    max_subscriptions_per_connection: int = 1000
    """Receiver links on topics one connection holds at once; one more is refused."""
    auto_delete_idle: float = 300.0
    """Seconds after which a node created on demand (not configured, not declared by the embedder) that is empty,
    has no link and no transactional work is deleted (checked every half of it); 0 means never."""
    max_selector_length: int = 4096
    """Characters of a JMS selector; a longer one is refused on attach (amqp:invalid-field). 0: no limit."""
    max_selector_properties_size: int = 64 * 1024
    """Bytes of a message's header, properties or application-properties section a selector reads; a message
    with a larger one is not selected by a selector that reads a field of it. 0: no limit."""
    check_back: CheckBackSettings = field(default_factory=CheckBackSettings)
    """``[transactions]``: in-doubt transactions and check-back (``checkback.py``)."""
    servicebus: Declarations = field(default_factory=Declarations)
    """Service Bus entities that exist from the start in every namespace of the ``servicebus`` personality, with
    their properties (``[servicebus]``, the emulator's ``Config.json``)."""
    sas_keys: dict[str, str] = field(default_factory=dict, repr=False)
    """Shared access keys by name ``$cbs`` checks put-token tokens against; empty: any token is accepted."""

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

    def policy_for(self, name: str) -> tuple[str | None, NodePolicy]:
        """The kind the configuration gives node ``name`` (None: not configured) and its policy."""
        if name in self.topics:
            return "topic", self.topics[name]
        if name in self.queues:
            return "queue", self.queues[name]
        return None, self.node_defaults
