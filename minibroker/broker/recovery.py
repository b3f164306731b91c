"""Recovery: the broker's durable state rebuilt from a recovered journal (DESIGN §4, ``store/journal.py``).

Durable queues and durable topic subscriptions come back with their messages in their original order and
with their delivery-counts; nothing from an uncommitted or rolled-back transaction was ever recorded, and
nothing accepted is left.
"""

from __future__ import annotations

from minibroker.broker.dispatch import Dispatcher
from minibroker.broker.message import Message
from minibroker.broker.namespace import QUEUE, TOPIC
from minibroker.broker.nodes import Nodes
from minibroker.broker.queue import Queue
from minibroker.broker.recorder import Recorder
from minibroker.broker.topic import Topic
from minibroker.store.journal import DurableState, NodeKey


def restore(state: DurableState, nodes: Nodes, dispatcher: Dispatcher, recorder: Recorder) -> int:
    """Recreate durable nodes, subscriptions and messages (in their order); return how many messages."""
    recorder.restart_ids(state.max_message_id)
    for key, selector_text in state.subscriptions.items():
        namespace_name, _, name = key
        topic_name, container, link = name.split("\x00")
        topic = _topic(nodes, namespace_name, topic_name)
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
        subscription = topic.subscribe((container, link), durable=True, shared=False, selector=selector)
        subscription.links = 0
        subscription.journal = recorder
    restored = 0
    for key, messages in state.messages.items():
        queue = _queue(nodes, key)
        if queue is None:
            continue
        for stored in sorted(messages.values(), key=lambda m: m.message_id):
            message = Message(stored.payload)
            message.delivery_count = stored.delivery_count
            message.durable_id = stored.message_id
            dispatcher.restore(queue, message)
            restored += 1
    return restored


def _topic(nodes: Nodes, namespace_name: str, name: str) -> Topic:
    namespace = nodes.namespace(namespace_name)
    topic = namespace.topics.get(name)
    if topic is None:
        node = nodes.create(namespace, name, TOPIC)
        assert isinstance(node, Topic)
        topic = node
    return topic


def _queue(nodes: Nodes, key: NodeKey) -> Queue | None:
    namespace_name, kind, name = key
    namespace = nodes.namespace(namespace_name)
    if kind == QUEUE:
        queue = namespace.queues.get(name)
        if queue is None:
            node = nodes.create(namespace, name, QUEUE)
            if not isinstance(node, Queue):
                return None
            queue = node
        return queue
    topic_name, container, link = name.split("\x00")
    topic = namespace.topics.get(topic_name)
    return topic.subscriptions.get((container, link)) if topic is not None else None
