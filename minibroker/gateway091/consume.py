"""Consuming: ``basic.consume`` / ``basic.cancel``, ``basic.get``, ``basic.qos``, and the acknowledgements
(``basic.ack``, ``basic.nack``, ``basic.reject``, ``basic.recover``).

A consumer is an inner receiver link from ``/queues/NAME``, settled when the consumer is ``no_ack``. Its credit is
what ``basic.qos`` allows: the prefetch count less the deliveries the client holds unacked (per consumer, or across
the channel for a ``global`` qos, as RabbitMQ 3.3+ reads the flag); without a limit a window of ``WINDOW`` deliveries
is kept topped up. A delivery becomes a ``basic.deliver`` under the channel's next delivery tag; ``redelivered`` is
set when the broker counts an earlier delivery of the message (its header's delivery-count, which a requeue
raises).

Acknowledgements settle the inner deliveries: ``ack`` accepts; ``nack``/``reject`` with requeue give them back as
``modified`` with delivery-failed (so the next delivery is marked redelivered, as RabbitMQ marks a requeued message),
without requeue ``rejected`` (dead-lettered through the queue's ``x-dead-letter-exchange``, else dropped). In a
channel transaction they carry the txn-id and stay unsettled until the commit (``publish.py``).

``basic.cancel`` answers at once and stops the link's credit, but the link stays attached until the client has
settled every delivery it holds from it: 0-9-1 lets a client ack after cancelling, and a 1.0 detach would give
them back. A link the broker detaches (its queue deleted) is a consumer cancelled by the server: the client gets a
``basic.cancel`` (RabbitMQ's consumer cancel notification).

``basic.get`` drains a link of its own (one per queue and ``no_ack``) with credit 1: a delivery is ``get-ok``, a
drain that ends without one ``get-empty``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from minibroker.amqp.definitions import Accepted, Error, Modified, Rejected, Released, TransactionalState
from minibroker.amqp.states import Outcome
from minibroker.amqp091.definitions import (
    BasicAck,
    BasicCancel,
    BasicCancelOk,
    BasicConsume,
    BasicConsumeOk,
    BasicDeliver,
    BasicGet,
    BasicGetEmpty,
    BasicGetOk,
    BasicNack,
    BasicQos,
    BasicQosOk,
    BasicRecover,
    BasicRecoverAsync,
    BasicRecoverOk,
    BasicReject,
    ReplyCode,
)
from minibroker.amqp091.errors import ProtocolError
from minibroker.broker.rabbit import RabbitError
from minibroker.gateway091 import convert
from minibroker.gateway091.channel import Channel, Command, Consumer, Unacked
from minibroker.gateway091.publish import ensure_transaction

if TYPE_CHECKING:
    from minibroker.gateway091.connection import Gateway
    from minibroker.gateway091.inner import Attached, Credit, Delivered, Detached

GETTER_LINK = {"rabbitmq:get": True}
"""The properties of the link ``basic.get`` drains: no consumer for the RabbitMQ model (``broker/rabbit.py``)."""
WINDOW = 1000
"""Credit kept on a consumer link without a prefetch limit (topped up when half used)."""
EXCLUSIVE = "rabbitmq:exclusive"
"""The inner attach's link property asking for an exclusive consumer (``broker/rabbit.py`` honours it)."""
REQUEUE = Modified(delivery_failed=True)
"""A nack or reject with requeue, and the inner consumers' default outcome: what the client held when its channel
closed or its connection went is requeued redelivered (rabbit_channel.erl requeues a closing channel's unacked
messages; the 0-9-1 redelivered flag: "previously delivered to this or another client")."""
_CONDITION_CODES = {
    "amqp:not-found": ReplyCode.NOT_FOUND,
    "amqp:resource-locked": ReplyCode.RESOURCE_LOCKED,
    "amqp:unauthorized-access": ReplyCode.ACCESS_REFUSED,
    "amqp:precondition-failed": ReplyCode.PRECONDITION_FAILED,
}
_REPLY_CODES = frozenset(ReplyCode)
REPLY_CODE = "rabbitmq:reply-code"
"""Where a refusal from the RabbitMQ model carries its 0-9-1 reply code (the error's info map)."""


