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
from dataclasses import dataclass, replace
from functools import cache
from typing import Literal

from minibroker.amqp.definitions import Error
from minibroker.amqp.errors import Condition
from minibroker.amqp.types import Symbol

TXN_CAPABILITIES = ("amqp:local-transactions", "amqp:multi-txns-per-ssn", "amqp:multi-ssns-per-txn")
ECHO: Literal["echo"] = "echo"
"""``coordinator_capabilities``: answer with the controller's own coordinator target, capabilities and all."""
FAILED = "failed"
"""The bare (non-``amqp:``) condition Artemis and ActiveMQ give a discharge that failed."""
TxnIds = Callable[[int, int, "set[bytes]"], bytes]


@dataclass(frozen=True)
class Quirk:
    """One way a personality differs from ``minibroker``, as it shows on the wire, and where that was read."""

    text: str
    source: str
    """The broker's source file (repository, path, method) or the issue or document that shows it."""


@dataclass(frozen=True)
class Personality:
    """The policies of one personality; the defaults are ``minibroker``'s own (the specification, DESIGN §4).

    Descriptions given as templates may name ``{xid}``: the txn-id as Java brokers print a binary (printable
    ASCII as it is, other octets as ``\\xHH``).
    """

    name: str
    summary: str
    quirks: tuple[Quirk, ...] = ()

    # -- the coordinator's link (§4.2, §4.3) --------------------------------------------------------------
    transactions: bool = True
    """Whether a coordinator can be attached at all (refused with ``no_transactions`` otherwise)."""
    no_transactions: tuple[str, str] = (Condition.NOT_IMPLEMENTED, "transactions are not supported")
    coordinator_capabilities: tuple[str, ...] | Literal["echo"] = TXN_CAPABILITIES
    """The capabilities of the coordinator target we answer with (``ECHO``: the controller's target as sent)."""
    controller_credit: int = 100
    """Credit given to a controller link, topped up when half is used."""
    controller_window: bool = False
    """Give a controller its credit back one by one, as each declare or discharge is answered (never more than
    ``controller_credit`` outstanding), instead of topping it up."""
    errors: Literal["lenient", "exact", "always"] = "lenient"
    """§4.3: a declare or discharge error travels as ``rejected`` when the controller's source offers
    ``amqp:rejected:list`` ("exact"), or also when it lists no outcomes at all ("lenient": python-qpid-proton lists
    none), or always ("always"); otherwise the coordinator link is detached with it."""
    global_id: Literal["refuse", "ignore"] = "refuse"
    """A declare with a global-id: refused with amqp:not-implemented, or declared as if it had none."""

    # -- ids and discharge ------------------------------------------------------------------------------------
    txn_id: TxnIds | None = None
    """The txn-id of the ``serial``-th transaction of connection ``conn_id``, not one of ``in_use`` (the connection's
    ids); None: the broker's own generator (unique, 16 opaque bytes)."""
    txn_scope: Literal["connection", "namespace"] = "connection"
    """Where a txn-id is valid: on the connection that declared it, or on every connection of the namespace."""
    unknown_discharge: tuple[str, str] | None = None
    """Condition and description template of a discharge naming an unknown id (None: amqp:transaction:unknown-id)."""
    commit_failed: tuple[str, str | None] = (Condition.TRANSACTION_ROLLBACK, None)
    """Condition and description of a commit that could not be applied (None: the cause's own description)."""
    commit_failed_keeps_cause: bool = False
    """A commit that failed because a post was refused fails with that refusal's condition."""
    controller_detach_rolls_back: bool = True
    """§4 intro: a controller link that closes rolls back the transactions it declared (else: only the end of
    the connection does, and another controller of the connection may still discharge them)."""

    one_entity: bool = False
    """A transaction's work is on one top-level entity, the first it touches: a transfer to (or a settlement on)
    another one is refused with amqp:not-allowed and the commit fails; a sender reaches other entities through
    the transaction's entity (Service Bus send-via, ``minibroker.servicebus.via``)."""

    # -- time-outs ----------------------------------------------------------------------------------------------
    timeout: float | None = None
    """Seconds a transaction may live (None: the broker's ``transaction_timeout``; 0: never times out)."""
    timeout_from: Literal["declare", "first-operation"] = "declare"
    timeout_mode: Literal["timer", "close", "lazy"] = "timer"
    """"timer": rolled back when it expires, its id answered with amqp:transaction:timeout afterwards; "close": its
    connection is closed with amqp:transaction:timeout; "lazy": nothing happens until a commit, which fails."""
    timeout_text: str = "the transaction timed out and was rolled back"

    # -- posting (§4.4.1) -----------------------------------------------------------------------------------------
    provisional: Literal["transactional", "settled", "accepted"] = "transactional"
    """The answer to an unsettled transactional transfer before the discharge: ``transactional-state(accepted)``
    (left unsettled in rcv-settle-mode second), the same always settled ("settled"), or a plain ``accepted``."""
    post_refusal_wrapped: bool = True
    """A post the broker cannot take is answered ``transactional-state(rejected)`` (else a plain ``rejected``)."""
    unknown_txn_closes: tuple[str, str] | None = None
    """A transfer or disposition naming an unknown txn-id closes the connection with this condition and
    description template (None: the transfer is rejected, the disposition's delivery released)."""
    unknown_txn_detaches: tuple[str, str] | None = None
    """A transfer naming an unknown txn-id detaches its link with this condition and description template (None:
    the transfer is rejected)."""

    # -- acquiring and retiring (§4.4.2, §4.4.3) ------------------------------------------------------------------
    transactional_acquisition: Literal["yes", "ignore", "refuse"] = "yes"
    """A flow's ``txn-id``: honoured, ignored (nothing sent is acquired under it), or refused (the link is detached
    with amqp:not-implemented, §4.4.3)."""
    retire_accepted_only: bool = False
    """A transactional retirement whose outcome is not ``accepted`` is ignored: no disposition, the delivery stays
    acquired and unsettled."""
    retire_answered: bool = False
    """A transactional ``accepted`` of a delivery the client left unsettled is answered at once with an unsettled
    ``transactional-state(accepted)`` (the broker's commit settles it)."""
    redelivery_limit: int = 0
    """A message given ``modified(delivery-failed)`` when its delivery-count has already reached this is dropped
    instead of being counted once more and redelivered (0: never)."""

    # -- links and addresses ----------------------------------------------------------------------------------------
    rcv_settle_first: bool = False
    """rcv-settle-mode second is answered (and followed) as first, on every link but the coordinator's."""
    refuse_rcv_second: tuple[str, str] | None = None
    """An attach asking rcv-settle-mode second without snd-settle-mode settled is refused with this error (one that
    sends settled is answered first)."""
    settle_second_at_once: bool = False
    """A producer's rcv-settle-mode second is echoed, but every outcome is sent settled at once."""
    addresses: Literal["plain", "rabbitmq"] = "plain"
    """How addresses name nodes: node names with optional ``queue://``/``topic://`` prefixes, or RabbitMQ 4's
    ``/queues/NAME`` and ``/exchanges/NAME/KEY`` ("plain": both; "rabbitmq": only RabbitMQ 4's, so an attach never
    creates a queue).  RabbitMQ 4 addresses, exchanges and bindings are ``exchanges.py``'s and ``rabbit.py``'s."""

    servicebus: bool = False
    """Azure Service Bus as its SDKs meet it (issue 17, ``minibroker.servicebus``): addresses are URIs, ``$cbs``
    answers put-token, deliveries carry lock tokens and Service Bus annotations, dead-letters go to
    ``<entity>/$DeadLetterQueue``, batch messages are split."""

    # -- strict -----------------------------------------------------------------------------------------------------
    strict: bool = False
    """Client mistakes that ``minibroker`` tolerates are errors naming the specification's section."""

    def describe(self) -> str:
        """The personality with its quirks, as ``minibroker personalities`` prints it."""
        lines = [f"{self.name}: {self.summary}"]
        lines += [f"  - {q.text}\n      ({q.source})" for q in self.quirks]
        return "\n".join(lines)


