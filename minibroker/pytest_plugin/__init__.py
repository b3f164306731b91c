"""pytest plugin (installed with the package, entry point ``pytest11``): brokers as fixtures.

Fixtures:

- ``minibroker_proc`` (session): a broker in a background thread on a free port; no subprocess, no JVM.
- ``minibroker`` (function): a fresh, isolated namespace of that broker for each test; ``.url`` connects
  into it, ``.queue(name)``, ``.transactions``, ``.wait_for(...)`` inspect it; dropped after the test.
- ``minibroker_noproc`` (session): an already running broker, by ``--minibroker-url`` (CI containers).
- ``minibroker_trio`` (function, pytest-trio): a broker in the test's own trio run.

Options (command line, then ini): ``--minibroker-host`` / ``minibroker_host``, ``--minibroker-port`` /
``minibroker_port`` (default: any free port, which keeps pytest-xdist workers apart),
``--minibroker-config`` / ``minibroker_config`` (a TOML file), ``--minibroker-url`` / ``minibroker_url``.
``factories`` makes more fixtures with configurations of your own.
"""

from __future__ import annotations

import pytest

from minibroker.pytest_plugin import factories

__all__ = ["factories"]

_OPTIONS = {
    "host": "address the session broker listens on (default 127.0.0.1)",
    "port": "port of the session broker (default: any free port)",
    "config": "TOML configuration file for the session broker",
    "url": "URL of an already running broker, for minibroker_noproc",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("minibroker", "minibroker AMQP 1.0 broker fixtures")
    for name, help_text in _OPTIONS.items():
        group.addoption(f"--minibroker-{name}", dest=f"minibroker_{name}", default=None, help=help_text)
        parser.addini(f"minibroker_{name}", help_text, default=None)


minibroker_proc = factories.minibroker_proc()
minibroker = factories.minibroker()
minibroker_noproc = factories.minibroker_noproc()
minibroker_trio = factories.minibroker_trio()