def refusal(err: Error) -> tuple[ReplyCode, str]:
    """The 0-9-1 channel error for a broker refusal: the reply code the RabbitMQ model put in the error's info, else
    one for its condition; the text prefixed with the code's name, as RabbitMQ words them."""
    code: ReplyCode | None = None
    info = err.info or {}
    for key, value in info.items():
        if str(key) == REPLY_CODE and isinstance(value, int) and value in _REPLY_CODES:
            code = ReplyCode(value)
    if code is None:
        code = _CONDITION_CODES.get(str(err.condition), ReplyCode.PRECONDITION_FAILED)
    description = err.description or str(err.condition)
    text = description if description.startswith(code.name) else f"{code.name} - {description}"
    return code, text


def _attach(
    gateway: Gateway,
    channel: Channel,
    command: Command,
    consumer: Consumer,
    then: Callable[[], None],
    refused: Callable[[], None] | None = None,
) -> None:
    """Wait for ``consumer``'s link; a refusal closes the channel with the error's reply code."""
    method = command.method

    def attached(event: Attached) -> None:
        if event.error is not None:
            channel.links.pop(consumer.handle, None)
            if refused is not None:
                refused()
            code, text = refusal(event.error)
            gateway.fail(channel, code, text, method.CLASS_ID, method.METHOD_ID)
            return
        then()

    channel.wait("attach", consumer.handle, attached)


# -- consumers --------------------------------------------------------------------------------------------------
def basic_qos(gateway: Gateway, channel: Channel, command: Command) -> None:
    method = command.method
    assert isinstance(method, BasicQos)
    if method.prefetch_size:  # rabbit_channel.erl: not_implemented "prefetch_size!=0 (~w)"
        raise ProtocolError(ReplyCode.NOT_IMPLEMENTED, f"NOT_IMPLEMENTED - prefetch_size!=0 ({method.prefetch_size})")
    if method.global_:
        channel.global_prefetch = method.prefetch_count
    else:
        channel.prefetch_count = method.prefetch_count
    gateway.engine.send_method(channel.number, BasicQosOk())
    grant(gateway, channel)


def basic_consume(gateway: Gateway, channel: Channel, command: Command) -> None:
    method = command.method
    assert isinstance(method, BasicConsume)
    queue = channel.queue(method.queue)
    tag = method.consumer_tag or next(gateway.tags)
    if tag in channel.consumers:
        raise ProtocolError(ReplyCode.NOT_ALLOWED, f"NOT_ALLOWED - attempt to reuse consumer tag '{tag}'")
    handle = gateway.client.attach_receiver(
        channel.number,
        source=f"/queues/{quote(queue, safe='')}",
        settled=method.no_ack,
        properties={EXCLUSIVE: True} if method.exclusive else None,
        default_outcome=REQUEUE,
    )
    consumer = Consumer(handle, queue, tag, method.no_ack, limit=channel.prefetch_count)
    channel.links[handle] = consumer

    def started() -> None:
        channel.consumers[tag] = consumer
        if not method.no_wait:
            gateway.engine.send_method(channel.number, BasicConsumeOk(consumer_tag=tag))
        grant(gateway, channel)

    _attach(gateway, channel, command, consumer, started)


