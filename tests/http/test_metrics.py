"""``GET /metrics``'s page (issue 14): the broker's counts in the Prometheus text format, read by
prometheus_client's own parser.

Every figure is driven by real traffic: the real broker core, engine and connection tasks over in-memory
streams (``minibroker.testing.memory``), clients speaking frame by frame; and once the real server in a thread
(``run_in_thread``), with python-qpid-proton clients.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from prometheus_client.parser import text_string_to_metric_families
from proton import Message
from proton.utils import BlockingConnection
from trio.testing import MockClock

from minibroker.amqp.definitions import Accepted, Disposition, Header, Properties, Rejected
from minibroker.amqp.errors import Condition
from minibroker.broker.core import Broker, BrokerSettings
from minibroker.broker.policy import NodePolicy
from minibroker.http.metrics import CONTENT_TYPE, exposition
from minibroker.testing import frames
from minibroker.testing.memory import MemoryBroker, memory_broker
from minibroker.testing.thread import ThreadedBroker
from tests.broker.test_transactions_frames import Client, client, discharge_with

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

NODE_FIGURES = ("depth", "acquired", "staged", "scheduled", "consumers", "messages_in_total", "messages_out_total")


def parse(text: str) -> tuple[dict[str, str], Samples]:
    """The page as prometheus_client reads it: each family's type, and every sample by (name, labels)."""
    types: dict[str, str] = {}
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        assert family.name not in types, f"family {family.name} twice"
        types[family.name] = family.type
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in samples, f"sample {key} twice"
            samples[key] = sample.value
    return types, samples


def node(samples: Samples, kind: str, **labels: str) -> dict[str, float]:
    """The figures of one queue (``kind="queue"``) or subscription, by ``NODE_FIGURES`` name."""
    wanted = frozenset(labels.items())
    return {figure: samples[(f"minibroker_{kind}_{figure}", wanted)] for figure in NODE_FIGURES}


def figures(depth: int, acquired: int, staged: int, consumers: int, into: int, out: int) -> dict[str, float]:
    values = (depth, acquired, staged, 0, consumers, into, out)
    return dict(zip(NODE_FIGURES, map(float, values), strict=True))


