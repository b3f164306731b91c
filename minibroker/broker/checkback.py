"""In-doubt transactions with check-back: a documented minibroker extension of AMQP 1.0 Part 4 (issue 16 §4).

Theory of operation
-------------------
RocketMQ holds a transactional "half message" invisibly until its producer commits or rolls back, and asks the
producer group when the second acknowledgement is lost. This is the same over AMQP 1.0. The specification rolls
back a transaction whose connection is lost (Part 4 §4 intro, DESIGN §4); a controller that opts in, with the
coordinator target capability ``minibroker:check-back`` (echoed in our attach reply when granted), or every
controller of a broker configured ``[transactions] orphaned = "hold"``, has its open transactions held **in
doubt** instead when its connection closes or drops. A controller link that detaches (or whose session ends), a
discharge, a transaction that failed or timed out, and the ``strict`` personality (which never grants the
capability nor honours ``orphaned``, and for which ``$txn-check`` is an ordinary address) all roll back as the
specification says.

What an in-doubt transaction holds stays held: its posts stay staged, invisible to every consumer and to queue
depth; a delivery it acquired (§4.4.3) or staged an outcome for (§4.4.2) stays acquired, on whichever connection
its consumer is, and is neither redelivered nor lost. Its resolution decides it exactly as a discharge would:
a commit posts the messages and applies the staged outcomes (an acquisition with none whose link is gone gets the
source's default outcome, §3.5.3), a rollback releases what it acquired and leaves what it retired as it was.
The links acquiring under it stop, as after any transaction that ended without a discharge.

Resolution, whichever comes first: (a) a connection with the same container-id, in the same namespace,
discharges the txn-id on any coordinator; (b) the embedder (``broker.resolve_transaction``, ``POST
/api/transactions/{id}/commit|rollback``); (c) check-back: ``check_immunity`` seconds after the loss, and every
``check_interval`` after that, ``check_max`` times in all, a check message goes out on every link with source
``$txn-check`` held by a connection of that container-id; the producer answers by discharging, or by sending
``{"txn-id": hex, "outcome": "commit" | "rollback" | "unknown"}`` (application-properties) to target
``$txn-check``. ``check_interval`` after the last check, a transaction nobody decided is rolled back and counted
as abandoned.

An outcome query, ``{"txn-id": hex, "query": true}`` to ``$txn-check``, is answered on the sender's own
``$txn-check`` source links with ``{"txn-id", "state"}``: ``committed`` or ``rolled-back`` for a check-back
transaction of that container that ended within ``outcome_retention`` seconds, ``in-doubt`` for one not ended
yet (held in doubt, or still open), ``unknown`` otherwise. An ``in-doubt`` answer also says ``posts``, how many
posts the broker holds for it (as the check messages do): a producer whose connection was lost before every post
arrived must not commit it. Outcomes are remembered for opted-in transactions only,
so a broker where nobody opts in pays nothing.

All timers run on the broker's ``now`` (``next_deadline``/``due``), so virtual time drives them. In-doubt
transactions live in memory only: they do not survive a restart (their staged work was never journaled), and
a producer querying after one hears ``unknown``.

This module owns the in-doubt registry, the check schedule, the remembered outcomes and the ``$txn-check``
links; it decides (``due`` returns what to check and what to abandon) and the coordinator applies, so the
coordinator stays the one owner of every transaction's work.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

from minibroker.amqp import codec
from minibroker.amqp.definitions import AmqpValue, ApplicationProperties, Error, Properties
from minibroker.amqp.errors import Condition, error
from minibroker.amqp.sections import APPLICATION_PROPERTIES, walk
from minibroker.amqp.types import DecodeError
from minibroker.broker.namespace import Namespace
from minibroker.broker.outbox import Outbox
from minibroker.broker.transactions import Transaction
from minibroker.engine.connection import ServerConnection
from minibroker.engine.endpoints import Link, LinkState

_ATTACHED = LinkState.ATTACHED  # globals: ~10x cheaper than enum lookups (issue 19)

CHECK_ADDRESS = "$txn-check"
"""The address of check messages (a source) and of the producer's answers and queries (a target)."""
CHECK_BACK = "minibroker:check-back"
"""The coordinator target capability a controller opts in with."""
ORPHANED = ("rollback", "hold")
"""``[transactions] orphaned``: what becomes of the open transactions of a lost connection."""
OUTCOMES = ("commit", "rollback", "unknown")
COMMITTED = "committed"
ROLLED_BACK = "rolled-back"
IN_DOUBT = "in-doubt"
UNKNOWN = "unknown"
MAX_PENDING = 64
"""Check messages and answers kept for a ``$txn-check`` link without credit (the oldest go first: a check
comes again)."""
MAX_IN_DOUBT = 10_000
"""In-doubt transactions held at once on the whole broker; beyond, a lost connection's transactions roll back (each
holds its staged bytes, counted in ``max_total_staged_bytes``, for at most immunity + check_max intervals)."""
MAX_OUTCOMES = 100_000
"""Ended transactions remembered at once, whatever ``outcome_retention`` says."""