def wire_error(condition: str, description: str | None = None, txn_id: object = None) -> Error:
    """An ``error`` with any condition symbol (brokers use some the specification does not define); ``{xid}`` in
    ``description`` is the txn-id as Java brokers print it."""
    if description is not None and txn_id is not None:
        description = description.replace("{xid}", show_id(txn_id))
    return Error(condition=Symbol(condition), description=description)


def show_id(txn_id: object) -> str:
    """A txn-id as Java brokers print a binary: printable ASCII as it is, other octets as ``\\xHH``."""
    if not isinstance(txn_id, bytes):
        return repr(txn_id)
    return "".join(chr(b) if 32 <= b < 127 and b != 0x5C else f"\\x{b:02x}" for b in txn_id)


def _counter(width: int) -> TxnIds:
    """Ids numbering the connection's transactions from 1, ``width`` octets big-endian."""

    def txn_id(serial: int, conn_id: int, in_use: set[bytes]) -> bytes:
        return (serial % (1 << (8 * width))).to_bytes(width, "big")

    return txn_id


def _lowest_free(width: int) -> TxnIds:
    """The lowest number its connection does not use now, ``width`` octets big-endian (ids are reused)."""

    def txn_id(serial: int, conn_id: int, in_use: set[bytes]) -> bytes:
        number = 0
        while (candidate := number.to_bytes(width, "big")) in in_use:
            number += 1
        return candidate

    return txn_id


