"""The regression corpus: every input in ``corpus/*.bin`` through the fuzz harness, in several chunkings.

A corpus file is a client's byte stream as it would arrive on the socket: hand-made tricky inputs
(``corpus/make.py`` writes them and says what each is) and every input the fuzzer found a bug with. Each
is replayed whole in one read, one frame per read (so the broker answers between frames, as it does for
a client that waits for credit), in 13-byte reads, and one frame per read with 45 s between reads (past
the close grace, the handshake and transaction time-outs); each against the harness's small
max-frame-size and the engine's default one, with ``fuzz_harness``'s invariants checked all along.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.fuzz_harness import MAX_FRAME_SIZE, BrokerRun, split, units_of

CORPUS = Path(__file__).parent / "corpus"
FILES = sorted(CORPUS.glob("*.bin"))
CHUNKINGS = {
    "whole": (lambda data: [data], 0.0),
    "per-frame": (units_of, 0.0),
    "13-bytes": (lambda data: split(data, [13]), 0.0),
    "per-frame-slowly": (units_of, 45.0),
}


def test_the_corpus_is_there_and_small() -> None:
    assert len(FILES) >= 30
    assert all(path.stat().st_size < 64 * 1024 for path in FILES)


@pytest.mark.parametrize("path", FILES, ids=[path.stem for path in FILES])
@pytest.mark.parametrize("max_frame_size", [MAX_FRAME_SIZE, 65536])
def test_corpus_input(path: Path, max_frame_size: int) -> None:
    data = path.read_bytes()
    for name, (cut, advance) in CHUNKINGS.items():
        run = BrokerRun(prefill=3, max_frame_size=max_frame_size)
        for chunk in cut(data):
            run.feed(chunk, advance)
        run.eof()
        assert run.conn.finished, name
