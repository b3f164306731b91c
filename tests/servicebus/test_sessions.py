"""Service Bus sessions with the azure-servicebus SDK (issue 17 item 8, and the session operations of item 6):
session receivers (a session id, or NEXT_AVAILABLE_SESSION), dispatch by the message's session id (group-id), one
receiver per session, the session lock (on the virtual clock), session state, and listing sessions. Real SDK, no
mocks."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.exceptions import (
    OperationTimeoutError,
    ServiceBusError,
    SessionCannotBeLockedError,
    SessionLockLostError,
)

from minibroker.broker.core import Broker
from minibroker.servicebus.entities import EntityProperties, key
from minibroker.testing.thread import ThreadedBroker
from tests.servicebus.conftest import connection_string

pytestmark = pytest.mark.timeout(60)


def _send(client: ServiceBusClient, queue: str, *messages: tuple[str, str | None]) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(body, session_id=session) for body, session in messages])


def _configure(broker: ThreadedBroker, path: str, properties: EntityProperties) -> None:
    """Configure one entity of the broker's default namespace (what the ``[servicebus]`` config is to do)."""

    def configure(core: Broker) -> None:
        core.nodes.default.servicebus_entities[key(path)] = properties

    broker.call(lambda running: configure(running.broker))


def test_session_receiver_gets_its_session_only(client: ServiceBusClient) -> None:
    _send(client, "orders", ("a1", "a"), ("b1", "b"), ("a2", "a"), ("plain", None))
    with client.get_queue_receiver("orders", session_id="a", max_wait_time=2) as receiver:
        got = receiver.receive_messages(max_message_count=10, max_wait_time=2)
        assert [str(m) for m in got] == ["a1", "a2"]
        assert {m.session_id for m in got} == {"a"}
        assert receiver.session.session_id == "a"
        locked_until = receiver.session.locked_until_utc
        assert locked_until is not None
        assert abs(locked_until.timestamp() - (time.time() + 60)) < 5
        for message in got:
            receiver.complete_message(message)
    with client.get_queue_receiver("orders", max_wait_time=2) as plain:
        # an entity nobody configured: a message without a session id goes to receivers without a session filter
        assert [str(m) for m in plain.receive_messages(max_message_count=10, max_wait_time=1)] == ["plain"]


def test_next_available_session_picks_an_unlocked_one(client: ServiceBusClient) -> None:
    _send(client, "tasks", ("x1", "x"), ("y1", "y"))
    with client.get_queue_receiver("tasks", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=2) as first:
        (one,) = first.receive_messages(max_message_count=5, max_wait_time=2)
        assert first.session.session_id == "x"
        assert str(one) == "x1"
        with client.get_queue_receiver("tasks", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=2) as second:
            (two,) = second.receive_messages(max_message_count=5, max_wait_time=2)
            assert second.session.session_id == "y"
            assert str(two) == "y1"
            second.complete_message(two)
        first.complete_message(one)


def test_next_available_without_sessions_times_out(sb_broker: ThreadedBroker) -> None:
    started = time.monotonic()
    with (
        ServiceBusClient.from_connection_string(connection_string(sb_broker.port), retry_total=0) as client,
        pytest.raises(OperationTimeoutError),
        client.get_queue_receiver("idle", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=2) as receiver,
    ):
        receiver.receive_messages(max_message_count=1, max_wait_time=2)
    assert time.monotonic() - started < 5  # answered at once: no session has messages


