"""The fast paths (amqp/fastpath.py) give exactly what the general codec gives, in any legal encoding.

Issue 19's "a CI test proves the fast paths equal the general codec": transfers, dispositions and the
coordinator's declare/discharge are decoded from odd-but-legal encodings (descriptors as smallulong, ulong or
symbol; list0, list8 or list32; trailing nulls written out), the answers the transaction path sends
(``accepted``, ``declared``, ``transactional-state``) are encoded for txn-ids of 0..40 octets, and both sides
of each comparison agree on what is refused (a ``DecodeError``) too.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.amqp import codec
from minibroker.amqp.definitions import (
    Accepted,
    AmqpValue,
    Declare,
    Declared,
    Discharge,
    Disposition,
    Error,
    Header,
    Modified,
    Properties,
    Rejected,
    Released,
    TransactionalState,
)
from minibroker.amqp.fastpath import (
    control_value,
    control_value_general,
    decode_disposition,
    decode_transfer,
    encode_disposition,
    state_bytes,
)
from minibroker.amqp.types import DecodeError, Symbol, UInt
from tests.amqp.test_fastpath import dispositions, transfers

_EMPTY_HEADER = codec.encode(Header())  # list0, as python-qpid-proton writes an empty one
_EMPTY_PROPERTIES = codec.encode(Properties())
_EMPTY_BOTH = _EMPTY_HEADER + _EMPTY_PROPERTIES

Draw = Callable[[st.SearchStrategy[Any]], Any]
_CLASSES = {  # descriptor code -> the class its ``from_described`` belongs to (sections included)
    int(key): cast(Any, make).__self__ for key, make in codec.DESCRIBED_TYPES.items() if not isinstance(key, str)
}

txn_ids = st.binary(min_size=1, max_size=32)
flags = st.one_of(st.none(), st.booleans())
states = st.one_of(
    st.none(),
    st.just(Accepted()),
    st.builds(Declared, txn_id=st.binary(max_size=40)),
    st.builds(TransactionalState, txn_id=st.binary(max_size=40), outcome=st.sampled_from([None, Accepted()])),
    st.builds(TransactionalState, txn_id=txn_ids, outcome=st.just(Released())),
    st.just(Released()),
    st.builds(Modified, delivery_failed=flags, undeliverable_here=flags),
    st.builds(lambda d: Rejected(error=Error(condition=Symbol("amqp:x"), description=d)), st.text(max_size=10)),
)
controls = st.one_of(
    st.just(Declare()),
    st.builds(Declare, global_id=st.binary(max_size=4)),
    st.builds(Discharge, txn_id=st.binary(max_size=40), fail=flags),
    st.builds(Discharge, txn_id=st.text(max_size=4), fail=flags),
    st.builds(Declared, txn_id=txn_ids),
    st.text(max_size=4),
    st.none(),
)


def _recode(data: bytes, draw: Draw) -> bytes:
    """``data`` (one encoded value) in another legal encoding, chosen by ``draw``: each described value's
    descriptor as smallulong, ulong or symbol, each described list as list0/list8/list32 with up to two of its
    trailing null fields written out."""
    if data[:2] != b"\x00\x53":
        return data
    cls = _CLASSES[data[2]]
    descriptor = draw(st.sampled_from(["smallulong", "ulong", "symbol"]))
    head = {
        "smallulong": data[:3],
        "ulong": b"\x00\x80" + struct.pack(">Q", data[2]),
        "symbol": b"\x00" + codec.encode(Symbol(cls.DESCRIPTOR_NAME)),
    }[descriptor]
    code = data[3]
    if code == 0x45:
        count, pos = 0, 4
    elif code == 0xC0:
        count, pos = data[5], 6
    elif code == 0xD0:
        count, pos = struct.unpack_from(">I", data, 8)[0], 12
    else:  # a described value that is no list (an amqp-value section): its value may be described in turn
        return head + _recode(data[3:], draw)
    fields = []
    for _ in range(count):
        end = codec.decode(data, pos)[1]
        fields.append(_recode(data[pos:end], draw))
        pos = end
    fields += [b"\x40"] * draw(st.integers(0, min(2, len(cls.FIELDS) - count)))
    body = b"".join(fields)
    forms = (["list0"] if not fields else []) + (["list8"] if len(body) < 255 else []) + ["list32"]
    form = draw(st.sampled_from(forms))
    if form == "list0":
        return head + b"\x45"
    if form == "list8":
        return head + bytes((0xC0, len(body) + 1, len(fields))) + body
    return head + struct.pack(">BII", 0xD0, len(body) + 4, len(fields)) + body


def _result(decode: Callable[[bytes], Any], data: bytes) -> Any:
    """What ``decode`` gives for ``data``: its value, or that it refused it."""
    try:
        return decode(data)
    except DecodeError:
        return DecodeError


@given(transfers, st.binary(max_size=20), st.data())
@settings(max_examples=300, deadline=None)
def test_transfer_in_any_encoding_decodes_like_the_codec(transfer: Any, payload: bytes, data: st.DataObject) -> None:
    body = _recode(codec.encode(transfer), data.draw) + payload
    fast, end = decode_transfer(body)
    assert (fast, end) == codec.decode(body)
    assert fast == transfer


@given(dispositions, st.data())
@settings(max_examples=300, deadline=None)
def test_disposition_in_any_encoding_decodes_like_the_codec(disposition: Any, data: st.DataObject) -> None:
    body = _recode(codec.encode(disposition), data.draw)
    assert decode_disposition(body) == codec.decode(body)


@given(
    st.builds(
        Disposition,
        role=st.booleans(),
        first=st.integers(0, 2**32 - 1).map(UInt),
        last=st.one_of(st.none(), st.integers(0, 2**32 - 1).map(UInt)),
        settled=st.booleans(),
        state=st.builds(TransactionalState, txn_id=txn_ids, outcome=st.sampled_from([None, Accepted()])),
    ),
    st.data(),
)
@settings(max_examples=200, deadline=None)
def test_transactional_disposition_in_any_encoding_decodes_like_the_codec(
    disposition: Any, data: st.DataObject
) -> None:
    body = _recode(codec.encode(disposition), data.draw)
    assert decode_disposition(body) == codec.decode(body) == (disposition, len(body))


@given(
    role=st.booleans(),
    first=st.integers(0, 2**32 - 1),
    last=st.one_of(st.none(), st.integers(0, 2**32 - 1)),
    settled=st.booleans(),
    state=states,
)
@settings(max_examples=500, deadline=None)
def test_disposition_encodes_like_the_codec(
    role: bool, first: int, last: int | None, settled: bool, state: Any
) -> None:
    fast = encode_disposition(role, first, last, settled, state)
    general = Disposition(
        role=role, first=UInt(first), last=None if last is None else UInt(last), settled=settled, state=state
    )
    if state_bytes(state) is None and state is not None:
        assert fast is None  # not one the fast path builds: the caller uses the codec
    else:
        assert fast == codec.encode(general)


@given(st.sampled_from([Accepted(), Declared(txn_id=b"\x01" * 32), TransactionalState(txn_id=b"\x07")]))
def test_the_transaction_path_answers_take_the_fast_path(state: Any) -> None:
    assert state_bytes(state) == codec.encode(state)


@given(controls, st.booleans(), st.data())
@settings(max_examples=500, deadline=None)
def test_control_message_decodes_like_the_codec(value: Any, odd: bool, data: st.DataObject) -> None:
    """``odd``: recoded, maybe after a header and before a footer or junk; else as clients send it."""
    payload = codec.encode(AmqpValue(value))
    if odd:
        payload = _recode(payload, data.draw)
        leading = [b"", codec.encode(Header(durable=True)), _EMPTY_HEADER, _EMPTY_PROPERTIES, _EMPTY_BOTH]
        payload = data.draw(st.sampled_from(leading)) + payload
        payload += data.draw(st.sampled_from([b"", b"\x00\x53\x78\xc1\x01\x00", b"\xff"]))  # a footer, or junk
    assert _result(control_value, payload) == _result(control_value_general, payload)
    cut = data.draw(st.integers(0, len(payload)))
    assert _result(control_value, payload[:cut]) == _result(control_value_general, payload[:cut])


@given(st.binary(max_size=48), st.sampled_from([b"\x00\x53\x77\x00\x53\x31", b"\x00\x53\x77\x00\x53\x32"]))
@settings(max_examples=500, deadline=None)
def test_control_garbage_is_refused_like_the_codec(tail: bytes, prefix: bytes) -> None:
    payload = prefix + tail
    assert _result(control_value, payload) == _result(control_value_general, payload)


def test_a_usual_declare_and_discharge_decode() -> None:
    assert control_value(bytes.fromhex("00537700533145")) == Declare()
    discharge = bytes.fromhex("005377005332c00502a0013141")
    assert control_value(discharge) == Discharge(txn_id=b"1", fail=True)


def test_what_python_qpid_proton_sends_takes_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """python-qpid-proton 0.39 writes each control as a whole message (an empty header and properties before the
    amqp-value), the descriptor as a symbol and the list as list32: these bytes (its ``Message.encode()`` of
    ``Described(symbol("amqp:declare:list"), [None])`` and of the discharge) are decoded without the codec."""
    from minibroker.amqp import fastpath

    def general(payload: bytes) -> Any:
        raise AssertionError("the general codec was used")

    monkeypatch.setattr(fastpath, "control_value_general", general)
    declare = "00537045005373450053770" + "0a311" + b"amqp:declare:list".hex() + "d0000000050000000140"
    assert control_value(bytes.fromhex(declare)) == Declare()
    discharge = "00537045005373450053770" + "0a313" + b"amqp:discharge:list".hex() + "d00000000f00000002a008"
    discharge += b"txn-1234".hex() + "42"
    assert control_value(bytes.fromhex(discharge)) == Discharge(txn_id=b"txn-1234", fail=False)
    assert control_value(bytearray.fromhex(discharge)) == Discharge(txn_id=b"txn-1234", fail=False)


def test_python_qpid_protons_transactional_states_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """python-qpid-proton 0.39 writes the ``transactional-state`` of a transactional post (a transfer's state) and
    of a transactional accept (a disposition's) as a list32, a 16-octet txn-id: decoded without the codec (issue 19:
    one codec decode per message of ``txn_100`` and ``txn_accept_100`` before)."""
    from minibroker.amqp import fastpath

    txn_id = bytes.fromhex("86427e0e2b6095980000000000000001")

    def list32(code: int, count: int, fields: bytes) -> bytes:
        return bytes((0, 0x53, code)) + struct.pack(">BII", 0xD0, len(fields) + 4, count) + fields

    binary = b"\xa0\x10" + txn_id
    transfer = list32(0x14, 8, b"\x43\x43\xa0\x01\x01\x43\x42\x40\x40" + list32(0x34, 1, binary))
    accept = list32(0x34, 2, binary + b"\x00\x53\x24\x45")
    disposition = list32(0x15, 5, b"\x41\x52\x05\x40\x42" + accept)  # receiver, first 5, unsettled
    post_state, accept_state = TransactionalState(txn_id=txn_id), TransactionalState(txn_id=txn_id, outcome=Accepted())
    assert codec.decode(transfer)[0].state == post_state  # (the bytes are what they claim)
    assert codec.decode(disposition)[0].state == accept_state
    monkeypatch.setattr(fastpath, "codec", None)  # any use of the codec fails
    assert decode_transfer(transfer)[0].state == post_state
    assert decode_disposition(disposition)[0].state == accept_state


_STATE_POOL = [
    None,
    Accepted(),
    Released(),
    TransactionalState(txn_id=b"\x01"),
    TransactionalState(txn_id=b"\x01", outcome=Accepted()),
    TransactionalState(txn_id=b"\x02" * 16),
    TransactionalState(txn_id=b"\x02" * 16, outcome=Accepted()),
    TransactionalState(txn_id=b"\x01", outcome=Rejected(error=Error(condition=Symbol("amqp:x")))),
]


@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(0, 2**32 - 1), st.sampled_from(_STATE_POOL), st.booleans()),
        min_size=1,
        max_size=12,
    ),
    st.data(),
)
@settings(max_examples=300, deadline=None)
def test_transfers_and_dispositions_in_a_row_decode_like_the_codec(frames: list[Any], data: st.DataObject) -> None:
    """A transaction's posts and accepts carry the same state one after another (decoded once, issue 19): each of a
    run of transfers and dispositions, states repeating or not, recoded or as the codec writes them, maybe cut short,
    decodes as the codec decodes it."""
    from minibroker.amqp.definitions import Transfer

    for is_transfer, number, state, odd in frames:
        if is_transfer:
            performative: Any = Transfer(handle=UInt(1), delivery_id=UInt(number), delivery_tag=b"t", state=state)
            performative.message_format = UInt(0)
        else:
            performative = Disposition(role=True, first=UInt(number), settled=False, state=state)
        body = codec.encode(performative)
        if odd:
            body = _recode(body, data.draw)
        body += b"payload" if is_transfer else b""
        decode = decode_transfer if is_transfer else decode_disposition
        assert _result(decode, body) == _result(codec.decode, body)
        cut = data.draw(st.integers(0, len(body)))
        assert _result(decode, body[:cut]) == _result(codec.decode, body[:cut])


def test_a_transactions_repeated_state_is_decoded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The posts of one transaction (and its accepts) carry the same ``transactional-state``: once decoded, the
    same bytes are not decoded again (issue 19), and the value is the same."""
    from minibroker.amqp import fastpath

    state = codec.encode(TransactionalState(txn_id=b"\x05" * 16))
    accept = codec.encode(TransactionalState(txn_id=b"\x05" * 16, outcome=Accepted()))

    def post(delivery_id: int) -> bytes:
        fields = b"\x43\x52" + bytes((delivery_id,)) + b"\xa0\x01t\x43\x40\x40\x40" + state
        return b"\x00\x53\x14\xc0" + bytes((len(fields) + 1, 8)) + fields + b"payload"

    def disposition(first: int) -> bytes:
        fields = b"\x41\x52" + bytes((first,)) + b"\x40\x42" + accept
        return b"\x00\x53\x15\xc0" + bytes((len(fields) + 1, 5)) + fields

    assert decode_transfer(post(1))[0].state == TransactionalState(txn_id=b"\x05" * 16)
    monkeypatch.setattr(fastpath, "_state", None)  # any decode of the state now fails
    decoded, end = decode_transfer(post(2))
    assert (decoded, end) == codec.decode(post(2))
    monkeypatch.undo()
    assert decode_disposition(disposition(1))[0].state == TransactionalState(txn_id=b"\x05" * 16, outcome=Accepted())
    monkeypatch.setattr(fastpath, "_state", None)
    assert decode_disposition(disposition(2)) == codec.decode(disposition(2))
