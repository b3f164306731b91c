"""The pytest plugin, exercised the way users use it: a test suite using the fixtures, run with pytester
inside our own suite."""

from __future__ import annotations

import proton  # noqa: F401 -- imported first: pytester restores sys.modules and proton cannot be imported twice
import pytest

pytest_plugins = ["pytester"]

EXAMPLE = """
from proton import Message
from proton.utils import BlockingConnection


def send(url, address, *bodies):
    conn = BlockingConnection(url, timeout=5)
    try:
        sender = conn.create_sender(address)
        for body in bodies:
            sender.send(Message(body=body))
    finally:
        conn.close()


def test_orders_reach_the_queue(minibroker):
    send(minibroker.url, "orders", "first", "second")
    assert minibroker.queue("orders").depth == 2
    assert [m.body for m in minibroker.queue("orders").peek()] == ["first", "second"]


def test_each_test_has_a_fresh_namespace(minibroker):
    assert minibroker.queue("orders").depth == 0
    assert minibroker.queues == []


def test_session_broker_is_shared(minibroker_proc, minibroker):
    assert minibroker_proc.port != minibroker.port
    send(minibroker_proc.url, "shared", "x")
    assert minibroker_proc.queue("shared").depth == 1
    assert minibroker.queue("shared").depth == 0
"""


def test_fixtures_in_a_user_suite(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_example=EXAMPLE)
    result = pytester.runpytest("-p", "no:benchmark", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)


def test_factories_with_own_config(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
from minibroker.pytest_plugin import factories

strict_proc = factories.minibroker_proc(config={"broker": {"auto_create": False}, "queues": {"known": {}}})
strict = factories.minibroker("strict_proc")
"""
    )
    pytester.makepyfile(
        test_strict="""
import pytest
from proton import Message
from proton.utils import BlockingConnection, LinkDetached


def test_unknown_address_is_refused(strict_proc):
    conn = BlockingConnection(strict_proc.url, timeout=5)
    try:
        with pytest.raises(LinkDetached, match="amqp:not-found"):
            conn.create_sender("unknown")
        conn.create_sender("known").send(Message(body=1))
    finally:
        conn.close()
    assert strict_proc.queue("known").depth == 1
"""
    )
    result = pytester.runpytest("-p", "no:benchmark", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_settings_resolve_argument_then_option_then_ini(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nminibroker_host = 127.0.0.2\nminibroker_config = absent.toml\n")
    pytester.makepyfile(
        test_settings="""
def test_host(minibroker_proc):
    assert minibroker_proc.host == "127.0.0.1"   # the command line beats the ini file
""",
    )
    # the ini names a config file that does not exist: the command line's --minibroker-config must win
    pytester.makefile(".toml", good="[broker]\nlink_credit = 10\n")
    result = pytester.runpytest(
        "-p",
        "no:benchmark",
        "-p",
        "no:cacheprovider",
        "--minibroker-host",
        "127.0.0.1",
        "--minibroker-config",
        "good.toml",
    )
    result.assert_outcomes(passed=1)


def test_ini_option_is_used(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", bad="[broker]\nbogus = 1\n")
    pytester.makeini("[pytest]\nminibroker_config = bad.toml\n")
    pytester.makepyfile(test_x="def test_x(minibroker_proc):\n    pass\n")
    result = pytester.runpytest("-p", "no:benchmark", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*bad.toml: broker.bogus: unknown key*"])


def test_noproc_points_at_a_running_broker(pytester: pytest.Pytester) -> None:
    from minibroker.testing.thread import run_in_thread

    pytester.makepyfile(
        test_remote="""
from proton import Message
from proton.utils import BlockingConnection


def test_remote(minibroker_noproc):
    conn = BlockingConnection(minibroker_noproc.url, timeout=5)
    conn.create_sender("remote").send(Message(body="hi"))
    conn.close()
"""
    )
    with run_in_thread({"server": {"port": 0}}) as broker:
        result = pytester.runpytest("-p", "no:benchmark", "-p", "no:cacheprovider", "--minibroker-url", broker.url)
        result.assert_outcomes(passed=1)
        assert broker.queue("remote").depth == 1


def test_noproc_fails_clearly_without_a_broker(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_remote="def test_remote(minibroker_noproc):\n    pass\n")
    result = pytester.runpytest(
        "-p", "no:benchmark", "-p", "no:cacheprovider", "--minibroker-url", "amqp://127.0.0.1:1"
    )
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*NotHealthy*cannot connect to 127.0.0.1:1*"])


def test_trio_fixture(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ntrio_mode = true\n")
    pytester.makepyfile(
        test_trio="""
import trio


async def test_broker_in_the_test_run(minibroker_trio):
    assert minibroker_trio.url.startswith("amqp://127.0.0.1:")
    stream = await trio.open_tcp_stream("127.0.0.1", minibroker_trio.port)
    await stream.send_all(b"AMQP\\x00\\x01\\x00\\x00")
    assert await stream.receive_some(8) == b"AMQP\\x00\\x01\\x00\\x00"
    await stream.aclose()
    assert minibroker_trio.queues == []
"""
    )
    result = pytester.runpytest("-p", "no:benchmark", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_safe_under_xdist(pytester: pytest.Pytester) -> None:
    """Each xdist worker gets its own session broker on its own free port: no collisions, no sharing."""
    pytester.makepyfile(test_example=EXAMPLE)
    pytester.makepyfile(
        test_more="\n".join(
            f"def test_isolated_{i}(minibroker):\n    assert minibroker.queues == []\n" for i in range(8)
        )
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2")
    result.assert_outcomes(passed=11)
