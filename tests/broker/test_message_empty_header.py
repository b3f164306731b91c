"""An empty header section (list0, which python-qpid-proton writes in every message) is read without the codec
and gives the same ``Message`` as the general path (Part 3 §3.2.1: every header field at its default; issue 19)."""

from __future__ import annotations

from typing import Any

import pytest

from minibroker.amqp import codec
from minibroker.amqp.definitions import AmqpValue, Header, MessageAnnotations, Properties
from minibroker.amqp.types import Symbol, Timestamp
from minibroker.broker import message as message_module
from minibroker.broker.message import Message

EMPTY_LIST0 = b"\x00\x53\x70\x45"
EMPTY_LIST8 = b"\x00\x53\x70\xc0\x01\x00"  # the same header, the long way: the codec decodes it
# (an absolute-expiry-time: the properties list is long enough for ``properties_at`` to point at it)
REST = codec.encode(Properties(message_id="m-1", to="q", absolute_expiry_time=Timestamp(7))) + codec.encode(
    AmqpValue("body")
)


def _view(message: Message) -> dict[str, Any]:
    content = message.content
    return {
        "header": content.header,
        "count": content.count,
        "priority": content.priority,
        "malformed": content.malformed,
        "oversized": content.oversized,
        "annotations": content.annotations,
        "properties": message.properties(),
    }


@pytest.mark.parametrize("annotations", [False, True])
def test_an_empty_header_reads_as_the_long_form_does(annotations: bool) -> None:
    middle = codec.encode(MessageAnnotations({Symbol("x-a"): 1})) if annotations else b""
    short, long = Message(EMPTY_LIST0 + middle + REST), Message(EMPTY_LIST8 + middle + REST)
    assert _view(short) == _view(long)
    assert short.header == Header()
    assert short.content.properties_at >= 0
    assert short.content.properties_at - len(EMPTY_LIST0) == long.content.properties_at - len(EMPTY_LIST8)
    assert short.absolute_expiry_time() == long.absolute_expiry_time() == 7
    assert short.encoded() == EMPTY_LIST0 + middle + REST


def test_an_empty_header_needs_no_codec(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any) -> Any:
        raise AssertionError("the codec decoded a section")

    monkeypatch.setattr(message_module.codec, "decode", refuse)
    assert Message(EMPTY_LIST0 + REST).header == Header()


@pytest.mark.parametrize("limit", [1, 3, 4, 5])
def test_the_size_limit_holds_for_an_empty_header_too(limit: int) -> None:
    """``limit`` (the largest header decoded) refuses a 4-octet empty header below 4, as for any header."""
    short = Message(EMPTY_LIST0 + REST, limit=limit)
    assert short.content.oversized == (limit < len(EMPTY_LIST0))
    if limit >= len(EMPTY_LIST0):  # (the properties section is larger than any of these limits: not compared)
        assert (short.header, short.content.count, short.content.malformed) == (Header(), 0, None)
