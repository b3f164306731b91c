"""A queue's ready messages against a reference sort (``queue.py``'s docstring: higher priority first, FIFO within a
priority, a released message back at its old place).

Hypothesis drives random puts (any priority, rising sequence, as the dispatcher places them), takes (the first, or
any ready message, as a selector's consumer does), releases of taken messages and removals (expiry), on a queue whose
sorted list has a tiny load factor, so sublists split, and with positional reads between, so sortedcontainers' index
is built and must be kept: the ready list must always equal the reference, ``sorted(messages, key=(-priority,
seq))``, and pass sortedcontainers' own invariant check (``_check``). This guards the in-order append fast path of
``queue._Ready.add`` and the head taken by ``_Ready.pop_first`` (``acquire_first``) and read by ``_Ready.first``
(issue 19).
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from minibroker.broker.message import Message
from minibroker.broker.queue import Queue

BODY = b"\x00\x53\x77\xa1\x01x"  # an amqp-value "x": no header, the default priority

operations = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(0, 9), st.integers(1, 12)),  # a priority, how many in a row
        st.tuples(st.just("take_first"), st.just(0), st.just(0)),
        st.tuples(st.just("take_any"), st.integers(0, 1 << 16), st.just(0)),
        st.tuples(st.just("release"), st.integers(0, 1 << 16), st.just(0)),
        st.tuples(st.just("remove"), st.integers(0, 1 << 16), st.just(0)),
        st.tuples(st.just("index"), st.integers(0, 1 << 16), st.just(0)),
    ),
    max_size=120,
)


def _reference(messages: list[Message]) -> list[Message]:
    return sorted(messages, key=lambda message: (-message.priority, message.seq))


@settings(max_examples=300, deadline=None)
@given(operations, st.sampled_from([4, 5, 8]), st.booleans())
# an in-order put right after the index is built over two sublists (the fast path must not leave it stale)
@example([("put", 4, 12), ("put", 4, 6), ("index", 3, 0), ("put", 4, 1)], 4, True)
def test_ready_order_matches_a_reference_sort(
    steps: list[tuple[str, int, int]], load: int, default_priorities: bool
) -> None:
    queue = Queue("q")
    queue.ready._reset(load)  # small sublists: splits and index upkeep happen within a few messages
    ready: list[Message] = []  # the reference: what should be ready, in any order
    taken: list[Message] = []
    seq = 0
    for op, value, count in steps:
        if op == "put":
            for _ in range(count):
                seq += 1
                message = Message(BODY)
                if not default_priorities:
                    message.content.priority = value
                message.content.place(seq)
                queue.put(message)
                ready.append(message)
        elif op == "take_first" and ready:
            message = queue.acquire_first()
            assert message is _reference(ready)[0]
            ready.remove(message)
            taken.append(message)
        elif op == "take_any" and ready:
            message = ready.pop(value % len(ready))
            queue.acquire(message)
            taken.append(message)
        elif op == "release" and taken:
            message = taken.pop(value % len(taken))
            queue.requeue(message)
            ready.append(message)
        elif op == "remove" and ready:
            message = ready.pop(value % len(ready))
            assert queue.remove_ready(message)
        elif op == "index" and ready:
            for position in (value % len(ready), len(ready) - 1):
                expected = _reference(ready)[position]
                assert queue.ready[position] is expected
                assert queue.ready.index(expected) == position  # (builds sortedcontainers' positional index)
        queue.ready._check()
        assert list(queue.ready) == _reference(ready)
        assert queue.ready.first() is (_reference(ready)[0] if ready else None)  # the head, as dispatch reads it
        assert queue.acquired == len(taken)


def test_in_order_puts_over_many_sublists_keep_their_order() -> None:
    """Thousands of in-order arrivals (the fast path) fill sublists past the load factor, then a higher priority
    and a release go ahead of them."""
    queue = Queue("q")
    messages = []
    for seq in range(1, 5001):
        message = Message(BODY, seq)
        queue.put(message)
        messages.append(message)
    queue.ready._check()
    assert list(queue.ready) == messages
    first = queue.acquire_first()
    urgent = Message(BODY)
    urgent.content.priority = 9
    urgent.content.place(5001)
    queue.put(urgent)
    queue.requeue(first)
    queue.ready._check()
    assert list(queue.ready) == [urgent, *messages]


def test_taking_every_head_of_a_deep_queue_keeps_the_list_sound() -> None:
    """Heads taken one by one from thousands of ready messages over several sublists (``pop_first``: its own
    step while the first sublist stays more than half full, ``pop(0)`` when it must merge): arrival order, and
    sortedcontainers' invariants, at every sublist boundary."""
    queue = Queue("q")
    messages = [Message(BODY, seq) for seq in range(1, 4501)]
    for message in messages:
        queue.put(message)
    for i, expected in enumerate(messages):
        assert queue.ready.first() is expected
        assert queue.acquire_first() is expected
        if i % 250 == 0:
            queue.ready._check()
    assert queue.ready.first() is None
    assert len(queue.ready) == 0
    assert queue.acquired == len(messages)
