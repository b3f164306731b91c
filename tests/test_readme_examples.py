"""The README's Python examples run as written: a user copying one gets what the README says."""

from __future__ import annotations

import re
from pathlib import Path

import proton  # noqa: F401 -- imported first: pytester restores sys.modules and proton cannot be imported twice
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"

pytest_plugins = ["pytester"]


def python_block(heading: str) -> str:
    """The first ```python block under the README heading ``heading``."""
    text = README.read_text()
    start = text.index(heading)
    found = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert found is not None, f"no python example under {heading!r}"
    return found.group(1)


@pytest.mark.timeout(30)
def test_the_scripted_peer_example_runs() -> None:
    code = python_block("### Frame by frame: the scripted peer and the client core")
    exec(compile(code, "README.md (scripted peer)", "exec"), {})  # every assert in it must hold


@pytest.mark.timeout(30)
def test_the_local_or_remote_example_runs() -> None:
    code = python_block("### A running broker, local or remote")
    exec(compile(code, "README.md (local or remote)", "exec"), {})  # every assert in it must hold


@pytest.mark.timeout(60)
def test_the_personalities_example_runs(pytester: pytest.Pytester) -> None:
    """The example under "Broker personalities" is a test file a user can copy: run as one (pytester, the plugin's
    ``minibroker`` fixture parametrized indirectly), it passes once for each of the three personalities."""
    pytester.makepyfile(test_personalities_example=python_block("## Broker personalities"))
    # (no pytest-benchmark inside: under xdist it warns, and warnings are errors)
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:benchmark", "-v")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(
        [f"*test_release_inside_a_transaction?{name}? PASSED*" for name in ("minibroker", "artemis", "broker-j")]
    )


@pytest.mark.timeout(60)
def test_the_amqp091_example_runs(pytester: pytest.Pytester) -> None:
    """The example under "AMQP 0-9-1" is a test file a user can copy: pika through the ``amqp091_url`` fixture."""
    pytester.makepyfile(test_amqp091_example=python_block("## AMQP 0-9-1"))
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:benchmark", "-v")
    result.assert_outcomes(passed=1)