Key = tuple[str, str]
"""(namespace name, container-id): a producer group."""


@dataclass(frozen=True)
class CheckBackSettings:
    """``[transactions]``: in-doubt transactions and check-back."""

    orphaned: Literal["rollback", "hold"] = "rollback"
    """The open transactions of a lost connection: rolled back (the specification), or held in doubt (every
    controller, as if it asked for ``minibroker:check-back``)."""
    check_immunity: float = 60.0
    """Seconds after the loss before the first check message."""
    check_interval: float = 30.0
    """Seconds between check messages, and after the last one before the transaction is abandoned."""
    check_max: int = 15
    """Check messages sent before an undecided transaction is rolled back (abandoned)."""
    outcome_retention: float = 600.0
    """Seconds the outcome of an ended check-back transaction is remembered for queries."""


class CheckLink:
    """A ``$txn-check`` link: ``outgoing`` (its source is ``$txn-check``: we send checks and answers on it), or
    incoming (its target is: the producer sends outcomes and queries)."""

    __slots__ = ("conn", "key", "link", "outgoing", "pending")

    def __init__(self, conn: ServerConnection, link: Link, key: Key, *, outgoing: bool) -> None:
        self.conn = conn
        self.link = link
        self.key = key
        self.outgoing = outgoing
        self.pending: deque[bytes] = deque(maxlen=MAX_PENDING)

    def __repr__(self) -> str:
        return f"CheckLink({self.link.name!r}, {'out' if self.outgoing else 'in'})"


class Doubt:
    """One in-doubt transaction: whose it is, and how often it was checked."""

    __slots__ = ("checks", "key", "namespace", "next_at", "txn")

    def __init__(self, txn: Transaction, namespace: Namespace, container: str, next_at: float) -> None:
        self.txn = txn
        self.namespace = namespace
        self.key: Key = (namespace.name, container)
        self.checks = 0
        self.next_at = next_at


@dataclass(frozen=True)
class CheckRequest:
    """A message to target ``$txn-check``: an outcome for an in-doubt transaction, or a query."""

    txn_id: bytes
    outcome: str | None
    """``commit``, ``rollback`` or ``unknown``; None for a query."""


def request_of(payload: bytes) -> CheckRequest | Error:
    """What a message sent to ``$txn-check`` asks (from its application-properties), or why it cannot be read."""
    props: Any = None
    try:
        for section in walk(payload, last=APPLICATION_PROPERTIES):
            if section.code == APPLICATION_PROPERTIES:
                props = codec.decode(payload, section.start)[0]
    except DecodeError as exc:
        return error(Condition.DECODE_ERROR, f"the message does not decode: {exc}")
    values = props.value if isinstance(props, ApplicationProperties) else None
    if not isinstance(values, dict):
        return error(Condition.INVALID_FIELD, f"a {CHECK_ADDRESS} message needs application-properties")
    text = values.get("txn-id")
    try:
        txn_id = bytes.fromhex(text) if isinstance(text, str) and text else None
    except ValueError:
        txn_id = None
    if txn_id is None:
        return error(Condition.INVALID_FIELD, f"txn-id: expected the transaction id in hex, got {text!r}")
    outcome = values.get("outcome")
    query = values.get("query")
    if outcome is None and query is True:
        return CheckRequest(txn_id, None)
    if query is not None and query is not False:
        return error(Condition.INVALID_FIELD, f"query: expected true, got {query!r} (alone, without outcome)")
    if outcome not in OUTCOMES:
        return error(Condition.INVALID_FIELD, f"outcome: expected one of {', '.join(OUTCOMES)}, got {outcome!r}")
    return CheckRequest(txn_id, str(outcome))