def _uuid_text(serial: int, conn_id: int, in_use: set[bytes]) -> bytes:
    """A hyphenated hex UUID in ASCII (36 octets)."""
    hexed = f"{(conn_id << 64) | serial:032x}"[-32:]
    return f"{hexed[:8]}-{hexed[8:12]}-{hexed[12:16]}-{hexed[16:20]}-{hexed[20:]}".encode("ascii")


def _servicebus(serial: int, conn_id: int, in_use: set[bytes]) -> bytes:
    """``txn:<32 hex>__G<n>:<n>_G<n>`` in ASCII: 53 octets, longer than the specification's 32."""
    gateway = 10 + conn_id % 90
    return f"txn:{(conn_id << 64) | serial:032x}__G{gateway}:{1_000_000 + serial % 9_000_000}_G{gateway}".encode()


_PART4 = "OASIS AMQP 1.0 part 4"
_AZURE_SB = "Azure/azure-sdk-for-python: sdk/servicebus/azure-servicebus/azure/servicebus/"
_ARTEMIS = (
    "apache/activemq-artemis: artemis-protocols/artemis-amqp-protocol/src/main/java/org/apache/activemq/artemis/"
    "protocol/amqp/"
)
_ACTIVEMQ = "apache/activemq: activemq-amqp/src/main/java/org/apache/activemq/transport/amqp/protocol/"
_BROKER_J = "apache/qpid-broker-j: broker-plugins/amqp-1-0-protocol/src/main/java/org/apache/qpid/server/protocol/v1_0/"
_RABBITMQ = "rabbitmq/rabbitmq-server: deps/rabbit/src/rabbit_amqp_session.erl"
_PROTON = "apache/qpid-proton: python/examples/broker.py"


MINIBROKER = Personality(
    "minibroker",
    "the AMQP 1.0 specification, lenient where clients are known to stray (the default)",
)

