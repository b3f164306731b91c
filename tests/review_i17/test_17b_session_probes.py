"""Review of issue 17 (sessions): probes with the real azure-servicebus SDK against the real broker.

Service Bus session ids are not case-sensitive: a session receiver for ``ABC`` gets the messages sent with session
id ``abc``, and ``ABC`` and ``abc`` are one session (one lock, one state). Azure/azure-sdk-for-java#48759 ("Service
Bus sessionid is not case sensitive": the SDK had compared the message's and the link's session id exactly) and
Azure/durabletask#1334 (the service may hand a session id back in another casing)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import SessionCannotBeLockedError

from minibroker.testing.thread import ThreadedBroker, run_in_thread
from tests.servicebus.conftest import connection_string

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def client() -> Iterator[ServiceBusClient]:
    config = {"server": {"port": 0}, "broker": {"personality": "servicebus", "clock": "virtual"}}
    broker: ThreadedBroker
    with (
        run_in_thread(config) as broker,
        ServiceBusClient.from_connection_string(connection_string(broker.port), retry_total=0) as sb,
    ):
        yield sb


def _send(client: ServiceBusClient, queue: str, *messages: tuple[str, str]) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages([ServiceBusMessage(body, session_id=session) for body, session in messages])


def test_17b_a_session_receiver_gets_its_session_in_any_casing(client: ServiceBusClient) -> None:
    _send(client, "cased", ("lower", "abc"), ("upper", "ABC"), ("other", "abd"))
    with client.get_queue_receiver("cased", session_id="Abc", max_wait_time=2) as receiver:
        got = receiver.receive_messages(max_message_count=10, max_wait_time=2)
        assert sorted(str(m) for m in got) == ["lower", "upper"]
        for message in got:
            receiver.complete_message(message)


def test_17b_session_ids_differing_in_case_are_one_lock(client: ServiceBusClient) -> None:
    _send(client, "one-lock", ("m", "Session-1"))
    with client.get_queue_receiver("one-lock", session_id="session-1", max_wait_time=2) as holder:
        (message,) = holder.receive_messages(max_message_count=1, max_wait_time=2)
        with (
            pytest.raises(SessionCannotBeLockedError),
            client.get_queue_receiver("one-lock", session_id="SESSION-1", max_wait_time=2) as other,
        ):
            other.receive_messages(max_message_count=1, max_wait_time=1)
        holder.complete_message(message)


def test_17b_session_state_is_shared_across_casings(client: ServiceBusClient) -> None:
    with client.get_queue_receiver("stateful", session_id="Mixed", max_wait_time=1) as receiver:
        receiver.session.set_state(b"kept")
    with client.get_queue_receiver("stateful", session_id="mIXED", max_wait_time=1) as receiver:
        assert receiver.session.get_state() == b"kept"


def test_17b_next_available_skips_a_session_held_in_another_casing(client: ServiceBusClient) -> None:
    _send(client, "racing", ("first", "k"), ("second", "K"), ("third", "z"))
    with client.get_queue_receiver("racing", session_id="K", max_wait_time=2) as holder:
        held = holder.receive_messages(max_message_count=5, max_wait_time=2)
        assert sorted(str(m) for m in held) == ["first", "second"]
        with client.get_queue_receiver("racing", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=2) as nxt:
            assert nxt.session.session_id == "z"
            (third,) = nxt.receive_messages(max_message_count=5, max_wait_time=2)
            nxt.complete_message(third)
        for message in held:
            holder.complete_message(message)


def test_17b_a_one_mebibyte_state_round_trips(client: ServiceBusClient) -> None:
    """A state far larger than a frame (the SDK and the broker split and join the transfers)."""
    state = bytes(range(256)) * 4096
    with client.get_queue_receiver("big-state", session_id="s", max_wait_time=1) as receiver:
        receiver.session.set_state(state, timeout=20)
        assert receiver.session.get_state(timeout=20) == state


def test_17b_a_session_receiver_peeks_its_session_in_any_casing(client: ServiceBusClient) -> None:
    _send(client, "peeked", ("one", "abc"), ("two", "ABC"), ("other", "xyz"))
    with client.get_queue_receiver("peeked", session_id="aBc", max_wait_time=1) as receiver:
        assert sorted(str(m) for m in receiver.peek_messages(max_message_count=10, timeout=10)) == ["one", "two"]
