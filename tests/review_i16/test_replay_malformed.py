"""Review of issue 16 §3: ``minibroker replay`` of malformed captures exits 2 with a message, never a traceback
(an uncaught exception exits 1, the code of "the broker answered differently") and never hangs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from minibroker.amqp.definitions import Open
from minibroker.amqp.framing import AMQP_HEADER, encode_frame
from minibroker.testing.thread import ThreadedBroker, run_in_thread

ROOT = Path(__file__).parents[2]


def replay(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "minibroker", "replay", *args], capture_output=True, text=True, env=env, timeout=60
    )


@pytest.fixture(scope="module")
def target() -> Iterator[ThreadedBroker]:
    with run_in_thread({"server": {"port": 0}}) as broker:
        yield broker


def frame(direction: str, raw: bytes | str) -> dict[str, Any]:
    return {"direction": direction, "raw": raw if isinstance(raw, str) else raw.hex()}


OPEN = encode_frame(0, Open(container_id="c"))
CASES: dict[str, Any] = {
    "frames-not-a-list": {"frames": {"a": 1}},
    "frame-not-an-object": {"frames": [1, 2]},
    "raw-not-hex": {"frames": [frame("in", "zz")]},
    "raw-odd": {"frames": [frame("in", "abc")]},
    "raw-missing": {"frames": [{"direction": "in"}]},
    "raw-number": {"frames": [{"direction": "in", "raw": 12}]},
    "direction-missing": {"frames": [{"raw": AMQP_HEADER.hex()}]},
    "bogus-frame-size": {"frames": [frame("in", AMQP_HEADER), frame("in", b"\xff\xff\xff\xff\x02\x00\x00\x00")]},
    "garbage-performative": {
        "frames": [frame("in", AMQP_HEADER), frame("in", b"\x00\x00\x00\x0c\x02\x00\x00\x00\x00S\x10\xff")]
    },
    "only-broker-frames": {"frames": [frame("out", AMQP_HEADER), frame("out", OPEN)]},
    "top-level-string": "hello",
    "nested-deep": {"frames": [[[[[[]]]]]]},
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_malformed_capture_is_a_clean_exit(target: ThreadedBroker, tmp_path: Path, name: str) -> None:
    """Each malformed capture: exit 0, 1 or 2 by decision, with no Python traceback on stderr."""
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(CASES[name]))
    result = replay(str(path), "--url", target.url)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode in (0, 1, 2), result.stdout + result.stderr
    if result.returncode == 1:
        assert "answered differently" in result.stdout, result.stdout