STRICT = Personality(
    "strict",
    "the specification, with the client mistakes minibroker tolerates answered as errors naming the section",
    quirks=(
        Quirk(
            "a declare while the controller's session still has unsettled transfers of its own is refused "
            "(amqp:illegal-state): Qpid Proton's rule, which its tx_tester expects an error for",
            "apache/qpid-proton: cpp/src/session.cpp (session::transaction_declare); "
            "tests/cpp/tx_tests/15_error_declare_unsettled_outgoing.tx_test",
        ),
        Quirk(
            "a coordinator source that lists no outcomes is refused (amqp:invalid-field): errors could only "
            "travel by detaching; errors travel as rejected only when it lists amqp:rejected:list",
            f"{_PART4} §4.3",
        ),
        Quirk(
            "a retirement naming one transaction for a delivery whose outcome another transaction holds rolls "
            "both back and detaches their controllers (amqp:transaction:rollback)",
            f"{_PART4} §4.4.2",
        ),
        Quirk(
            "a fields map (attach or flow properties) with a key that is not a symbol is refused (amqp:invalid-field)",
            "OASIS AMQP 1.0 part 2 §2.8.13",
        ),
        Quirk("a txn-id longer than 32 octets is refused (amqp:invalid-field)", f"{_PART4} §4.5.4"),
        Quirk(
            "a declare or discharge sent settled detaches the controller (amqp:not-allowed, as minibroker), "
            "the description naming §4.3",
            f"{_PART4} §4.3",
        ),
    ),
    errors="exact",
    strict=True,
)

ARTEMIS = Personality(
    "artemis",
    "Apache ActiveMQ Artemis",
    quirks=(
        Quirk(
            "a transactional retirement honours only accepted, answered at once with an unsettled "
            "transactional-state(accepted) when the client left it unsettled: released, rejected and modified are "
            "ignored (no disposition; the message stays acquired by the consumer until its link closes)",
            _ARTEMIS + "proton/ProtonServerSenderContext.java (handleExtendedDeliveryOutcomes)",
        ),
        Quirk(
            "rcv-settle-mode second is answered as first, on consumer and producer links",
            _ARTEMIS + "proton/DefaultSenderController.java (init); proton/ProtonServerReceiverContext.java "
            "(initialize)",
        ),
        Quirk(
            "a discharge of an unknown txn-id is rejected with amqp:illegal-state "
            "'AMQ119014: Transaction not found: xid=...'; declare and discharge errors are always sent as rejected, "
            "whatever the controller's source lists",
            _ARTEMIS + "proton/transaction/ProtonTransactionHandler.java (onMessage, txError); "
            "broker/AMQPConnectionCallback.java (getTransaction)",
        ),
        Quirk(
            "a commit that cannot be applied is rejected with the bare condition 'failed' (a refused post's own "
            "condition when that was the cause)",
            _ARTEMIS + "proton/transaction/ProtonTransactionHandler.java (txError)",
        ),
        Quirk(
            "a transfer or disposition naming an unknown txn-id closes the connection with amqp:internal-error",
            _ARTEMIS + "proton/ProtonAbstractReceiver.java (onMessageComplete); proton/handler/ProtonHandler.java",
        ),
        Quirk(
            "detaching the coordinator rolls nothing back (only closing the connection does); another "
            "coordinator of the connection may discharge the transaction",
            _ARTEMIS + "proton/transaction/ProtonTransactionHandler.java (close); broker/AMQPConnectionCallback.java "
            "(close)",
        ),
        Quirk(
            "the provisional transactional-state(accepted) of a post is sent settled; a post it cannot take gets a "
            "plain rejected",
            _ARTEMIS + "broker/AMQPSessionCallback.java (inSessionSend); proton/ProtonAbstractReceiver.java "
            "(deliveryFailed)",
        ),
        Quirk(
            "a flow's txn-id is ignored: no transactional acquisition",
            _ARTEMIS + "proton/AMQPConnectionContext.java (onFlow)",
        ),
        Quirk(
            "a declare's global-id is ignored (declared as a local transaction)",
            _ARTEMIS + "proton/transaction/ProtonTransactionHandler.java (onMessage)",
        ),
        Quirk(
            "txn-ids are 36-octet ASCII UUIDs",
            _ARTEMIS + "broker/AMQPConnectionCallback.java (newTransaction)",
        ),
        Quirk(
            "a rollback leaves an accepted, unsettled delivery acquired by its consumer (as minibroker does); its "
            "documentation allows one transaction per session, which the code does not enforce (neither does "
            "this personality)",
            _ARTEMIS + "proton/transaction/ProtonTransactionRefsOperation.java (rollbackRedelivery); "
            "docs/user-manual/amqp.adoc",
        ),
    ),
    txn_id=_uuid_text,
    unknown_discharge=(Condition.ILLEGAL_STATE, "AMQ119014: Transaction not found: xid={xid}"),
    errors="always",
    commit_failed=(FAILED, None),
    commit_failed_keeps_cause=True,
    unknown_txn_closes=(Condition.INTERNAL_ERROR, "AMQ119014: Transaction not found: xid={xid}"),
    controller_detach_rolls_back=False,
    provisional="settled",
    post_refusal_wrapped=False,
    transactional_acquisition="ignore",
    retire_accepted_only=True,
    retire_answered=True,
    rcv_settle_first=True,
    global_id="ignore",
)

