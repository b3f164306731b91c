"""Broker personalities: the small policies in which deployed brokers differ from the specification on the wire.

minibroker follows the AMQP 1.0 specification (lenient where clients are known to stray); a personality makes it
answer as another broker does, so that client code can be proven against the broker it will meet. A
``Personality`` is a value: a set of policies the core consults at its decision points (attach negotiation in
``attach.py``, the coordinator in ``coordinator.py``, the settlement of posts in ``outbox.py``), plus the
quirks it stands for, each with the source file or issue of that broker that shows it (``minibroker
personalities`` prints them; the README's table is made from them).

A personality applies per namespace (``Namespace.personality``; the broker's default comes from ``[broker]
personality``): one broker can hold an ``artemis`` namespace next to a ``broker-j`` one, and the connections of
each meet the behaviour of theirs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote

from minibroker.amqp.definitions import Error
from minibroker.amqp.errors import Condition, error

TXN_CAPABILITIES = ("amqp:local-transactions", "amqp:multi-txns-per-ssn", "amqp:multi-ssns-per-txn")
ECHO = "echo"
"""``coordinator_capabilities``: answer with the capabilities the controller asked for."""
TimeoutMode = Literal["timer", "close", "lazy"]
ErrorTransport = Literal["lenient", "exact"]
Provisional = Literal["transactional", "settled", "accepted"]


@dataclass(frozen=True)
class Quirk:
    """One way a personality differs from ``minibroker``, as it shows on the wire, and where that was read."""

    text: str
    source: str
    """The broker's source file (repository and path, and the method) or issue that shows it."""


@dataclass(frozen=True)
class Personality:
    """The policies of one personality; the defaults are ``minibroker``'s own (the specification, DESIGN §4)."""

    name: str
    summary: str
    quirks: tuple[Quirk, ...] = ()

    # -- the coordinator's link (§4.2) ------------------------------------------------------------------
    transactions: bool = True
    """Whether a coordinator can be attached at all (refused with ``no_transactions`` otherwise)."""
    no_transactions: tuple[str, str] = (Condition.NOT_IMPLEMENTED, "transactions are not supported")
    coordinator_capabilities: tuple[str, ...] | Literal["echo"] = TXN_CAPABILITIES
    """The capabilities of the coordinator target we answer with (``ECHO``: those the controller asked for)."""
    controller_credit: int = 100
    """Credit first given to a controller link."""
    controller_credit_step: int | None = None
    """Grow the controller's credit by this much per declare or discharge (None: topped up to
    ``controller_credit`` whenever half is used)."""
    errors: ErrorTransport = "lenient"
    """§4.3: a declare or discharge error travels as ``rejected`` when the controller's source offers
    ``amqp:rejected:list`` ("exact"), or also when it lists no outcomes at all ("lenient": python-qpid-proton
    lists none); otherwise the coordinator link is detached with it."""

    # -- ids and discharge (§4.2, §4.3) -------------------------------------------------------------------
    txn_id: Callable[[int, int], bytes] | None = None
    """The txn-id of the broker's ``serial``-th transaction, declared on connection ``conn_id``; None: the
    broker's own generator (unique, 16 opaque bytes)."""
    txn_scope: Literal["connection", "namespace"] = "connection"
    """Where a txn-id is valid: on the connection that declared it, or on every connection of the namespace."""
    unknown_discharge: tuple[str, str] | None = None
    """The condition and description answering a discharge of an unknown id (None: amqp:transaction:unknown-id)."""
    commit_failed: str = Condition.TRANSACTION_ROLLBACK
    """The condition of a commit that could not be applied (rolled back instead)."""
    controller_detach_rolls_back: bool = True
    """§4 intro: a controller link that closes rolls back the transactions it declared."""

    # -- time-outs -------------------------------------------------------------------------------------
    timeout: float | None = None
    """Seconds a transaction may live (None: the broker's ``transaction_timeout``)."""
    timeout_from: Literal["declare", "first-operation"] = "declare"
    timeout_mode: TimeoutMode = "timer"
    """"timer": rolled back when it expires, its id answered with amqp:transaction:timeout afterwards; "close":
    its connection is closed with amqp:transaction:timeout; "lazy": only a commit notices it (rolled back then)."""

    # -- posting (§4.4.1) ---------------------------------------------------------------------------------
    provisional: Provisional = "transactional"
    """The answer to an unsettled transactional transfer before the discharge: ``transactional-state(accepted)``
    unsettled (in rcv-settle-mode second) or settled ("settled"), or a plain ``accepted`` ("accepted")."""
    unknown_txn_post_closes: bool = False
    """A transfer naming an unknown txn-id closes the connection with amqp:internal-error (else: rejected)."""

    # -- acquiring and retiring (§4.4.2, §4.4.3) ----------------------------------------------------------
    transactional_acquisition: bool = True
    """Whether a flow's ``txn-id`` is honoured (else the link is detached with amqp:not-implemented)."""
    retire_accepted_only: bool = False
    """A transactional retirement with an outcome other than ``accepted`` is ignored (the delivery stays as it
    was: acquired, unsettled)."""
    redelivery_limit: int = 0
    """Deliveries after which a released or modified message is dropped (0: no limit beyond the queue's)."""

    # -- links and addresses --------------------------------------------------------------------------------
    consumer_rcv_first: bool = False
    """A receiving client's rcv-settle-mode second is answered (and treated) as first."""
    refuse_rcv_second: bool = False
    """A sending client asking rcv-settle-mode second (without sending settled) is refused."""
    settle_second_at_once: bool = False
    """rcv-settle-mode second is echoed, but every outcome is sent settled (the peer need not settle first)."""
    addresses: Literal["plain", "rabbitmq"] = "plain"
    """How addresses name nodes: node names with optional ``queue://``/``topic://`` prefixes ("plain"), or
    RabbitMQ 4's ``/queues/NAME`` and ``/exchanges/NAME/KEY`` ("rabbitmq": queues are never created by an
    attach)."""

    # -- strict ---------------------------------------------------------------------------------------------
    strict: bool = False
    """Client mistakes that ``minibroker`` tolerates are errors naming the specification's section."""

    def describe(self) -> str:
        """The personality with its quirks, as ``minibroker personalities`` prints it."""
        lines = [f"{self.name}: {self.summary}"]
        lines += [f"  - {q.text}\n      ({q.source})" for q in self.quirks]
        return "\n".join(lines)

    def resolve(self, address: str) -> tuple[str, str | None] | Error:
        """The node a RabbitMQ 4 address names (``addresses == "rabbitmq"``), and its kind; or why it names none.

        ``/queues/NAME`` is queue NAME; ``/exchanges/NAME/KEY`` routes by KEY to the queue of that name (the
        default exchange's direct routing, all this personality models); names are percent-decoded.
        """
        parts = address.split("/")
        if len(parts) == 3 and parts[:2] == ["", "queues"] and parts[2]:
            return unquote(parts[2]), "queue"
        if len(parts) == 4 and parts[:2] == ["", "exchanges"] and parts[3]:
            return unquote(parts[3]), "queue"
        return error(
            Condition.INVALID_FIELD,
            f"bad address {address!r}: expected /queues/NAME or /exchanges/NAME/KEY (RabbitMQ 4 address v2)",
        )


