"""Lazy imports (issue 19): the default configuration's process, once its listening line is printed, has loaded
nothing that configuration does not use. The features that need those modules still load them when turned on:
their own tests (tests/servicebus, tests/store, tests/http, tests/capture, tests/test_cli*.py, tests/test_remote.py)
run them through the same entry points."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# The child runs ``minibroker.cli.main`` as ``python -m minibroker`` does and, when the listening line is written,
# first writes every loaded module's name on a line of its own (no import of its own: json would count).
CHILD = """
import sys
real = sys.stdout
class Tap:
    def write(self, text):
        if "listening" in text:  # (a _LazyModule is bound, not loaded: minibroker/broker/lazy.py)
            loaded = [name for name, module in sys.modules.items() if type(module).__name__ != "_LazyModule"]
            real.write("MODULES " + " ".join(sorted(loaded)) + "\\n")
        return real.write(text)
    def flush(self):
        real.flush()
sys.stdout = Tap()
import minibroker.cli
sys.exit(minibroker.cli.main(sys.argv[1:]))
"""

NOT_NEEDED = (
    # the embedding API's parts the command line does not use (minibroker/__init__.py loads them on first use)
    "minibroker.remote",
    "minibroker.testing.thread",
    # other subcommands: the health probe (with the test kit's client core), management commands, replay
    "minibroker.health",
    "minibroker.manage_cli",
    "minibroker.replay",
    "minibroker.testing.client",
    "minibroker.testing.frames",
    "minibroker.testing.peer",
    # the journal: only with a data dir
    "minibroker.store.journal",
    "minibroker.store.crash",
    "minibroker.server.journal",
    "minibroker.store.state",
    "minibroker.broker.recovery",
    # capture and pcap: only with [broker] capture; selectors: only when a link asks for one
    "minibroker.server.capture",
    "minibroker.server.pcap",
    "minibroker.broker.selector",
    # the HTTP management API: only with [http] port
    "minibroker.http",
    "minibroker.http.api",
    "minibroker.http.server",
    "minibroker.http.metrics",
    "minibroker.http.console",
    "h11",
    # the read-only views (message views, counts, connection and exchange infos, their dataclasses): on the first
    # read through a handle or the HTTP API
    "minibroker.broker.views",
    # the Service Bus side of the endpoints ($management, $cbs, event hubs): at the first attach in a namespace of
    # the servicebus personality
    "minibroker.broker.servicebus_links",
    "minibroker.broker.management",
    "minibroker.broker.services",
    "minibroker.broker.eventhubs",
    "minibroker.servicebus.management",
    "minibroker.servicebus.cbs",
    "minibroker.servicebus.eventhubs",
    # Service Bus subscription rules (SQL filters and actions): on the first message published to a Service Bus
    # topic, or the first rule made
    "minibroker.servicebus.rules",
    # the frame printer: only with --trace-frames
    "minibroker.server.trace",
    # AMQP 0-9-1: only when the first 0-9-1 client connects (its wire definitions alone take tens of ms to load)
    "minibroker.server.amqp091",
    "minibroker.gateway091",
    "minibroker.amqp091",
    "minibroker.amqp091.definitions",
    # parsers and clients of files and HTTP: only with a config file, a Service Bus config or `connect`
    "tomllib",
    "json",
    "http.client",
    "urllib.request",
    "email.parser",
    # the password prompt of `minibroker hash-password` (with termios)
    "getpass",
)


def loaded_when_listening(*args: str) -> set[str]:
    """The modules loaded when the process started with ``args`` prints its listening line."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("MINIBROKER_")}
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    ) as proc:
        assert proc.stdout is not None
        try:
            first = proc.stdout.readline()
            assert first.startswith("MODULES "), f"{first!r}; stderr: {proc.stderr.read() if proc.stderr else ''}"
            assert proc.stdout.readline().startswith("minibroker listening on amqp://")
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    return set(first.split()[1:])


@pytest.mark.timeout(60)
def test_the_default_configuration_loads_only_what_it_uses() -> None:
    loaded = loaded_when_listening("--port", "0")
    assert "minibroker.server.app" in loaded  # the child did run the broker
    assert sorted(loaded.intersection(NOT_NEEDED)) == []
