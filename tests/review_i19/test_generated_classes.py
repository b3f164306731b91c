"""Adversarial review of issue 19's generated AMQP 1.0 classes (plain slotted classes replacing
``@dataclass(slots=True)``, ``tools/gen_definitions.py``): what a dataclass gave and code may rely on. Each
expectation holds on a0f32da (the dataclasses) too."""

from __future__ import annotations

import copy
import math
import pickle

import pytest

from minibroker.amqp import codec
from minibroker.amqp.definitions import (
    Accepted,
    AmqpValue,
    Data,
    Disposition,
    Error,
    Modified,
    Open,
    Rejected,
    Released,
    Source,
    TransactionalState,
)
from minibroker.amqp.types import Symbol, UInt

pytestmark = pytest.mark.timeout(30)


def test_equality_is_by_class_and_fields() -> None:
    assert Accepted() == Accepted()
    assert Accepted() != Released()  # both field-less: another class is never equal
    assert Modified() != Modified(delivery_failed=True)
    assert Modified(delivery_failed=False) != Modified()  # false is not null
    assert TransactionalState(txn_id=b"a", outcome=Accepted()) == TransactionalState(txn_id=b"a", outcome=Accepted())
    assert TransactionalState(txn_id=b"a") != TransactionalState(txn_id=b"a", outcome=Accepted())
    assert Disposition(role=True, first=UInt(1)) == Disposition(role=True, first=1)
    assert (Accepted() == object()) is False
    assert (Accepted() != 1) is True


def test_a_nan_field_is_equal_to_itself_as_in_a_dataclass() -> None:
    nan = math.nan
    value = AmqpValue(nan)
    assert value == value  # identity first, as a tuple compares
    assert value == AmqpValue(nan)
    assert Open(container_id="c", properties={Symbol("x"): nan}) == Open(
        container_id="c", properties={Symbol("x"): nan}
    )


def test_unhashable_like_a_mutable_dataclass() -> None:
    for value in (Accepted(), Released(), Data(b"x"), Source(address="a")):
        with pytest.raises(TypeError):
            hash(value)


def test_slots_only() -> None:
    values: list[object] = [Accepted(), Rejected(), Open(container_id="c"), AmqpValue(1)]
    for value in values:
        assert not hasattr(value, "__dict__")
        with pytest.raises(AttributeError):
            setattr(value, "nonsense", 1)  # noqa: B010  (the attribute is not declared: that is the point)


@pytest.mark.parametrize(
    "value",
    [
        Accepted(),
        Rejected(error=Error(condition=Symbol("amqp:internal-error"), description="d", info={Symbol("k"): 1})),
        TransactionalState(txn_id=b"t", outcome=Modified(delivery_failed=True, message_annotations={Symbol("a"): 1})),
        Open(container_id="c", offered_capabilities=[Symbol("x")]),
        AmqpValue([1, "two", None]),
        Data(b"\x00\x01"),
    ],
    ids=lambda v: type(v).__name__,
)
def test_copy_pickle_repr_and_codec_round_trip(value: object) -> None:
    for other in (
        copy.copy(value),
        copy.deepcopy(value),
        *(pickle.loads(pickle.dumps(value, protocol)) for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1)),
    ):
        assert type(other) is type(value)
        assert other == value
        assert repr(other) == repr(value)
    decoded = codec.decode(codec.encode(value))[0]
    assert type(decoded) is type(value)  # (ints come back typed: the repr differs)
    assert decoded == value
    assert repr(value).startswith(type(value).__qualname__ + "(")


def test_deepcopy_does_not_share_mutable_fields() -> None:
    state = TransactionalState(txn_id=b"t", outcome=Modified(message_annotations={Symbol("a"): 1}))
    other = copy.deepcopy(state)
    other.outcome.message_annotations[Symbol("a")] = 2
    assert state.outcome.message_annotations == {Symbol("a"): 1}


def test_repr_names_every_field_in_order() -> None:
    assert repr(Modified(delivery_failed=True)) == (
        "Modified(delivery_failed=True, undeliverable_here=None, message_annotations=None)"
    )
    assert repr(Data(b"x")) == "Data(value=b'x')"


def test_pattern_matching_by_position() -> None:
    match TransactionalState(b"t", Accepted()):
        case TransactionalState(txn_id, Accepted()):
            assert txn_id == b"t"
        case _:
            pytest.fail("no match")
    match Disposition(True, 1, 3):
        case Disposition(role, first, last):
            assert (role, first, last) == (True, 1, 3)