ACTIVEMQ = Personality(
    "activemq",
    'Apache ActiveMQ 5.x "Classic"',
    quirks=(
        Quirk(
            "txn-ids are 8-octet big-endian counters, per connection (from 1)",
            _ACTIVEMQ + "AmqpTransactionCoordinator.java (processDelivery); AmqpConnection.java (getNextTransactionId)",
        ),
        Quirk(
            "the coordinator target is the controller's own, echoed: no capabilities of the broker's",
            _ACTIVEMQ + "AmqpConnection.java (processLinkOpen); AmqpSession.java (createCoordinator)",
        ),
        Quirk(
            "a commit that cannot be applied is rejected with the bare condition 'failed'",
            _ACTIVEMQ + "AmqpTransactionCoordinator.java (processDelivery)",
        ),
        Quirk(
            "a discharge of an unknown txn-id is rejected with 'failed' \"Transaction '...' has not been started.\" "
            "(errors are always sent as rejected, whatever the controller's source lists)",
            "apache/activemq: activemq-broker/src/main/java/org/apache/activemq/broker/TransactionBroker.java "
            "(getTransaction)",
        ),
        Quirk(
            "a transactional retirement honours only accepted, answered at once with an unsettled "
            "transactional-state(accepted); other outcomes are ignored (the message stays acquired)",
            _ACTIVEMQ + "AmqpSender.java (delivery)",
        ),
        Quirk(
            "a flow's txn-id is ignored: no transactional acquisition",
            _ACTIVEMQ + "AmqpSender.java",
        ),
    ),
    txn_id=_counter(8),
    coordinator_capabilities=ECHO,
    unknown_discharge=(FAILED, "Transaction '{xid}' has not been started."),
    errors="always",
    commit_failed=(FAILED, None),
    retire_accepted_only=True,
    retire_answered=True,
    transactional_acquisition="ignore",
)

