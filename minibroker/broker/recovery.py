"""Recovery: the broker's durable state rebuilt from a recovered journal (DESIGN §4, ``store/state.py``).

Durable queues and durable topic subscriptions come back with their messages in their original order, with
their delivery-counts, their expiry and their delivery time; nothing from an uncommitted or rolled-back
transaction was ever recorded, and nothing accepted is left. The journal keeps times as wall-clock instants:
they are mapped onto the new broker clock here, so a message that expired while the broker was down is
expired at once (``Broker.restore``) and a scheduled one waits for its time. A subscription is named by its
topic, container-id and link name, whatever characters they hold, and comes back shared if it was.
"""

from __future__ import annotations

import logging

from minibroker.broker.dispatch import Dispatcher
from minibroker.broker.message import Message
from minibroker.broker.namespace import QUEUE, TOPIC
from minibroker.broker.nodes import Nodes
from minibroker.broker.queue import Queue
from minibroker.broker.recorder import SUBSCRIPTION, Recorder
from minibroker.broker.topic import Topic
from minibroker.store.records import NodeKey
from minibroker.store.state import DurableState, StoredMessage

log = logging.getLogger("minibroker.store")


def restore(state: DurableState, nodes: Nodes, dispatcher: Dispatcher, recorder: Recorder) -> int:
    """Recreate durable nodes, subscriptions and messages (in their order); return how many messages."""
    recorder.restart_ids(state.max_message_id)
    for key, selector_text in state.subscriptions.items():
        if len(key) != 5 or key[1] != SUBSCRIPTION:
            log.warning("journal: ignored a subscription with an unexpected name %r", key)
            continue
        namespace_name, _, topic_name, container, link = key
        topic = _topic(nodes, namespace_name, topic_name)
        if topic is None:
            log.warning("journal: ignored subscription %r of %r, which is now a queue", key, topic_name)
            continue
        selector = None
        if selector_text:
            from minibroker.broker.selector import Selector, SelectorError

            try:
                # no length limit: the selector was accepted when the subscription was made
                selector = Selector(
                    selector_text, max_properties_size=nodes.settings.max_selector_properties_size or None
                )
            except SelectorError:
                selector = None
        shared = key in state.shared
        subscription = topic.subscribe((container, link), durable=True, shared=shared, selector=selector)
        subscription.links = 0
        recorder.watch(subscription)
    restored = 0
    for key, messages in state.messages.items():
        queue = _queue(nodes, key)
        if queue is None:
            if messages:
                log.warning("journal: %d messages of an unknown node %r ignored", len(messages), key)
            continue
        for stored in sorted(messages.values(), key=lambda m: m.message_id):
            dispatcher.restore(queue, _message(stored, dispatcher))
            restored += 1
    return restored


def _message(stored: StoredMessage, dispatcher: Dispatcher) -> Message:
    message = Message(stored.payload, limit=None)  # the bytes are shared by every message of one publish
    message.delivery_count = stored.delivery_count
    message.durable_id = stored.message_id
    if stored.timed:
        clock = dispatcher.clock
        message.expires_at = clock.from_wall_ms(stored.expires_at) if stored.expires_at is not None else None
        message.deliver_at = clock.from_wall_ms(stored.deliver_at) if stored.deliver_at is not None else None
    else:
        dispatcher.arrive(message)  # the first journal format kept no times: read them from the message
    return message


def _topic(nodes: Nodes, namespace_name: str, name: str) -> Topic | None:
    """The topic ``name``, created if no node has that name; None when a queue has it (configured as one now)."""
    namespace = nodes.namespace(namespace_name)
    node = namespace.node(name) or nodes.create(namespace, name, TOPIC)
    return node if isinstance(node, Topic) else None


def _queue(nodes: Nodes, key: NodeKey) -> Queue | None:
    if len(key) == 3 and key[1] == QUEUE:
        namespace_name, _, name = key
        namespace = nodes.namespace(namespace_name)
        node = namespace.node(name) or nodes.create(namespace, name, QUEUE)
        return node if isinstance(node, Queue) else None
    if len(key) == 5 and key[1] == SUBSCRIPTION:
        namespace_name, _, topic_name, container, link = key
        topic = nodes.namespace(namespace_name).topics.get(topic_name)
        return topic.subscriptions.get((container, link)) if topic is not None else None
    return None
