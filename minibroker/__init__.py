"""minibroker: an embeddable AMQP 1.0 broker on trio, whose heart is AMQP 1.0 transactions.

Public API (DESIGN §2): ``serve`` (trio), ``run_in_thread`` (any code), ``Config``, ``ConfigError``, and
``connect`` (a running broker through its HTTP management API, with the same handle surface).
"""

from minibroker.config import Config, ConfigError
from minibroker.remote import connect
from minibroker.server.app import RunningBroker, serve
from minibroker.testing.thread import ThreadedBroker, run_in_thread

__all__ = ["Config", "ConfigError", "RunningBroker", "ThreadedBroker", "connect", "run_in_thread", "serve"]
__version__ = "0.1.0"
