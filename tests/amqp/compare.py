"""Type-aware equality of AMQP values, for round-trip and differential tests.

Python's ``==`` is too lenient for them: ``UInt(1) == Long(1) == True``, ``Symbol("a") == "a"`` and
``-0.0 == 0.0``, yet each pair is two different AMQP values; and ``nan != nan``. ``same`` compares the
Python type at every level, floats by sign and NaN-ness, and composites field by field.
"""

from __future__ import annotations

import math
from typing import Any

from minibroker.amqp.composite import Composite, DescribedSection
from minibroker.amqp.types import Array, Described


def same(a: Any, b: Any) -> bool:
    """True when ``a`` and ``b`` are the same AMQP value with the same AMQP type, at every level."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return len(a) == len(b) and all(
            same(ka, kb) and same(va, vb) for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=True)
        )
    if isinstance(a, Array):
        return a.type == b.type and same(a.descriptor, b.descriptor) and same(a.items, b.items)
    if isinstance(a, Described):
        return same(a.descriptor, b.descriptor) and same(a.value, b.value)
    if isinstance(a, Composite):
        return same(a.field_values(), b.field_values())
    if isinstance(a, DescribedSection):  # message sections
        return same(a.value, b.value)
    return bool(a == b)


def assert_same(actual: Any, expected: Any) -> None:
    """``assert same(actual, expected)`` with both values in the message."""
    assert same(actual, expected), f"\n  actual:   {actual!r}\n  expected: {expected!r}"