def one(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def page(mb: MemoryBroker) -> Samples:
    return parse(exposition(mb.broker, mb.writer.journal if mb.writer is not None else None))[1]


async def answer(c: Client) -> Any:
    """The state of the next disposition the broker sends."""
    while True:
        performative = (await c.peer.receive()).performative
        if isinstance(performative, Disposition):
            return performative.state


def test_no_nodes_at_all() -> None:
    """A broker with nothing in it still gives a valid page: every family typed, the per-namespace ones at 0."""
    text = exposition(Broker())
    assert text.endswith("\n")
    assert CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"
    types, samples = parse(text)
    assert types["minibroker_queue_depth"] == "gauge"
    assert types["minibroker_queue_messages_in"] == "counter"  # (the parser names a counter without _total)
    assert types["minibroker_transactions"] == "counter"
    assert "minibroker_journal_bytes" not in types  # no journal, no journal figures
    assert not [key for key in samples if key[0].startswith(("minibroker_queue_", "minibroker_subscription_"))]
    assert one(samples, "minibroker_connections", namespace="default") == 0
    assert one(samples, "minibroker_transactions_open", namespace="default") == 0
    assert one(samples, "minibroker_transactions_declared_total") == 0
    for outcome in ("committed", "rolled_back", "timed_out", "failed"):
        assert one(samples, "minibroker_transactions_total", outcome=outcome) == 0
    for line in text.splitlines():  # every sample's family was announced before it
        if not line.startswith("#"):
            name = line.split("{")[0].split(" ")[0]
            assert f"# TYPE {name} " in text


async def test_label_values_are_escaped(autojump_clock: MockClock) -> None:
    """A queue name with a double quote, a backslash, a line feed, a NUL and an emoji comes back intact."""
    name = 'we"ird\\name\nline two\x00🙂'
    async with memory_broker() as mb:
        c = await client(mb)
        await c.sender(name, 1)
        await c.post(1, frames.message("x"))
        assert isinstance(await answer(c), Accepted)
        text = exposition(mb.broker)
        assert '\\"' in text
        assert "\\\\" in text
        assert "\\n" in text
        samples = parse(text)[1]
        assert node(samples, "queue", namespace="default", queue=name) == figures(1, 0, 0, 0, 1, 0)


async def test_queues_transactions_connections_and_namespaces(autojump_clock: MockClock) -> None:
    settings = BrokerSettings(transaction_timeout=10, queues={"full": NodePolicy(max_messages=1)})
    async with memory_broker(settings) as mb:
        mb.broker.namespace("other")
        c = await client(mb, "a")
        await c.coordinator()
        await c.sender("orders", 1)
        for n in range(3):
            await c.post(1, frames.message(f"m{n}"))
            assert isinstance(await answer(c), Accepted)
        await c.receiver("orders", 2)
        await c.credit(2, 2)
        first, _ = await c.take(2)
        await c.peer.disposition(first.performative.delivery_id, state=Accepted())
        await mb.settle()
        samples = page(mb)
        assert node(samples, "queue", namespace="default", queue="orders") == figures(1, 1, 0, 1, 3, 1)
        assert node(samples, "queue", namespace="default", queue="full") == figures(0, 0, 0, 0, 0, 0)
        assert one(samples, "minibroker_connections", namespace="default") == 1
        assert one(samples, "minibroker_connections", namespace="other") == 0

        # committed: staged while open, then ready
        txn = await c.declare()
        await c.post(1, frames.message("in txn"), txn=txn)
        await mb.settle()
        samples = page(mb)
        assert node(samples, "queue", namespace="default", queue="orders")["staged"] == 1
        assert one(samples, "minibroker_transactions_open", namespace="default") == 1
        assert one(samples, "minibroker_transactions_open", namespace="other") == 0
        state, _ = await discharge_with(c, txn, 1)  # (the post's provisional answer comes too)
        assert isinstance(state, Accepted)

        # rolled back by the controller
        txn = await c.declare()
        await c.post(1, frames.message("never"), txn=txn)
        state, _ = await discharge_with(c, txn, 1, fail=True)
        assert isinstance(state, Accepted)

        # failed: its post does not fit the full queue at commit
        await c.sender("full", 3)
        await c.post(3, frames.message("fills it"))
        assert isinstance(await answer(c), Accepted)
        txn = await c.declare()
        await c.post(3, frames.message("too many"), txn=txn)
        state, _ = await discharge_with(c, txn, 1)  # (the post's refusal comes too)
        assert isinstance(state, Rejected)
        assert state.error is not None
        assert str(state.error.condition) == Condition.TRANSACTION_ROLLBACK.value

        # timed out
        await c.declare()
        await trio.sleep(11)
        await mb.settle()

        # a second namespace, chosen by the open's hostname
        other = Client(await mb.connect())
        await other.peer.open(container_id="b", hostname="other")
        await other.peer.begin()
        await other.sender("orders", 1)
        await other.post(1, frames.message("elsewhere"))
        assert isinstance(await answer(other), Accepted)

        samples = page(mb)
        # 3 sent + 1 committed; 1 accepted; 1 still acquired by the receiver (its credit is used up)
        assert node(samples, "queue", namespace="default", queue="orders") == figures(2, 1, 0, 1, 4, 1)
        assert node(samples, "queue", namespace="default", queue="full") == figures(1, 0, 0, 0, 1, 0)
        assert node(samples, "queue", namespace="other", queue="orders") == figures(1, 0, 0, 0, 1, 0)
        assert one(samples, "minibroker_connections", namespace="default") == 1
        assert one(samples, "minibroker_connections", namespace="other") == 1
        assert one(samples, "minibroker_transactions_open", namespace="default") == 0
        assert one(samples, "minibroker_transactions_declared_total") == 4
        ended = {o: one(samples, "minibroker_transactions_total", outcome=o) for o in ("committed", "rolled_back")}
        ended |= {o: one(samples, "minibroker_transactions_total", outcome=o) for o in ("timed_out", "failed")}
        assert ended == {"committed": 1, "rolled_back": 1, "timed_out": 1, "failed": 1}
        assert one(samples, "minibroker_internal_errors_total") == 0

        # the connection that goes takes its count with it; messages out grow as its delivery is released
        await c.peer.close()
        await mb.settle()
        samples = page(mb)
        assert one(samples, "minibroker_connections", namespace="default") == 0
        assert node(samples, "queue", namespace="default", queue="orders") == figures(3, 0, 0, 0, 4, 1)


async def test_topic_subscriptions(autojump_clock: MockClock) -> None:
    async with memory_broker() as mb:
        c = await client(mb, "subscriber")
        await c.receiver("topic://news", 1)
        await c.receiver("topic://news", 2)
        await c.sender("topic://news", 3)
        for n in range(2):
            await c.post(3, frames.message(f"news {n}", Properties(to="news")))
            assert isinstance(await answer(c), Accepted)
        await c.credit(1, 5)
        deliveries = await c.take(2)
        await c.peer.disposition(deliveries[0].performative.delivery_id, state=Accepted())
        await mb.settle()

        samples = page(mb)
        keys = [(s.container, s.name) for s in mb.topic("news").subscriptions()]
        assert len(keys) == 2
        by_key = {
            key: node(samples, "subscription", namespace="default", topic="news", container=key[0], subscription=key[1])
            for key in keys
        }
        assert sorted(by_key.values(), key=lambda f: f["depth"]) == [
            figures(0, 1, 0, 1, 2, 1),  # the subscription of link 1: one accepted, one acquired
            figures(2, 0, 0, 1, 2, 0),  # link 2 gave no credit
        ]
        assert one(samples, "minibroker_topic_messages_in_total", namespace="default", topic="news") == 2
        assert one(samples, "minibroker_topic_subscriptions", namespace="default", topic="news") == 2
        assert one(samples, "minibroker_topic_staged", namespace="default", topic="news") == 0
        assert not [key for key in samples if key[0].startswith("minibroker_queue_")]


async def test_a_topics_transactional_posts_are_counted_once(autojump_clock: MockClock) -> None:
    """``minibroker_topic_messages_in_total`` counts each message published once, whether it came in a transaction
    (its admission checked when posted and again at the commit) or not; a rolled-back post was never published."""
    async with memory_broker() as mb:
        c = await client(mb, "poster")
        await c.coordinator()
        await c.receiver("topic://news", 1)
        await c.sender("topic://news", 2)
        await c.post(2, frames.message("plain", Properties(to="news")))
        assert isinstance(await answer(c), Accepted)
        for fail in (False, True):
            txn = await c.declare()
            for n in range(3):
                await c.post(2, frames.message(f"news {n}", Properties(to="news")), txn=txn)
                await answer(c)
            assert await c.discharge(txn, fail=fail) == Accepted()
        await mb.settle()
        samples = page(mb)
        assert one(samples, "minibroker_topic_messages_in_total", namespace="default", topic="news") == 1 + 3
        (subscription,) = mb.topic("news").subscriptions()
        assert subscription.depth == 1 + 3


def journal_files(data_dir: Path) -> int:
    return sum(path.stat().st_size for path in data_dir.glob("journal-*.log"))


async def test_journal_bytes_and_fsyncs_grow(tmp_path: Path) -> None:
    """With a data dir: every byte the journal wrote is in its files (nothing compacted), and a durable
    message's ``accepted`` waits for an fsync (real time here: the fsync runs in a worker thread)."""
    async with memory_broker(data_dir=tmp_path) as mb:
        assert mb.writer is not None
        types, before = parse(exposition(mb.broker, mb.writer.journal))
        assert types["minibroker_journal_bytes"] == types["minibroker_journal_fsyncs"] == "counter"
        assert one(before, "minibroker_journal_bytes_total") == journal_files(tmp_path) > 0

        c = await client(mb)
        await c.sender("orders", 1)
        for n in range(3):
            await c.post(1, frames.message(f"durable {n}", Header(durable=True)))
            assert isinstance(await answer(c), Accepted)
        after = page(mb)
        assert one(after, "minibroker_journal_bytes_total") == journal_files(tmp_path)
        assert one(after, "minibroker_journal_bytes_total") > one(before, "minibroker_journal_bytes_total")
        assert one(after, "minibroker_journal_fsyncs_total") >= one(before, "minibroker_journal_fsyncs_total") + 1
        assert node(after, "queue", namespace="default", queue="orders") == figures(3, 0, 0, 0, 3, 0)


async def test_journal_without_fsync_counts_bytes_only(tmp_path: Path) -> None:
    async with memory_broker(data_dir=tmp_path, data_sync=False) as mb:
        assert mb.writer is not None
        before = page(mb)
        c = await client(mb)
        await c.sender("orders", 1)
        await c.post(1, frames.message("durable", Header(durable=True)))
        assert isinstance(await answer(c), Accepted)
        after = page(mb)
        assert one(after, "minibroker_journal_bytes_total") == journal_files(tmp_path)
        assert one(after, "minibroker_journal_bytes_total") > one(before, "minibroker_journal_bytes_total")
        assert one(after, "minibroker_journal_fsyncs_total") == one(before, "minibroker_journal_fsyncs_total")


def threaded_page(broker: ThreadedBroker) -> Samples:
    return parse(broker.call(lambda running: exposition(running.broker)))[1]


def test_read_in_the_thread_runner_with_proton_clients(broker: ThreadedBroker, broker_address: str) -> None:
    """As the embedder reads it: ``call`` runs ``exposition`` in the broker's thread, clients are proton's."""
    conn = BlockingConnection(broker_address, timeout=5)
    try:
        sender = conn.create_sender("orders")
        for n in range(3):
            sender.send(Message(body=f"m{n}"))
        receiver = conn.create_receiver("orders", credit=1)
        assert receiver.receive(timeout=5).body == "m0"
        receiver.accept()
        samples = threaded_page(broker)
        assert one(samples, "minibroker_queue_consumers", namespace="default", queue="orders") == 1
        receiver.close()  # (waits for the detach: the accept went before it; a prefetched one comes back)
        samples = threaded_page(broker)
        assert one(samples, "minibroker_connections", namespace="default") == 1
        assert node(samples, "queue", namespace="default", queue="orders") == figures(2, 0, 0, 0, 3, 1)
    finally:
        conn.close()
    broker.wait_for(lambda: not broker.connections)
    samples = threaded_page(broker)
    assert one(samples, "minibroker_connections", namespace="default") == 0
    assert node(samples, "queue", namespace="default", queue="orders") == figures(2, 0, 0, 0, 3, 1)


def test_get_metrics_over_http_parses_and_needs_credentials_when_users_are_configured(tmp_path: Path) -> None:
    """``GET /metrics`` on the management listener: the exposition above, its content type, every namespace's
    samples on one page, and the same Basic auth as the rest of the API (read-only: no ``manage`` needed)."""
    from tests.http.client import call, http_broker

    users = {"alice": "secret", "viewer": "look"}
    permissions = {"viewer": {"manage": False}}
    with http_broker(auth={"users": users, "permissions": permissions}, data_dir=str(tmp_path)) as broker:
        assert call(broker, "GET", "/metrics").status == 401
        conn = BlockingConnection(broker.url, user="alice", password="secret", allowed_mechs="PLAIN")
        try:
            sender = conn.create_sender("orders")
            for i in range(3):
                sender.send(Message(body=f"m{i}", durable=True))
        finally:
            conn.close()
        answer = call(broker, "GET", "/metrics", auth=("viewer", "look"))
        assert answer.status == 200
        assert answer.headers["content-type"] == CONTENT_TYPE
        types, samples = parse(answer.body.decode())
        assert one(samples, "minibroker_queue_depth", namespace="default", queue="orders") == 3.0
        assert types["minibroker_queue_messages_in"] == "counter"
        assert one(samples, "minibroker_journal_bytes_total") > 0
