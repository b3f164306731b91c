"""The hot-path transfer/disposition code (amqp/fastpath.py) gives exactly what the general codec gives."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.amqp import codec
from minibroker.amqp.definitions import (
    Accepted,
    Disposition,
    Error,
    Modified,
    Rejected,
    Released,
    TransactionalState,
    Transfer,
)
from minibroker.amqp.fastpath import decode_disposition, decode_transfer, encode_transfer
from minibroker.amqp.types import DecodeError, Symbol, UInt

uints = st.integers(0, 2**32 - 1)
flags = st.one_of(st.none(), st.booleans())
states = st.one_of(
    st.none(),
    st.just(Accepted()),
    st.builds(TransactionalState, txn_id=st.binary(max_size=40), outcome=st.sampled_from([None, Accepted()])),
    st.just(Released()),
    st.builds(Modified, delivery_failed=flags, undeliverable_here=flags),
    st.builds(lambda d: Rejected(error=Error(condition=Symbol("amqp:x"), description=d)), st.text(max_size=10)),
)
transfers = st.builds(
    Transfer,
    handle=uints,
    delivery_id=st.one_of(st.none(), uints),
    delivery_tag=st.one_of(st.none(), st.binary(max_size=40)),
    message_format=st.one_of(st.none(), uints),
    settled=flags,
    more=flags,
    rcv_settle_mode=st.one_of(st.none(), st.integers(0, 1)),
    state=states,
    resume=flags,
    aborted=flags,
    batchable=flags,
)
dispositions = st.builds(
    Disposition,
    role=st.booleans(),
    first=uints,
    last=st.one_of(st.none(), uints),
    settled=flags,
    state=states,
    batchable=flags,
)


@given(transfers, st.binary(max_size=20))
@settings(max_examples=300, deadline=None)
def test_transfer_decodes_like_the_codec(transfer: Transfer, payload: bytes) -> None:
    body = codec.encode(transfer) + payload
    fast, end = decode_transfer(body)
    slow, slow_end = codec.decode(body)
    assert (fast, end) == (slow, slow_end)
    assert body[end:] == payload


@given(dispositions)
@settings(max_examples=300, deadline=None)
def test_disposition_decodes_like_the_codec(disposition: Disposition) -> None:
    body = codec.encode(disposition)
    assert decode_disposition(body) == codec.decode(body)


@given(
    handle=uints,
    delivery_id=st.one_of(st.none(), uints),
    tag=st.binary(min_size=0, max_size=300),
    message_format=uints,
    settled=st.booleans(),
    more=st.booleans(),
    state=states,
)
@settings(max_examples=300, deadline=None)
def test_transfer_encodes_like_the_codec(
    handle: int, delivery_id: int | None, tag: bytes, message_format: int, settled: bool, more: bool, state: Any
) -> None:
    fast = encode_transfer(handle, delivery_id, tag, message_format, settled, more, state)
    if delivery_id is None:
        expected = Transfer(handle=UInt(handle), more=more or None, state=state)
        expected.delivery_tag = expected.message_format = expected.settled = None
    else:
        expected = Transfer(
            handle=UInt(handle),
            delivery_id=UInt(delivery_id),
            delivery_tag=tag,
            message_format=UInt(message_format),
            settled=settled,
            more=more or None,
            state=state,
        )
    assert codec.decode(fast)[0] == codec.decode(codec.encode(expected))[0]


@given(st.binary(max_size=64))
@settings(max_examples=500, deadline=None)
def test_garbage_raises_only_decode_error(tail: bytes) -> None:
    for prefix in (b"\x00\x53\x14", b"\x00\x53\x15"):
        decoder = decode_transfer if prefix == b"\x00\x53\x14" else decode_disposition
        with contextlib.suppress(DecodeError):
            decoder(prefix + tail)


def test_transfer_without_handle_is_a_decode_error() -> None:
    with pytest.raises(DecodeError):
        decode_transfer(b"\x00\x53\x14\xc0\x02\x01\x40")


usual_states = st.one_of(
    st.none(),
    st.just(Accepted()),
    st.builds(TransactionalState, txn_id=st.binary(max_size=32), outcome=st.sampled_from([None, Accepted()])),
)


@given(transfers, dispositions, usual_states, st.binary(max_size=20))
@settings(max_examples=200, deadline=None)
def test_what_clients_usually_send_takes_the_fast_path(
    transfer: Transfer, disposition: Disposition, state: Any, payload: bytes
) -> None:
    """Transfers and dispositions as the codec writes them (the compact encodings clients use), with no state,
    ``accepted`` or a ``transactional-state``, are decoded without the general codec (issue 19: one per frame)."""
    from minibroker.amqp import fastpath

    transfer.state = disposition.state = state
    transfer_body = codec.encode(transfer) + payload
    disposition_body = codec.encode(disposition)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fastpath, "codec", None)  # any use of the codec fails
        assert decode_transfer(transfer_body) == (transfer, len(transfer_body) - len(payload))
        assert decode_disposition(disposition_body) == (disposition, len(disposition_body))


def _result(decode: Any, data: bytes) -> Any:
    """What ``decode`` gives for ``data``: its value (the performative, without where it ends), or a refusal."""
    try:
        return decode(data)[0]
    except DecodeError:
        return DecodeError


@given(st.one_of(transfers, dispositions), st.data())
@settings(max_examples=400, deadline=None)
def test_damaged_input_is_refused_or_decoded_like_the_codec(performative: Any, data: st.DataObject) -> None:
    """An encoding cut short, or with one byte changed, decodes to what the codec makes of it, or is refused by
    both: the fast paths never accept what the codec refuses, nor read a field differently."""
    body = bytearray(codec.encode(performative))
    if data.draw(st.booleans()):
        body = body[: data.draw(st.integers(3, len(body)))]
    else:
        body[data.draw(st.integers(3, len(body) - 1))] = data.draw(st.integers(0, 255))
    decoder = decode_transfer if isinstance(performative, Transfer) else decode_disposition
    fast, slow = _result(decoder, bytes(body)), _result(codec.decode, bytes(body))
    if slow is not DecodeError and not isinstance(slow, type(performative)):
        slow = DecodeError  # (another performative altogether: the fast path refuses it, as the engine would)
    assert fast == slow


@given(
    handle=uints,
    delivery_id=uints,
    tag=st.binary(max_size=20),
    message_format=st.sampled_from([None, 0]),
    settled=flags,
    more=flags,
    state=states,
    aborted=flags,
)
@settings(max_examples=300, deadline=None)
def test_transfer_as_clients_write_it_decodes_like_the_codec(
    handle: int, delivery_id: int, tag: bytes, message_format: int | None, **rest: Any
) -> None:
    """message-format, settled, more and rcv-settle-mode one byte each (every client's transfer), read by one table
    lookup (issue 19): each count of fields the codec writes decodes as the codec decodes it."""
    transfer = Transfer(
        handle=UInt(handle),
        delivery_id=UInt(delivery_id),
        delivery_tag=tag,
        message_format=None if message_format is None else UInt(message_format),
        **rest,
    )
    body = codec.encode(transfer) + b"payload"
    assert decode_transfer(body) == codec.decode(body)
    assert decode_transfer(body)[0] == transfer


@given(
    handle=st.one_of(st.integers(0, 300), uints),
    delivery_id=st.one_of(st.integers(0, 300), uints),
    tag=st.one_of(st.binary(min_size=8, max_size=8), st.binary(min_size=230, max_size=260)),
    message_format=st.sampled_from([None, 0]),
    settled=st.booleans(),
)
@settings(max_examples=300, deadline=None)
def test_transfer_as_the_broker_sends_it_encodes_like_the_codec(
    handle: int, delivery_id: int, tag: bytes, message_format: int | None, settled: bool
) -> None:
    """A whole message in one frame with no state (every delivery the broker sends but large ones) takes its own
    branch (issue 19): the same bytes as the codec, small and large handles, ids and tags."""
    fast = encode_transfer(handle, delivery_id, tag, message_format, settled, False)
    expected = Transfer(
        handle=UInt(handle), delivery_id=UInt(delivery_id), delivery_tag=tag, message_format=UInt(0), settled=settled
    )
    assert fast == codec.encode(expected)
