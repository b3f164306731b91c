"""``minibroker_trio`` under trio's ``MockClock(autojump_threshold=0)`` (issue 16 §2), run as a user runs it: a test
file with pytester. On the real clock the broker's timers run on the mock clock (a 1-hour ttl passes when trio's
clock jumps an hour); on the virtual clock they wait for ``broker.clock.advance``, whatever trio's clock does. A
real AMQP connection over TCP is served meanwhile."""

from __future__ import annotations

import proton  # noqa: F401 -- imported first: pytester restores sys.modules and proton cannot be imported twice
import pytest

pytest_plugins = ["pytester"]

CONFTEST = """
from minibroker.pytest_plugin import factories

virtual_broker = factories.minibroker_trio(config={"broker": {"clock": "virtual"}})
"""

TESTS = """
import trio
from trio.testing import MockClock

from minibroker.amqp.definitions import Begin, Header
from minibroker.amqp.types import UInt
from minibroker.testing import frames
from minibroker.testing.memory import MemoryPeer

HOUR = 3600.0


def perishable():
    return frames.message("perishable", Header(ttl=UInt(int(HOUR * 1000))))


async def amqp_session(broker):
    peer = MemoryPeer(await trio.open_tcp_stream("127.0.0.1", broker.port), timeout=10 * HOUR)
    await peer.open()
    assert isinstance(await peer.begin(), Begin)
    return peer


async def test_real_clock_runs_on_the_mock_clock(minibroker_trio, autojump_clock: MockClock):
    assert isinstance(trio.lowlevel.current_clock(), MockClock)
    assert minibroker_trio.clock.mode == "real"
    peer = await amqp_session(minibroker_trio)
    minibroker_trio.post("orders", perishable())
    await trio.sleep(HOUR - 1)
    assert minibroker_trio.queue("orders").depth == 1
    await trio.sleep(1)
    await trio.testing.wait_all_tasks_blocked()
    assert minibroker_trio.queue("orders").depth == 0
    await peer.close()
    await peer.aclose()


async def test_virtual_clock_ignores_the_mock_clock(virtual_broker, autojump_clock: MockClock):
    assert virtual_broker.clock.mode == "virtual"
    peer = await amqp_session(virtual_broker)
    virtual_broker.post("orders", perishable())
    now = virtual_broker.clock.now
    await trio.sleep(10 * HOUR)
    assert virtual_broker.clock.now == now
    assert virtual_broker.queue("orders").depth == 1
    virtual_broker.clock.advance(HOUR)
    assert virtual_broker.queue("orders").depth == 0
    await peer.close()
    await peer.aclose()
"""


def test_minibroker_trio_works_under_an_autojump_mock_clock(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ntrio_mode = true\n")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_clock=TESTS)
    result = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:benchmark")
    result.assert_outcomes(passed=2)
