"""Subscription rules with the real azure-servicebus 7.15 SDK against the broker (issue 17 item 2).

azure-servicebus has no public AMQP rule API (its rules live in the HTTP administration client), so the rule
requests go through the receiver's own management link, as the SDK sends its other ``$management`` operations
(``_base_handler.py`` ``_mgmt_request_response_with_retry``; operation names from ``_common/constants.py``
``REQUEST_RESPONSE_ADD_RULE_OPERATION`` ...), with the body the JS SDK's ``addRule`` sends."""

from __future__ import annotations

from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiver
from azure.servicebus._common import mgmt_handlers
from azure.servicebus._common.constants import (
    REQUEST_RESPONSE_ADD_RULE_OPERATION,
    REQUEST_RESPONSE_GET_RULES_OPERATION,
    REQUEST_RESPONSE_REMOVE_RULE_OPERATION,
)
from azure.servicebus.exceptions import (
    MessagingEntityAlreadyExistsError,
    MessagingEntityNotFoundError,
    ServiceBusError,
)

from minibroker.testing.thread import ThreadedBroker
from tests.servicebus.conftest import connection_string

pytestmark = pytest.mark.timeout(60)


def _request(receiver: ServiceBusReceiver, operation: bytes, body: dict[str, Any]) -> Any:
    """The answer's body; an error status raised as the SDK raises it (``mgmt_handlers.default``)."""
    return receiver._mgmt_request_response_with_retry(operation, body, mgmt_handlers.default, timeout=10)


def _enumerate(receiver: ServiceBusReceiver) -> tuple[int, Any]:
    """The status and body of an enumerate-rules answer (``default`` would take 204, no rules, for an error)."""

    def answer(status_code: int, message: Any, description: str, amqp_transport: Any) -> tuple[int, Any]:
        return status_code, message.value

    status, value = receiver._mgmt_request_response_with_retry(
        REQUEST_RESPONSE_GET_RULES_OPERATION, {"top": 10, "skip": 0}, answer, timeout=10
    )
    return int(status), value


def _add_rule(receiver: ServiceBusReceiver, name: str, description: dict[str, Any]) -> None:
    _request(receiver, REQUEST_RESPONSE_ADD_RULE_OPERATION, {"rule-name": name, "rule-description": description})


def _remove_rule(receiver: ServiceBusReceiver, name: str) -> None:
    _request(receiver, REQUEST_RESPONSE_REMOVE_RULE_OPERATION, {"rule-name": name})


def _received(receiver: ServiceBusReceiver, count: int) -> list[str]:
    """The bodies of ``count`` messages, completed; then nothing else is left in the subscription."""
    bodies: list[str] = []
    while len(bodies) < count:
        batch = receiver.receive_messages(max_message_count=count - len(bodies), max_wait_time=5)
        assert batch, f"only {bodies} arrived"
        for message in batch:
            bodies.append(str(message))
            receiver.complete_message(message)
    assert receiver.peek_messages(10) == []
    return sorted(bodies)


def test_sql_rule_on_user_and_system_properties(client: ServiceBusClient) -> None:
    with client.get_subscription_receiver("shop", "wanted") as receiver:
        _add_rule(receiver, "red-or-urgent", {"sql-filter": {"expression": "color = 'red' OR sys.Label = 'urgent'"}})
        _remove_rule(receiver, "$Default")
        with client.get_topic_sender("shop") as sender:
            sender.send_messages(
                [
                    ServiceBusMessage("red", application_properties={"color": "red"}),
                    ServiceBusMessage("urgent", subject="urgent", application_properties={"color": "blue"}),
                    ServiceBusMessage("blue", application_properties={"color": "blue"}),
                    ServiceBusMessage("plain"),
                ]
            )
        assert _received(receiver, 2) == ["red", "urgent"]


def test_correlation_rule(client: ServiceBusClient) -> None:
    with client.get_subscription_receiver("audit", "eu") as receiver:
        _add_rule(
            receiver,
            "eu-orders",
            {"correlation-filter": {"correlation-id": "order", "properties": {"region": "eu"}}},
        )
        _remove_rule(receiver, "$Default")
        with client.get_topic_sender("audit") as sender:
            sender.send_messages(
                [
                    ServiceBusMessage("hit", correlation_id="order", application_properties={"region": "eu"}),
                    ServiceBusMessage("wrong-region", correlation_id="order", application_properties={"region": "us"}),
                    ServiceBusMessage("wrong-id", correlation_id="other", application_properties={"region": "eu"}),
                ]
            )
        assert _received(receiver, 1) == ["hit"]


def test_default_removed_delivers_nothing(client: ServiceBusClient) -> None:
    with client.get_subscription_receiver("quiet", "none") as receiver:
        _remove_rule(receiver, "$Default")
        with client.get_topic_sender("quiet") as sender:
            sender.send_messages(ServiceBusMessage("dropped"))
        assert receiver.peek_messages(10) == []
        assert _enumerate(receiver) == (204, None)


