"""The README's virtual-time example runs as written (issue 16 §2)."""

from __future__ import annotations

import time

import pytest

from tests.test_readme_examples import python_block


@pytest.mark.timeout(30)
def test_the_virtual_time_example_runs_in_well_under_a_second_per_day() -> None:
    code = python_block("### Virtual time")
    started = time.monotonic()
    exec(compile(code, "README.md (virtual time)", "exec"), {})  # every assert in it must hold
    assert time.monotonic() - started < 5.0  # a day of ttl, a broker start and stop, one connection