BROKER_J = Personality(
    "broker-j",
    "Apache Qpid Broker-J",
    quirks=(
        Quirk(
            "the coordinator gets credit 1, given back as each declare or discharge is answered: one at a time",
            _BROKER_J + "TxnCoordinatorReceivingLinkEndpoint.java (start); AbstractReceivingLinkEndpoint.java "
            "(updateDispositions)",
        ),
        Quirk(
            "an open transaction that times out (counted from its first operation) closes the connection with "
            "amqp:transaction:timeout 'Open transaction timed out' (Broker-J's own default is off: here the "
            "broker's transaction_timeout)",
            _BROKER_J + "TxnCoordinatorReceivingLinkEndpoint.java (doTimeoutAction); "
            "apache/qpid-broker-j: broker-core/src/main/java/org/apache/qpid/server/virtualhost/"
            "QueueManagingVirtualHost.java (storeTransactionOpenTimeoutClose)",
        ),
        Quirk(
            "txn-ids are 4 octets: the lowest number the connection does not use, so ids are reused",
            _BROKER_J + "Session_1_0.java (integerToTransactionId); AMQPConnection_1_0Impl.java "
            "(createIdentifiedTransaction)",
        ),
        Quirk(
            "errors travel as rejected only when the controller's source lists amqp:rejected:list; else the "
            "coordinator link is detached with them (§4.3 exactly)",
            _BROKER_J + "TxnCoordinatorReceivingLinkEndpoint.java (receiveDelivery)",
        ),
        Quirk(
            "a transfer naming an unknown txn-id detaches its link with amqp:transaction:unknown-id",
            _BROKER_J + "AbstractReceivingLinkEndpoint.java (validateTransfer)",
        ),
        Quirk(
            "the coordinator target carries no capabilities",
            _BROKER_J + "TxnCoordinatorReceivingLinkEndpoint.java (establishLink)",
        ),
        Quirk(
            "an unknown txn-id is 'Unknown transactionId ...'; a failed commit 'The transaction was rolled back due "
            "to an earlier issue ...'",
            _BROKER_J + "TxnCoordinatorReceivingLinkEndpoint.java (discharge)",
        ),
    ),
    controller_credit=1,
    controller_window=True,
    unknown_txn_detaches=(Condition.UNKNOWN_TXN_ID, "Transfer has an unknown transaction-id '{xid}'."),
    errors="exact",
    coordinator_capabilities=(),
    txn_id=_lowest_free(4),
    unknown_discharge=(Condition.UNKNOWN_TXN_ID, "Unknown transactionId {xid}"),
    commit_failed=(
        Condition.TRANSACTION_ROLLBACK,
        "The transaction was rolled back due to an earlier issue (e.g. a published message was sent settled but "
        "could not be enqueued)",
    ),
    timeout_from="first-operation",
    timeout_mode="close",
    timeout_text="Open transaction timed out",
)

RABBITMQ = Personality(
    "rabbitmq",
    "RabbitMQ 4",
    quirks=(
        Quirk(
            "a coordinator attach is refused: null target, detach with amqp:not-implemented 'Transactions not "
            "supported'",
            _RABBITMQ + " (validate_attach)",
        ),
        Quirk(
            "rcv-settle-mode second is refused (amqp:not-implemented) on any link not sending settled; a producer "
            "sending settled is answered first",
            _RABBITMQ + " (validate_attach)",
        ),
        Quirk(
            "addresses are only /queues/NAME and /exchanges/NAME[/KEY] (percent-encoded; other formats refused "
            "with amqp:invalid-field; every personality understands these too)",
            "rabbitmq/rabbitmq-server: deps/rabbit/src/rabbit_amqp_session.erl (parse_target_v2_string0, "
            "ensure_target, link_error_not_found)",
        ),
    ),
    transactions=False,
    no_transactions=(Condition.NOT_IMPLEMENTED, "Transactions not supported"),
    refuse_rcv_second=(Condition.NOT_IMPLEMENTED, "rcv-settle-mode second not supported"),
    addresses="rabbitmq",
)

