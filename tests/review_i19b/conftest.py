"""The ``mb`` and ``settings`` fixtures of the transaction frame tests, shared with this review's probes."""

from tests.broker.test_transactions_frames import mb, settings

__all__ = ["mb", "settings"]
