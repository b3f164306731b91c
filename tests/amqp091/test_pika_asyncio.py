"""pika's asyncio adapter (``pika.adapters.asyncio_connection.AsyncioConnection``, callback style) against the AMQP
port: a publish/consume/ack round trip, and publisher confirms counted delivery tag by delivery tag, through the
broker's acks with ``multiple`` (RabbitMQ's confirms documentation: an ack with multiple set confirms every
publish up to its tag). ``test_pika.py`` has the blocking adapter, whose ``confirm_delivery`` waits on one publish
at a time; this adapter lets a burst be confirmed together.

Each scenario is a coroutine run with ``asyncio.run`` under an asyncio time-out; pika's callbacks resolve futures.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pika
import pika.spec
import pytest
from pika.adapters.asyncio_connection import AsyncioConnection

from minibroker.testing.thread import ThreadedBroker

pytestmark = pytest.mark.timeout(30)
SCENARIO_TIMEOUT = 15.0


async def call(method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call a pika method that answers through ``callback`` and wait for the answer."""
    answered: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    method(*args, callback=answered.set_result, **kwargs)
    return await answered


async def open_connection(broker: ThreadedBroker) -> AsyncioConnection:
    loop = asyncio.get_running_loop()
    opened: asyncio.Future[AsyncioConnection] = loop.create_future()
    AsyncioConnection(
        pika.URLParameters(broker.amqp091_url),
        on_open_callback=opened.set_result,
        on_open_error_callback=lambda _conn, exc: opened.set_exception(exc),
        custom_ioloop=loop,
    )
    return await opened


async def open_channel(connection: AsyncioConnection) -> Any:
    opened: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    connection.channel(on_open_callback=opened.set_result)
    return await opened


async def close(connection: AsyncioConnection) -> None:
    closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    connection.add_on_close_callback(lambda _conn, _exc: closed.set_result(None))
    connection.close()
    await closed


def play(broker: ThreadedBroker, scenario: Callable[[Any], Awaitable[None]]) -> None:
    """Open a connection and a channel, run ``scenario`` with the channel, close; within ``SCENARIO_TIMEOUT``."""

    async def main() -> None:
        connection = await open_connection(broker)
        try:
            await scenario(await open_channel(connection))
        finally:
            await close(connection)

    asyncio.run(asyncio.wait_for(main(), SCENARIO_TIMEOUT))


def test_publish_consume_ack_round_trip(minibroker: ThreadedBroker) -> None:
    async def scenario(channel: Any) -> None:
        ok = await call(channel.queue_declare, "round")
        assert ok.method.queue == "round"
        properties = pika.BasicProperties(content_type="text/plain", headers={"n": 1}, message_id="m-1")
        channel.basic_publish("", "round", b"hello", properties)
        got: asyncio.Future[tuple[Any, Any, bytes]] = asyncio.get_running_loop().create_future()
        await call(channel.basic_qos, prefetch_count=1)
        consume_ok = await call(
            channel.basic_consume,
            "round",
            lambda _ch, method, props, body: got.set_result((method, props, body)),
            consumer_tag="mine",
        )
        assert consume_ok.method.consumer_tag == "mine"
        method, props, body = await got
        assert (body, method.consumer_tag, method.routing_key, method.redelivered) == (b"hello", "mine", "round", False)
        assert (props.content_type, props.headers, props.message_id) == ("text/plain", {"n": 1}, "m-1")
        assert minibroker.queue("round").depth == 0  # held by the consumer, unacked
        channel.basic_ack(method.delivery_tag)
        await call(channel.basic_cancel, "mine")
        ok = await call(channel.queue_declare, "round", passive=True)
        assert (ok.method.message_count, ok.method.consumer_count) == (0, 0)  # acked: gone

    play(minibroker, scenario)


class Confirms:
    """The broker's basic.ack / basic.nack frames on a confirm channel, and the delivery tags each one settles: an
    ack or nack with ``multiple`` settles every tag up to its own not settled before (RabbitMQ's confirms
    documentation), which may come in any order."""

    def __init__(self, published: int) -> None:
        self.outstanding = set(range(1, published + 1))
        self.frames: list[pika.spec.Basic.Ack | pika.spec.Basic.Nack] = []
        self.acked: list[int] = []
        self.nacked: list[int] = []
        self.all_in: asyncio.Event = asyncio.Event()

    def on_frame(self, frame: Any) -> None:
        method = frame.method
        self.frames.append(method)
        tag = method.delivery_tag
        tags = sorted(t for t in self.outstanding if t <= tag) if method.multiple else [tag]
        into = self.acked if isinstance(method, pika.spec.Basic.Ack) else self.nacked
        for settled in tags:
            if settled not in self.outstanding:
                self.acked.append(-settled)  # confirmed twice, or never published: the test's asserts catch it
            self.outstanding.discard(settled)
            into.append(settled)
        if not self.outstanding:
            self.all_in.set()


def test_a_hundred_publishes_are_each_confirmed_once(minibroker: ThreadedBroker) -> None:
    confirms = Confirms(100)

    async def scenario(channel: Any) -> None:
        await call(channel.queue_declare, "confirmed")
        await call(channel.confirm_delivery, confirms.on_frame)
        for n in range(100):
            channel.basic_publish("", "confirmed", b"%d" % n)
        await confirms.all_in.wait()

    play(minibroker, scenario)
    assert sorted(confirms.acked) == list(range(1, 101))
    assert confirms.nacked == []
    assert [frame.delivery_tag for frame in confirms.frames] == sorted(f.delivery_tag for f in confirms.frames)
    assert minibroker.queue("confirmed").depth == 100


def test_acks_with_multiple_stop_at_a_nack(minibroker: ThreadedBroker) -> None:
    """A queue that takes 50 (x-overflow reject-publish): the first 50 publishes are acked, the other 50 nacked,
    and no ack with multiple reaches past a nacked tag."""
    confirms = Confirms(100)

    async def scenario(channel: Any) -> None:
        arguments = {"x-max-length": 50, "x-overflow": "reject-publish"}
        await call(channel.queue_declare, "half", arguments=arguments)
        await call(channel.confirm_delivery, confirms.on_frame)
        for n in range(100):
            channel.basic_publish("", "half", b"%d" % n)
        await confirms.all_in.wait()

    play(minibroker, scenario)
    assert sorted(confirms.acked) == list(range(1, 51))
    assert sorted(confirms.nacked) == list(range(51, 101))
    assert minibroker.queue("half").depth == 50
