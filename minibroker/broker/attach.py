"""Attach negotiation (Part 2 §2.6.3, Part 3 §3.5, Part 4 §4.2): what the broker answers to each attach,
decided as a value before anything is created.

``decide(link, context)`` reads the peer's attach and returns one decision: refuse it with an error, or
attach a consumer, a producer or a coordinator, or resume a durable subscription by its link name.
``endpoints.py`` applies the decision: it creates or finds the node, builds the terminus it answers with,
and registers the link. Deciding first and applying second is the seam where later policies plug in
(broker personalities, fault injection): they replace or wrap the function that decides, not code paths
scattered through the core. What ``decide`` cannot know, because it needs the node (does it exist, is it a
topic), the applier refuses: an unknown address with auto-create off gets ``amqp:not-found``.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from minibroker.amqp.composite import SymbolizedFields
from minibroker.amqp.definitions import Accepted, Coordinator, Error, Modified, Rejected, Released, Source, Target
from minibroker.amqp.errors import Condition, error
from minibroker.amqp.states import Outcome
from minibroker.amqp.types import Described, Symbol
from minibroker.broker.checkback import CHECK_ADDRESS, CHECK_BACK
from minibroker.broker.exchanges import DEFAULT, Address, is_v2, missing_queue, parse_v2
from minibroker.broker.links import RELEASED
from minibroker.broker.namespace import QUEUE, TOPIC, parse_address
from minibroker.broker.nodes import SubscriptionSpec
from minibroker.broker.personality import ECHO, MINIBROKER, Personality, wire_error
from minibroker.broker.settings import BrokerSettings
from minibroker.broker.topic import shared_subscription_name
from minibroker.engine.endpoints import Link
from minibroker.servicebus import addresses as sb_addresses
from minibroker.servicebus import sessions as sb_sessions
from minibroker.servicebus import via as sb_via

if TYPE_CHECKING:
    from minibroker.broker.selector import Selector
    from minibroker.servicebus import eventhubs as sb_eventhubs

OUTCOMES: list[str] = [
    Symbol(o) for o in ("amqp:accepted:list", "amqp:rejected:list", "amqp:released:list", "amqp:modified:list")
]
_REJECTED_LIST = "amqp:rejected:list"
_NO_LOCAL = {Symbol("apache.org:no-local-filter:list"), 0x0000468C00000003}
_DURABLE_NONE = 0  # terminus-durability none (§3.5.5)
_SND_SETTLED = 1  # snd-settle-mode settled (§2.8.2)
_RCV_FIRST, _RCV_SECOND = 0, 1  # rcv-settle-mode (§2.8.3)


def fields_error(fields: Any, what: str) -> Error | None:
    """Part 2 §2.8.13: the keys of a ``fields`` map are symbols; ``amqp:invalid-field`` naming one that is not."""
    if not isinstance(fields, dict):
        return None
    if isinstance(fields, SymbolizedFields) and fields.string_keys:  # decoded leniently, the keys made symbols
        key = fields.string_keys[0]
        return error(
            Condition.INVALID_FIELD,
            f"strict (AMQP 1.0 part 2 §2.8.13): {what} has a key that is no symbol: the string {key!r}",
        )
    for key in fields:
        if not isinstance(key, Symbol):
            return error(
                Condition.INVALID_FIELD,
                f"strict (AMQP 1.0 part 2 §2.8.13): {what} has a key that is no symbol: {key!r}",
            )
    return None


def _rcv_settle_answer(link: Link, personality: Personality) -> int | None:
    """The rcv-settle-mode a personality answers a consumer's or producer's attach with (None: the peer's)."""
    if link.rcv_settle_mode != _RCV_SECOND:
        return None
    if personality.rcv_settle_first:
        return _RCV_FIRST
    if personality.refuse_rcv_second is not None and not link.is_sender:
        # a producer that sends settled (one that does not was refused by ``decide``) is answered first, as RabbitMQ
        # answers its publishers; a consumer's mode is echoed (rabbit_amqp_session.erl handle_attach)
        return _RCV_FIRST
    return None


def _resolve(
    address: str, capabilities: Any, personality: Personality, *, source: bool
) -> tuple[str, str | None, Address | None] | Error:
    """The node an address names, the kind it asks for, and the RabbitMQ 4 address it is (None: another form).

    RabbitMQ 4 addresses (``exchanges.parse_v2``) are understood in every personality but ``servicebus`` (whose
    addresses are URIs); the ``rabbitmq`` personality knows no other form. The name of an exchange address is what
    permissions are checked against: the exchange, or for the default exchange the queue its key names."""
    if personality.addresses == "rabbitmq" or (not personality.servicebus and is_v2(address)):
        found = parse_v2(address, source=source)
        if isinstance(found, Error):
            return found
        if found.queue is not None:
            return found.queue, QUEUE, found
        assert found.exchange is not None
        return (found.key or "") if found.exchange == DEFAULT else found.exchange, QUEUE, found
    if personality.servicebus:
        address = sb_addresses.entity_path(address)
        named = sb_addresses.subscription(address)
        if named is not None:
            topic, name, sub_queue = named
            if sub_queue:  # a subscription's dead-letter queue: a queue of its own
                return sb_addresses.sub_queue_node(topic, name, sub_queue), QUEUE, None
            return topic, TOPIC, None
        return address, None, None
    name, kind = parse_address(address, capabilities)
    return name, kind, None


def _missing(context: AttachContext, name: str, v2: Address | None) -> Error | None:
    """The refusal of an attach to a queue that does not exist, when it is never created: named by a RabbitMQ 4
    address (or in the ``rabbitmq`` personality)."""
    if v2 is not None or context.personality.addresses == "rabbitmq":
        return missing_queue(name, context.vhost)
    return None


@dataclass(frozen=True)
class AttachContext:
    """What a decision may depend on besides the attach itself."""

    settings: BrokerSettings
    user: str | None
    """The authenticated user of the connection (None: anonymous)."""
    container_id: str
    """The peer's container-id (from its open)."""
    conn_id: int
    personality: Personality = MINIBROKER
    """The personality of the connection's namespace."""
    event_hubs: Container[str] = frozenset()
    """Names that are event hubs (``eventhubs.py``): a sender link to one of them reaches the hub, not a queue."""
    entities: Container[str] = frozenset()
    """Names that are queues or topics of the connection's namespace: a producer's attach never makes one a hub."""
    vhost: str = "/"
    """The connection's namespace as RabbitMQ names a virtual host in its errors (the default one is "/")."""


@dataclass(frozen=True)
class Refuse:
    """Answer with a null terminus, then detach with ``error``."""

    error: Error


@dataclass(frozen=True)
class AttachConsumer:
    """The peer receives from a node (we send on the link)."""

    source: Source
    """The peer's source, echoed (with the generated address of a dynamic node) in our answer."""
    name: str | None
    """The node's name; None for a dynamic node."""
    kind: str | None
    """"queue" or "topic" as the capabilities or an address prefix ask, or None."""
    default_outcome: Outcome
    selector: Selector | None
    filters: dict[Any, Any] | None
    """The filters we apply, echoed in our source (§3.5.3: filters not echoed are not applied)."""
    no_local: bool
    browse: bool
    """distribution-mode copy: read without acquiring (queues only)."""
    subscription: SubscriptionSpec
    """The subscription this link takes when the node turns out to be a topic."""
    rcv_settle_mode: int | None = None
    """The rcv-settle-mode we answer with and follow (None: the peer's)."""
    missing: Error | None = None
    """When set, a node that does not exist is not created: the attach is refused with this error."""
    session: str | sb_sessions.NotRequested | None = sb_sessions.NOT_REQUESTED
    """A Service Bus session receiver's session filter: the session id, None for the next available one
    (``minibroker.servicebus.sessions``)."""


@dataclass(frozen=True)
class ResumeSubscription:
    """An attach without a source names an existing durable subscription (as JMS unsubscribe does)."""

    link_name: str


@dataclass(frozen=True)
class AttachProducer:
    """The peer sends to a node, or through the anonymous relay (``name`` None and not dynamic)."""

    target: Any
    name: str | None
    kind: str | None
    dynamic: bool
    rcv_settle_mode: int | None = None
    """The rcv-settle-mode we answer with and follow (None: the peer's)."""
    settle_at_once: bool = False
    """Echo the peer's rcv-settle-mode, but settle every outcome at once."""
    missing: Error | None = None
    """When set, a node that does not exist is not created: the attach is refused with this error."""
    exchange: str | None = None
    """The exchange the link sends to (a RabbitMQ 4 ``/exchanges/NAME[/KEY]`` target), instead of a node."""
    route: str | None = None
    """The routing key of every message sent to ``exchange`` (None: each message's own)."""
    via: tuple[str, str | None] | None = None
    """Service Bus send-via: the entity (name, kind) the link is attached to, through which its messages go to
    node ``name`` (``minibroker.servicebus.via``); it is created like any entity."""


@dataclass(frozen=True)
class AttachCoordinator:
    """The peer is a transaction controller (Part 4 §4.2)."""

    source: Any
    target: Coordinator
    """Our coordinator terminus, listing the capabilities really provided."""
    rejects_errors: bool
    """§4.3: errors travel as rejected outcomes (else by detaching the link)."""
    check_back: bool = False
    """Its transactions are held in doubt when the connection is lost (``checkback.py``)."""


@dataclass(frozen=True)
class AttachService:
    """A link to a Service Bus service node (``$cbs``, ``ENTITY/$management``): requests come in on an incoming
    link, answers go out on an ``outgoing`` one (its source is the node)."""

    node: str
    outgoing: bool


@dataclass(frozen=True)
class AttachEventHub:
    """A link to an event hub or one of its partitions (``eventhubs.py``): we receive on it when it names no
    consumer group, else we send the partition's events from where ``selector`` says."""

    address: sb_eventhubs.EventHubAddress
    selector: object = None


def _event_hub(link: Link, path: str, context: AttachContext) -> AttachEventHub | Refuse | None:
    """An attach to an address of the Event Hubs form, or a producer's to a hub's plain name (a hub already, or an
    event hub producer's attach to a name that is no queue or topic), else None."""
    from minibroker.servicebus import eventhubs as sb_eventhubs  # Service Bus attaches only: not at start (issue 19)

    address = sb_eventhubs.parse_address(path)
    if address is None:
        if link.is_sender:
            return None
        attach = link.attach
        producer = sb_eventhubs.names_a_producer(attach.desired_capabilities, attach.properties)
        producer = producer and path not in context.entities
        if not (path in context.event_hubs or producer):
            return None
        address = sb_eventhubs.EventHubAddress(path, None)
    if (address.consumer_group is not None) != link.is_sender:
        what = "read from a consumer group's partition" if link.is_sender else "sent to a hub or its partitions"
        return Refuse(error(Condition.NOT_ALLOWED, f"{path!r}: events are {what}"))
    source = link.source
    return AttachEventHub(address, sb_eventhubs.selector_text(getattr(source, "filter", None)))


@dataclass(frozen=True)
class AttachCheck:
    """A ``$txn-check`` link (``checkback.py``): ``outgoing`` when its source is ``$txn-check`` (we send)."""

    outgoing: bool


AttachDecision = (
    Refuse
    | AttachConsumer
    | ResumeSubscription
    | AttachProducer
    | AttachCoordinator
    | AttachCheck
    | AttachService
    | AttachEventHub
)


def decide(link: Link, context: AttachContext) -> AttachDecision:
    """The broker's answer to the peer's attach of ``link``."""
    personality = context.personality
    if personality.strict:
        refusal = fields_error(link.attach.properties, "the attach's properties")
        if refusal is not None:
            return Refuse(refusal)
    if not personality.transactions and not link.is_sender and isinstance(link.target, Coordinator):
        return Refuse(wire_error(*personality.no_transactions))  # (RabbitMQ checks this before the settle modes)
    if (
        personality.refuse_rcv_second is not None
        and link.rcv_settle_mode == _RCV_SECOND
        and link.snd_settle_mode != _SND_SETTLED
    ):
        return Refuse(wire_error(*personality.refuse_rcv_second))
    if not personality.strict and _address(link.source if link.is_sender else link.target) == CHECK_ADDRESS:
        return AttachCheck(outgoing=link.is_sender)  # strict: an ordinary address (the extension is off)
    if personality.servicebus:
        address = _address(link.source if link.is_sender else link.target)
        path = sb_addresses.entity_path(address) if isinstance(address, str) else None
        if path == sb_addresses.CBS:
            return AttachService(sb_addresses.CBS, outgoing=link.is_sender)
        if path is not None and sb_addresses.is_management(path):
            return AttachService(path, outgoing=link.is_sender)
        if path is not None:
            hub = _event_hub(link, path, context)
            if hub is not None:
                return hub
    if link.is_sender:
        return decide_consumer(link, context)
    if isinstance(link.target, Coordinator):
        return decide_coordinator(link, context)
    return decide_producer(link, context)


def denied(context: AttachContext, action: str, address: Any, capabilities: Any = None) -> Error | None:
    """``amqp:unauthorized-access`` when the connection's user may not ``action`` on ``address``."""
    if not context.settings.permissions or not isinstance(address, str):
        return None
    resolved = _resolve(address, capabilities, context.personality, source=action == "receive")
    if isinstance(resolved, Error):
        return None  # (refused for its format by the caller)
    name = resolved[0]
    if context.settings.permits(context.user, action, name):
        return None
    return error(Condition.UNAUTHORIZED_ACCESS, f"{context.user!r} may not {action} on {name!r}")


def decide_consumer(link: Link, context: AttachContext) -> AttachDecision:
    source = link.source
    if not isinstance(source, Source):
        return ResumeSubscription(link.name)
    name = kind = None
    v2: Address | None = None
    if source.dynamic:
        # the permission is checked against the generated address, when the node is made (endpoints.py)
        _, kind = parse_address("", source.capabilities)
    else:
        refusal = denied(context, "receive", source.address, source.capabilities)
        if refusal is not None:
            return Refuse(refusal)
        if not source.address or not isinstance(source.address, str):
            return Refuse(error(Condition.NOT_FOUND, f"no node at address {source.address!r}"))
        resolved = _resolve(source.address, source.capabilities, context.personality, source=True)
        if isinstance(resolved, Error):
            return Refuse(resolved)
        name, kind, v2 = resolved
    selector = None
    filters: dict[Any, Any] = {}
    if source.filter:
        from minibroker.broker.selector import SelectorError, selector_from_filter  # imported only when used

        settings = context.settings
        try:
            found = selector_from_filter(
                source.filter,
                max_length=settings.max_selector_length or None,
                max_properties_size=settings.max_selector_properties_size or None,
            )
        except SelectorError as exc:
            return Refuse(error(Condition.INVALID_FIELD, f"invalid selector: {exc}"))
        if found is not None:
            key, selector = found
            filters[key] = source.filter[key]
    no_local = _no_local_filter(source.filter)
    if no_local is not None:
        filters[no_local] = source.filter[no_local]  # type: ignore[index]
    default_outcome = source.default_outcome
    if not isinstance(default_outcome, Released | Modified | Rejected | Accepted):
        default_outcome = RELEASED
    session = sb_sessions.requested(source.filter) if context.personality.servicebus else sb_sessions.NOT_REQUESTED
    if isinstance(session, Error):
        return Refuse(session)
    return AttachConsumer(
        source=source,
        name=name,
        kind=kind,
        default_outcome=default_outcome,
        selector=selector,
        filters=filters or None,
        no_local=no_local is not None,
        browse=source.distribution_mode == "copy",
        subscription=_subscription(link, source, context),
        rcv_settle_mode=_rcv_settle_answer(link, context.personality),
        missing=_missing(context, name, v2) if name is not None else None,
        session=session,
    )


def _no_local_filter(filter_set: Any) -> Any:
    """The key of a no-local filter (apache.org:no-local-filter:list) in a source's filter set."""
    if not isinstance(filter_set, dict):
        return None
    for key, value in filter_set.items():
        if isinstance(value, Described) and value.descriptor in _NO_LOCAL:
            return key
    return None


def _subscription(link: Link, source: Source, context: AttachContext) -> SubscriptionSpec:
    """Which subscription of a topic the link takes (see ``topic.py``)."""
    if context.personality.servicebus and isinstance(source.address, str):
        # Service Bus: ``TOPIC/Subscriptions/NAME`` names one durable subscription all its receivers share
        found = sb_addresses.subscription(sb_addresses.entity_path(source.address))
        if found is not None:
            return SubscriptionSpec.servicebus(found[1])
    capabilities = {str(c) for c in source.capabilities or ()}
    durable = (source.durable or _DURABLE_NONE) != _DURABLE_NONE and source.expiry_policy == "never"
    shared = "shared" in capabilities
    container = "" if "global" in capabilities else context.container_id
    if shared:
        name = shared_subscription_name(link.name)
        key = (container, name if durable else f"{name}|volatile")  # (a stripped name holds no "|")
    elif durable:
        key = (container, link.name)
    else:
        key = (f"#{context.conn_id}", f"{link.name}#{link.session.channel}:{link.input_handle}")
    return SubscriptionSpec(key, durable, shared)


def decide_producer(link: Link, context: AttachContext) -> AttachDecision:
    decision = _producer(link, context)
    if isinstance(decision, Refuse):
        return decision
    return replace(
        decision,
        rcv_settle_mode=_rcv_settle_answer(link, context.personality),
        settle_at_once=context.personality.settle_second_at_once and link.rcv_settle_mode == _RCV_SECOND,
    )


def _producer(link: Link, context: AttachContext) -> AttachProducer | Refuse:
    target = link.target
    if (
        context.personality.servicebus
        and sb_via.transfer_destination(link.attach.properties) is not None
        and (not isinstance(target, Target) or not isinstance(target.address, str) or target.dynamic)
    ):
        text = f"{sb_via.TRANSFER_DESTINATION} needs a target address: the via entity"
        return Refuse(wire_error(sb_via.ARGUMENT_ERROR, text))
    if isinstance(target, Target) and target.dynamic:
        # the permission is checked against the generated address, when the node is made (endpoints.py)
        _, kind = parse_address("", target.capabilities)
        return AttachProducer(target, None, kind, dynamic=True)
    if isinstance(target, Target) and target.address is not None:
        refusal = denied(context, "send", target.address, target.capabilities)
        if refusal is not None:
            return Refuse(refusal)
        if not isinstance(target.address, str) or not target.address:
            return Refuse(error(Condition.NOT_FOUND, f"no node at address {target.address!r}"))
        resolved = _resolve(target.address, target.capabilities, context.personality, source=False)
        if isinstance(resolved, Error):
            return Refuse(resolved)
        name, kind, v2 = resolved
        if v2 is not None and v2.exchange is not None:  # each message is routed by the exchange: no node
            return AttachProducer(target, None, kind, dynamic=False, exchange=v2.exchange, route=v2.key)
        if context.personality.servicebus:
            return _send_via(link, context, target, (name, kind))
        return AttachProducer(target, name, kind, dynamic=False, missing=_missing(context, name, v2))
    # a null target address: the anonymous relay routes each message by its ``to``
    return AttachProducer(target, None, None, dynamic=False)


def _send_via(
    link: Link, context: AttachContext, target: Target, via: tuple[str, str | None]
) -> AttachProducer | Refuse:
    """A Service Bus sender to entity ``via``; with ``com.microsoft:transfer-destination-address`` a via-sender
    whose messages go to that destination (azure-sdk-for-net ``Microsoft.Azure.ServiceBus/src/Core/
    MessageSender.cs`` ``CreateLinkAsync``; ``minibroker.servicebus.via``)."""
    destination = sb_via.transfer_destination(link.attach.properties)
    if isinstance(destination, sb_via.BadDestination):
        return Refuse(wire_error(sb_via.ARGUMENT_ERROR, destination.reason))
    name, kind = via
    if destination is None:
        return AttachProducer(target, name, kind, dynamic=False)
    refusal = denied(context, "send", destination)
    if refusal is not None:
        return Refuse(refusal)
    resolved = _resolve(destination, None, context.personality, source=False)
    assert not isinstance(resolved, Error)  # (Service Bus addresses always resolve)
    final, final_kind, _ = resolved
    if final == name:
        return AttachProducer(target, name, kind, dynamic=False)  # via itself: a plain sender
    return AttachProducer(target, final, final_kind, dynamic=False, via=via)


def decide_coordinator(link: Link, context: AttachContext) -> AttachDecision:
    personality = context.personality
    if not personality.transactions:
        return Refuse(wire_error(*personality.no_transactions))
    if not context.settings.permits(context.user, "transactions", ""):
        return Refuse(error(Condition.UNAUTHORIZED_ACCESS, f"{context.user!r} may not use transactions"))
    if link.snd_settle_mode == _SND_SETTLED:
        # §4.3: declare and discharge "MUST NOT be sent settled"; a controller that can only send settled
        # could never learn a txn-id, so it is refused at once
        return Refuse(
            error(
                Condition.NOT_ALLOWED, f"{_strict(personality, '§4.3')}a transaction controller must not send settled"
            )
        )
    source = link.source
    outcomes = source.outcomes if isinstance(source, Source) else None
    if personality.strict and not outcomes:
        err = error(
            Condition.INVALID_FIELD,
            "strict (AMQP 1.0 part 4 §4.3): the controller's source lists no outcomes, so a discharge error could "
            "only be sent by detaching the link; list amqp:rejected:list (and amqp:accepted:list)",
        )
        return Refuse(err)
    # §4.3 / DESIGN §4: errors travel as rejected when the controller offers it (or, leniently, lists no outcomes)
    offered = outcomes is not None and _REJECTED_LIST in outcomes
    rejects = {"exact": offered, "lenient": offered or not outcomes, "always": True}[personality.errors]
    capabilities = personality.coordinator_capabilities
    asked = link.target.capabilities if isinstance(link.target, Coordinator) else None
    # checkback.py: asked for with the capability (granted, so echoed), or broker-wide; never under strict
    requested = asked is not None and CHECK_BACK in (asked if isinstance(asked, list) else [asked])
    check_back = not personality.strict and (requested or context.settings.check_back.orphaned == "hold")
    if capabilities == ECHO:
        reply = link.target if isinstance(link.target, Coordinator) else Coordinator()
    else:
        granted = [*capabilities, CHECK_BACK] if requested and check_back else capabilities
        reply = Coordinator(capabilities=[Symbol(c) for c in granted] or None)
    return AttachCoordinator(source=source, target=reply, rejects_errors=rejects, check_back=check_back)


def _address(terminus: Any) -> Any:
    return terminus.address if isinstance(terminus, Source | Target) else None


def _strict(personality: Personality, section: str) -> str:
    """The prefix of an error description naming the specification's section, under ``strict``."""
    return f"strict (AMQP 1.0 part 4 {section}): " if personality.strict else ""
