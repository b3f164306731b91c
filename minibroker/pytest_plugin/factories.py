"""Fixture factories: make minibroker fixtures of your own, with your own configuration.

    # conftest.py
    from minibroker.pytest_plugin import factories

    secure_proc = factories.minibroker_proc(config={"auth": {"users": {"app": "secret"}}})
    secure = factories.minibroker("secure_proc")

Settings resolve in this order: the factory's arguments, then the ``--minibroker-*`` command-line options,
then the ``minibroker_*`` ini options, then the defaults (127.0.0.1, any free port).

A personality (``minibroker personalities`` lists them) is chosen per broker (``minibroker_proc(personality=
"strict")``, ``[broker] personality`` of its config), per namespace fixture (``minibroker(personality=...)``), or per
test, by indirect parametrization of a namespace fixture::

    @pytest.mark.parametrize("minibroker", ["minibroker", "strict"], indirect=True)
    def test_both(minibroker): ...  # two tests, each in a namespace of that personality
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import pytest

from minibroker.broker import personality as personalities
from minibroker.config import Config
from minibroker.remote import RemoteBroker, connect
from minibroker.server.app import ConfigLike, RunningBroker, as_config, format_url, serve
from minibroker.testing.thread import ThreadedBroker, run_in_thread

Fixture = Callable[..., Any]
Scope = Literal["session", "package", "module", "class", "function"]


def _setting(request: pytest.FixtureRequest, name: str, given: Any) -> Any:
    """A setting from the factory argument, else --minibroker-NAME, else the minibroker_NAME ini option."""
    if given is not None:
        return given
    option = request.config.getoption(f"minibroker_{name}", default=None)
    if option is not None:
        return option
    ini = request.config.getini(f"minibroker_{name}")
    return ini or None


def _config(
    request: pytest.FixtureRequest,
    config: ConfigLike,
    host: str | None,
    port: int | None,
    personality: str | None = None,
) -> Config:
    cfg = as_config(_setting(request, "config", config))
    host = _setting(request, "host", host) or "127.0.0.1"
    port_setting = _setting(request, "port", port)
    cfg = cfg.replace(server__host=host, server__port=int(port_setting) if port_setting is not None else 0)
    return cfg if personality is None else cfg.replace(broker__personality=personality)


def _known(personality: str | None) -> str | None:
    """``personality`` when it names one (or is None); ``ValueError`` listing the known names otherwise, raised
    where the factory is called (a conftest), not in every test that uses its fixture."""
    if personality is not None:
        personalities.get(personality)
    return personality


def minibroker_proc(
    config: ConfigLike = None,
    *,
    personality: str | None = None,
    host: str | None = None,
    port: int | None = None,
    scope: Scope = "session",
) -> Fixture:
    """A fixture that runs a broker in a background thread (no subprocess) for its scope.

    ``personality`` (a name ``minibroker personalities`` lists) sets ``[broker] personality`` of ``config``: the
    broker's default namespace, and the namespaces created without one, have it.
    """
    personality = _known(personality)

    @pytest.fixture(scope=scope)
    def minibroker_proc_fixture(request: pytest.FixtureRequest) -> Iterator[ThreadedBroker]:
        """A ``ThreadedBroker`` serving from a background thread for the fixture's scope."""
        with run_in_thread(_config(request, config, host, port, personality)) as broker:
            yield broker

    return minibroker_proc_fixture


