"""Per-node policies: limits, dead-lettering, expiry and redelivery (configured in ``[queues.NAME]``,
``[topics.NAME]`` and ``[node_defaults]``)."""

from __future__ import annotations

from dataclasses import dataclass

REJECT_PUBLISH = "reject-publish"
DROP_HEAD = "drop-head"
OVERFLOW_POLICIES = (REJECT_PUBLISH, DROP_HEAD)
REJECT_PUBLISH_DLX = "reject-publish-dlx"
"""RabbitMQ's third overflow (a queue declared with ``x-overflow``): reject-publish, dead-lettering the refused
message (rabbit_amqqueue.erl ``check_overflow``)."""


@dataclass(frozen=True)
class NodePolicy:
    """How one node (a queue, or each subscription of a topic) treats its messages."""

    max_messages: int = 0
    """Most messages held (ready, acquired and scheduled); 0 means no limit (a negative one, none at all: RabbitMQ's
    ``x-max-length`` 0)."""
    max_bytes: int = 0
    """Most bytes of messages held; 0 means no limit (a negative one, none at all)."""
    overflow: str = REJECT_PUBLISH
    """At a limit: "reject-publish" refuses the new message (amqp:resource-limit-exceeded), "drop-head" drops
    the oldest ready one."""
    max_delivery_attempts: int = 10
    """Failed deliveries (modified with delivery-failed) after which a message is dead-lettered; 0: never."""
    dead_letter_address: str | None = None
    """Where rejected and undeliverable messages go; unset means "<node>.DLQ", "" means they are dropped."""
    expiry_address: str = ""
    """Where expired messages go; "" means they are dropped."""
    redelivery_delay: float = 0.0
    """Seconds before a released or failed message becomes deliverable again."""
    message_ttl: float | None = None
    """Seconds a message lives on this queue at most (RabbitMQ ``x-message-ttl``; the least of it and the message's
    own ttl); None: no limit."""
    limit_ready: bool = False
    """The limits count ready (and scheduled) messages only, not delivered unsettled ones, as RabbitMQ's length limits
    do (a queue declared through the model)."""
    max_priority: int | None = None
    """RabbitMQ's priorities (a queue declared through the model): 0 means none, FIFO whatever the messages say (a
    classic queue without ``x-max-priority``); N means priorities 0..N, a message without one being 0
    (``x-max-priority``). None: minibroker's, header.priority 0-9 as sent (default 4)."""
    dead_letter_exchange: str | None = None
    """Dead-letter through this exchange of the namespace instead of ``dead_letter_address`` (RabbitMQ
    ``x-dead-letter-exchange``: rejected, expired and dropped-at-a-limit messages)."""
    dead_letter_routing_key: str | None = None
    """The routing key of dead-letters through ``dead_letter_exchange`` (None: the message's own)."""

    def admits(self, held: int, held_bytes: int, size: int) -> bool:
        """Whether a node holding ``held`` messages of ``held_bytes`` has room for one of ``size`` bytes."""
        if self.max_messages and held + 1 > self.max_messages:
            return False
        return not (self.max_bytes and held_bytes + size > self.max_bytes)

    def dead_letter_target(self, node: str) -> str:
        """The dead-letter address for messages of ``node`` ("" when dead-lettering is off)."""
        if self.dead_letter_address is None:
            return "" if node.endswith(".DLQ") else f"{node}.DLQ"
        return self.dead_letter_address
