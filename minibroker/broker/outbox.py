"""Where the broker core's answers wait for the end of a batch, and which connections have output.

The trio layer hands the core one batch of events at a time (what one read of a socket produced). The
outcomes the core gives to the peer's transfers during a batch (``accepted``, a provisional
``transactional-state``) are collected here and sent at the end of the batch as one disposition per run of
consecutive delivery ids, instead of one per transfer. Part 4 §4.4.1 needs the provisional outcomes of
posts to reach the controller before a declare or discharge is answered: ``flush`` sends them early.

``dirty`` holds every connection the core gave a command to, so the I/O layer knows whose socket has bytes
to write.
"""

from __future__ import annotations

from typing import Any

from minibroker.amqp.states import DeliveryState
from minibroker.engine.connection import ServerConnection
from minibroker.engine.endpoints import IncomingDelivery, OutgoingDelivery

_RCV_SETTLE_SECOND = 1  # rcv-settle-mode second (§2.8.3)


class Outbox:
    """The batch's pending answers, and the connections with output."""

    def __init__(self) -> None:
        self.dirty: set[ServerConnection] = set()
        self.pending: dict[ServerConnection, dict[int, tuple[Any, list[IncomingDelivery]]]] = {}
        """The answers waiting for the end of the batch, by connection (read-only outside: the core tests it for
        emptiness after every read, a dict rather than a property call, issue 19)."""

    def touch(self, conn: ServerConnection) -> None:
        """``conn`` was given a command: it has bytes to write."""
        self.dirty.add(conn)

    def take_dirty(self) -> set[ServerConnection]:
        dirty, self.dirty = self.dirty, set()
        return dirty

    def answer(
        self, conn: ServerConnection, delivery: IncomingDelivery, state: DeliveryState, *, settle: bool = False
    ) -> None:
        """Settle the peer's ``delivery`` with ``state`` at the end of this batch, merged into ranges.

        ``state`` should be one shared object per outcome: the batch groups deliveries by its identity. A
        link in rcv-settle-mode second is answered at once (and left unsettled, see ``answer_now``), unless
        ``settle`` (a personality that settles regardless).
        """
        if delivery.settled:
            return
        if delivery.link.rcv_settle_mode == _RCV_SETTLE_SECOND and not settle:
            self.answer_now(conn, delivery, state)
            return
        # get-then-set rather than setdefault: no tuple and list built and thrown away per answer (issue 19)
        batch = self.pending.get(conn)
        if batch is None:
            batch = self.pending[conn] = {}
        group = batch.get(id(state))
        if group is None:
            group = batch[id(state)] = (state, [])
        group[1].append(delivery)

    def answer_now(self, conn: ServerConnection, delivery: IncomingDelivery, state: DeliveryState) -> None:
        """Give the peer's ``delivery`` the outcome ``state`` now.

        rcv-settle-mode second (§2.8.3): we give the outcome and settle only after the sender does.
        """
        if delivery.settled:
            return
        conn.dispose_incoming([delivery], state, settled=delivery.link.rcv_settle_mode != _RCV_SETTLE_SECOND)
        self.dirty.add(conn)

    def flush(self, conn: ServerConnection) -> None:
        """Send the answers waiting for ``conn``: one disposition per run of consecutive ids with one state."""
        batch = self.pending.pop(conn, None)
        if batch:
            for state, deliveries in batch.values():
                conn.dispose_incoming([d for d in deliveries if not d.settled], state)
            self.dirty.add(conn)

    def settle(self, conn: ServerConnection, deliveries: list[OutgoingDelivery], state: DeliveryState | None) -> None:
        """Settle deliveries we sent on ``conn`` with ``state`` (one disposition per run of ids)."""
        if deliveries:
            conn.settle(deliveries, state)
            self.dirty.add(conn)

    def forget(self, conn: ServerConnection) -> None:
        """``conn`` is gone."""
        self.pending.pop(conn, None)
        self.dirty.discard(conn)
