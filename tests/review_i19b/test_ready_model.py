"""Model-based probe of ``queue._Ready.first``/``pop_first`` (issue 19), which reach into sortedcontainers 2.4's
internals: against a plain sorted list, with a small load so sublists split and merge, and the positional index
built at random (``bisect_key_right``, ``ready[i]``, as a cursor, a browse or a listing does); sortedcontainers'
own ``_check`` verifies every invariant (``_maxes``, ``_len``, ``_index``) after each step."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.broker.message import Message
from minibroker.broker.queue import _Ready

pytestmark = pytest.mark.timeout(60)

_PAYLOAD = b"\x00\x53\x77\xa1\x01x"

ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 9)),
        st.tuples(st.just("pop"), st.just(0)),
        st.tuples(st.just("pop"), st.just(0)),
        st.tuples(st.just("index"), st.integers(0, 1000)),
        st.tuples(st.just("remove"), st.integers(0, 1000)),
        st.tuples(st.just("back"), st.just(0)),
    ),
    max_size=300,
)


@settings(max_examples=300, deadline=None)
@given(load=st.integers(4, 8), steps=ops)
def test_first_and_pop_first_as_a_sorted_list(load: int, steps: list[tuple[str, int]]) -> None:
    ready = _Ready()
    ready._reset(load)
    model: list[Message] = []
    popped: list[Message] = []
    seq = 0
    for op, arg in steps:
        if op == "add":
            seq += 1
            message = Message(_PAYLOAD)
            message.content.priority = arg
            message.content.place(seq)
            ready.add(message)
            model.append(message)
        elif op == "back" and popped:  # a released message going back to its place
            message = popped.pop()
            ready.add(message)
            model.append(message)
        elif op == "pop" and model:
            message = ready.pop_first()
            assert message is min(model, key=lambda m: m.content.key)
            model.remove(message)
            popped.append(message)
        elif op == "index" and model:
            assert ready[arg % len(model)] is sorted(model, key=lambda m: m.content.key)[arg % len(model)]
            ready.bisect_key_right((0, arg))
        elif op == "remove" and model:
            message = sorted(model, key=lambda m: m.content.key)[arg % len(model)]
            ready.remove(message)
            model.remove(message)
        ready._check()
        expected = min(model, key=lambda m: m.content.key) if model else None
        assert ready.first() is expected
        assert len(ready) == len(model)
