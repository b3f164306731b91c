"""Review of issue 17 item 11 (the emulator's Config.json, ``[servicebus]``): absurd durations and counts, names
that collide without regard to case, with the real azure-servicebus SDK where the broker must run."""

from __future__ import annotations

import json
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue

from minibroker.servicebus.declarations import DeclarationError, parse_emulator_config, parse_toml_entities
from minibroker.testing.thread import run_in_thread
from tests.servicebus.conftest import connection_string

pytestmark = pytest.mark.timeout(60)


def _emulator(queues: list[Any] = (), topics: list[Any] = ()) -> str:  # type: ignore[assignment]
    return json.dumps(
        {"UserConfig": {"Namespaces": [{"Name": "sbemulatorns", "Queues": list(queues), "Topics": list(topics)}]}}
    )


@pytest.mark.parametrize("lock", ["P1D", "PT5M1S", "P99999999999Y", "PT0S", "-PT1M"])
def test_a_lock_duration_service_bus_refuses_is_refused(lock: str) -> None:
    """Service Bus takes a LockDuration up to 5 minutes (the emulator's schema: PT5M at most); more, or none,
    is refused with its path rather than run with a lock no Service Bus could have (or, past 10**11 years, one
    whose expiry cannot be encoded)."""
    text = _emulator([{"Name": "q", "Properties": {"LockDuration": lock}}])
    with pytest.raises(DeclarationError) as raised:
        parse_emulator_config(text)
    assert raised.value.path == "UserConfig.Namespaces[0].Queues[0].Properties.LockDuration"


def test_the_longest_lock_is_taken() -> None:
    text = _emulator([{"Name": "q", "Properties": {"LockDuration": "PT5M"}}])
    assert parse_emulator_config(text).queues["q"].lock_duration == 300.0


@pytest.mark.parametrize("count", [0, -1, 2**63, True, 1.5, "3"])
def test_a_bad_max_delivery_count_is_refused(count: Any) -> None:
    text = _emulator([{"Name": "q", "Properties": {"MaxDeliveryCount": count}}])
    if count == 2**63:  # (a big count is no harm: it never dead-letters)
        assert parse_emulator_config(text).queues["q"].max_delivery_count == 2**63
        return
    with pytest.raises(DeclarationError):
        parse_emulator_config(text)


@pytest.mark.parametrize(
    ("queues", "topics"),
    [
        ([{"Name": "Orders"}, {"Name": "orders"}], []),
        ([{"Name": "Orders"}], [{"Name": "ORDERS"}]),
        ([], [{"Name": "t", "Subscriptions": [{"Name": "Audit"}, {"Name": "audit"}]}]),
    ],
)
def test_names_equal_but_for_case_are_declared_twice(queues: list[Any], topics: list[Any]) -> None:
    with pytest.raises(DeclarationError, match="declared twice"):
        parse_emulator_config(_emulator(queues, topics))


def test_toml_names_equal_but_for_case_are_declared_twice() -> None:
    with pytest.raises(DeclarationError, match="declared twice"):
        parse_toml_entities({"Orders": {}}, {"orders": {}}, "servicebus")


def test_the_longest_time_to_live_works_end_to_end() -> None:
    """TimeSpan.MaxValue, Service Bus's default DefaultMessageTimeToLive as its tools write it, with dead-lettering
    on expiry: a message is sent, received and completed (no overflow in its expiry)."""
    servicebus = {
        "queues": {
            "forever": {
                "default_message_time_to_live": "P10675199DT2H48M5.4775807S",
                "dead_lettering_on_message_expiration": True,
            },
            "slow": {"lock_duration": "PT5M"},
        }
    }
    config = {"server": {"port": 0}, "broker": {"clock": "virtual"}, "servicebus": servicebus}
    with (
        run_in_thread(config) as broker,
        ServiceBusClient.from_connection_string(connection_string(broker.port), retry_total=0) as client,
    ):
        for queue in ("forever", "slow"):
            with client.get_queue_sender(queue) as sender:
                sender.send_messages(ServiceBusMessage("m", time_to_live=None))
            with client.get_queue_receiver(queue) as receiver:
                (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
                receiver.complete_message(message)
            with client.get_queue_receiver(queue, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
                assert dlq.receive_messages(max_message_count=1, max_wait_time=1) == []