def grant(gateway: Gateway, channel: Channel) -> None:
    """Top up every consumer's credit to what qos allows (nothing while the client stopped the channel's flow)."""
    if not channel.flow_active:
        return
    room = None
    if channel.global_prefetch:
        held = sum(c.unacked + c.credit for c in channel.consumers.values() if not c.no_ack)
        room = max(0, channel.global_prefetch - held)
    flow = gateway.client.flow
    for consumer in channel.consumers.values():
        if consumer.cancelled:
            continue
        if consumer.no_ack or not (consumer.limit or room is not None):
            if consumer.credit < WINDOW // 2:
                consumer.credit = WINDOW
                flow(channel.number, consumer.handle, WINDOW)
            continue
        want = WINDOW if not consumer.limit else max(0, consumer.limit - consumer.unacked)
        if room is not None:
            extra = min(room, max(0, want - consumer.credit))
            want = consumer.credit + extra
            room -= extra
        if want > consumer.credit:
            consumer.credit = want
            flow(channel.number, consumer.handle, want)


def basic_cancel(gateway: Gateway, channel: Channel, command: Command) -> None:
    method = command.method
    assert isinstance(method, BasicCancel)
    consumer = channel.consumers.get(method.consumer_tag)

    def cancelled(_: object = None) -> None:
        if consumer is not None:
            channel.consumers.pop(method.consumer_tag, None)
            consumer.cancelled = True
            _detach_if_done(gateway, channel, consumer)
        if not method.no_wait:  # an unknown tag is answered too (rabbit_channel.erl: "no consumer with that tag")
            gateway.engine.send_method(channel.number, BasicCancelOk(consumer_tag=method.consumer_tag))

    if consumer is None or consumer.gone:
        cancelled()
        return
    # what the broker sent before it saw the cancel still reaches the client, before cancel-ok (a no-ack delivery
    # is settled already: dropped, it would be lost): drain the credit, and answer when the drain comes back
    consumer.credit = 0
    gateway.client.flow(channel.number, consumer.handle, 0, drain=True)
    channel.wait("drained", consumer.handle, cancelled)


def _detach_if_done(gateway: Gateway, channel: Channel, consumer: Consumer) -> None:
    if consumer.cancelled and not consumer.unacked and channel.links.get(consumer.handle) is consumer:
        del channel.links[consumer.handle]
        gateway.client.detach(channel.number, consumer.handle)


def delivered(gateway: Gateway, channel: Channel, event: Delivered) -> None:
    """A message from the broker on one of the channel's links."""
    consumer = channel.links.get(event.handle)
    if consumer is None:
        return
    consumer.credit = max(0, consumer.credit - 1)
    getting = consumer.tag is None and channel.waiting is not None and channel.waiting.kind == "get"
    if consumer.cancelled or (consumer.tag is None and not getting):
        if not event.settled:  # in flight when the client cancelled: back to the queue, not redelivered
            gateway.client.settle(channel.number, event.delivery_id, event.delivery_id, Released())
        return
    try:
        message = convert.from_amqp10(event.payload)
    except convert.ConversionError as exc:
        if not event.settled:
            gateway.client.settle(channel.number, event.delivery_id, event.delivery_id, Rejected(error=None))
        gateway.log_unconvertible(exc)
        return
    tag = channel.take_tag()
    if not consumer.no_ack:
        channel.unacked[tag] = Unacked(consumer, event.delivery_id)
        consumer.unacked += 1
    redelivered = message.delivery_count > 0
    routing_key = message.routing_key
    if routing_key is None:
        routing_key = _default_routing_key(message.exchange, consumer.queue)
    if consumer.tag is None:
        try:
            count = gateway.model.message_count(gateway.inner, consumer.queue)
            gateway.model.got_from(gateway.inner, consumer.queue)
        except RabbitError:  # deleted meanwhile (by another channel, in the same read)
            count = 0
        get_ok = BasicGetOk(
            delivery_tag=tag,
            redelivered=redelivered,
            exchange=message.exchange,
            routing_key=routing_key,
            message_count=count,
        )
        gateway.engine.send_content(channel.number, get_ok, message.properties, message.body)
        channel.resolve("get", event.handle, None)
        return
    deliver = BasicDeliver(
        consumer_tag=consumer.tag,
        delivery_tag=tag,
        redelivered=redelivered,
        exchange=message.exchange,
        routing_key=routing_key,
    )
    gateway.engine.send_content(channel.number, deliver, message.properties, message.body)
    if consumer.no_ack or not consumer.limit:
        grant(gateway, channel)


