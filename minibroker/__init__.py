"""minibroker: an embeddable AMQP 1.0 broker on trio, whose heart is AMQP 1.0 transactions.

Public API (DESIGN §2): ``serve`` (trio), ``run_in_thread`` (any code), ``Config``, ``ConfigError``, and
``connect`` (a running broker through its HTTP management API, with the same handle surface).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from minibroker.config import Config, ConfigError
    from minibroker.remote import connect
    from minibroker.server.app import RunningBroker, serve
    from minibroker.testing.thread import ThreadedBroker, run_in_thread

__all__ = ["Config", "ConfigError", "RunningBroker", "ThreadedBroker", "connect", "run_in_thread", "serve"]
__version__ = "0.1.0"

_HOMES = {
    "Config": "minibroker.config",
    "ConfigError": "minibroker.config",
    "connect": "minibroker.remote",
    "RunningBroker": "minibroker.server.app",
    "serve": "minibroker.server.app",
    "ThreadedBroker": "minibroker.testing.thread",
    "run_in_thread": "minibroker.testing.thread",
}


def __getattr__(name: str) -> Any:
    """The public names, each imported on first use (PEP 562): ``python -m minibroker`` imports this package
    first, and would otherwise load the HTTP client of ``connect`` and the thread runner before it listens."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'minibroker' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next look-up does not come here
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