SERVICEBUS = Personality(
    "servicebus",
    "Azure Service Bus (its transaction and settlement behaviour)",
    quirks=(
        Quirk(
            "txn-ids are per connection, ASCII, about 53 octets (txn:<32 hex>__G<n>:<n>_G<n>), longer than the "
            "specification's 32",
            "as observed on the wire (issue 15); no public source shows the format",
        ),
        Quirk(
            "a transactional transfer is answered with a plain accepted, not transactional-state",
            "Azure/azure-service-bus#657",
        ),
        Quirk(
            "a transaction is on the first queue or topic it touches (a subscription or dead-letter queue counts as "
            "its topic or queue): a transactional transfer to, or settlement on, another one is rejected with "
            "amqp:not-allowed (Local transactions cannot span multiple top-level entities...) and the commit fails",
            "Azure/azure-sdk-for-net#18160, #42316; Azure/azure-sdk-for-java#29881; azure-sdk-for-net "
            "Azure.Messaging.ServiceBus/samples/Sample06_Transactions.md (Transactions across entities)",
        ),
        Quirk(
            "send-via: a sender attached to entity VIA with the property com.microsoft:transfer-destination-address "
            "= DEST sends to DEST through VIA (in a transaction on VIA, committed with the rest of its work); a "
            "destination that is no string, empty, with a NUL or a service node refuses the attach with "
            "com.microsoft:argument-error; on a session whose first link is a coordinator every sender sends via the "
            "entity of the session's first sender or receiver, and a receiver on another entity is refused with "
            "amqp:not-allowed",
            "Azure/azure-sdk-for-net: sdk/servicebus/Microsoft.Azure.ServiceBus/src/Core/MessageSender.cs "
            "(CreateLinkAsync); src/Amqp/AmqpClientConstants.cs (TransferDestinationAddress, ArgumentError); "
            "Azure.Messaging.ServiceBus/src/Amqp/AmqpConnectionScope.cs (EnableCrossEntityTransactions: one "
            "session, its controller opened first)",
        ),
        Quirk(
            "a transaction times out 2 minutes after its first operation",
            "MicrosoftDocs/azure-docs: articles/service-bus-messaging/service-bus-transactions.md (Timeout)",
        ),
        Quirk(
            "no transactional acquisition: a flow naming a txn-id detaches the link with amqp:not-implemented",
            "MicrosoftDocs/azure-docs: articles/service-bus-messaging/service-bus-transactions.md (receive is not "
            "a transactional operation; the exact answer is not in a public source)",
        ),
        Quirk(
            "a producer asking rcv-settle-mode second gets settled dispositions (the Python SDK ignores unsettled "
            "ones and would wait forever)",
            "Azure/azure-sdk-for-python: sdk/servicebus/azure-servicebus/azure/servicebus/_pyamqp/sender.py "
            "(SenderLink._incoming_disposition)",
        ),
        Quirk(
            "$cbs answers a put-token with status-code 202 (any token), correlation-id the request's message-id, "
            "on the connection's link from $cbs or the one its reply-to names",
            _AZURE_SB + "_pyamqp/cbs.py (CBSAuthenticator._put_token); _pyamqp/management_link.py "
            "(ManagementLink._on_message_received)",
        ),
        Quirk(
            "entity addresses are URIs (amqps://host:port/ENTITY, even without TLS): scheme and authority are "
            "stripped; TOPIC/Subscriptions/NAME is subscription NAME of topic TOPIC, shared by its receivers",
            _AZURE_SB + "_servicebus_sender.py, _servicebus_receiver.py (_entity_uri)",
        ),
        Quirk(
            "ENTITY/$management answers com.microsoft:peek-message (204 when empty), schedule-message, "
            "cancel-scheduled-message, receive-by-sequence-number (deferred messages, with lock tokens), "
            "update-disposition and renew-lock (expirations; 410 message-lock-lost when the lock is gone), "
            "correlation-id the request's message-id, the status as both statusCode / "
            "statusDescription and status-code / status-description; another operation is answered 501",
            _AZURE_SB + "_common/mgmt_handlers.py; _base_handler.py (_mgmt_request_response); "
            "_pyamqp/management_link.py",
        ),
        Quirk(
            "a peek-lock delivery's lock runs out 60 s (broker time) after delivery, or after its last renew-lock: "
            "the message goes back with its delivery-count + 1, and a later settlement of that delivery is "
            "answered rejected with com.microsoft:message-lock-lost",
            _AZURE_SB + "_pyamqp/receiver.py (check_disposition_outcome); _transport/_pyamqp_transport.py "
            "(ERROR_CODE_MESSAGE_LOCK_LOST: MessageLockLostError)",
        ),
        Quirk(
            "deliveries carry 16-octet delivery-tags (the lock token), a header delivery-count, and the annotations "
            "x-opt-sequence-number, x-opt-enqueued-time, x-opt-locked-until and x-opt-message-state; a message "
            "with no message-id gets one",
            _AZURE_SB + "_common/message.py (ServiceBusReceivedMessage); _common/constants.py",
        ),
        Quirk(
            "a rejected delivery goes to <entity>/$DeadLetterQueue with the DeadLetterReason and "
            "DeadLetterErrorDescription of its error's info as application-properties and x-opt-deadletter-source "
            "(echoed as a rejected without error); after 10 failed deliveries with reason MaxDeliveryCountExceeded",
            _AZURE_SB + "_transport/_pyamqp_transport.py (settle_message_via_receiver_link)",
        ),
        Quirk(
            "modified(undeliverable-here) defers a message: it is set aside and never delivered again",
            _AZURE_SB + "_transport/_pyamqp_transport.py (settle_message_via_receiver_link, MESSAGE_DEFER)",
        ),
        Quirk(
            "a transfer of message-format 0x80013700 is a batch: each data section holds one message, posted on "
            "its own",
            _AZURE_SB + "_pyamqp/message.py (BatchMessage); _common/message.py (ServiceBusMessageBatch)",
        ),
    ),
    txn_id=_servicebus,
    one_entity=True,
    provisional="accepted",
    timeout=120.0,
    timeout_from="first-operation",
    transactional_acquisition="refuse",
    settle_second_at_once=True,
    servicebus=True,
)

