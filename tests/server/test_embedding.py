"""The embedding API (DESIGN §2, §1.3): both runners, inspection, namespaces, wait_for and reset, through
their public interface and with a real client."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import trio
from proton import Message
from proton.reactor import DurableSubscription
from proton.utils import BlockingConnection

import minibroker
from minibroker.config import Config, ConfigError
from minibroker.testing.thread import ThreadedBroker, run_in_thread
from tests.integration.proton_options import Capabilities


def _send(url: str, address: str, *messages: Message) -> None:
    conn = BlockingConnection(url, timeout=5)
    try:
        sender = conn.create_sender(address)
        for message in messages:
            sender.send(message)
    finally:
        conn.close()


def test_thread_runner_from_plain_synchronous_code() -> None:
    with minibroker.run_in_thread({"server": {"port": 0}, "queues": {"declared": {}}}) as broker:
        assert broker.url == f"amqp://127.0.0.1:{broker.port}"
        assert broker.queues == ["declared"]  # configured nodes exist before run_in_thread returns
        _send(
            broker.url,
            "orders",
            Message(body="one", id="m-1", properties={"kind": "a"}, annotations={"x-opt-k": 7}, subject="s"),
            Message(body=b"two", durable=True, priority=7, ttl=30),
        )
        queue = broker.queue("orders")
        assert queue.exists
        assert (queue.depth, queue.ready, queue.acquired, queue.staged) == (2, 2, 0, 0)
        second, first = queue.peek()  # priority 7 goes before the default 4
        assert (first.body, first.id, first.subject, first.properties, first.annotations) == (
            "one", "m-1", "s", {"kind": "a"}, {"x-opt-k": 7},
        )  # fmt: skip
        assert (second.body, second.durable, second.priority, second.ttl) == (b"two", True, 7, 30.0)
        assert queue.depth == 2  # peek consumed nothing
        assert queue.purge() == 2
        assert queue.depth == 0
        assert not broker.queue("nothing-here").exists


def test_stats_count_acquired_messages(broker: ThreadedBroker) -> None:
    _send(broker.url, "work", Message(body=1), Message(body=2))
    conn = BlockingConnection(broker.url, timeout=5)
    try:
        receiver = conn.create_receiver("work", credit=1)
        receiver.receive(timeout=5)
        stats = broker.queue("work").stats()
        assert (stats.ready, stats.acquired, stats.consumers) == (1, 1, 1)
        assert [c.links for c in broker.connections] == [1]
    finally:
        conn.close()


def test_topic_handle_shows_each_subscription(broker: ThreadedBroker) -> None:
    conn = BlockingConnection(broker.url, timeout=5, container_id="app")
    try:
        conn.create_receiver("topic://news", name="keeper", credit=0, options=DurableSubscription())
        conn.create_receiver("topic://news", name="shared-one", credit=0, options=Capabilities("shared"))
        assert broker.topics == ["news"]
        assert broker.queues == []  # subscriptions are not queues
        _send(broker.url, "topic://news", Message(body="one"), Message(body="two", priority=7))
        topic = broker.topic("news")
        broker.wait_for(lambda: sum(s.held for s in topic.subscriptions()) == 4)
        keeper, shared = topic.subscriptions()  # in the order they were made
        assert (keeper.container, keeper.name, keeper.durable, keeper.shared) == ("app", "keeper", True, False)
        assert (shared.container, shared.name) == ("app", "shared-one|volatile")  # its name, less "|anything"
        assert (shared.durable, shared.shared) == (False, True)
        assert (keeper.ready, keeper.acquired, keeper.consumers, keeper.enqueued_total) == (2, 0, 1, 2)
        assert (shared.depth, shared.acquired, shared.held, shared.staged, shared.scheduled) == (2, 0, 2, 0, 0)
        assert shared.held_bytes > 0
        assert [m.body for m in topic.peek("app", "shared-one|volatile")] == ["two", "one"]  # priority 7 first
        assert [m.body for m in topic.peek("app", "keeper", limit=1)] == ["two"]
        assert topic.peek("app", "nobody") == []
        assert (topic.exists, topic.staged) == (True, 0)
    finally:
        conn.close()
    missing = broker.topic("nothing-here")
    assert (missing.exists, missing.subscriptions(), missing.peek("app", "keeper")) == (False, [], [])


def test_wait_for_is_woken_by_a_real_message(broker: ThreadedBroker) -> None:
    def produce_later() -> None:
        time.sleep(0.3)
        _send(broker.url, "later", Message(body="arrived"))

    producer = threading.Thread(target=produce_later)
    started = time.monotonic()
    producer.start()
    broker.wait_for(lambda: broker.queue("later").depth == 1, timeout=5)
    waited = time.monotonic() - started
    producer.join(5)
    assert 0.25 <= waited < 3
    with pytest.raises(TimeoutError):
        broker.wait_for(lambda: broker.queue("later").depth == 2, timeout=0.2)


def test_namespaces_are_isolated_and_reset_only_touches_one(broker: ThreadedBroker) -> None:
    first = broker.create_namespace()
    second = broker.create_namespace("second")
    assert len({broker.port, first.port, second.port}) == 3
    _send(first.url, "q", Message(body="first"))
    _send(second.url, "q", Message(body="second"))
    _send(broker.url, "q", Message(body="default"))
    assert [m.body for m in first.queue("q").peek()] == ["first"]
    first.reset()
    assert first.queue("q").depth == 0
    assert first.queues == []
    assert [m.body for m in second.queue("q").peek()] == ["second"]
    assert [m.body for m in broker.queue("q").peek()] == ["default"]
    # the open frame's hostname selects a namespace, whatever listener the connection came through
    conn = BlockingConnection(broker.url, timeout=5, virtual_host="second")
    conn.create_sender("q").send(Message(body="by hostname"))
    assert second.queue("q").depth == 2
    assert [c.namespace for c in second.connections] == ["second"]
    conn.close()
    second.drop_namespace()
    with pytest.raises(LookupError):
        second.queue("q").depth  # noqa: B018


def test_reset_closes_connections_and_rolls_back(broker: ThreadedBroker) -> None:
    conn = BlockingConnection(broker.url, timeout=5)
    conn.create_sender("r").send(Message(body=1))
    broker.reset()
    assert broker.queues == []
    assert broker.connections == []
    with pytest.raises(Exception, match=r"forced|reset|closed|aborted"):
        conn.create_sender("r").send(Message(body=2))
    conn.close()


def test_config_as_path_dict_or_object(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[server]\nport = 0\n[queues.from-file]\n")
    for config in (path, str(path), Config.load(path)):
        with minibroker.run_in_thread(config) as broker:
            assert broker.queues == ["from-file"]
    with (
        pytest.raises(ConfigError, match=r"server\.prot: unknown key"),
        minibroker.run_in_thread({"server": {"prot": 1}}),
    ):
        pass


async def test_trio_runner_and_async_wait_for() -> None:
    async with minibroker.serve({"server": {"port": 0}, "queues": {"a": {}}}) as broker:
        assert broker.queues == ["a"]
        assert broker.queue("a").depth == 0

        async def connect_and_speak() -> bytes:
            stream = await trio.open_tcp_stream("127.0.0.1", broker.port)
            await stream.send_all(b"AMQP\x00\x01\x00\x00")
            reply = await stream.receive_some(8)
            await stream.aclose()
            return bytes(reply)

        with trio.fail_after(5):
            assert await connect_and_speak() == b"AMQP\x00\x01\x00\x00"
            namespace = await broker.create_namespace("t")
            assert namespace.port != broker.port
            with pytest.raises(TimeoutError):
                await broker.wait_for(lambda: broker.queue("a").depth > 0, timeout=0.1)


def test_embedded_start_and_stop_are_fast() -> None:
    """Not a benchmark (see bench/startup.py): a generous bound that still catches a broker that sleeps."""
    started = time.perf_counter()
    with run_in_thread({"server": {"port": 0}}):
        pass
    assert time.perf_counter() - started < 2.0