def _fixed(width: int) -> Callable[[int, int], bytes]:
    def txn_id(serial: int, conn_id: int) -> bytes:
        return (serial % (1 << (8 * width))).to_bytes(width, "big")

    return txn_id


def _servicebus_txn_id(serial: int, conn_id: int) -> bytes:
    return f"txn:{conn_id:032x}__G{conn_id}:{serial}_G{conn_id}".encode("ascii")


_SPEC = "https://docs.oasis-open.org/amqp/core/v1.0/os/amqp-core-transactions-v1.0-os.html"

MINIBROKER = Personality(
    "minibroker",
    "the AMQP 1.0 specification, lenient where clients are known to stray (the default)",
)

STRICT = Personality(
    "strict",
    "the specification, with client mistakes that minibroker tolerates answered as errors naming the section",
    quirks=(
        Quirk("a declare or discharge sent settled detaches the controller, naming §4.3", f"{_SPEC} §4.3"),
        Quirk(
            "a declare while the connection still has unsettled transfers of its own is rejected "
            "(Qpid Proton's transaction rules)",
            "apache/qpid-proton: python/tests/integration/test_tx.py",
        ),
        Quirk(
            "a coordinator source that lists no outcomes is refused (§4.3 could only detach on an error)",
            f"{_SPEC} §4.3",
        ),
        Quirk(
            "a retirement whose range holds deliveries of two transactions detaches the controller "
            "with amqp:transaction:rollback",
            f"{_SPEC} §4.4.2",
        ),
        Quirk("a fields map with non-symbol keys is refused with amqp:invalid-field", "AMQP 1.0 part 2 §2.8.?"),
        Quirk("a txn-id longer than 32 octets is refused with amqp:invalid-field", f"{_SPEC} §4.5.4"),
    ),
    errors="exact",
    strict=True,
)

PERSONALITIES: dict[str, Personality] = {p.name: p for p in (MINIBROKER, STRICT)}


def names() -> list[str]:
    """The known personalities' names, the default first."""
    return list(PERSONALITIES)


def get(name: str) -> Personality:
    """The personality called ``name``; ``ValueError`` naming the known ones otherwise."""
    found = PERSONALITIES.get(name)
    if found is None:
        raise ValueError(f"unknown personality {name!r}; known: {', '.join(names())}")
    return found

