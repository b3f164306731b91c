"""Probe: every message's header, delivery-annotations and message-annotations are decoded in full on arrival
(``Content.__init__``), whatever their size, with no selector anywhere and the default configuration.

Issue 12 item 6 found 11 MB of application-properties (1M entries) taking 4 s on the loop once a selector
consumer existed, and asked to "bound what is decoded". The fix bounds what a *selector* decodes; the sections
before the properties are still decoded for every transfer: the delivery-annotations only to be skipped
(``codec.decode(payload, pos)[1]``), the message-annotations to look up three scheduling keys. 9.5 MiB of
either (1M entries) blocks the loop ~3.5 s per message, and ``max_message_size`` allows 100 MiB (~35 s).
README "Limits and security": "keeps serving everyone else".
"""

from __future__ import annotations

import time

import pytest

from minibroker.amqp import codec
from minibroker.amqp.definitions import AmqpValue, Properties, Rejected
from minibroker.broker.core import Broker, BrokerSettings
from minibroker.broker.message import Message
from minibroker.handles import CoreView
from minibroker.testing import frames
from tests.broker.txn_driver import World


def _map32_section(code: int, entries: int) -> bytes:
    body = b"".join(b"\xa3\x06" + b"%06x" % i + b"\x54\x01" for i in range(entries))
    size = (len(body) + 4).to_bytes(4, "big")
    return b"\x00\x53" + bytes([code]) + b"\xd1" + size + (2 * entries).to_bytes(4, "big") + body


@pytest.mark.parametrize(("code", "section"), [(0x71, "delivery-annotations"), (0x72, "message-annotations")])
def test_a_huge_annotations_section_is_not_decoded_on_arrival(code: int, section: str) -> None:
    payload = _map32_section(code, 1_000_000) + codec.encode(AmqpValue("x"))
    started = time.perf_counter()
    message = Message(payload)
    elapsed = time.perf_counter() - started
    assert message.size == len(payload)
    assert elapsed < 0.5, f"{section} of {len(payload) / 2**20:.1f} MiB: {elapsed:.2f} s on the loop for one message"


def test_the_broker_refuses_message_annotations_larger_than_its_limit() -> None:
    """On arrival the broker decodes at most ``max_selector_properties_size`` of message-annotations: past it the
    transfer is rejected with ``amqp:resource-limit-exceeded``, and the connection goes on."""
    world = World(Broker(BrokerSettings(max_selector_properties_size=1024)))
    peer = world.connect("app")
    peer.attach_producer("p", "q")
    world.settle()
    peer.transfer("p", _map32_section(0x72, 200) + codec.encode(AmqpValue("x")), settled=False)
    peer.transfer("p", _map32_section(0x72, 10) + codec.encode(AmqpValue("y")), settled=False)
    seen = world.settle()[peer]
    assert not seen.closed
    (big, _), (small, _) = (seen.answers[i] for i in sorted(seen.answers))
    assert isinstance(big, Rejected)
    assert big.error is not None
    assert big.error.condition == "amqp:resource-limit-exceeded", big.error
    assert not isinstance(small, Rejected), small
    assert CoreView(world.broker).queue("q").depth == 1


def test_the_relay_does_not_decode_a_properties_section_larger_than_the_limit() -> None:
    """A properties section past the limit is never decoded: for the anonymous relay its ``to`` is absent."""
    world = World(Broker(BrokerSettings(max_selector_properties_size=1024)))
    peer = world.connect("app")
    peer.attach_producer("relay", None)
    world.settle()
    huge = Properties(to="q", subject="s" * 4000)
    peer.transfer("relay", frames.message("big", huge), settled=False)
    peer.transfer("relay", frames.message("small", Properties(to="q")), settled=False)
    seen = world.settle()[peer]
    assert not seen.closed
    (big, _), (small, _) = (seen.answers[i] for i in sorted(seen.answers))
    assert isinstance(big, Rejected)
    assert big.error is not None
    assert big.error.condition == "amqp:not-found", big.error
    assert not isinstance(small, Rejected), small
    assert CoreView(world.broker).queue("q").depth == 1
