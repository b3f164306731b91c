"""The exchange and queue methods (0-9-1 classes ``exchange`` and ``queue``): asked of the broker's RabbitMQ model
(``broker/rabbit.py``), which raises ``ProtocolError`` with RabbitMQ's reply code and text when it refuses.

An empty queue name in ``queue.bind``, ``queue.purge`` and ``queue.delete`` is the queue last declared on the channel
(0-9-1 §1.7.2: "If the queue name is empty, the server uses the last queue declared on the channel"). ``no_wait``
suppresses the answer, never the check. After each change the broker is stepped (``to_broker(())``) so what the
change did to other connections (consumers cancelled by a queue.delete, say) goes out with it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from minibroker.amqp091.base import Method
from minibroker.amqp091.definitions import (
    ExchangeBind,
    ExchangeBindOk,
    ExchangeDeclare,
    ExchangeDeclareOk,
    ExchangeDelete,
    ExchangeDeleteOk,
    ExchangeUnbind,
    ExchangeUnbindOk,
    QueueBind,
    QueueBindOk,
    QueueDeclare,
    QueueDeclareOk,
    QueueDelete,
    QueueDeleteOk,
    QueuePurge,
    QueuePurgeOk,
    QueueUnbind,
    QueueUnbindOk,
)
from minibroker.gateway091.channel import Channel, Command

if TYPE_CHECKING:
    from minibroker.gateway091.connection import Gateway


def _answer(gateway: Gateway, channel: Channel, method: Any, answer: Method) -> None:
    gateway.to_broker(())
    if not getattr(method, "no_wait", False):
        gateway.engine.send_method(channel.number, answer)


def _handler(serve: Callable[[Gateway, Channel, Command], None]) -> Callable[[Gateway, Channel, Command], None]:
    """``serve`` once the channel's earlier publishes have reached the broker (what it answers must see them)."""

    def handler(gateway: Gateway, channel: Channel, command: Command) -> None:
        if gateway.after_publishes(channel, command):
            serve(gateway, channel, command)

    return handler


def exchange_declare(gateway: Gateway, channel: Channel, command: Command) -> None:
    m = command.method
    assert isinstance(m, ExchangeDeclare)
    gateway.model.declare_exchange(
        gateway.inner,
        m.exchange,
        m.type,
        passive=m.passive,
        durable=m.durable,
        auto_delete=m.auto_delete,
        internal=m.internal,
        arguments=m.arguments,
    )
    _answer(gateway, channel, m, ExchangeDeclareOk())


def exchange_delete(gateway: Gateway, channel: Channel, command: Command) -> None:
    m = command.method
    assert isinstance(m, ExchangeDelete)
    gateway.model.delete_exchange(gateway.inner, m.exchange, if_unused=m.if_unused)
    _answer(gateway, channel, m, ExchangeDeleteOk())


def exchange_bind(gateway: Gateway, channel: Channel, command: Command) -> None:
    m = command.method
    assert isinstance(m, (ExchangeBind, ExchangeUnbind))
    if isinstance(m, ExchangeBind):
        gateway.model.bind_exchange(gateway.inner, m.destination, m.source, m.routing_key, m.arguments)
        _answer(gateway, channel, m, ExchangeBindOk())
    else:
        gateway.model.unbind_exchange(gateway.inner, m.destination, m.source, m.routing_key, m.arguments)
        _answer(gateway, channel, m, ExchangeUnbindOk())


def queue_declare(gateway: Gateway, channel: Channel, command: Command) -> None:
    m = command.method
    assert isinstance(m, QueueDeclare)
    name, messages, consumers = gateway.model.declare_queue(
        gateway.inner,
        m.queue,
        passive=m.passive,
        durable=m.durable,
        exclusive=m.exclusive,
        auto_delete=m.auto_delete,
        arguments=m.arguments,
    )
    channel.last_queue = name
    _answer(gateway, channel, m, QueueDeclareOk(queue=name, message_count=messages, consumer_count=consumers))


def queue_bind(gateway: Gateway, channel: Channel, command: Command) -> None:
    m = command.method
    assert isinstance(m, (QueueBind, QueueUnbind))
    queue = channel.queue(m.queue)
    if isinstance(m, QueueBind):
        gateway.model.bind_queue(gateway.inner, queue, m.exchange, m.routing_key, m.arguments)
        _answer(gateway, channel, m, QueueBindOk())
    else:
        gateway.model.unbind_queue(gateway.inner, queue, m.exchange, m.routing_key, m.arguments)
        _answer(gateway, channel, m, QueueUnbindOk())


def queue_purge(gateway: Gateway, channel: Channel, command: Command) -> None:
    m = command.method
    assert isinstance(m, QueuePurge)
    count = gateway.model.purge_queue(gateway.inner, channel.queue(m.queue))
    _answer(gateway, channel, m, QueuePurgeOk(message_count=count))


def queue_delete(gateway: Gateway, channel: Channel, command: Command) -> None:
    m = command.method
    assert isinstance(m, QueueDelete)
    count = gateway.model.delete_queue(
        gateway.inner, channel.queue(m.queue), if_unused=m.if_unused, if_empty=m.if_empty
    )
    _answer(gateway, channel, m, QueueDeleteOk(message_count=count))


HANDLERS: dict[type[Any], Any] = {
    ExchangeDeclare: _handler(exchange_declare),
    ExchangeDelete: _handler(exchange_delete),
    ExchangeBind: _handler(exchange_bind),
    ExchangeUnbind: _handler(exchange_bind),
    QueueDeclare: _handler(queue_declare),
    QueueBind: _handler(queue_bind),
    QueueUnbind: _handler(queue_bind),
    QueuePurge: _handler(queue_purge),
    QueueDelete: _handler(queue_delete),
}
