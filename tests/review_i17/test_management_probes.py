"""Review of issue 17 ($management on ``TOPIC/Subscriptions/NAME``), frame by frame: when ``TOPIC`` is a queue the
address names no subscription, so a peek there does not show the queue's messages."""

from __future__ import annotations

import uuid

import pytest

from minibroker.amqp.types import Int, Long
from tests.personalities.harness import payload, peer, world
from tests.servicebus.test_management_frames import _answers, _request

pytestmark = pytest.mark.timeout(30)
NODE = "amqps://127.0.0.1:5672/orders/Subscriptions/s/$management"


def test_peek_on_a_subscription_of_a_queue_finds_nothing() -> None:
    w = world("servicebus")
    p = peer(w)
    p.attach_producer("orders-in", "orders")
    p.transfer("orders-in", payload("queued"))
    p.attach_producer("mgmt-req", NODE)
    p.attach_consumer("mgmt-resp", NODE, presettled=False, default_outcome=None)
    w.settle()
    p.flow("mgmt-resp", 10)
    w.settle()
    message_id = uuid.uuid4()
    peek = {"from-sequence-number": Long(0), "message-count": Int(5)}
    p.transfer("mgmt-req", _request(message_id, "com.microsoft:peek-message", peek))
    w.settle()
    ((correlation, status, body),) = _answers(p)
    assert correlation == message_id
    assert (status["statusCode"], body) == (204, None)
    assert not p.observed.violations
