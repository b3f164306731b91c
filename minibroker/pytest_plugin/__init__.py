"""pytest plugin (installed with the package, entry point ``pytest11``): brokers as fixtures.

Fixtures:

- ``minibroker_proc`` (session): a broker in a background thread on a free port; no subprocess, no JVM.
- ``minibroker`` (function): a fresh, isolated namespace of that broker for each test; ``.url`` connects
  into it, ``.queue(name)``, ``.transactions``, ``.wait_for(...)`` inspect it; dropped after the test.
  ``@pytest.mark.parametrize("minibroker", ["minibroker", "strict"], indirect=True)`` runs a test once per
  personality named, each in a namespace of that personality.
- ``minibroker_noproc`` (session): an already running broker, by ``--minibroker-url`` (CI containers); with
  ``--minibroker-http-url`` (its HTTP management API, ``http://[USER:PASSWORD@]HOST:PORT``), a handle with the
  surface of ``minibroker_proc``'s (``minibroker.connect``), so ``factories.minibroker("minibroker_noproc")``
  runs a suite written against ``minibroker`` unchanged against the container.
- ``minibroker_trio`` (function, pytest-trio): a broker in the test's own trio run.
- ``amqp091_url`` (function): ``amqp://guest:guest@HOST:PORT/``, the ``minibroker`` fixture's namespace for AMQP
  0-9-1 clients (pika, aio-pika, amqplib): the same port, the same queues.

Options (command line, then ini): ``--minibroker-host`` / ``minibroker_host``, ``--minibroker-port`` /
``minibroker_port`` (default: any free port, which keeps pytest-xdist workers apart),
``--minibroker-config`` / ``minibroker_config`` (a TOML file), ``--minibroker-url`` / ``minibroker_url``,
``--minibroker-http-url`` / ``minibroker_http_url``.
``factories`` makes more fixtures with configurations of your own.
"""

from __future__ import annotations

import pytest

from minibroker.pytest_plugin import factories
from minibroker.remote import RemoteBroker
from minibroker.testing.thread import ThreadedBroker

__all__ = ["factories"]

_OPTIONS = {
    "host": "address the session broker listens on (default 127.0.0.1)",
    "port": "port of the session broker (default: any free port)",
    "config": "TOML configuration file for the session broker",
    "url": "URL of an already running broker, for minibroker_noproc",
    "http_url": "URL of an already running broker's HTTP management API: minibroker_noproc is then a full handle",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("minibroker", "minibroker AMQP 1.0 broker fixtures")
    for name, help_text in _OPTIONS.items():
        option = name.replace("_", "-")
        group.addoption(f"--minibroker-{option}", dest=f"minibroker_{name}", default=None, help=help_text)
        parser.addini(f"minibroker_{name}", help_text, default=None)


minibroker_proc = factories.minibroker_proc()
minibroker = factories.minibroker()
minibroker_noproc = factories.minibroker_noproc()
minibroker_trio = factories.minibroker_trio()


@pytest.fixture
def amqp091_url(minibroker: ThreadedBroker | RemoteBroker) -> str:
    """``amqp://guest:guest@HOST:PORT/``: the test's namespace (``minibroker``) for AMQP 0-9-1 clients."""
    return minibroker.amqp091_url
