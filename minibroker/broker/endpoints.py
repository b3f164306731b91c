"""The broker's link endpoints: attaching by decision, detaching, credit, and where each transfer goes.

Theory of operation
-------------------
An attach is answered by applying the decision ``attach.decide`` made: a receiver link becomes a
``Consumer`` of a queue, of a topic subscription, or a browser; a sender link a ``Producer`` of a node or
of the anonymous relay; a coordinator target a ``Controller``. The broker's object rides on the engine's
link as ``link.context``, given with ``accept_attach``.

A transfer on a controller link goes to the coordinator; on a producer link it is routed (the anonymous
relay looks up ``properties.to``) and either posted at once (``Dispatcher.publish``) or, when its state
names a transaction, staged (``Coordinator.post``). A transactional relay post to an address with no node
does not create one: the node is created by the commit, so a rollback leaves nothing behind.

A link that detaches hands its unsettled deliveries to the coordinator (a transaction may hold them) and
takes with it the dynamic node it created; deleting a node detaches every link still attached to it with
``amqp:resource-deleted``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from minibroker.amqp.definitions import Rejected, Source, Target, TransactionalState
from minibroker.amqp.errors import Condition, error
from minibroker.amqp.types import Symbol
from minibroker.broker.attach import (
    OUTCOMES,
    AttachConsumer,
    AttachContext,
    AttachCoordinator,
    AttachDecision,
    AttachProducer,
    Refuse,
    ResumeSubscription,
    decide,
    denied,
)
from minibroker.broker.coordinator import CONTROLLER_CREDIT, Coordinator
from minibroker.broker.dispatch import Dispatcher
from minibroker.broker.links import RELEASED, Consumer, Controller, Producer
from minibroker.broker.message import Message
from minibroker.broker.namespace import Node, parse_address
from minibroker.broker.nodes import Nodes
from minibroker.broker.outbox import Outbox
from minibroker.broker.queue import Queue
from minibroker.broker.settings import BrokerSettings
from minibroker.broker.topic import Subscription, Topic
from minibroker.broker.transactions import Deferred
from minibroker.engine.connection import ServerConnection
from minibroker.engine.endpoints import Link, LinkState
from minibroker.engine.events import (
    LinkAttached,
    LinkDetached,
    LinkFlow,
    SessionFlow,
    TransferDiscarded,
    TransferReceived,
)

Decide = Callable[[Link, AttachContext], AttachDecision]


class Endpoints:
    """The links of one broker, from attach to detach."""

    def __init__(
        self,
        settings: BrokerSettings,
        nodes: Nodes,
        dispatcher: Dispatcher,
        coordinator: Coordinator,
        outbox: Outbox,
        decide: Decide = decide,
    ) -> None:
        self.settings = settings
        self.nodes = nodes
        self.dispatcher = dispatcher
        self.coordinator = coordinator
        self.outbox = outbox
        self.decide = decide
        self._producers: dict[Node, set[Producer]] = {}  # producer links of each node, detached when it goes

    def _context(self, conn: ServerConnection) -> AttachContext:
        remote = conn.remote_open
        container = str(remote.container_id if remote else "")
        return AttachContext(self.settings, conn.user, container, conn.conn_id)

    # -- attach -----------------------------------------------------------------------------------------
    def attached(self, conn: ServerConnection, event: LinkAttached) -> None:
        link = event.link
        decision = self.decide(link, self._context(conn))
        if isinstance(decision, Refuse):
            conn.refuse_attach(link, decision.error)
        elif isinstance(decision, AttachConsumer):
            self._attach_consumer(conn, link, decision)
        elif isinstance(decision, ResumeSubscription):
            self._resume_subscription(conn, link, decision)
        elif isinstance(decision, AttachProducer):
            self._attach_producer(conn, link, decision)
        else:
            self._attach_coordinator(conn, link, decision)
        self.outbox.touch(conn)

    def _attach_consumer(self, conn: ServerConnection, link: Link, decision: AttachConsumer) -> None:
        source = decision.source
        node: Node | None
        if decision.name is None:
            node = self._dynamic_node(conn, link, "receive", source.capabilities)
            if node is None:
                return
        else:
            node = self.nodes.lookup(conn, decision.name, decision.kind)
            if node is None:
                conn.refuse_attach(link, error(Condition.NOT_FOUND, f"no node at address {source.address!r}"))
                return
        browse = decision.browse and isinstance(node, Queue)
        if isinstance(node, Topic):
            no_local = conn if decision.no_local else None
            subscription = self.nodes.subscribe(node, decision.subscription, decision.selector, no_local)
            consumer = Consumer(conn, link, subscription, decision.default_outcome)
        else:
            consumer = Consumer(conn, link, node, decision.default_outcome, selector=decision.selector, browser=browse)
        if source.dynamic:
            consumer.owned_node = node
        reply = Source(
            address=node.name if source.dynamic else source.address,
            durable=source.durable,
            expiry_policy=source.expiry_policy,
            timeout=source.timeout,
            dynamic=source.dynamic,
            dynamic_node_properties=source.dynamic_node_properties,
            distribution_mode=Symbol("copy" if browse else "move"),
            filter=decision.filters,
            default_outcome=decision.default_outcome,
            outcomes=OUTCOMES,
            capabilities=source.capabilities,
        )
        conn.accept_attach(link, source=reply, target=link.target, context=consumer)
        self.dispatcher.add_consumer(consumer)
        self.dispatcher.dispatch(consumer.queue)

    def _dynamic_node(self, conn: ServerConnection, link: Link, action: str, capabilities: Any) -> Node | None:
        """A dynamic node for ``link``, when its user may ``action`` ("receive" for a dynamic source, "send" for
        a dynamic target) on the address generated for it; else the attach is refused (unauthorized-access)."""
        name = self.nodes.dynamic_name(conn)
        refusal = denied(self._context(conn), action, name)
        if refusal is not None:
            conn.refuse_attach(link, refusal)
            return None
        return self.nodes.dynamic(conn, capabilities, name)

    def _resume_subscription(self, conn: ServerConnection, link: Link, decision: ResumeSubscription) -> None:
        subscription = self.nodes.durable_subscription(conn, decision.link_name)
        if subscription is None:
            conn.refuse_attach(link, error(Condition.NOT_FOUND, f"no subscription named {decision.link_name!r}"))
            return
        refusal = denied(self._context(conn), "receive", subscription.topic.name)
        if refusal is not None:  # found by name alone: the topic's permission still applies
            conn.refuse_attach(link, refusal)
            return
        subscription.links += 1
        consumer = Consumer(conn, link, subscription, RELEASED)
        reply = Source(
            address=subscription.topic.name,
            durable=2,
            expiry_policy=Symbol("never"),
            default_outcome=RELEASED,
            outcomes=OUTCOMES,
        )
        conn.accept_attach(link, source=reply, target=link.target, context=consumer)
        self.dispatcher.add_consumer(consumer)
        self.dispatcher.dispatch(subscription)

    def _attach_producer(self, conn: ServerConnection, link: Link, decision: AttachProducer) -> None:
        target = decision.target
        reply = target
        node: Node | None = None
        if decision.dynamic:
            node = self._dynamic_node(conn, link, "send", target.capabilities)
            if node is None:
                return
            reply = Target(
                address=node.name,
                durable=target.durable,
                expiry_policy=target.expiry_policy,
                timeout=target.timeout,
                dynamic=True,
                dynamic_node_properties=target.dynamic_node_properties,
                capabilities=target.capabilities,
            )
        elif decision.name is not None:
            node = self.nodes.lookup(conn, decision.name, decision.kind)
            if node is None:
                conn.refuse_attach(link, error(Condition.NOT_FOUND, f"no node at address {target.address!r}"))
                return
        producer = Producer(conn, link, node)
        if decision.dynamic:
            producer.owned_node = node
        # what a transfer naming at most one state makes the broker do (post or stage it, answer, top up credit)
        # never changes how the next frame reads: the engine may parse a read's run of them in one go (one whose
        # frames name two transactions detaches controllers, so it is handled before the next frame is read)
        conn.accept_attach(link, source=link.source, target=reply, context=producer, read_ahead=True)
        if node is not None:
            self._producers.setdefault(node, set()).add(producer)
        conn.grant_credit(link, self.settings.link_credit)

    def _attach_coordinator(self, conn: ServerConnection, link: Link, decision: AttachCoordinator) -> None:
        controller = Controller(conn, link, decision.rejects_errors)
        conn.accept_attach(link, source=decision.source, target=decision.target, context=controller)
        conn.grant_credit(link, CONTROLLER_CREDIT)

    # -- detach -----------------------------------------------------------------------------------------
    def detached(self, conn: ServerConnection, event: LinkDetached) -> None:
        context = event.link.context
        if isinstance(context, Consumer):
            self._consumer_detached(context, closed=event.closed)
        elif isinstance(context, Producer):
            if context.node is not None:
                producers = self._producers.get(context.node)
                if producers is not None:
                    producers.discard(context)
                    if not producers:
                        del self._producers[context.node]
            if context.owned_node is not None:
                self.delete_node(context.owned_node)
        elif isinstance(context, Controller):
            self.coordinator.controller_gone(context)

    def _consumer_detached(self, consumer: Consumer, *, closed: bool) -> None:
        self.dispatcher.remove_consumer(consumer)
        self.coordinator.consumer_gone(consumer)
        queue = consumer.queue
        if isinstance(queue, Subscription):
            queue.links -= 1
            if queue.links <= 0 and (not queue.durable or closed):
                self.nodes.unsubscribe(queue)
                if consumer.owned_node is None:  # a dynamic topic goes with its link, below
                    return
        if consumer.owned_node is not None:
            self.delete_node(consumer.owned_node)
            return
        self.dispatcher.dispatch(queue)

    def delete_node(self, node: Node) -> None:
        """Delete a node: links still attached to it are detached with ``amqp:resource-deleted`` (its
        consumers' unsettled deliveries and a transaction's posts to it are settled when they detach or
        discharge: a commit of a transaction that posted to it fails)."""
        for queue in self.nodes.delete(node):
            self.dispatcher.queue_deleted(queue)
        err = error(Condition.RESOURCE_DELETED, f"{node.name!r} was deleted")
        for producer in self._producers.pop(node, ()):
            producer.conn.detach(producer.link, err)
            self.outbox.touch(producer.conn)

    # -- credit -----------------------------------------------------------------------------------------
    def flow(self, conn: ServerConnection, event: LinkFlow) -> None:
        consumer = event.link.context
        if not isinstance(consumer, Consumer):
            return
        if event.properties is not None:
            err = self.coordinator.flow(conn, consumer, event.properties)
            if err is not None:
                conn.detach(consumer.link, err)
                self.outbox.touch(conn)
                return
        self.dispatcher.dispatch(consumer.queue)
        if consumer.link.drain:
            conn.complete_drain(consumer.link)
            self.outbox.touch(conn)

    def session_flow(self, conn: ServerConnection, event: SessionFlow) -> None:
        session = event.session
        consumers = self.dispatcher.consumers_of(conn)
        self.dispatcher.dispatch_all({c.queue for c in consumers if c.link.session is session})

    # -- messages in --------------------------------------------------------------------------------------
    def transfer(self, conn: ServerConnection, event: TransferReceived) -> None:
        context = event.link.context
        if isinstance(context, Controller):
            self.coordinator.control(conn, context, event)
            return
        if not isinstance(context, Producer):
            return
        delivery = event.delivery
        message = Message(event.payload)
        self.dispatcher.arrive(message)
        transactional = isinstance(delivery.state, TransactionalState) or bool(delivery.earlier_states)
        target: Node | Deferred | None = context.node
        if target is None:  # the anonymous relay routes by ``to``
            to = message.to
            refusal = denied(self._context(conn), "send", to) if self.settings.permissions else None
            if refusal is not None:
                if transactional:  # refused, and so is the commit of the transaction it names
                    self.coordinator.post(conn, delivery, None, message, refusal)
                else:
                    self.outbox.answer_now(conn, delivery, Rejected(error=refusal))
                self._top_up(conn, context.link)
                return
            target = self._relay_target(conn, to, transactional)
        if transactional:
            self.coordinator.post(conn, delivery, target, message)
        elif target is None:
            refusal = error(Condition.NOT_FOUND, f"no node at address {message.to!r}")
            self.outbox.answer_now(conn, delivery, Rejected(error=refusal))
        else:
            assert not isinstance(target, Deferred)
            self.dispatcher.publish(conn, delivery, target, message)
        self._top_up(conn, context.link)

    def transfer_discarded(self, conn: ServerConnection, event: TransferDiscarded) -> None:
        """A transfer the engine discarded before it was whole: a transaction it was posted in cannot commit
        (unless its sender aborted it: then it never was work of the transaction), and the credit it used is
        made good."""
        if not event.aborted:
            self.coordinator.discarded(conn, event.states)
        link = event.link
        if link is None or link.state is not LinkState.ATTACHED:
            return
        if isinstance(link.context, Producer):
            self._top_up(conn, link)
        elif isinstance(link.context, Controller):
            self.coordinator.replenish(conn, link.context)

    def _relay_target(self, conn: ServerConnection, to: object, transactional: bool) -> Node | Deferred | None:
        """The node the anonymous relay routes ``to`` to; a transactional post to an address with no node
        gets a ``Deferred`` one, created by the commit."""
        if not to or not isinstance(to, str):
            return None
        name, kind = parse_address(to)
        node = self.nodes.lookup(conn, name, kind, create=not transactional)
        if node is None and transactional and self.settings.auto_create:
            return Deferred(self.nodes.namespace_of(conn), name, kind)
        return node

    def _top_up(self, conn: ServerConnection, link: Link) -> None:
        if link.credit <= self.settings.link_credit // 2:  # <=: with a credit of 1, refill at 0
            self.outbox.flush(conn)  # outcomes first, then the credit they make room for
            conn.grant_credit(link, self.settings.link_credit)
            self.outbox.touch(conn)
