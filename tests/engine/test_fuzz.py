"""Fuzzing the engine and the broker core together: garbage and mutated client sessions, in random chunks.

Every input goes through ``fuzz_harness.BrokerRun`` (one ``ServerConnection`` wired to a real ``Broker``),
which checks its invariants after every chunk and at end of stream. Three kinds of input:

* arbitrary bytes, alone or after a valid header (and open), so that garbage reaches the frame parser;
* valid client sessions built from the frame factory (header, SASL or not, open, begin, attach both ways,
  flow, transfers of random messages, dispositions, transactions, detach, end, close), fed one frame per
  chunk so that the broker answers between frames as it would for a real client; handles, channels and
  delivery ids are drawn wrong at times;
* the same sessions mutated: frame-level (duplicate, drop, swap, splice frames; rewrite the size,
  data-offset, type or channel field) and byte-level (bit flips, insertions, deletions, truncation), fed
  in random chunk sizes.

Sessions are built by ``fuzz_inputs`` from one drawn byte string (see there why). A failing input is
shrunk and printed with its seed; once fixed, keep it in ``corpus/`` (``test_corpus.py`` replays it).
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minibroker.amqp.framing import AMQP_HEADER, SASL_HEADER
from minibroker.testing import frames
from tests.engine.fuzz_harness import BrokerRun, split, units_of
from tests.engine.fuzz_inputs import ADVANCES, Choices, chunk_sizes, mutate, run, session

FUZZ = settings(max_examples=300, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
OPENED = AMQP_HEADER + frames.frame(0, frames.open_())
SESSION = OPENED + frames.frame(0, frames.begin())

choices = st.binary(max_size=600).map(Choices)
configs = st.fixed_dictionaries(
    {
        "sasl_required": st.booleans(),
        "link_credit": st.sampled_from([100, 1, 2]),
        "prefill": st.sampled_from([3, 0, 40]),
        "idle_time_out": st.sampled_from([None, 10.0]),
    }
)
advances = st.lists(st.sampled_from(ADVANCES), min_size=1, max_size=4)


def _feed(broker: BrokerRun, chunks: list[bytes], advance: list[float]) -> None:
    for n, chunk in enumerate(chunks):
        if chunk:
            broker.feed(chunk, advance[n % len(advance)])
    broker.eof()


@FUZZ
@given(
    prefix=st.sampled_from([b"", AMQP_HEADER, SASL_HEADER, OPENED, SESSION]),
    data=st.binary(max_size=4096),
    sizes=st.lists(st.integers(1, 2048), min_size=1, max_size=8),
    advance=advances,
)
def test_arbitrary_bytes(prefix: bytes, data: bytes, sizes: list[int], advance: list[float]) -> None:
    _feed(BrokerRun(prefill=3), split(prefix + data, sizes), advance)


@FUZZ
@given(c=choices, config=configs, advance=advances)
def test_client_sessions_one_frame_per_chunk(c: Choices, config: dict[str, Any], advance: list[float]) -> None:
    _feed(BrokerRun(**config), session(c), advance)


@FUZZ
@given(c=choices, config=configs, advance=advances, per_frame=st.booleans())
def test_mutated_client_sessions(c: Choices, config: dict[str, Any], advance: list[float], per_frame: bool) -> None:
    stream = mutate(session(c), c)
    chunks = units_of(stream) if per_frame else split(stream, chunk_sizes(c))
    _feed(BrokerRun(**config), chunks, advance)


@FUZZ
@given(c=st.binary(max_size=2000).map(Choices))
def test_everything_from_one_byte_string(c: Choices) -> None:
    # the libFuzzer entry point's case: settings, kind of input, chunking and timing all from the bytes
    run(c)
