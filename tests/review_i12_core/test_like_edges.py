"""LIKE edge cases (issue 12, item 2): escape characters that are themselves wildcards, non-BMP characters,
NUL, _ at both ends, %%, the empty pattern, and selectors exactly at the length limit, against a regex reference."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.broker.selector import MessageFields, Selector, SelectorError, _LikePattern

ESCAPES = [None, "!", "%", "_", "\U0001f600", "\x00", "a"]


def reference(pattern: str, escape: str | None, value: str) -> bool | None:
    parts = []
    chars = iter(pattern)
    for char in chars:
        if char == escape:
            quoted = next(chars, None)
            if quoted is None:
                return None
            parts.append(re.escape(quoted))
        elif char == "%":
            parts.append(".*")
        elif char == "_":
            parts.append(".")
        else:
            parts.append(re.escape(char))
    return re.fullmatch("".join(parts), value, re.DOTALL) is not None


_chars = st.sampled_from(["a", "b", "%", "_", "!", "\U0001f600", "\x00", "\n", "é", "\ud7ff"])


@settings(max_examples=3000, deadline=None)
@given(st.lists(_chars, max_size=12).map("".join), st.sampled_from(ESCAPES), st.lists(_chars, max_size=30).map("".join))
def test_like_agrees_with_a_regex_for_any_escape(pattern: str, escape: str | None, value: str) -> None:
    expected = reference(pattern, escape, value)
    if expected is None:
        with pytest.raises(ValueError, match="escape"):
            _LikePattern(pattern, escape)
        return
    assert _LikePattern(pattern, escape).matches(value) is expected


@pytest.mark.parametrize(
    ("pattern", "value", "expected"),
    [
        ("", "", True),
        ("", "a", False),
        ("%", "", True),
        ("%%", "", True),
        ("%%", "xyz", True),
        ("_", "\U0001f600", True),  # one character, not two UTF-16 units
        ("__", "\U0001f600", False),
        ("_%_", "\U0001f600", False),
        ("_%_", "ab", True),
        ("_a%a_", "xaax", True),
        ("_a%a_", "xax", False),
        ("%_%", "", False),
        ("\U0001f600%", "\U0001f600x", True),
    ],
)
def test_like_edges(pattern: str, value: str, expected: bool) -> None:
    assert _LikePattern(pattern, None).matches(value) is expected
    quoted = pattern.replace("'", "''")
    assert Selector(f"p LIKE '{quoted}'").matches(MessageFields({"p": value})) is expected


def test_selector_exactly_at_the_length_limit() -> None:
    body = "p LIKE '"
    text = body + "a" * (4096 - len(body) - 1) + "'"
    assert len(text) == 4096
    Selector(text, max_length=4096)
    with pytest.raises(SelectorError):
        Selector(text + " ", max_length=4096)
    # the limit counts characters, not bytes or UTF-16 units
    wide = body + "\U0001f600" * (4096 - len(body) - 1) + "'"
    Selector(wide, max_length=4096)
