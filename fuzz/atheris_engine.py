"""libFuzzer entry point (atheris) over the engine + broker harness of ``tests/engine``.

Each input is a byte string of choices (``tests/engine/fuzz_inputs.py``): broker settings, the kind of
input (a valid client session fed frame by frame, a mutated one in random reads, or raw garbage after a
valid prefix), its chunking and the time between reads. ``fuzz_harness.BrokerRun`` checks its invariants
after every read and at end of stream; a broken invariant or any exception is a crash to libFuzzer.

Not part of the test run, nor of the ``test`` extra. To run it (atheris ships wheels for CPython on
Linux x86-64; elsewhere it needs clang to build)::

    pip install atheris
    mkdir -p fuzz/work
    python fuzz/atheris_engine.py fuzz/work tests/engine/corpus -max_len=4096 -timeout=10
    python fuzz/atheris_engine.py -runs=20000 -max_len=4096        # a bounded run, e.g. in CI

The corpus files are raw byte streams, not choice strings, but they are still good seeds (libFuzzer
mutates from them; a choice string starting with them decodes into other inputs). New interesting inputs
go to ``fuzz/work``. To reproduce a crash::

    python fuzz/atheris_engine.py crash-<sha1>

then turn it into a regression test: decode it with ``fuzz_inputs.run(Choices(data))`` under a debugger,
reduce it to the byte stream it fed, and add that to ``tests/engine/corpus/make.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root, for ``tests``

with atheris.instrument_imports(include=["minibroker", "tests.engine"]):
    from tests.engine.fuzz_inputs import Choices, run


def test_one_input(data: bytes) -> None:
    run(Choices(data))


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
