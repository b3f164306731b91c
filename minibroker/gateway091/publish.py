"""Publishing: ``basic.publish`` with the three policies a 0-9-1 publisher has (fire and forget, publisher confirms,
channel transactions), through the channel's inner sender to the anonymous relay.

Every publish is an unsettled transfer whose ``to`` is the RabbitMQ 4 address of the exchange and routing key
(``/exchanges/EXCHANGE/KEY``, the default exchange as ``amq.default``), so the broker's answer tells what became of
it, as RabbitMQ's routing does for a 0-9-1 publish (rabbit_channel.erl, ``handle_method(#'basic.publish'{})``):

- ``accepted``: in every queue it was routed to (journaled first, for a persistent message on a durable queue:
  the broker answers only once it is on disk): confirmed with ``basic.ack``;
- ``released``: routed nowhere: dropped, after a ``basic.return`` (312 NO_ROUTE) when it was ``mandatory``, then
  confirmed with ``basic.ack`` (RabbitMQ's publisher confirms documentation: an unroutable message is confirmed
  once the exchange found no queue);
- ``rejected`` ``amqp:not-found``: no such exchange: the channel is closed with 404, as RabbitMQ closes it (and
  with 403 for ``amqp:unauthorized-access``: an internal exchange, or no permission);
- any other ``rejected`` (a queue at its limit with ``x-overflow = reject-publish``): ``basic.nack``.

Confirms are numbered per channel from 1 (the confirm.select documentation of RabbitMQ's extensions) and acked in
runs with ``multiple`` once the broker's answers to a read are in (``send_confirms``).

A channel transaction (``tx.select``) is an AMQP 1.0 transaction on the channel's coordinator link: its publishes
and acknowledgements carry the txn-id, ``tx.commit`` discharges it and ``tx.rollback`` discharges it failed; the next
one is declared by the next publish or ack (so an idle transactional channel holds no open transaction).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from minibroker.amqp.definitions import Accepted, Declared, Rejected, Released, TransactionalState
from minibroker.amqp091.definitions import (
    BasicAck,
    BasicNack,
    BasicPublish,
    BasicReturn,
    ConfirmSelect,
    ConfirmSelectOk,
    ReplyCode,
    TxCommit,
    TxCommitOk,
    TxRollback,
    TxRollbackOk,
    TxSelect,
    TxSelectOk,
)
from minibroker.amqp091.errors import ProtocolError
from minibroker.gateway091 import convert
from minibroker.gateway091.channel import Channel, Command, Published, Returned

if TYPE_CHECKING:
    from minibroker.gateway091.connection import Gateway
    from minibroker.gateway091.inner import Attached, Outcome

NO_ROUTE = 312
"""The reply code of a ``basic.return`` for an unroutable message (RabbitMQ's ``?NO_ROUTE``; the 0-9-1 XML lacks it)."""
DEFAULT_EXCHANGE = "amq.default"
"""How the default exchange ("") is named in an address."""


@functools.lru_cache(maxsize=1024)  # the same few addresses over and over: quoting each costs 1.6 µs
def address(exchange: str, routing_key: str) -> str:
    """The RabbitMQ 4 address of a publish (segments percent-encoded, as rabbit_amqp_session.erl decodes them)."""
    return f"/exchanges/{quote(exchange or DEFAULT_EXCHANGE, safe='')}/{quote(routing_key, safe='')}"


def basic_publish(gateway: Gateway, channel: Channel, command: Command) -> None:
    method = command.method
    assert isinstance(method, BasicPublish)
    if method.immediate:  # RabbitMQ 3.0 dropped it: rabbit_channel.erl answers not_implemented
        raise ProtocolError(ReplyCode.NOT_IMPLEMENTED, "NOT_IMPLEMENTED - immediate=true")
    if channel.transactional and not ensure_transaction(gateway, channel, command):
        return
    properties, body = command.properties, command.body or b""
    assert properties is not None
    if properties.expiration is not None:
        check_expiration(properties.expiration)
    if properties.user_id is not None and properties.user_id != gateway.user:  # rabbit_channel check_user_id_header
        text = f"user_id property set to '{properties.user_id}' but authenticated user was '{gateway.user}'"
        raise ProtocolError(ReplyCode.PRECONDITION_FAILED, f"PRECONDITION_FAILED - {text}")
    payload = convert.to_amqp10(
        properties, body, method.exchange, method.routing_key, address(method.exchange, method.routing_key)
    )
    seq = 0
    if channel.confirm:
        seq = channel.next_seq
        channel.next_seq += 1
        channel.unconfirmed[seq] = None
    returned = (method.exchange, method.routing_key, properties, body) if method.mandatory else None
    if returned is not None and channel.transactional:  # routed at the commit: checked then (``_discharge``)
        channel.txn_returns.append(returned)
        returned = None
    if channel.relay is None:
        channel.relay = gateway.client.attach_sender(channel.number, target=None)
    # (the inner client holds the transfer until the relay link has credit, and what follows it in the session)
    delivery_id = gateway.client.transfer(channel.number, channel.relay, payload, settled=False, txn_id=channel.txn)
    channel.in_flight[delivery_id] = Published(seq, returned)


MAX_EXPIRY = 4294967295
"""The largest per-message TTL RabbitMQ takes, in milliseconds (rabbit.hrl ``?MAX_EXPIRY_TIMER``)."""


def check_expiration(expiration: str) -> None:
    """406 for an ``expiration`` that is not a decimal count of milliseconds, with RabbitMQ's text
    (rabbit_channel.erl ``check_expiration_header`` on ``rabbit_basic:parse_expiration``, which reads it with
    Erlang's ``string:to_integer``: an optional sign, digits, nothing after; negative or too large refused)."""
    sign = -1 if expiration.startswith("-") else 1
    digits = expiration[1:] if expiration[:1] in ("+", "-") else expiration
    count = len(digits) - len(digits.lstrip("0123456789"))
    if count == 0:
        reason = "no_integer"
    elif count < len(digits):
        reason = '{leftover_string,"' + digits[count:] + '"}'
    else:
        value = sign * int(digits)
        if value < 0:
            reason = f"{{value_negative,{value}}}"
        elif value > MAX_EXPIRY:
            reason = f"{{value_too_large,{value}}}"
        else:
            return
    raise ProtocolError(
        ReplyCode.PRECONDITION_FAILED, f"PRECONDITION_FAILED - invalid expiration '{expiration}': {reason}"
    )


_CHANNEL_ERRORS = {"amqp:not-found": ReplyCode.NOT_FOUND, "amqp:unauthorized-access": ReplyCode.ACCESS_REFUSED}
"""Refusals of a publish that close the channel (rabbit_channel.erl: a missing exchange is 404; an internal exchange,
or one the user may not write to, 403), whatever the confirm mode; other refusals are nacks."""


def outcome(gateway: Gateway, channel: Channel, event: Outcome) -> None:
    """The broker's answer to a publish, or to a declare or discharge on the coordinator link."""
    if event.handle == channel.coordinator:
        channel.resolve("outcome", event.delivery_id, event.state)
        return
    published = channel.in_flight.pop(event.delivery_id, None)
    if published is None:
        return
    state = event.state
    if isinstance(state, TransactionalState):
        state = state.outcome
    if isinstance(state, Released):
        if published.returned is not None:
            send_return(gateway, channel, published.returned)
        _confirmed(channel, published.seq)
    elif isinstance(state, Rejected):
        err = state.error
        code = _CHANNEL_ERRORS.get(str(err.condition)) if err is not None else None
        if err is not None and code is not None:
            text = err.description or str(err.condition)
            gateway.fail(channel, code, f"{code.name} - {text}", BasicPublish.CLASS_ID, BasicPublish.METHOD_ID)
            return
        if published.seq:
            channel.unconfirmed.pop(published.seq, None)
            gateway.engine.send_method(channel.number, BasicNack(delivery_tag=published.seq))
    else:  # accepted (or no outcome: settled by the broker)
        _confirmed(channel, published.seq)


def send_return(gateway: Gateway, channel: Channel, returned: Returned) -> None:
    """``basic.return`` of an unroutable mandatory publish (312 NO_ROUTE)."""
    exchange, routing_key, properties, body = returned
    gateway.engine.send_content(
        channel.number,
        BasicReturn(reply_code=NO_ROUTE, reply_text="NO_ROUTE", exchange=exchange, routing_key=routing_key),
        properties,
        body,
    )


def _confirmed(channel: Channel, seq: int) -> None:
    if seq:
        channel.confirmed.append(seq)


def send_confirms(gateway: Gateway, channel: Channel) -> None:
    """Ack what the broker took since the last call: the longest run from the oldest unconfirmed publish as one
    ``basic.ack`` with ``multiple``, each other one on its own (confirm numbers are the client's delivery tags)."""
    confirmed, unconfirmed = channel.confirmed, channel.unconfirmed
    if not confirmed:
        return
    channel.confirmed = []
    taken = set(confirmed)
    run_end = 0
    for seq in unconfirmed:  # in order
        if seq not in taken:
            break
        run_end = seq
    send = gateway.engine.send_method
    if run_end:
        for seq in [s for s in unconfirmed if s <= run_end]:
            del unconfirmed[seq]
        send(channel.number, BasicAck(delivery_tag=run_end, multiple=run_end > 1 or len(taken) > 1))
    for seq in sorted(taken):
        if seq > run_end and unconfirmed.pop(seq, 0) is None:
            send(channel.number, BasicAck(delivery_tag=seq))


# -- publisher confirms and channel transactions ------------------------------------------------------------------
def confirm_select(gateway: Gateway, channel: Channel, command: Command) -> None:
    method = command.method
    assert isinstance(method, ConfirmSelect)
    if channel.transactional:
        raise ProtocolError(
            ReplyCode.PRECONDITION_FAILED, "PRECONDITION_FAILED - cannot switch from tx to confirm mode"
        )
    channel.confirm = True
    if not method.nowait:
        gateway.engine.send_method(channel.number, ConfirmSelectOk())


def tx_select(gateway: Gateway, channel: Channel, command: Command) -> None:
    if channel.confirm:
        raise ProtocolError(
            ReplyCode.PRECONDITION_FAILED, "PRECONDITION_FAILED - cannot switch from confirm to tx mode"
        )
    if channel.coordinator is not None:
        gateway.engine.send_method(channel.number, TxSelectOk())
        return
    channel.transactional = True
    handle = channel.coordinator = gateway.client.attach_coordinator(channel.number)

    def attached(event: Attached) -> None:
        if event.error is not None:
            text = event.error.description or str(event.error.condition)
            gateway.fail(
                channel, ReplyCode.NOT_IMPLEMENTED, f"NOT_IMPLEMENTED - {text}", TxSelect.CLASS_ID, TxSelect.METHOD_ID
            )
            return
        gateway.engine.send_method(channel.number, TxSelectOk())

    channel.wait("attach", handle, attached)


def ensure_transaction(gateway: Gateway, channel: Channel, command: Command) -> bool:
    """True when the channel's transaction is declared; else declare it and hold ``command`` until it is."""
    if channel.txn is not None:
        return True
    assert channel.coordinator is not None
    delivery_id = gateway.client.declare(channel.number, channel.coordinator)

    def declared(state: Any) -> None:
        if isinstance(state, Declared):
            channel.txn = bytes(state.txn_id)
            return
        # the broker declined (its limit on a connection's open transactions, say): this channel fails, not the
        # connection (RabbitMQ has no such limit; nothing here is the client's or the gateway's fault)
        text = _refusal_text(state)
        method = command.method
        gateway.fail(
            channel,
            ReplyCode.PRECONDITION_FAILED,
            f"PRECONDITION_FAILED - no transaction: {text}",
            method.CLASS_ID,
            method.METHOD_ID,
        )

    channel.wait("outcome", delivery_id, declared, command)
    return False


def tx_commit(gateway: Gateway, channel: Channel, command: Command) -> None:
    _discharge(gateway, channel, command, fail=False)


def tx_rollback(gateway: Gateway, channel: Channel, command: Command) -> None:
    _discharge(gateway, channel, command, fail=True)


def _discharge(gateway: Gateway, channel: Channel, command: Command, *, fail: bool) -> None:
    """tx.commit / tx.rollback: discharge the transaction (the inner client sends the discharge after the publishes
    before it); a transaction with no work was never declared: answered at once."""
    method = command.method
    if not channel.transactional:
        raise ProtocolError(ReplyCode.PRECONDITION_FAILED, "PRECONDITION_FAILED - channel is not transactional")
    answer = TxRollbackOk() if fail else TxCommitOk()
    txn, acks, returns = channel.txn, channel.txn_acks, channel.txn_returns
    channel.txn, channel.txn_acks, channel.txn_returns = None, [], []
    if not fail:  # the commit routes the transaction's publishes: the unroutable mandatory ones come back first
        for returned in returns:
            exchange, routing_key, properties, _ = returned
            if not gateway.model.routable(gateway.inner, exchange, routing_key, properties.headers or {}):
                send_return(gateway, channel, returned)
    if txn is None:
        gateway.engine.send_method(channel.number, answer)
        return
    assert channel.coordinator is not None
    delivery_id = gateway.client.discharge(channel.number, channel.coordinator, txn, fail)

    def discharged(state: Any) -> None:
        if fail or not isinstance(state, Accepted):
            for tag, unacked in acks:  # a rolled back ack leaves the delivery with the client, unacked
                channel.unacked[tag] = unacked
                unacked.consumer.unacked += 1
            channel.unacked = dict(sorted(channel.unacked.items()))
        if fail or isinstance(state, Accepted):
            gateway.engine.send_method(channel.number, answer)
            return
        text = _refusal_text(state)
        gateway.fail(
            channel,
            ReplyCode.PRECONDITION_FAILED,
            f"PRECONDITION_FAILED - transaction rolled back: {text}",
            method.CLASS_ID,
            method.METHOD_ID,
        )

    channel.wait("outcome", delivery_id, discharged)


def _refusal_text(state: Any) -> str:
    err = getattr(state, "error", None)
    if err is None:
        return f"the broker answered {type(state).__name__}"
    return str(err.description or err.condition)


HANDLERS: dict[type[Any], Any] = {
    BasicPublish: basic_publish,
    ConfirmSelect: confirm_select,
    TxSelect: tx_select,
    TxCommit: tx_commit,
    TxRollback: tx_rollback,
}