def test_other_subscriptions_keep_default(client: ServiceBusClient) -> None:
    with (
        client.get_subscription_receiver("fan", "all") as everything,
        client.get_subscription_receiver("fan", "some") as some,
    ):
        _add_rule(some, "big", {"sql-filter": {"expression": "n > 10"}})
        _remove_rule(some, "$Default")
        with client.get_topic_sender("fan") as sender:
            sender.send_messages([ServiceBusMessage(str(n), application_properties={"n": n}) for n in (5, 50)])
        assert _received(everything, 2) == ["5", "50"]
        assert _received(some, 1) == ["50"]


def test_rule_errors_raise(sb_broker: ThreadedBroker) -> None:
    """Each error status raises the SDK's error on the first try: ``retry_total=0`` keeps the SDK from backing
    off and retrying after it shut its management handler down for the error (seconds each, to the same end)."""
    with (
        ServiceBusClient.from_connection_string(connection_string(sb_broker.port), retry_total=0) as client,
        client.get_subscription_receiver("errs", "sub") as receiver,
    ):
        with pytest.raises(MessagingEntityNotFoundError):
            _remove_rule(receiver, "no-such-rule")
        with pytest.raises(MessagingEntityAlreadyExistsError):
            _add_rule(receiver, "$Default", {"sql-filter": {"expression": "1=1"}})
        with pytest.raises(ServiceBusError):
            _add_rule(receiver, "bad", {"sql-filter": {"expression": "color = "}})
        status, value = _enumerate(receiver)
        assert status == 200
        # pyamqp decodes a described value as its value: [filter, action, name, created-at]
        assert [entry[b"rule-description"][2] for entry in value[b"rules"]] == [b"$Default"]


def test_rules_outlive_the_receiver(client: ServiceBusClient) -> None:
    """A Service Bus subscription exists without receivers: its rules, and the messages they let in while no
    receiver is attached, are there for the next receiver (even after the SDK closed the first one's link)."""
    with client.get_subscription_receiver("kept", "sub") as receiver:
        _add_rule(receiver, "big", {"sql-filter": {"expression": "n > 10"}})
        _remove_rule(receiver, "$Default")
    with client.get_topic_sender("kept") as sender:
        sender.send_messages([ServiceBusMessage(str(n), application_properties={"n": n}) for n in (5, 50)])
    with client.get_subscription_receiver("kept", "sub") as receiver:
        assert _received(receiver, 1) == ["50"]


def test_rule_action_sets_and_removes_properties(client: ServiceBusClient) -> None:
    with client.get_subscription_receiver("tinted", "sub") as receiver:
        _add_rule(
            receiver,
            "tint",
            {
                "sql-filter": {"expression": "color = 'red'"},
                "sql-rule-action": {"expression": "SET color = 'crimson'; SET n = n + 1; REMOVE secret"},
            },
        )
        _remove_rule(receiver, "$Default")
        with client.get_topic_sender("tinted") as sender:
            sender.send_messages(ServiceBusMessage("m", application_properties={"color": "red", "n": 1, "secret": "s"}))
        (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert message.application_properties == {b"color": b"crimson", b"n": 2, b"RuleName": b"tint"}  # pyamqp: bytes
        receiver.complete_message(message)


def test_each_rule_with_an_action_gives_its_own_copy(client: ServiceBusClient) -> None:
    """learn.microsoft.com "Topic filters and actions": matching rules without an action give one copy between
    them; each matching rule with an action gives one more, that rule's action applied and ``RuleName`` naming it
    (five matching rules, two with actions: three copies)."""
    with client.get_subscription_receiver("copies", "sub") as receiver:
        _add_rule(receiver, "plain-a", {"sql-filter": {"expression": "n > 0"}})
        _add_rule(receiver, "plain-b", {"correlation-filter": {"properties": {"n": 1}}})
        for name, when, value in (("act-x", "n = 1", "x"), ("act-y", "n = 1", "y"), ("act-none", "n = 2", "z")):
            action = {"expression": f"SET tag = '{value}'"}
            _add_rule(receiver, name, {"sql-filter": {"expression": when}, "sql-rule-action": action})
        with client.get_topic_sender("copies") as sender:
            sender.send_messages(ServiceBusMessage("m", application_properties={"n": 1}))
        got: list[dict[Any, Any]] = []
        sequence_numbers: list[int] = []
        while len(sequence_numbers) < 3:
            batch = receiver.receive_messages(max_message_count=3 - len(sequence_numbers), max_wait_time=5)
            assert batch, f"only {sequence_numbers} arrived"
            for message in batch:
                assert message.sequence_number is not None
                sequence_numbers.append(message.sequence_number)
                receiver.defer_message(message)
        # each copy is a message of its own in the subscription: its own sequence number, deferred and fetched by it
        assert len(set(sequence_numbers)) == 3, sequence_numbers
        for message in receiver.receive_deferred_messages(sequence_numbers):
            got.append(dict(message.application_properties or {}))
            receiver.complete_message(message)
        assert receiver.peek_messages(10) == []
        assert sorted(got, key=lambda p: p.get(b"RuleName", b"")) == [
            {b"n": 1},
            {b"n": 1, b"tag": b"x", b"RuleName": b"act-x"},
            {b"n": 1, b"tag": b"y", b"RuleName": b"act-y"},
        ]
