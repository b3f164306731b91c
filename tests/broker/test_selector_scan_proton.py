"""White-box: a selector consumer's scan cost, with a real python-qpid-proton client against the threaded broker
(issue 12). How many messages a consumer has looked at (``Scan.examined``) is the dispatcher's own counter, not a
public fact, so this test reads the core; ``test_selector_cost.py`` checks the same on a bare core.
"""

from __future__ import annotations

from typing import Any

from proton import Message
from proton.reactor import AtMostOnce, Selector

from minibroker.testing.thread import ThreadedBroker
from tests.integration.helpers import queue_stats, wait_for
from tests.integration.proton_options import connection, read_broker, take


def _scans(core: Any, queue: str) -> dict[str, int]:
    """Messages each consumer of ``queue`` has looked at so far, by link name."""
    return {c.link.name: c.scan.examined for c in core.dispatcher.consumers(core.queues[queue]) if c.scan is not None}


def test_a_selector_consumer_looks_at_each_message_once(broker: ThreadedBroker) -> None:
    """A consumer whose selector matches nothing on a deep queue rescanned the whole queue at every arrival.
    Now it looks at each message once: the first time it attaches, then once per arrival."""
    depth = 2000
    with connection(broker) as conn:
        sender = conn.create_sender("deep", options=AtMostOnce())
        for i in range(depth):
            sender.send(Message(body=i, properties={"color": "blue"}))
        wait_for(lambda: queue_stats(broker, "deep") == (depth, 0), "the messages", conn=conn)
        reds = conn.create_receiver("deep", name="reds", credit=10, options=Selector("color = 'red'"))
        wait_for(lambda: read_broker(broker, lambda core: _scans(core, "deep")) == {"reds": depth}, "its first look")
        for i in range(20):
            sender.send(Message(body=f"blue-{i}", properties={"color": "blue"}))
        sender.send(Message(body="red", properties={"color": "red"}))
        assert take(reds, 1) == ["red"]
        assert read_broker(broker, lambda core: _scans(core, "deep")) == {"reds": depth + 21}
        wait_for(lambda: queue_stats(broker, "deep") == (depth + 20, 0), "the accept", conn=conn)
