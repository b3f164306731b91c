"""azure-eventhub 5.x against ``--personality servicebus`` (issue 17 item 10): the real SDK, no mocks."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pytest
from azure.eventhub import EventData, EventHubConsumerClient, EventHubProducerClient  # the ``test`` extras
from azure.eventhub.exceptions import EventHubError

from minibroker.testing.thread import ThreadedBroker
from tests.servicebus.conftest import connection_string

pytestmark = pytest.mark.timeout(60)


def hub_connection_string(port: int, hub: str = "telemetry") -> str:
    """The Event Hubs emulator's connection string (the Service Bus one with ``EntityPath``)."""
    return connection_string(port) + f";EntityPath={hub}"


@pytest.fixture
def hub(sb_broker: ThreadedBroker) -> str:
    return hub_connection_string(sb_broker.port)


@pytest.fixture
def producer(hub: str) -> Iterator[EventHubProducerClient]:
    with EventHubProducerClient.from_connection_string(hub, retry_total=0) as client:
        yield client


def _send(producer: EventHubProducerClient, *bodies: str, **batch: Any) -> None:
    events = producer.create_batch(**batch)
    for body in bodies:
        events.add(EventData(body))
    producer.send_batch(events)


def _receive(hub: str, partition: str, count: int, *, group: str = "$Default", **start: Any) -> list[EventData]:
    """Up to ``count`` events of ``partition`` for ``group`` (fewer when none comes for 3 s), by ``receive`` with a
    callback that stops the client; ``start`` as ``receive`` takes it (``starting_position`` ...)."""
    client = EventHubConsumerClient.from_connection_string(hub, consumer_group=group, retry_total=0)
    got: list[EventData] = []

    def on_event(_context: Any, event: EventData | None) -> None:
        if event is not None:
            got.append(event)
        if event is None or len(got) >= count:
            client.close()

    start.setdefault("starting_position", "-1")
    with client:
        client.receive(on_event=on_event, partition_id=partition, max_wait_time=3, **start)
    return got


def test_get_eventhub_properties(producer: EventHubProducerClient) -> None:
    properties = producer.get_eventhub_properties()
    assert properties["eventhub_name"] == "telemetry"
    assert properties["partition_ids"] == ["0", "1"]
    assert isinstance(properties["created_at"], datetime.datetime)
    assert producer.get_partition_ids() == ["0", "1"]


def test_get_partition_properties(producer: EventHubProducerClient) -> None:
    empty = producer.get_partition_properties("1")
    assert (empty["eventhub_name"], empty["id"], empty["is_empty"]) == ("telemetry", "1", True)
    assert (empty["beginning_sequence_number"], empty["last_enqueued_sequence_number"]) == (0, -1)
    _send(producer, "a", "b", partition_id="1")
    after = producer.get_partition_properties("1")
    assert after["is_empty"] is False
    assert (after["beginning_sequence_number"], after["last_enqueued_sequence_number"]) == (0, 1)
    assert int(after["last_enqueued_offset"]) > 0
    assert after["last_enqueued_time_utc"].year >= 2024


def test_partition_out_of_range_is_an_error(producer: EventHubProducerClient) -> None:
    with pytest.raises(EventHubError, match="404"):
        producer.get_partition_properties("7")


def test_send_batch_and_receive_from_the_start(hub: str, producer: EventHubProducerClient) -> None:
    _send(producer, "one", "two", "three", partition_id="0")
    events = _receive(hub, "0", 3)
    assert [e.body_as_str() for e in events] == ["one", "two", "three"]
    assert [e.sequence_number for e in events] == [0, 1, 2]
    offsets = [int(e.offset) for e in events]
    assert offsets[0] == 0
    assert offsets == sorted(offsets)
    assert len(set(offsets)) == 3
    assert all(isinstance(e.enqueued_time, datetime.datetime) for e in events)


def test_receive_batch(hub: str, producer: EventHubProducerClient) -> None:
    _send(producer, "x", "y", partition_id="1")
    client = EventHubConsumerClient.from_connection_string(hub, consumer_group="$Default", retry_total=0)
    got: list[str] = []

    def on_batch(_context: Any, events: list[EventData]) -> None:
        got.extend(e.body_as_str() for e in events)
        client.close()

    with client:
        client.receive_batch(on_event_batch=on_batch, partition_id="1", starting_position="-1", max_wait_time=3)
    assert got == ["x", "y"]


def test_events_are_not_removed_and_every_consumer_group_sees_them(hub: str, producer: EventHubProducerClient) -> None:
    _send(producer, "a", "b", partition_id="0")
    first = [e.body_as_str() for e in _receive(hub, "0", 2)]
    again = [e.body_as_str() for e in _receive(hub, "0", 2)]
    other = [e.body_as_str() for e in _receive(hub, "0", 2, group="analytics")]
    assert first == again == other == ["a", "b"]


def test_receive_from_a_sequence_number(hub: str, producer: EventHubProducerClient) -> None:
    _send(producer, "s0", "s1", "s2", "s3", partition_id="0")
    after = _receive(hub, "0", 4, starting_position=1)
    assert [e.body_as_str() for e in after] == ["s2", "s3"]
    inclusive = _receive(hub, "0", 4, starting_position=1, starting_position_inclusive=True)
    assert [e.body_as_str() for e in inclusive] == ["s1", "s2", "s3"]


def test_receive_from_an_offset(hub: str, producer: EventHubProducerClient) -> None:
    _send(producer, "o0", "o1", "o2", partition_id="1")
    offsets = [e.offset for e in _receive(hub, "1", 3)]
    after = _receive(hub, "1", 3, starting_position=offsets[0])
    assert [e.body_as_str() for e in after] == ["o1", "o2"]


def test_receive_from_an_enqueued_time(hub: str, producer: EventHubProducerClient) -> None:
    _send(producer, "t0", partition_id="0")
    enqueued = _receive(hub, "0", 1)[0].enqueued_time
    assert _receive(hub, "0", 1, starting_position=enqueued) == []
    earlier = enqueued - datetime.timedelta(seconds=1)
    assert [e.body_as_str() for e in _receive(hub, "0", 1, starting_position=earlier)] == ["t0"]


def test_events_to_the_hub_go_to_its_partitions_and_a_key_keeps_one(hub: str, producer: EventHubProducerClient) -> None:
    _send(producer, "r0")
    _send(producer, "r1")
    spread = [e.body_as_str() for p in ("0", "1") for e in _receive(hub, p, 1)]
    assert sorted(spread) == ["r0", "r1"]  # one each: in turn
    _send(producer, "k0", "k1", partition_key="device-7")
    _send(producer, "k2", partition_key="device-7")
    keyed = {p: [e.body_as_str() for e in _receive(hub, p, 10) if e.body_as_str().startswith("k")] for p in "01"}
    assert sorted(keyed.values()) == [[], ["k0", "k1", "k2"]]
    partition = "0" if keyed["0"] else "1"
    keys = {e.partition_key for e in _receive(hub, partition, 10) if e.body_as_str().startswith("k")}
    assert keys == {b"device-7"}  # (the SDK's pyamqp gives the annotation's string as bytes)