def test_next_available_waits_for_a_session_within_max_wait_time(
    sb_broker: ThreadedBroker, client: ServiceBusClient
) -> None:
    got: list[tuple[str, str]] = []

    def receive() -> None:  # a client of its own: the SDK's clients are not to be shared between threads
        with (
            ServiceBusClient.from_connection_string(connection_string(sb_broker.port)) as own,
            own.get_queue_receiver("later", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=20) as receiver,
        ):
            (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            got.append((receiver.session.session_id, str(message)))
            receiver.complete_message(message)

    waiting = threading.Thread(target=receive)
    waiting.start()
    # its attach waits unanswered in the broker until a session has a message
    sb_broker.wait_for(lambda: sb_broker.call(lambda running: bool(running.broker.dispatcher.sessions.waiting)))
    _send(client, "later", ("arrived", "late"))
    waiting.join(timeout=30)
    assert got == [("late", "arrived")]


def test_a_locked_session_cannot_be_taken_twice(client: ServiceBusClient) -> None:
    _send(client, "single", ("m", "s"))
    with client.get_queue_receiver("single", session_id="s", max_wait_time=2) as holder:
        (message,) = holder.receive_messages(max_message_count=1, max_wait_time=2)
        with (
            pytest.raises(SessionCannotBeLockedError),
            client.get_queue_receiver("single", session_id="s", max_wait_time=2) as other,
        ):
            other.receive_messages(max_message_count=1, max_wait_time=1)
        holder.complete_message(message)


def test_closing_a_receiver_releases_the_session_and_its_messages(client: ServiceBusClient) -> None:
    _send(client, "handover", ("h1", "h"), ("h2", "h"))
    with client.get_queue_receiver("handover", session_id="h", max_wait_time=2) as first:
        got = first.receive_messages(max_message_count=1, max_wait_time=2)
        assert [str(m) for m in got] == ["h1"]  # left unsettled
    with client.get_queue_receiver("handover", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=2) as second:
        again = second.receive_messages(max_message_count=5, max_wait_time=2)
        assert second.session.session_id == "h"
        assert [str(m) for m in again] == ["h1", "h2"]
        for message in again:
            second.complete_message(message)


def test_session_state_is_kept_across_receivers(client: ServiceBusClient) -> None:
    with client.get_queue_receiver("stateful", session_id="empty-session", max_wait_time=1) as receiver:
        assert receiver.session.get_state() is None
        receiver.session.set_state(b"\x00step-1\xff")
        assert receiver.session.get_state() == b"\x00step-1\xff"
    with client.get_queue_receiver("stateful", session_id="empty-session", max_wait_time=1) as receiver:
        assert receiver.session.get_state() == b"\x00step-1\xff"
        receiver.session.set_state("text is encoded")
        assert receiver.session.get_state() == b"text is encoded"
        receiver.session.set_state(None)
        assert receiver.session.get_state() is None
    with client.get_queue_receiver("stateful", session_id="other", max_wait_time=1) as receiver:
        assert receiver.session.get_state() is None


def test_list_sessions_with_messages_or_state(client: ServiceBusClient) -> None:
    _send(client, "listed", ("1", "with-messages"), ("2", "with-messages"), ("3", "second"))
    with client.get_queue_receiver("listed", session_id="with-state", max_wait_time=1) as receiver:
        receiver.session.set_state(b"s")
    assert sorted(client.list_queue_sessions("listed", timeout=10)) == ["second", "with-messages", "with-state"]
    assert list(client.list_queue_sessions("never-used", timeout=10)) == []
    a_minute_ago = datetime.now(UTC) - timedelta(minutes=1)
    assert list(client.list_queue_sessions("listed", state_updated_after=a_minute_ago, timeout=10)) == ["with-state"]


def test_subscription_sessions(client: ServiceBusClient) -> None:
    with client.get_subscription_receiver("news", "reader", session_id="eu", max_wait_time=2) as receiver:
        with client.get_topic_sender("news") as sender:
            sender.send_messages(
                [ServiceBusMessage("us-1", session_id="us"), ServiceBusMessage("eu-1", session_id="eu")]
            )
        (message,) = receiver.receive_messages(max_message_count=5, max_wait_time=2)
        assert str(message) == "eu-1"
        assert receiver.session.session_id == "eu"
        receiver.complete_message(message)
        with client.get_subscription_receiver(
            "news", "reader", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=2
        ) as other:
            (message,) = other.receive_messages(max_message_count=5, max_wait_time=2)
            assert (other.session.session_id, str(message)) == ("us", "us-1")
            other.complete_message(message)


def test_session_lock_renewed_then_lost(virtual_broker: ThreadedBroker, virtual_client: ServiceBusClient) -> None:
    _send(virtual_client, "locked", ("l1", "l"))
    with virtual_client.get_queue_receiver("locked", session_id="l", max_wait_time=2) as receiver:
        (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=2)
        first_until = receiver.session.locked_until_utc
        assert first_until is not None
        assert abs(first_until.timestamp() - (virtual_broker.clock.now + 60)) < 2
        virtual_broker.clock.advance(50)
        renewed = receiver.session.renew_lock(timeout=10)
        assert abs(renewed.timestamp() - (virtual_broker.clock.now + 60)) < 2
        virtual_broker.clock.advance(50)  # past the first lock, within the renewed one
        virtual_broker.clock.advance(11)  # and past that one too: the session is lost, its link detached
        with pytest.raises(SessionLockLostError):
            receiver.complete_message(message)
    with virtual_client.get_queue_receiver("locked", session_id="l", max_wait_time=2) as receiver:
        (again,) = receiver.receive_messages(max_message_count=1, max_wait_time=2)
        assert str(again) == "l1"
        assert again.delivery_count == 1
        receiver.complete_message(again)


def test_requires_session_refuses_plain_receivers_and_messages(
    sb_broker: ThreadedBroker, client: ServiceBusClient
) -> None:
    _configure(sb_broker, "strict", EntityProperties(requires_session=True))
    with pytest.raises(ServiceBusError), client.get_queue_sender("strict") as sender:
        sender.send_messages(ServiceBusMessage("no session"))
    with (
        pytest.raises(ServiceBusError),
        client.get_queue_receiver("strict", max_wait_time=1) as receiver,
    ):
        receiver.receive_messages(max_message_count=1, max_wait_time=1)
    with pytest.raises(ServiceBusError), client.get_queue_sender("strict") as sender:
        sender.schedule_messages(ServiceBusMessage("no session"), datetime.now(UTC) + timedelta(hours=1))
    _send(client, "strict", ("ok", "s"))
    with client.get_queue_receiver("strict", session_id="s", max_wait_time=2) as receiver:
        (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=2)
        assert str(message) == "ok"
        receiver.complete_message(message)


def test_an_entity_configured_without_sessions_refuses_session_receivers(
    sb_broker: ThreadedBroker, client: ServiceBusClient
) -> None:
    _configure(sb_broker, "plain", EntityProperties(requires_session=False))
    _send(client, "plain", ("tagged", "s"))
    with (
        pytest.raises(ServiceBusError),
        client.get_queue_receiver("plain", session_id="s", max_wait_time=1) as receiver,
    ):
        receiver.receive_messages(max_message_count=1, max_wait_time=1)
    with client.get_queue_receiver("plain", max_wait_time=2) as receiver:
        # as in Service Bus: on an entity without sessions the session id is only a property
        (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=2)
        assert (str(message), message.session_id) == ("tagged", "s")
        receiver.complete_message(message)


def test_a_session_receiver_peeks_its_own_session(client: ServiceBusClient) -> None:
    _send(client, "peeked", ("a1", "a"), ("b1", "b"), ("a2", "a"), ("plain", None))
    with client.get_queue_receiver("peeked", session_id="a", max_wait_time=1) as receiver:
        assert [str(m) for m in receiver.peek_messages(max_message_count=10, timeout=10)] == ["a1", "a2"]


def test_dead_lettered_session_messages_reach_the_dead_letter_receiver(client: ServiceBusClient) -> None:
    _send(client, "doomed", ("d1", "d"))
    with client.get_queue_receiver("doomed", session_id="d", max_wait_time=2) as receiver:
        (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=2)
        receiver.dead_letter_message(message, reason="bad", error_description="very bad")
    # a dead-letter queue has no sessions: its plain receiver gets the message, session id and all
    with client.get_queue_receiver("doomed", sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=2) as dlq:
        (dead,) = dlq.receive_messages(max_message_count=1, max_wait_time=2)
        assert (str(dead), dead.session_id, dead.dead_letter_reason) == ("d1", "d", "bad")
        dlq.complete_message(dead)