def _default_routing_key(exchange: str, queue: str) -> str:
    """The routing key of a message that names none (a 1.0 message sent to the queue, with no ``x-routing-key``
    annotation, whatever its subject): through the default exchange, the queue's name, as RabbitMQ 4 routes a 1.0
    transfer to ``/queues/Q`` (rabbit_amqp_session.erl: the default exchange, routing key Q)."""
    return queue if not exchange else ""


def credit(gateway: Gateway, channel: Channel, event: Credit) -> None:
    """The broker's flow on a receiver link: a drain that ended with no message answers ``basic.get``."""
    if event.credit == 0 and channel.resolve("drained", event.handle, None):
        return
    consumer = channel.links.get(event.handle)
    if consumer is not None and consumer.tag is None and event.credit == 0:
        consumer.credit = 0
        if channel.resolve("get", event.handle, None):
            gateway.engine.send_method(channel.number, BasicGetEmpty())


def detached(gateway: Gateway, channel: Channel, event: Detached) -> None:
    """The broker detached a link: a consumer whose queue went away is cancelled, and the client told."""
    consumer = channel.links.pop(event.handle, None)
    if consumer is None:
        return
    # its tags stay the client's: acking them does nothing (the broker has the messages back), as RabbitMQ ignores
    # an ack to a dead queue (rabbit_channel.erl keeps them in the unacked map)
    consumer.cancelled = consumer.gone = True
    channel.resolve("drained", event.handle, None)
    if consumer.tag is not None and channel.consumers.get(consumer.tag) is consumer:
        del channel.consumers[consumer.tag]
        gateway.engine.send_method(channel.number, BasicCancel(consumer_tag=consumer.tag, no_wait=True))
    elif consumer.tag is None:
        channel.getters.pop((consumer.queue, consumer.no_ack), None)
        if channel.resolve("get", event.handle, None):
            gateway.engine.send_method(channel.number, BasicGetEmpty())


# -- basic.get ----------------------------------------------------------------------------------------------------
def basic_get(gateway: Gateway, channel: Channel, command: Command) -> None:
    method = command.method
    assert isinstance(method, BasicGet)
    if not gateway.after_publishes(channel, command):  # a get sees what the channel published before it
        return
    queue = channel.queue(method.queue)
    getter = channel.getters.get((queue, method.no_ack))

    def drain() -> None:
        assert getter is not None
        getter.credit = 1
        gateway.client.flow(channel.number, getter.handle, 1, drain=True)
        channel.wait("get", getter.handle, lambda _: None)

    if getter is not None:
        drain()
        return
    handle = gateway.client.attach_receiver(
        channel.number,
        source=f"/queues/{quote(queue, safe='')}",
        settled=method.no_ack,
        properties=GETTER_LINK,
        default_outcome=REQUEUE,
    )
    getter = channel.getters[(queue, method.no_ack)] = Consumer(handle, queue, None, method.no_ack)
    channel.links[handle] = getter

    def refused() -> None:
        del channel.getters[(queue, method.no_ack)]

    _attach(gateway, channel, command, getter, drain, refused)


# -- acknowledgements ---------------------------------------------------------------------------------------------
def _held(channel: Channel, tag: int, multiple: bool) -> list[tuple[int, Unacked]]:
    """The deliveries a tag names: that one, or with ``multiple`` every one up to it (tag 0: all)."""
    unacked = channel.unacked
    if multiple and (tag == 0 or tag in unacked):  # rabbit_channel.erl collect_acks: the tag itself must be held
        return [(t, u) for t, u in unacked.items() if tag == 0 or t <= tag]
    held = unacked.get(tag)
    if held is None:
        raise ProtocolError(ReplyCode.PRECONDITION_FAILED, f"PRECONDITION_FAILED - unknown delivery tag {tag}")
    return [(tag, held)]


