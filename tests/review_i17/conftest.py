"""Fixtures of the Service Bus tests the review probes use (``tests/servicebus/conftest.py``)."""

from tests.servicebus.conftest import js_sdk as js_sdk
