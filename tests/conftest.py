"""Shared fixtures: a real broker on an ephemeral port, served from a background thread."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from minibroker.engine.connection import ServerConnection
from minibroker.engine.endpoints import IncomingDelivery, Link, OutgoingDelivery, Session
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


_ENGINE_RECORDS = (ServerConnection, Session, Link, IncomingDelivery, OutgoingDelivery)


def _refuse_broker_writes(original: Callable[[Any, str, Any], None]) -> Callable[[Any, str, Any], None]:
    def __setattr__(self: Any, name: str, value: Any) -> None:
        caller = str(sys._getframe(1).f_globals.get("__name__", ""))
        if caller.startswith("minibroker.broker."):
            raise AssertionError(
                f"{caller} assigns {type(self).__name__}.{name}: the broker core asks the engine through its "
                "commands and never writes the engine's fields"
            )
        original(self, name, value)

    return __setattr__


@pytest.fixture(autouse=True)
def _engine_boundary(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test runs with the engine's records refusing writes from the broker core (issue 11: "the broker
    never assigns to an engine object's fields"); a broker that reaches into the engine fails the test."""
    for record in _ENGINE_RECORDS:
        monkeypatch.setattr(record, "__setattr__", _refuse_broker_writes(record.__setattr__))