def settle(gateway: Gateway, channel: Channel, command: Command, tag: int, multiple: bool, outcome: Outcome) -> None:
    """Settle the deliveries ``tag`` names with ``outcome`` (staged in the channel's transaction, if it has one)."""
    if channel.transactional and not ensure_transaction(gateway, channel, command):
        return
    taken = _held(channel, tag, multiple)
    if not channel.transactional:
        _settle(gateway, channel, taken, outcome)
        return
    assert channel.txn is not None
    channel.txn_acks += taken
    _settle(gateway, channel, taken, TransactionalState(txn_id=channel.txn, outcome=outcome), settled=False)


def _settle(
    gateway: Gateway,
    channel: Channel,
    taken: list[tuple[int, Unacked]],
    state: Outcome | TransactionalState,
    *,
    settled: bool = True,
) -> None:
    """Take ``taken`` from the client's unacked and settle them on their links (those of a link gone need
    nothing: the broker has the messages back)."""
    by_link: dict[int, list[int]] = {}
    for t, unacked in taken:
        del channel.unacked[t]
        consumer = unacked.consumer
        consumer.unacked -= 1
        if not consumer.gone:
            by_link.setdefault(consumer.handle, []).append(unacked.delivery_id)
    for delivery_ids in by_link.values():
        for first, last in _runs(delivery_ids):
            gateway.client.settle(channel.number, first, last, state, settled=settled)
    for _, unacked in taken:
        _detach_if_done(gateway, channel, unacked.consumer)
    grant(gateway, channel)


def _runs(ids: list[int]) -> list[tuple[int, int]]:
    """Consecutive delivery-ids as (first, last) ranges (a disposition settles a range)."""
    runs: list[tuple[int, int]] = []
    for delivery_id in sorted(ids):
        if runs and runs[-1][1] + 1 == delivery_id:
            runs[-1] = (runs[-1][0], delivery_id)
        else:
            runs.append((delivery_id, delivery_id))
    return runs


def basic_ack(gateway: Gateway, channel: Channel, command: Command) -> None:
    method = command.method
    assert isinstance(method, BasicAck)
    settle(gateway, channel, command, method.delivery_tag, method.multiple, Accepted())


def basic_nack(gateway: Gateway, channel: Channel, command: Command) -> None:
    method = command.method
    assert isinstance(method, BasicNack)
    settle(gateway, channel, command, method.delivery_tag, method.multiple, REQUEUE if method.requeue else Rejected())


def basic_reject(gateway: Gateway, channel: Channel, command: Command) -> None:
    method = command.method
    assert isinstance(method, BasicReject)
    settle(gateway, channel, command, method.delivery_tag, False, REQUEUE if method.requeue else Rejected())


def basic_recover(gateway: Gateway, channel: Channel, command: Command) -> None:
    """basic.recover / recover-async: every unacked delivery goes back to its queue (requeue=false is
    not_implemented, as in rabbit_channel.erl)."""
    method = command.method
    assert isinstance(method, (BasicRecover, BasicRecoverAsync))
    if not method.requeue:
        raise ProtocolError(ReplyCode.NOT_IMPLEMENTED, "NOT_IMPLEMENTED - requeue=false")
    # at once, in a transaction too (rabbit_channel.erl requeues what the channel holds, outside the transaction)
    _settle(gateway, channel, list(channel.unacked.items()), REQUEUE)
    if isinstance(method, BasicRecover):
        gateway.engine.send_method(channel.number, BasicRecoverOk())


HANDLERS: dict[type[Any], Any] = {
    BasicQos: basic_qos,
    BasicConsume: basic_consume,
    BasicCancel: basic_cancel,
    BasicGet: basic_get,
    BasicAck: basic_ack,
    BasicNack: basic_nack,
    BasicReject: basic_reject,
    BasicRecover: basic_recover,
    BasicRecoverAsync: basic_recover,
}