def _message(txn_id: bytes, properties: dict[str, Any], body: str | None = None) -> bytes:
    sections: list[Any] = [Properties(correlation_id=txn_id), ApplicationProperties(properties)]
    sections.append(AmqpValue(body))
    return b"".join(codec.encode(s) for s in sections)


class CheckBack:
    """The in-doubt transactions of one broker, their checks, the outcomes remembered, the ``$txn-check`` links."""

    def __init__(self, settings: CheckBackSettings, outbox: Outbox) -> None:
        self.settings = settings
        self.outbox = outbox
        self._doubts: dict[bytes, Doubt] = {}
        self._heap: list[tuple[float, int, Doubt]] = []
        """(when, tie, doubt): the next check (or abandonment) of each; entries of ended ones are stale."""
        self._ties = itertools.count()
        self._links: dict[Key, list[CheckLink]] = {}
        """The outgoing ``$txn-check`` links of each producer group."""
        self._outcomes: dict[tuple[str, str, bytes], tuple[str, float]] = {}
        """(namespace, container, txn-id) -> (state, ended at), oldest first."""

    def __bool__(self) -> bool:
        return bool(self._doubts)

    # -- the registry -----------------------------------------------------------------------------------
    def hold(self, txn: Transaction, namespace: Namespace, container: str, now: float) -> bool:
        """Hold ``txn`` in doubt from ``now``; False (and nothing held) when its id is in doubt already, or
        ``MAX_IN_DOUBT`` are."""
        if txn.id in self._doubts or len(self._doubts) >= MAX_IN_DOUBT:
            return False
        doubt = Doubt(txn, namespace, container, now + self.settings.check_immunity)
        self._doubts[txn.id] = doubt
        heapq.heappush(self._heap, (doubt.next_at, next(self._ties), doubt))
        return True

    def holds(self, txn: Transaction) -> bool:
        doubt = self._doubts.get(txn.id)
        return doubt is not None and doubt.txn is txn

    def find(self, txn_id: bytes, namespace: Namespace | None = None, container: str | None = None) -> Doubt | None:
        """The in-doubt transaction ``txn_id`` (of ``namespace`` and ``container`` when given)."""
        doubt = self._doubts.get(txn_id)
        if doubt is None or (namespace is not None and doubt.namespace is not namespace):
            return None
        if container is not None and doubt.key[1] != container:
            return None
        return doubt

    def release(self, doubt: Doubt) -> None:
        """``doubt``'s transaction is a live connection's again (resolution a): out of doubt, not ended."""
        if self._doubts.get(doubt.txn.id) is doubt:
            del self._doubts[doubt.txn.id]

    def of_namespace(self, namespace: Namespace) -> list[Transaction]:
        return [d.txn for d in self._doubts.values() if d.namespace is namespace]

    def ended(self, txn: Transaction, state: str, now: float, key: Key) -> None:
        """``txn``, a check-back transaction of the producer group ``key``, ended as ``state``: out of doubt, and
        its outcome remembered for queries."""
        doubt = self._doubts.get(txn.id)
        if doubt is not None and doubt.txn is txn:
            del self._doubts[txn.id]
            key = doubt.key
        self._prune(now)
        outcomes = self._outcomes
        remembered = (*key, txn.id)
        outcomes.pop(remembered, None)
        outcomes[remembered] = (state, now)
        if len(outcomes) > MAX_OUTCOMES:
            del outcomes[next(iter(outcomes))]

    def _prune(self, now: float) -> None:
        outcomes = self._outcomes
        horizon = now - self.settings.outcome_retention
        while outcomes:
            key = next(iter(outcomes))
            if outcomes[key][1] >= horizon:
                return
            del outcomes[key]

    def state(self, key: Key, txn_id: bytes, now: float, *, open_: bool) -> str:
        """What an outcome query for ``txn_id`` by the producer group ``key`` is answered (``open_``: the group
        has it open on a live connection)."""
        doubt = self._doubts.get(txn_id)
        if open_ or (doubt is not None and doubt.key == key):
            return IN_DOUBT
        self._prune(now)
        found = self._outcomes.get((*key, txn_id))
        return found[0] if found is not None else UNKNOWN

    # -- the schedule -------------------------------------------------------------------------------------
    def next_deadline(self) -> float | None:
        due = self._due()
        return due.next_at if due is not None else None

    def _due(self) -> Doubt | None:
        heap = self._heap
        while heap:
            when, _, doubt = heap[0]
            if self._doubts.get(doubt.txn.id) is doubt and doubt.next_at == when:
                return doubt
            heapq.heappop(heap)
        return None

    def due(self, now: float) -> list[Doubt]:
        """Send the checks due at ``now``; return the transactions checked ``check_max`` times already and silent
        since (the caller rolls them back: abandoned)."""
        abandoned: list[Doubt] = []
        while (doubt := self._due()) is not None and doubt.next_at <= now:
            heapq.heappop(self._heap)
            if doubt.checks >= self.settings.check_max:
                abandoned.append(doubt)
                continue
            doubt.checks += 1
            doubt.next_at = now + self.settings.check_interval
            heapq.heappush(self._heap, (doubt.next_at, next(self._ties), doubt))
            txn = doubt.txn
            check = _message(
                txn.id,
                {"txn-id": txn.id.hex(), "posts": len(txn.posts), "check": doubt.checks},
                f"transaction {txn.id.hex()} is in doubt: discharge it, or send its outcome to {CHECK_ADDRESS}",
            )
            for link in self._links.get(doubt.key, ()):
                self.send(link, check)
        return abandoned

    # -- the $txn-check links -----------------------------------------------------------------------------
    def attached(self, check: CheckLink) -> None:
        if check.outgoing:
            self._links.setdefault(check.key, []).append(check)

    def detached(self, check: CheckLink) -> None:
        links = self._links.get(check.key)
        if links is not None and check in links:
            links.remove(check)
            if not links:
                del self._links[check.key]

    def links_of(self, conn: ServerConnection, key: Key) -> list[CheckLink]:
        """``conn``'s outgoing ``$txn-check`` links."""
        return [c for c in self._links.get(key, ()) if c.conn is conn]

    def answer(self, conn: ServerConnection, key: Key, txn_id: bytes, state: str, posts: int | None = None) -> bool:
        """Send a query's answer on ``conn``'s ``$txn-check`` source links (with ``posts``, the posts an ``in-doubt``
        one holds, when given); whether it has any."""
        links = self.links_of(conn, key)
        properties: dict[str, Any] = {"txn-id": txn_id.hex(), "state": state}
        if posts is not None:
            properties["posts"] = posts
        answer = _message(txn_id, properties)
        for link in links:
            self.send(link, answer)
        return bool(links)

    def send(self, check: CheckLink, payload: bytes) -> None:
        """Send ``payload`` on ``check`` now, or once it has credit."""
        check.pending.append(payload)
        self.flow(check)

    def flow(self, check: CheckLink) -> None:
        """Send what waits for ``check``'s credit (pre-settled unless the peer asked for unsettled transfers)."""
        conn, link = check.conn, check.link
        pending = check.pending
        while pending and link.state is _ATTACHED and conn.can_send(link):
            conn.deliver(link, pending.popleft(), settled=link.snd_settle_mode != 0)
            self.outbox.touch(conn)
