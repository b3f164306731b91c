"""A suite written against the ``minibroker`` fixture runs unchanged against a running broker through its HTTP
API (``--minibroker-http-url``): run with pytester, once embedded and once remote."""

from __future__ import annotations

import proton  # noqa: F401 -- imported first: pytester restores sys.modules and proton cannot be imported twice
import pytest

from minibroker.testing.thread import run_in_thread

pytest_plugins = ["pytester"]

SUITE = """
import pytest
from proton import Message
from proton.utils import BlockingConnection


def send(url, address, *bodies):
    conn = BlockingConnection(url, timeout=5)
    try:
        sender = conn.create_sender(address)
        for body in bodies:
            sender.send(Message(body=body, properties={"k": body}))
    finally:
        conn.close()


def test_orders_reach_the_queue(minibroker):
    send(minibroker.url, "orders", "first", "second")
    minibroker.wait_for(queue="orders", depth=2, timeout=5)
    assert minibroker.queues == ["orders"]
    assert [(m.body, m.properties) for m in minibroker.queue("orders").peek()] == [
        ("first", {"k": "first"}),
        ("second", {"k": "second"}),
    ]
    assert minibroker.queue("orders").stats().acquired == 0
    assert minibroker.queue("orders").purge() == 2
    assert minibroker.transactions == []


def test_each_test_has_a_fresh_namespace(minibroker):
    assert minibroker.queue("orders").depth == 0
    assert minibroker.queues == []
    with pytest.raises(TimeoutError):
        minibroker.wait_for(queue="orders", depth=1, timeout=0.2)
"""

REMOTE_CONFTEST = """
from minibroker.pytest_plugin import factories

minibroker = factories.minibroker("minibroker_noproc")
"""


def test_the_same_suite_runs_embedded_and_against_a_running_broker(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    pytester.runpytest("-p", "no:benchmark", "-p", "no:cacheprovider").assert_outcomes(passed=2)

    pytester.makeconftest(REMOTE_CONFTEST)
    with run_in_thread({"server": {"port": 0}, "http": {"port": 0}}) as broker:
        assert broker.http_url is not None
        result = pytester.runpytest(
            "-p", "no:benchmark", "-p", "no:cacheprovider", "--minibroker-http-url", broker.http_url
        )
        result.assert_outcomes(passed=2)
        assert broker.running.broker.namespaces.keys() == {"default"}  # each test's namespace was dropped


def test_noproc_with_an_http_url_is_the_remote_handle(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_remote="""
from minibroker.remote import RemoteBroker


def test_remote(minibroker_noproc):
    assert isinstance(minibroker_noproc, RemoteBroker)
    assert minibroker_noproc.url == "amqp://127.0.0.9:1234"   # the one given beats the broker's own
    assert minibroker_noproc.queues == []
"""
    )
    with run_in_thread({"server": {"port": 0}, "http": {"port": 0}}) as broker:
        assert broker.http_url is not None
        result = pytester.runpytest(
            "-p",
            "no:benchmark",
            "-p",
            "no:cacheprovider",
            "--minibroker-http-url",
            broker.http_url,
            "--minibroker-url",
            "127.0.0.9:1234",
        )
        result.assert_outcomes(passed=1)


def test_noproc_fails_clearly_without_an_http_api(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_remote="def test_remote(minibroker_noproc):\n    pass\n")
    result = pytester.runpytest(
        "-p", "no:benchmark", "-p", "no:cacheprovider", "--minibroker-http-url", "http://127.0.0.1:1"
    )
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*BrokerUnreachable*cannot reach the broker's HTTP API at http://127.0.0.1:1*"])
