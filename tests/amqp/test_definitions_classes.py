"""The generated classes behave as the ``@dataclass(slots=True)`` classes they replaced (issue 19, start-up).

``definitions.py`` once built its 40 classes with ``@dataclass(slots=True)``; the generator now writes the methods
out so that importing it does no dataclass processing. This pins what the code and the tests rely on, class by
class: the constructor (parameters in wire order, positional or keyword, every composite field defaulting to
None, a section's ``value`` required), slots and mutability, ``__eq__`` (same class and equal field tuples, else
``NotImplemented``), unhashability, ``__repr__``, ``__match_args__``, copying and pickling. The expectations are
derived from each class's field table, ``FIELDS`` (itself checked against the XML by test_definitions.py).
"""

from __future__ import annotations

import copy
import inspect
import pickle
from typing import Any

import pytest

from minibroker.amqp import definitions
from minibroker.amqp.composite import Composite, DescribedSection
from minibroker.amqp.definitions import Accepted, AmqpValue, Data, Detach, Error, Released, Transfer
from minibroker.amqp.types import Symbol, UInt
from tests.amqp.compare import same

ALL_TYPES: list[type[Any]] = list(definitions.ALL_TYPES)


def field_names(cls: type[Any]) -> list[str]:
    """The fields in wire order: the field table's names for a composite, ``value`` for a section."""
    if issubclass(cls, DescribedSection):
        return ["value"]
    return [spec.name for spec in cls.FIELDS]


def sample(cls: type[Any], salt: int = 0) -> Any:
    """An instance with a distinct value in every field (a composite's defaults are all None)."""
    return cls(*(f"{name}-{salt}" for name in field_names(cls)))


def class_id(cls: type[Any]) -> str:
    return cls.__name__


@pytest.mark.parametrize("cls", ALL_TYPES, ids=class_id)
def test_constructor_takes_the_fields_in_wire_order(cls: type[Any]) -> None:
    names = field_names(cls)
    params = list(inspect.signature(cls).parameters.values())
    assert [p.name for p in params] == names
    assert {p.kind for p in params} <= {inspect.Parameter.POSITIONAL_OR_KEYWORD}
    section = issubclass(cls, DescribedSection)
    assert [p.default for p in params] == [inspect.Parameter.empty if section else None] * len(names)
    positional, keyword = sample(cls), cls(**{name: f"{name}-0" for name in names})
    for value in (positional, keyword):
        assert [getattr(value, name) for name in names] == [f"{name}-0" for name in names]
    with pytest.raises(TypeError):
        cls(*names, "one too many")
    with pytest.raises(TypeError, match="no_such_field"):
        cls(*names, no_such_field=1)


@pytest.mark.parametrize("cls", [c for c in ALL_TYPES if issubclass(c, Composite)], ids=class_id)
def test_every_composite_field_defaults_to_none(cls: type[Any]) -> None:
    value = cls()
    assert [getattr(value, spec.name) for spec in cls.FIELDS] == [None] * len(cls.FIELDS)


@pytest.mark.parametrize("cls", [c for c in ALL_TYPES if issubclass(c, DescribedSection)], ids=class_id)
def test_a_section_needs_its_value(cls: type[Any]) -> None:
    with pytest.raises(TypeError):
        cls()


@pytest.mark.parametrize("cls", ALL_TYPES, ids=class_id)
def test_slotted_and_mutable(cls: type[Any]) -> None:
    assert cls.__slots__ == tuple(field_names(cls))
    value = sample(cls)
    assert not hasattr(value, "__dict__")
    with pytest.raises(AttributeError):
        value.no_such_field = 1
    for name in field_names(cls):
        setattr(value, name, "changed")
        assert getattr(value, name) == "changed"


@pytest.mark.parametrize("cls", ALL_TYPES, ids=class_id)
def test_equality_is_same_class_and_equal_fields(cls: type[Any]) -> None:
    assert sample(cls) == sample(cls)
    assert not sample(cls) != sample(cls)  # noqa: SIM202 (``!=`` itself is under test)
    for name in field_names(cls):
        other = sample(cls)
        setattr(other, name, "different")
        assert sample(cls) != other, name
    assert sample(cls).__eq__(field_names(cls)) is NotImplemented
    assert sample(cls) != tuple(getattr(sample(cls), name) for name in field_names(cls))
    nan = float("nan")  # fields compare as tuples do: identity first, so a field holding one NaN is equal
    same_nan = cls(*[nan] * len(field_names(cls)))
    assert same_nan == cls(*[nan] * len(field_names(cls)))
    with pytest.raises(TypeError, match="unhashable"):
        hash(sample(cls))
    assert cls.__hash__ is None


def test_classes_with_equal_fields_differ() -> None:
    assert Accepted() != Released()
    assert Accepted() == Accepted()
    assert Data(b"x") != AmqpValue(b"x")


@pytest.mark.parametrize("cls", ALL_TYPES, ids=class_id)
def test_repr_names_every_field(cls: type[Any]) -> None:
    fields = ", ".join(f"{name}={f'{name}-1'!r}" for name in field_names(cls))
    assert repr(sample(cls, 1)) == f"{cls.__qualname__}({fields})"


def test_repr_exact() -> None:
    assert repr(Accepted()) == "Accepted()"
    assert repr(Data(b"\x01")) == "Data(value=b'\\x01')"
    error = Error(condition=Symbol("amqp:internal-error"))
    assert repr(Detach(handle=UInt(3), closed=True, error=error)) == (
        "Detach(handle=UInt(3), closed=True, error=Error(condition=Symbol('amqp:internal-error'), description=None, "
        "info=None))"
    )


@pytest.mark.parametrize("cls", ALL_TYPES, ids=class_id)
def test_match_args_are_the_fields(cls: type[Any]) -> None:
    assert cls.__match_args__ == tuple(field_names(cls))


def test_pattern_matching() -> None:
    match Transfer(UInt(1), UInt(2), b"t"):
        case Transfer(handle, delivery_id, settled=None):
            assert (handle, delivery_id) == (1, 2)
        case _:
            pytest.fail("no match")
    match Data(b"\x01"):
        case AmqpValue():
            pytest.fail("wrong class matched")
        case Data(body):
            assert body == b"\x01"


@pytest.mark.parametrize("cls", ALL_TYPES, ids=class_id)
def test_copy_and_pickle(cls: type[Any]) -> None:
    value = sample(cls)
    for twin in (copy.copy(value), copy.deepcopy(value), pickle.loads(pickle.dumps(value))):
        assert type(twin) is cls
        assert twin == value
        assert twin is not value


def test_round_trip_comparison_sees_field_types() -> None:
    # tests/amqp/compare.py compares composites field by field, by AMQP type: ``==`` takes a string for a symbol
    assert Error(condition=Symbol("a")) == Error(condition="a")
    assert not same(Error(condition=Symbol("a")), Error(condition="a"))
    assert not same(Data(UInt(1)), Data(1))
    assert same(Detach(UInt(1), error=Error(Symbol("a"))), Detach(UInt(1), error=Error(Symbol("a"))))
