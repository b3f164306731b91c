"""Shared fixtures: a real broker on an ephemeral port, served from a background thread."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from minibroker.testing.thread import ThreadedBroker, run_in_thread


@pytest.fixture
def broker() -> Iterator[ThreadedBroker]:
    """A fresh broker on 127.0.0.1 and a free port, for synchronous clients such as proton's."""
    with run_in_thread({"server": {"port": 0}}) as running:
        yield running


@pytest.fixture
def broker_address(broker: ThreadedBroker) -> str:
    """``127.0.0.1:PORT`` of the ``broker`` fixture, as python-qpid-proton takes it."""
    return f"127.0.0.1:{broker.port}"
