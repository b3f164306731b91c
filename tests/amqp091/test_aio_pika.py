"""aio-pika (10.x, on aiormq, under asyncio) against the AMQP port: a second 0-9-1 client written by someone else,
driven the way its users drive it (``connect_robust``, the default channel with publisher confirms, queue
iterators, ``channel.transaction()``). ``test_pika.py`` has pika's blocking adapter; this file keeps to what aio-pika
does differently or on its own (its confirm futures, its ``on_return`` path, its transaction object) and to the
scenarios of issue 18's "Done when" for a second client.

Each scenario is a coroutine run with ``asyncio.run`` under an asyncio time-out (pytest-asyncio is not a test
dependency); the broker runs in a thread (``minibroker`` fixture: a fresh namespace per test).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aio_pika
import aio_pika.abc
import aiormq.exceptions
import pytest
from pamqp import commands as spec

from minibroker.testing.thread import ThreadedBroker

pytestmark = pytest.mark.timeout(30)
SCENARIO_TIMEOUT = 15.0

Scenario = Callable[[aio_pika.abc.AbstractRobustConnection], Awaitable[None]]


def play(broker: ThreadedBroker, scenario: Scenario, *, robust: bool = True, **options: Any) -> None:
    """Connect (``connect_robust`` unless told; ``options`` to it), run ``scenario`` with the connection, close;
    within ``SCENARIO_TIMEOUT``."""

    async def main() -> None:
        connect = aio_pika.connect_robust if robust else aio_pika.connect
        connection: Any = await connect(broker.amqp091_url, timeout=5, **options)
        try:
            await scenario(connection)
        finally:
            await connection.close()

    async def bounded() -> None:
        await asyncio.wait_for(main(), SCENARIO_TIMEOUT)

    asyncio.run(bounded())


async def get_all(queue: aio_pika.abc.AbstractQueue) -> list[bytes]:
    """Every message ``queue`` holds now, by basic.get with acks."""
    bodies = []
    while (message := await queue.get(no_ack=True, fail=False)) is not None:
        bodies.append(message.body)
    return bodies


# -- connecting, declaring, publishing with confirms -------------------------------------------------------------
@pytest.mark.parametrize("robust", [True, False])
def test_connect_declare_publish_confirmed_and_get(minibroker: ThreadedBroker, robust: bool) -> None:
    async def scenario(connection: Any) -> None:
        channel = await connection.channel()  # publisher confirms on: publish returns the broker's basic.ack
        queue = await channel.declare_queue("orders", durable=True)
        message = aio_pika.Message(
            b'{"id": 1}',
            content_type="application/json",
            headers={"kind": "order", "n": 7},
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            correlation_id="c-1",
            reply_to="replies",
            priority=3,
        )
        confirmation = await channel.default_exchange.publish(message, routing_key="orders")
        assert isinstance(confirmation, spec.Basic.Ack)
        got = await queue.get(no_ack=False)
        assert got.body == b'{"id": 1}'
        assert (got.exchange, got.routing_key, got.redelivered, got.message_count) == ("", "orders", False, 0)
        assert (got.content_type, got.correlation_id, got.reply_to) == ("application/json", "c-1", "replies")
        assert got.headers == {"kind": "order", "n": 7}
        assert got.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
        await got.ack()
        assert await queue.get(fail=False) is None

    play(minibroker, scenario, robust=robust)
    assert minibroker.queue("orders").depth == 0


def test_every_publish_of_a_burst_is_confirmed(minibroker: ThreadedBroker) -> None:
    async def scenario(connection: Any) -> None:
        channel = await connection.channel()
        await channel.declare_queue("burst")
        confirmations = await asyncio.gather(
            *(channel.default_exchange.publish(aio_pika.Message(b"%d" % n), "burst") for n in range(200))
        )
        assert all(isinstance(c, spec.Basic.Ack) for c in confirmations)

    play(minibroker, scenario)
    assert minibroker.queue("burst").depth == 200


def test_passive_declare_of_a_missing_queue_is_404_and_the_connection_lives(minibroker: ThreadedBroker) -> None:
    async def scenario(connection: Any) -> None:
        channel = await connection.channel()
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity) as raised:
            await channel.declare_queue("nowhere", passive=True)
        assert "nowhere" in str(raised.value)
        other = await connection.channel()
        assert (await other.declare_queue("elsewhere")).name == "elsewhere"

    play(minibroker, scenario)


# -- consuming ---------------------------------------------------------------------------------------------------
def test_consume_ack_nack_requeue_reject(minibroker: ThreadedBroker) -> None:
    seen: list[tuple[bytes, bool]] = []

    async def scenario(connection: Any) -> None:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=10)
        queue = await channel.declare_queue("work")
        for body in (b"a", b"b", b"c"):
            await channel.default_exchange.publish(aio_pika.Message(body), "work")
        async with queue.iterator() as messages:
            async for message in messages:
                seen.append((message.body, message.redelivered))
                if message.body == b"b" and not message.redelivered:
                    await message.nack(requeue=True)
                elif message.body == b"c":
                    await message.reject(requeue=False)
                else:
                    await message.ack()
                if len(seen) == 4:
                    break
        assert await queue.get(fail=False) is None

    play(minibroker, scenario)
    assert sorted(seen) == [(b"a", False), (b"b", False), (b"b", True), (b"c", False)]
    assert minibroker.queue("work").depth == 0


def test_reject_with_requeue_redelivers(minibroker: ThreadedBroker) -> None:
    async def scenario(connection: Any) -> None:
        channel = await connection.channel()
        queue = await channel.declare_queue("again")
        await channel.default_exchange.publish(aio_pika.Message(b"x"), "again")
        first = await queue.get(no_ack=False)
        await first.reject(requeue=True)
        second = await queue.get(no_ack=False)
        assert (second.body, first.redelivered, second.redelivered) == (b"x", False, True)
        await second.ack()

    play(minibroker, scenario)


def test_prefetch_holds_back_deliveries_until_acked(minibroker: ThreadedBroker) -> None:
    async def scenario(connection: Any) -> None:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=2)
        queue = await channel.declare_queue("limited")
        for n in range(5):
            await channel.default_exchange.publish(aio_pika.Message(b"%d" % n), "limited")
        held: asyncio.Queue[aio_pika.abc.AbstractIncomingMessage] = asyncio.Queue()
        await queue.consume(held.put)
        first = [await held.get(), await held.get()]
        await asyncio.sleep(0.3)  # (nothing to wait for: a third delivery must not come)
        assert held.empty()
        assert minibroker.queue("limited").depth == 3
        await first[-1].ack(multiple=True)
        more = [await held.get(), await held.get()]
        assert [m.body for m in first + more] == [b"0", b"1", b"2", b"3"]
        await asyncio.sleep(0.3)
        assert held.empty()
        for message in more:
            await message.ack()

    play(minibroker, scenario)
    assert minibroker.queue("limited").depth == 1


def test_what_a_closed_channel_held_comes_back_redelivered(minibroker: ThreadedBroker) -> None:
    async def scenario(connection: Any) -> None:
        channel = await connection.channel()
        queue = await channel.declare_queue("held")
        for body in (b"1", b"2"):
            await channel.default_exchange.publish(aio_pika.Message(body), "held")
        held: asyncio.Queue[aio_pika.abc.AbstractIncomingMessage] = asyncio.Queue()
        await queue.consume(held.put)
        assert [(await held.get()).redelivered for _ in range(2)] == [False, False]
        await channel.close()  # unacked: back to the queue
        other = await connection.channel()
        again = await other.declare_queue("held", passive=True)
        got = [await again.get(no_ack=True) for _ in range(2)]
        assert [(m.body, m.redelivered) for m in got] == [(b"1", True), (b"2", True)]

    play(minibroker, scenario)


# -- exchanges ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kind", "bindings", "published", "expected"),
    [
        (aio_pika.ExchangeType.DIRECT, {"qa": "a", "qb": "b"}, ["a", "b", "c"], {"qa": [b"a"], "qb": [b"b"]}),
        (aio_pika.ExchangeType.FANOUT, {"qa": "", "qb": "x"}, ["k"], {"qa": [b"k"], "qb": [b"k"]}),
        (
            aio_pika.ExchangeType.TOPIC,
            {"qa": "stock.*.nyse", "qb": "stock.#"},
            ["stock.ibm.nyse", "stock.ibm", "bond.x"],
            {"qa": [b"stock.ibm.nyse"], "qb": [b"stock.ibm.nyse", b"stock.ibm"]},
        ),
    ],
)
def test_exchange_types_route_by_their_bindings(
    minibroker: ThreadedBroker,
    kind: aio_pika.ExchangeType,
    bindings: dict[str, str],
    published: list[str],
    expected: dict[str, list[bytes]],
) -> None:
    async def scenario(connection: Any) -> None:
        channel = await connection.channel()
        exchange = await channel.declare_exchange("ex", kind)
        queues = {}
        for name, key in bindings.items():
            queues[name] = await channel.declare_queue(name)
            await queues[name].bind(exchange, key)
        for key in published:
            await exchange.publish(aio_pika.Message(key.encode()), routing_key=key)
        assert {name: await get_all(queue) for name, queue in queues.items()} == expected

    play(minibroker, scenario)


def test_headers_exchange_matches_all_or_any(minibroker: ThreadedBroker) -> None:
    async def scenario(connection: Any) -> None:
        channel = await connection.channel()
        exchange = await channel.declare_exchange("hx", aio_pika.ExchangeType.HEADERS)
        every = await channel.declare_queue("all")
        some = await channel.declare_queue("any")
        await every.bind(exchange, arguments={"x-match": "all", "format": "pdf", "type": "report"})
        await some.bind(exchange, arguments={"x-match": "any", "format": "pdf", "type": "report"})
        sent: list[tuple[bytes, dict[str, Any]]] = [
            (b"1", {"format": "pdf", "type": "report"}),
            (b"2", {"format": "pdf"}),
            (b"3", {"format": "zip"}),
        ]
        for body, headers in sent:
            await exchange.publish(aio_pika.Message(body, headers=headers), routing_key="")
        assert await get_all(every) == [b"1"]
        assert await get_all(some) == [b"1", b"2"]

    play(minibroker, scenario)


def test_exchange_to_exchange_binding_routes_through(minibroker: ThreadedBroker) -> None:
    async def scenario(connection: Any) -> None:
        channel = await connection.channel()
        front = await channel.declare_exchange("front", aio_pika.ExchangeType.TOPIC)
        back = await channel.declare_exchange("back", aio_pika.ExchangeType.FANOUT)
        await back.bind(front, "audit.#")
        queue = await channel.declare_queue("audit")
        await queue.bind(back)
        await front.publish(aio_pika.Message(b"kept"), routing_key="audit.login")
        await front.publish(aio_pika.Message(b"dropped"), routing_key="billing")
        assert await get_all(queue) == [b"kept"]

    play(minibroker, scenario)


# -- unroutable and refused publishes ----------------------------------------------------------------------------
def test_mandatory_unroutable_calls_on_return_then_resolves(minibroker: ThreadedBroker) -> None:
    returned: list[aio_pika.abc.AbstractIncomingMessage] = []

    async def scenario(connection: Any) -> None:
        channel = await connection.channel()  # on_return_raises False: the confirmation is the returned message
        channel.return_callbacks.add(lambda _channel, message: returned.append(message))
        result = await channel.default_exchange.publish(aio_pika.Message(b"lost"), "nowhere", mandatory=True)
        assert not isinstance(result, spec.Basic.Ack)  # resolved by the basic.return, not by an ack

    play(minibroker, scenario)
    (message,) = returned
    assert (message.body, message.routing_key, message.exchange) == (b"lost", "nowhere", "")


def test_mandatory_unroutable_raises_with_on_return_raises(minibroker: ThreadedBroker) -> None:
    async def scenario(connection: Any) -> None:
        channel = await connection.channel(on_return_raises=True)
        with pytest.raises(aio_pika.exceptions.PublishError) as raised:
            await channel.default_exchange.publish(aio_pika.Message(b"lost"), "nowhere", mandatory=True)
        frame = raised.value.frame
        assert isinstance(frame, spec.Basic.Return)
        assert (frame.reply_code, frame.reply_text) == (312, "NO_ROUTE")
        # the channel carries on
        await channel.declare_queue("after")
        assert isinstance(await channel.default_exchange.publish(aio_pika.Message(b"ok"), "after"), spec.Basic.Ack)

    play(minibroker, scenario)


def test_unroutable_without_mandatory_is_acked(minibroker: ThreadedBroker) -> None:
    async def scenario(connection: Any) -> None:
        channel = await connection.channel(on_return_raises=True)
        # (aio-pika publishes with mandatory=True unless told)
        result = await channel.default_exchange.publish(aio_pika.Message(b"dropped"), "nowhere", mandatory=False)
        assert isinstance(result, spec.Basic.Ack)

    play(minibroker, scenario)


def test_overflow_reject_publish_is_a_nack(minibroker: ThreadedBroker) -> None:
    async def scenario(connection: Any) -> None:
        channel = await connection.channel()
        queue = await channel.declare_queue("small", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
        assert isinstance(await channel.default_exchange.publish(aio_pika.Message(b"1"), "small"), spec.Basic.Ack)
        with pytest.raises(aio_pika.exceptions.DeliveryError) as raised:
            await channel.default_exchange.publish(aio_pika.Message(b"2"), "small")
        assert isinstance(raised.value.frame, spec.Basic.Nack)
        assert await get_all(queue) == [b"1"]

    play(minibroker, scenario)


def test_publish_to_a_missing_exchange_closes_the_channel_with_404(minibroker: ThreadedBroker) -> None:
    async def scenario(connection: Any) -> None:
        channel = await connection.channel()
        exchange = await channel.get_exchange("no-such-exchange", ensure=False)
        with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity) as raised:
            await exchange.publish(aio_pika.Message(b"x"), routing_key="k")
        assert "no-such-exchange" in str(raised.value)

    play(minibroker, scenario, robust=False)


# -- channel transactions ----------------------------------------------------------------------------------------
def test_transaction_context_commits_and_rollback_discards(minibroker: ThreadedBroker) -> None:
    async def scenario(connection: Any) -> None:
        channel = await connection.channel(publisher_confirms=False)
        queue = await channel.declare_queue("txq")
        async with channel.transaction():
            for n in range(3):
                await channel.default_exchange.publish(aio_pika.Message(b"%d" % n), "txq")
            # a round trip: the publishes are in, staged (on the channel underneath: see the robust-connection test)
            await (await channel.get_underlay_channel()).queue_declare("txq", passive=True)
            assert minibroker.queue("txq").depth == 0
            assert len(minibroker.transactions) == 1
        assert minibroker.queue("txq").depth == 3
        tx = channel.transaction()
        await tx.select()
        await channel.default_exchange.publish(aio_pika.Message(b"dropped"), "txq")
        await tx.rollback()
        assert await get_all(queue) == [b"0", b"1", b"2"]
        await tx.commit()

    play(minibroker, scenario)
    assert minibroker.transactions == []


def test_transaction_rolls_acks_back(minibroker: ThreadedBroker) -> None:
    async def scenario(connection: Any) -> None:
        channel = await connection.channel(publisher_confirms=False)
        queue = await channel.declare_queue("txa")
        await channel.default_exchange.publish(aio_pika.Message(b"kept"), "txa")
        tx = channel.transaction()
        await tx.select()
        message = await queue.get(no_ack=False)
        await message.ack()
        await tx.rollback()
        assert minibroker.queue("txa").depth == 0  # still with the client, unacked
        # the tag is the client's to ack again (aio-pika's message refuses a second ack: the channel underneath)
        await (await channel.get_underlay_channel()).basic_ack(message.delivery_tag)
        await tx.commit()
        assert await queue.get(fail=False) is None

    play(minibroker, scenario)
    assert minibroker.queue("txa").depth == 0


def test_tx_select_on_a_confirm_channel_is_406(minibroker: ThreadedBroker) -> None:
    async def scenario(connection: Any) -> None:
        channel = await connection.channel()  # confirm mode
        with pytest.raises(RuntimeError):
            channel.transaction()  # aio-pika itself refuses; the broker must too, below it
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed) as raised:
            await (await channel.get_underlay_channel()).tx_select()
        assert "confirm" in str(raised.value)
        transactional = await connection.channel(publisher_confirms=False)
        await transactional.transaction().select()
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed):
            await (await transactional.get_underlay_channel()).confirm_delivery()

    play(minibroker, scenario, robust=False)


def test_tx_commit_without_select_is_406(minibroker: ThreadedBroker) -> None:
    async def scenario(connection: Any) -> None:
        channel = await connection.channel(publisher_confirms=False)
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed):
            await (await channel.get_underlay_channel()).tx_commit()

    play(minibroker, scenario, robust=False)


# -- the connection ---------------------------------------------------------------------------------------------
def test_robust_connection_comes_back_after_a_forced_close(minibroker: ThreadedBroker) -> None:
    """The broker closes the connection (320 CONNECTION_FORCED, the handle's ``close_connection``): aio-pika's robust
    connection reconnects and restores its channel, queue and consumer, which receives again."""

    async def scenario(connection: Any) -> None:
        channel = await connection.channel()
        queue = await channel.declare_queue("robust")
        received: asyncio.Queue[bytes] = asyncio.Queue()

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            await message.ack()
            await received.put(message.body)

        await queue.consume(on_message)
        await channel.default_exchange.publish(aio_pika.Message(b"before"), "robust")
        assert await received.get() == b"before"
        # a round trip, so the ack is in before the close (aio-pika's robust channel answers a passive declare of a
        # queue it declared itself without asking: the channel underneath)
        await (await channel.get_underlay_channel()).queue_declare("robust", passive=True)
        closed: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
        reconnected = asyncio.Event()
        connection.close_callbacks.add(lambda _conn, exc: closed.done() or closed.set_result(exc))
        connection.reconnect_callbacks.add(lambda _conn: reconnected.set())
        (info,) = minibroker.connections
        assert info.container_id.startswith("amqp091-")  # the gateway's inner connection
        assert minibroker.close_connection(info.id, description="closed by the test")
        reason = await closed
        assert isinstance(reason, aiormq.exceptions.ConnectionClosed)
        assert reason.args[0] == 320
        await reconnected.wait()
        await channel.default_exchange.publish(aio_pika.Message(b"after"), "robust")
        assert await received.get() == b"after"

    play(minibroker, scenario, reconnect_interval=0.1)
