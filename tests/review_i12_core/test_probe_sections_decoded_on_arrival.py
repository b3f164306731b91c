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
from minibroker.amqp.definitions import AmqpValue
from minibroker.broker.message import Message


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