def minibroker(proc_fixture_name: str = "minibroker_proc", *, personality: str | None = None) -> Fixture:
    """A function-scoped fixture: a fresh namespace of the broker of ``proc_fixture_name`` per test.

    The namespace has its own listener, so its ``url`` needs no client option to select it (a remote broker's
    namespace listener must be reachable too: publish its ports when it runs in a container); it is
    dropped (nodes, messages, transactions, connections) when the test ends, and the fault rules the test added
    (``faults.add``, broker-wide) are removed. Its personality is the one a test
    parametrizes the fixture with indirectly (``@pytest.mark.parametrize("minibroker", ["strict"],
    indirect=True)``), else ``personality``, else the broker's.
    """
    personality = _known(personality)

    @pytest.fixture
    def minibroker_fixture(request: pytest.FixtureRequest) -> Iterator[ThreadedBroker | RemoteBroker]:
        """A fresh namespace of its process fixture's broker, with a ``url`` of its own; dropped after the test.

        Parametrized indirectly with a personality's name, the namespace has that personality."""
        proc: ThreadedBroker | RemoteBroker = request.getfixturevalue(proc_fixture_name)
        chosen: str | None = getattr(request, "param", personality)
        namespace = proc.create_namespace(personality=chosen)
        before = {rule.id for rule in namespace.faults.list()}
        try:
            yield namespace
        finally:
            # fault rules are broker-wide: those the test added go with its namespace, so no other test meets them
            for rule in namespace.faults.list():
                if rule.id not in before:
                    namespace.faults.remove(rule.id)
            namespace.drop_namespace()

    return minibroker_fixture


@dataclass(frozen=True)
class ExternalBroker:
    """A broker this test session did not start (a Docker container in CI, say): its address only."""

    url: str

    @property
    def host(self) -> str:
        return self.url.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def check(self, timeout: float = 1.0) -> None:
        """Raise ``minibroker.health.NotHealthy`` unless the broker answers AMQP open in time."""
        from minibroker.health import check

        check(self.url, timeout)


def _amqp_url(found: str) -> str:
    return found if "://" in found else f"amqp://{found}"


def minibroker_noproc(url: str | None = None, *, http_url: str | None = None, scope: Scope = "session") -> Fixture:
    """A fixture pointing at an already running broker (``--minibroker-url`` or ``minibroker_url``).

    With the URL of its HTTP management API (``http_url``, ``--minibroker-http-url`` or ``minibroker_http_url``)
    it is a ``RemoteBroker`` (``minibroker.connect``): the surface of ``minibroker_proc``'s handle, so
    ``minibroker("minibroker_noproc")`` gives each test a namespace of the remote broker. Its ``url`` is the one
    given, else the one the broker reports.
    """

    @pytest.fixture(scope=scope)
    def minibroker_noproc_fixture(request: pytest.FixtureRequest) -> ExternalBroker | RemoteBroker:
        """An already running broker: a ``RemoteBroker`` when its HTTP API's URL is given (checked to be ready),
        else an ``ExternalBroker``, its address, checked to answer AMQP open."""
        found = _setting(request, "url", url)
        found_http = _setting(request, "http_url", http_url)
        if found_http is not None:
            remote = connect(found_http, url=None if found is None else _amqp_url(found))
            remote.check(timeout=5.0)
            return remote
        if found is None:
            host = _setting(request, "host", None) or "127.0.0.1"
            found = format_url(host, int(_setting(request, "port", None) or 5672))
        broker = ExternalBroker(_amqp_url(found))
        broker.check(timeout=5.0)
        return broker

    return minibroker_noproc_fixture


def minibroker_trio(
    config: ConfigLike = None, *, personality: str | None = None, host: str | None = None, port: int | None = None
) -> Fixture:
    """For trio tests (pytest-trio): a broker in the test's own trio run, fresh for each test.

    ``personality`` sets ``[broker] personality`` of ``config``, as for ``minibroker_proc``.
    """
    personality = _known(personality)

    @pytest.fixture
    async def minibroker_trio_fixture(request: pytest.FixtureRequest) -> AsyncIterator[RunningBroker]:
        """A ``RunningBroker`` in the test's own trio run, fresh for each test."""
        async with serve(_config(request, config, host, port, personality)) as broker:
            yield broker

    return minibroker_trio_fixture


__all__ = ["ExternalBroker", "minibroker", "minibroker_noproc", "minibroker_proc", "minibroker_trio"]
