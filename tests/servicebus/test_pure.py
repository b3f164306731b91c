"""The pure Service Bus parts: addresses and the ``$cbs`` answer (``minibroker.servicebus``)."""

from __future__ import annotations

import uuid

import pytest

from minibroker.amqp import codec
from minibroker.amqp.definitions import AmqpValue, ApplicationProperties, Properties
from minibroker.servicebus import addresses, cbs, via

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(
    ("address", "path"),
    [
        ("amqps://127.0.0.1:5672/orders", "orders"),
        ("amqp://host/t/Subscriptions/s", "t/Subscriptions/s"),
        ("orders", "orders"),
        ("$cbs", "$cbs"),
        ("amqps://host:1/orders/$DeadLetterQueue", "orders/$DeadLetterQueue"),
    ],
)
def test_entity_path(address: str, path: str) -> None:
    assert addresses.entity_path(address) == path


def test_subscription() -> None:
    assert addresses.subscription("t/Subscriptions/s") == ("t", "s", "")
    assert addresses.subscription("t/subscriptions/s/$DeadLetterQueue") == ("t", "s", "$DeadLetterQueue")
    assert addresses.subscription("orders") is None
    assert addresses.subscription("/Subscriptions/s") is None


def test_put_token_answered_202_correlated() -> None:
    message_id = uuid.uuid4()
    request = (
        codec.encode(Properties(message_id=message_id, reply_to="cbs-reply"))
        + codec.encode(ApplicationProperties({"operation": "put-token", "type": "servicebus.windows.net:sastoken"}))
        + codec.encode(AmqpValue("SharedAccessSignature sr=..."))
    )
    _, answer = cbs.answer(request)
    properties, pos = codec.decode(answer)
    application, _ = codec.decode(answer, pos)
    assert isinstance(properties, Properties)
    assert isinstance(application, ApplicationProperties)
    assert properties.correlation_id == message_id
    assert properties.to == "cbs-reply"
    assert application.value == {"status-code": 202, "status-description": "Accepted"}


def test_other_operation_is_400() -> None:
    _, answer = cbs.answer(codec.encode(Properties(message_id="m")) + codec.encode(AmqpValue(None)))
    _, pos = codec.decode(answer)
    application, _ = codec.decode(answer, pos)
    assert isinstance(application, ApplicationProperties)
    assert application.value["status-code"] == 400


@pytest.mark.parametrize(
    ("path", "entity"),
    [
        ("orders", "orders"),
        ("orders/$DeadLetterQueue", "orders"),
        ("t/Subscriptions/s", "t"),
        ("t/subscriptions/s/$DeadLetterQueue", "t"),
        ("a/b", "a/b"),
        ("/$DeadLetterQueue", "/$DeadLetterQueue"),
    ],
)
def test_top_level_entity(path: str, entity: str) -> None:
    assert via.top_level_entity(path) == entity


@pytest.mark.parametrize("properties", [None, [], [via.TRANSFER_DESTINATION], 5, {}, {"other": "b"}])
def test_no_transfer_destination(properties: object) -> None:
    """Properties that are no map, or a map without the key, name no destination (never an error)."""
    assert via.transfer_destination(properties) is None


def test_transfer_destination_is_an_entity_path() -> None:
    assert via.transfer_destination({via.TRANSFER_DESTINATION: "amqps://ns.servicebus.windows.net/b"}) == "b"
    assert isinstance(via.transfer_destination({via.TRANSFER_DESTINATION: ["b"]}), via.BadDestination)
