"""The ``minibroker`` fixture and fault injection (issue 16 §1): rules are broker-wide, so those a test adds are
removed with its namespace and never reach the next test on the shared session broker."""

from __future__ import annotations

import proton  # noqa: F401 -- imported first: pytester restores sys.modules and proton cannot be imported twice
import pytest

pytest_plugins = ["pytester"]

SUITE = """
def test_adds_a_rule(minibroker):
    minibroker.faults.add("transfer", "reject", times=0)
    assert len(minibroker.faults.list()) == 1


def test_meets_no_rule_of_another_test(minibroker, minibroker_proc):
    assert minibroker.faults.list() == []
    assert minibroker_proc.faults.list() == []
"""


def test_a_tests_rules_go_with_its_namespace(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest("-p", "no:benchmark", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
