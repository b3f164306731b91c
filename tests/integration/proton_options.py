"""Link options and connections python-qpid-proton does not offer ready-made, for the messaging tests.

proton's ``reactor`` module has ``Selector``, ``Copy``, ``DurableSubscription``, ``AtMostOnce`` and
``AtLeastOnce``; what Qpid JMS sends besides (terminus capabilities, the no-local filter, any pair of
settle modes) is written here as ``LinkOption``s, so the tests attach exactly as those clients do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from proton import Condition, Data, Delivery, Described, Link, Message, Sender, Timeout, symbol
from proton.reactor import Filter, LinkOption
from proton.utils import BlockingConnection, BlockingReceiver, BlockingSender, LinkDetached

from minibroker.broker.core import Broker
from minibroker.testing.thread import ThreadedBroker, run_in_thread
from tests.integration.helpers import BLOCKING_TIMEOUT, QUIET_PERIOD, send_raw

T = TypeVar("T")
NO_LOCAL = symbol("apache.org:no-local-filter:list")
SELECTOR = symbol("apache.org:selector-filter:string")


class Capabilities(LinkOption):
    """Put ``capabilities`` on the link's source (a receiver) or target (a sender), as an array of symbols."""

    def __init__(self, *capabilities: str) -> None:
        self.capabilities = capabilities

    def apply(self, link: Link) -> None:
        terminus = link.source if link.is_receiver else link.target
        data: Data = terminus.capabilities
        data.put_array(False, Data.SYMBOL)
        data.enter()
        for capability in self.capabilities:
            data.put_symbol(symbol(capability))
        data.exit()


class Durability(LinkOption):
    """Set the source's terminus-durability and expiry-policy (what makes a topic subscription durable)."""

    def __init__(self, durability: int, expiry_policy: int) -> None:
        self.durability = durability
        self.expiry_policy = expiry_policy

    def apply(self, link: Link) -> None:
        link.source.durability = self.durability
        link.source.expiry_policy = self.expiry_policy


class NoLocal(Filter):
    """The no-local filter Qpid JMS puts on a topic subscriber created with ``noLocal=true``."""

    def __init__(self) -> None:
        super().__init__({symbol("no-local"): Described(NO_LOCAL, [])})


class SettleModes(LinkOption):
    """Ask for an snd-settle-mode and an rcv-settle-mode (Part 2 §2.8.2, §2.8.3)."""

    def __init__(self, snd: int, rcv: int) -> None:
        self.snd = snd
        self.rcv = rcv

    def apply(self, link: Link) -> None:
        link.snd_settle_mode = self.snd
        link.rcv_settle_mode = self.rcv


@contextmanager
def broker_with(**sections: Any) -> Iterator[ThreadedBroker]:
    """A broker on a free port configured with ``sections`` (``topics={"news": {}}``, ``broker={...}``)."""
    with run_in_thread({"server": {"port": 0}, **sections}) as running:
        yield running


@contextmanager
def connection(broker: ThreadedBroker, **options: Any) -> Iterator[BlockingConnection]:
    """A ``BlockingConnection`` with open ``options`` (``container_id=``), calls bounded by BLOCKING_TIMEOUT."""
    conn = BlockingConnection(broker.url, timeout=BLOCKING_TIMEOUT, **options)
    try:
        yield conn
    finally:
        conn.close()


def send_and_wait(conn: BlockingConnection, sender: Any, message: Message) -> Delivery:
    """Send ``message`` unsettled and wait for the broker's settlement, whatever the outcome.

    (``BlockingSender.send`` raises on rejected without saying why: the error condition is what we check.)
    """
    delivery: Delivery = sender.link.send(message)
    conn.wait(lambda: delivery.settled, msg="the broker's settlement", timeout=BLOCKING_TIMEOUT)
    delivery.settle()
    return delivery


def send_raw_and_wait(conn: BlockingConnection, sender: BlockingSender, payload: bytes) -> Delivery:
    """Send already encoded message bytes unsettled and wait for the broker's settlement."""
    link = sender.link
    assert isinstance(link, Sender)
    delivery = send_raw(link, payload)
    conn.wait(lambda: delivery.settled, msg="the broker's settlement", timeout=BLOCKING_TIMEOUT)
    delivery.settle()
    return delivery


def remote_condition(delivery: Delivery) -> str | None:
    """The error condition name of the broker's outcome (rejected), if any."""
    condition: Condition | None = delivery.remote.condition
    return None if condition is None else str(condition.name)


def next_delivery(receiver: BlockingReceiver) -> Delivery:
    """The delivery of the oldest message taken with ``receive()`` and not settled yet (to settle by hand)."""
    fetcher = receiver.fetcher
    assert fetcher is not None
    delivery: Delivery = fetcher.unsettled.popleft()
    return delivery


def close(link: BlockingReceiver | BlockingSender) -> None:
    """Close a link (detach with closed=true) and wait for the broker's answer."""
    link.close()  # type: ignore[no-untyped-call]


def refusal(error: LinkDetached) -> str:
    """The condition with which the broker refused or detached a link."""
    condition = error.link.remote_condition
    assert condition is not None, "detached without an error condition"
    return str(condition.name)


def read_broker(broker: ThreadedBroker, fn: Callable[[Broker], T]) -> T:
    """``fn(core)`` run in the broker's thread on its ``Broker`` core."""
    return broker.call(lambda running: fn(running.broker))


def take(receiver: BlockingReceiver, count: int) -> list[Any]:
    """Receive ``count`` messages, accepting each; return their bodies."""
    bodies = []
    for _ in range(count):
        bodies.append(receiver.receive().body)
        receiver.accept()
    return bodies


def assert_nothing_more(receiver: BlockingReceiver) -> None:
    """No message arrives on ``receiver`` within QUIET_PERIOD."""
    try:
        message = receiver.receive(timeout=QUIET_PERIOD)
    except Timeout:
        return
    raise AssertionError(f"unexpected message {message.body!r}")


def data_object(data: Data) -> Any:
    """The value held by a terminus field proton hands out as ``Data`` (filter, capabilities)."""
    data.rewind()
    data.next()
    return data.get_object()


__all__ = [
    "NO_LOCAL",
    "SELECTOR",
    "Capabilities",
    "Durability",
    "NoLocal",
    "SettleModes",
    "assert_nothing_more",
    "broker_with",
    "close",
    "connection",
    "data_object",
    "next_delivery",
    "read_broker",
    "refusal",
    "remote_condition",
    "send_and_wait",
    "send_raw_and_wait",
    "take",
]