PROTON = Personality(
    "proton",
    "Qpid Proton's example broker (python/examples/broker.py)",
    quirks=(
        Quirk(
            "txn-ids are valid on every connection (one broker-wide map; here one per namespace)",
            _PROTON + " (Broker._declare_txn, on_message, on_delivery_updated)",
        ),
        Quirk(
            "the coordinator target is the controller's own, echoed with the capabilities it asked for",
            _PROTON + " (on_link_opening)",
        ),
        Quirk(
            "a flow's txn-id is ignored: no transactional acquisition (nothing it sends carries transactional-state)",
            _PROTON + " (on_sendable, Queue.dispatch)",
        ),
        Quirk(
            "the time-out is lazy: only a commit notices it, rejected with amqp:transaction:timeout",
            _PROTON + " (_discharge_txn)",
        ),
        Quirk(
            "declare and discharge errors are always sent as rejected, whatever the controller's source lists; a "
            "declare's global-id is not looked at (declared as a local transaction)",
            _PROTON + " (_coordinator_message)",
        ),
        Quirk(
            "a message given modified(delivery-failed) when its delivery-count is already 5 is dropped: the 6th "
            "failure (redelivery limit 5)",
            _PROTON + " (_modify_delivery, --redelivery-limit)",
        ),
    ),
    txn_scope="namespace",
    transactional_acquisition="ignore",
    coordinator_capabilities=ECHO,
    timeout_mode="lazy",
    errors="always",
    global_id="ignore",
    redelivery_limit=5,
)

PERSONALITIES: dict[str, Personality] = {
    p.name: p for p in (MINIBROKER, STRICT, ARTEMIS, ACTIVEMQ, BROKER_J, RABBITMQ, SERVICEBUS, PROTON)
}


def names() -> list[str]:
    """The known personalities' names, the default first."""
    return list(PERSONALITIES)


def markdown_table() -> str:
    """Every personality's quirks with their sources, as the README's Markdown table (one row per quirk)."""
    import html  # only ``minibroker personalities --markdown`` needs it

    def cell(text: str) -> str:
        return html.escape(text, quote=False).replace("|", "\\|")

    rows = ["| personality | quirk | source |", "|---|---|---|"]
    for personality in PERSONALITIES.values():
        if not personality.quirks:
            rows.append(f"| `{personality.name}` | {cell(personality.summary)}: no quirks | the specification |")
        rows += [f"| `{personality.name}` | {cell(q.text)} | {cell(q.source)} |" for q in personality.quirks]
    return "\n".join(rows)


def get(name: str) -> Personality:
    """The personality called ``name``; ``ValueError`` naming the known ones otherwise."""
    found = PERSONALITIES.get(name)
    if found is None:
        raise ValueError(f"unknown personality {name!r}; known: {', '.join(names())}")
    return found


@cache
def with_transactions(personality: Personality) -> Personality:
    """``personality``, coordinators allowed: what an AMQP 0-9-1 client of it gets (RabbitMQ refuses AMQP 1.0
    transactions but serves 0-9-1 channel transactions, ``rabbit_channel.erl`` tx.select)."""
    return personality if personality.transactions else replace(personality, transactions=True)
