"""Choosing personalities through the pytest plugin: per test by indirect parametrization of the ``minibroker``
fixture, per fixture with the factories' ``personality``; run with pytester as a user's suite would be."""

from __future__ import annotations

import proton  # noqa: F401 -- imported first: pytester restores sys.modules and proton cannot be imported twice
import pytest

from minibroker.broker.personality import names

pytest_plugins = ["pytester"]

PARAMETRIZED = """
import pytest

SEEN = []


def personality_of(proc, namespace):
    return proc.call(lambda running: running.broker.namespaces[namespace].personality.name)


@pytest.mark.parametrize("minibroker", ["minibroker", "strict", "strict"], indirect=True)
def test_each_gets_a_namespace_of_its_personality(request, minibroker_proc, minibroker):
    expected = request.node.callspec.params["minibroker"]
    assert minibroker.personality == expected
    assert personality_of(minibroker_proc, minibroker.namespace_name) == expected
    assert minibroker.namespace_name != minibroker_proc.namespace_name
    SEEN.append((minibroker.namespace_name, expected))


def test_three_namespaces_of_the_named_personalities_were_made_and_dropped(minibroker_proc):
    assert [personality for _, personality in SEEN] == ["minibroker", "strict", "strict"]
    assert len({namespace for namespace, _ in SEEN}) == 3
    present = minibroker_proc.call(lambda running: set(running.broker.namespaces))
    assert present.isdisjoint(namespace for namespace, _ in SEEN)
    assert minibroker_proc.personality == "minibroker"


def test_unparametrized_gets_the_brokers(minibroker):
    assert minibroker.personality == "minibroker"
"""


def test_indirect_parametrization_gives_each_test_a_namespace_of_that_personality(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_personalities=PARAMETRIZED)
    result = pytester.runpytest("-p", "no:benchmark", "-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines(
        [
            "*test_each_gets_a_namespace_of_its_personality?minibroker*? PASSED*",
            "*test_each_gets_a_namespace_of_its_personality?strict*? PASSED*",
            "*test_each_gets_a_namespace_of_its_personality?strict*? PASSED*",
        ]
    )


def test_every_known_personality_can_be_parametrized(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_all="""
import pytest

from minibroker.broker.personality import names


@pytest.mark.parametrize("minibroker", names(), indirect=True)
def test_named(request, minibroker):
    assert minibroker.personality == request.node.callspec.params["minibroker"]
"""
    )
    result = pytester.runpytest("-p", "no:benchmark", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=len(names()))


def test_factories_take_a_personality(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ntrio_mode = true\n")
    pytester.makeconftest(
        """
from minibroker.pytest_plugin import factories

strict_proc = factories.minibroker_proc(personality="strict", scope="module")
strict_ns = factories.minibroker("strict_proc")
plain_ns = factories.minibroker("strict_proc", personality="minibroker")
strict_trio = factories.minibroker_trio(personality="strict")
"""
    )
    pytester.makepyfile(
        test_factories="""
import pytest


def test_the_proc_and_its_namespaces(strict_proc, strict_ns, plain_ns):
    assert strict_proc.personality == "strict"
    assert strict_ns.personality == "strict"
    assert plain_ns.personality == "minibroker"


@pytest.mark.parametrize("plain_ns", ["strict"], indirect=True)
def test_the_parameter_beats_the_factory(plain_ns):
    assert plain_ns.personality == "strict"


async def test_trio(strict_trio):
    assert strict_trio.personality == "strict"
    assert strict_trio.broker.default.personality.name == "strict"
"""
    )
    result = pytester.runpytest("-p", "no:benchmark", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)


def test_an_unknown_personality_fails_where_the_factory_is_called(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        'from minibroker.pytest_plugin import factories\n\nodd = factories.minibroker(personality="nobody")\n'
    )
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest("-p", "no:benchmark", "-p", "no:cacheprovider")
    assert result.ret != 0
    result.stderr.fnmatch_lines([f"*unknown personality 'nobody'; known: {', '.join(names())}*"])
