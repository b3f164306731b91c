"""``Message.size``: a field (issue 19: read per post and per delivery), always the length of the bytes the record's
content holds, through every way a record gets its content: made, shared with a copy (``sharing``, ``copy``), given
bytes of its own (``annotate``, with merged annotations or with bytes made for another copy)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.amqp import codec
from minibroker.amqp.definitions import AmqpValue, Header, MessageAnnotations
from minibroker.amqp.types import Symbol, UInt
from minibroker.broker.message import Message

steps = st.lists(
    st.one_of(
        st.tuples(st.just("copy"), st.integers(0, 8)),
        st.tuples(st.just("annotate"), st.integers(0, 8), st.text(max_size=40)),
        st.tuples(st.just("annotate-shared"), st.integers(0, 8), st.integers(0, 8)),
        st.tuples(st.just("count"), st.integers(0, 8)),
    ),
    max_size=25,
)


@settings(max_examples=200, deadline=None)
@given(st.booleans(), st.text(max_size=60), steps)
def test_size_is_the_length_of_the_content_s_bytes(header: bool, body: str, program: list[tuple]) -> None:
    sections = [Header(delivery_count=UInt(2))] if header else []
    sections += [MessageAnnotations({Symbol("x-a"): "a"}), AmqpValue(body)]
    records = [Message(b"".join(codec.encode(section) for section in sections))]
    for step in program:
        record = records[step[1] % len(records)]
        if step[0] == "copy":
            records.append(record.copy())
        elif step[0] == "annotate":
            record.annotate({"x-opt-why": step[2]})
        elif step[0] == "annotate-shared":  # the bytes another record was given, shared
            record.annotate({}, records[step[2] % len(records)].payload)
        else:
            record.delivery_count += 1  # (a redelivery: its bytes are rebuilt on the way out, not kept)
        for each in records:
            assert each.size == len(each.payload) == len(each.content.payload)
