"""What the broker does with a message beyond moving it (DESIGN §5), through python-qpid-proton: expiry (header
ttl, properties absolute-expiry-time), priority, scheduled delivery (Artemis and Service Bus annotations),
dead-lettering and node limits. Timer behaviour over long spans is proven under a mock clock in
``tests/broker/test_timers.py``; here the spans are short and real.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from proton import Condition, Delivery, Message, symbol

from minibroker.testing.thread import ThreadedBroker
from tests.integration.helpers import queue_stats, section, wait_for
from tests.integration.proton_options import (
    assert_nothing_more,
    broker_with,
    connection,
    next_delivery,
    remote_condition,
    send_and_wait,
    send_raw_and_wait,
    take,
)

SHORT = 0.5
"""Seconds: a ttl or delay short enough to wait out, long enough to observe the message meanwhile (even on a
loaded machine)."""


def annotations_of(message: Message) -> dict[str, Any]:
    return {str(k): v for k, v in (message.annotations or {}).items()}


def scheduled(broker: ThreadedBroker, name: str) -> int:
    return broker.queue(name).stats().scheduled


def node_names(broker: ThreadedBroker) -> set[str]:
    return set(broker.queues) | set(broker.topics)


# -- expiry --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("field", ["ttl", "absolute-expiry-time"])
def test_expired_message_goes_to_the_expiry_address(field: str) -> None:
    with (
        broker_with(queues={"perishable": {"expiry_address": "expired"}}) as broker,
        connection(broker) as conn,
    ):
        expiry = {"ttl": SHORT} if field == "ttl" else {"expiry_time": time.time() + SHORT}
        sender = conn.create_sender("perishable")
        sender.send(Message(body="soon stale", **expiry))
        sender.send(Message(body="fresh"))
        assert queue_stats(broker, "perishable") == (2, 0)
        wait_for(lambda: queue_stats(broker, "perishable") == (1, 0), "the expiry", timeout=SHORT + 5)

        assert take(conn.create_receiver("perishable"), 1) == ["fresh"]  # the expired one is never delivered
        expired = conn.create_receiver("expired").receive()
        assert expired.body == "soon stale"
        assert annotations_of(expired)["x-opt-original-address"] == "perishable"


def test_message_expired_on_arrival_is_never_visible(broker: ThreadedBroker) -> None:
    with connection(broker) as conn:
        sender = conn.create_sender("stale")
        delivery = sender.send(Message(body="already stale", expiry_time=time.time() - 60))
        assert delivery.remote_state == Delivery.ACCEPTED  # taken, then dropped: no expiry address is set
        sender.send(Message(body="ok"))
        assert queue_stats(broker, "stale") == (1, 0)
        receiver = conn.create_receiver("stale")
        assert take(receiver, 1) == ["ok"]
        assert_nothing_more(receiver)


def test_message_expiring_while_delivered_is_not_redelivered() -> None:
    with broker_with(queues={"held": {"expiry_address": "held.expired"}}) as broker, connection(broker) as conn:
        conn.create_sender("held").send(Message(body="short-lived", ttl=SHORT))
        receiver = conn.create_receiver("held", credit=1)
        assert receiver.receive().body == "short-lived"
        time.sleep(SHORT + 0.05)
        receiver.release()  # it comes back after its expiry: to the expiry address, not to us
        wait_for(lambda: queue_stats(broker, "held.expired") == (1, 0), "the expiry", conn=conn)
        assert queue_stats(broker, "held") == (0, 0)
        assert_nothing_more(receiver)


# -- priority ------------------------------------------------------------------------------------------------
def test_higher_priority_first_and_fifo_within_a_priority(broker: ThreadedBroker) -> None:
    sent = [(1, "low-a"), (9, "top-a"), (None, "no-header"), (4, "four"), (0, "lowest"), (9, "top-b"),
            (1, "low-b"), (None, "no-header-b")]  # fmt: skip
    with connection(broker) as conn:
        sender = conn.create_sender("ranked")
        for priority, body in sent:
            if priority is None:  # no header section at all: header.priority absent means 4 (Part 3 §3.2.1)
                send_raw_and_wait(conn, sender, section(0x77, body))  # an amqp-value body only
            else:
                sender.send(Message(body=body, priority=priority))
        got = take(conn.create_receiver("ranked", credit=10), len(sent))
    assert got == ["top-a", "top-b", "no-header", "four", "no-header-b", "low-a", "low-b", "lowest"]


def test_released_message_keeps_its_place_among_priorities(broker: ThreadedBroker) -> None:
    with connection(broker) as conn:
        sender = conn.create_sender("ranked-again")
        for priority, body in [(5, "first"), (5, "second"), (2, "low")]:
            sender.send(Message(body=body, priority=priority))
        receiver = conn.create_receiver("ranked-again")  # no prefetch: one credit per receive()
        assert receiver.receive().body == "first"
        receiver.release()
        wait_for(lambda: queue_stats(broker, "ranked-again") == (3, 0), "the release", conn=conn)
        assert take(receiver, 3) == ["first", "second", "low"]


# -- scheduled delivery --------------------------------------------------------------------------------------
def schedule(annotation: str) -> dict[symbol, int]:
    """The message-annotations that make a message visible SHORT seconds from now."""
    if annotation == "x-opt-delivery-delay":
        return {symbol(annotation): int(SHORT * 1000)}  # ms after arrival
    return {symbol(annotation): int((time.time() + SHORT) * 1000)}  # a wall-clock instant in ms


@pytest.mark.parametrize("annotation", ["x-opt-delivery-delay", "x-opt-delivery-time", "x-opt-scheduled-enqueue-time"])
def test_scheduled_message_is_invisible_until_due(broker: ThreadedBroker, annotation: str) -> None:
    with connection(broker) as conn:
        sender = conn.create_sender("later")
        started = time.monotonic()
        sender.send(Message(body="scheduled", annotations=schedule(annotation)))
        assert queue_stats(broker, "later") == (0, 0)  # not ready, not delivered...
        assert scheduled(broker, "later") == 1  # ...but held
        sender.send(Message(body="now"))
        receiver = conn.create_receiver("later", credit=10)
        assert receiver.receive().body == "now"
        receiver.accept()
        message = receiver.receive(timeout=SHORT + 5)
        assert time.monotonic() - started >= SHORT - 0.05  # (the wall clock and trio's may differ by a hair)
        receiver.accept()
        assert message.body == "scheduled"
        wait_for(
            lambda: scheduled(broker, "later") == 0 and queue_stats(broker, "later") == (0, 0), "the accept", conn=conn
        )


def test_delivery_time_in_the_past_is_visible_at_once(broker: ThreadedBroker) -> None:
    with connection(broker) as conn:
        past = {symbol("x-opt-delivery-time"): int((time.time() - 60) * 1000)}
        conn.create_sender("overdue").send(Message(body="overdue", annotations=past))
        assert queue_stats(broker, "overdue") == (1, 0)
        assert scheduled(broker, "overdue") == 0


# -- dead-lettering --------------------------------------------------------------------------------------------
def test_rejected_message_is_dead_lettered_with_the_reason(broker: ThreadedBroker) -> None:
    with connection(broker) as conn:
        conn.create_sender("orders").send(Message(body="bad order", id="o-1"))
        receiver = conn.create_receiver("orders")
        assert receiver.receive().body == "bad order"
        delivery = next_delivery(receiver)
        delivery.local.condition = Condition("app:invalid", "cannot parse the order")
        delivery.update(Delivery.REJECTED)
        delivery.settle()
        dead = conn.create_receiver("orders.DLQ").receive()
        assert (dead.body, dead.id) == ("bad order", "o-1")
        assert annotations_of(dead) == {
            "x-opt-dead-letter-reason": "rejected",
            "x-opt-dead-letter-description": "cannot parse the order",
            "x-opt-original-address": "orders",
        }
        assert queue_stats(broker, "orders") == (0, 0)


@pytest.mark.parametrize(("policy", "attempts"), [({}, 10), ({"max_delivery_attempts": 3}, 3)])
def test_failed_deliveries_past_the_limit_are_dead_lettered(policy: dict[str, Any], attempts: int) -> None:
    with broker_with(queues={"flaky": policy}) as broker, connection(broker) as conn:
        conn.create_sender("flaky").send(Message(body="poison"))
        receiver = conn.create_receiver("flaky", credit=1)
        counts = []
        for _ in range(attempts):
            message = receiver.receive()
            counts.append(message.delivery_count)
            delivery = next_delivery(receiver)
            delivery.local.failed = True
            delivery.update(Delivery.MODIFIED)
            delivery.settle()
        assert counts == list(range(attempts))
        assert_nothing_more(receiver)
        assert queue_stats(broker, "flaky") == (0, 0)
        dead = conn.create_receiver("flaky.DLQ").receive()
        assert dead.body == "poison"
        assert annotations_of(dead)["x-opt-dead-letter-reason"] == "max-delivery-attempts"
        assert annotations_of(dead)["x-opt-original-address"] == "flaky"
        assert "x-opt-dead-letter-description" in annotations_of(dead)


def test_released_deliveries_do_not_count_as_failed_attempts() -> None:
    with broker_with(queues={"patient": {"max_delivery_attempts": 2}}) as broker, connection(broker) as conn:
        conn.create_sender("patient").send(Message(body="again"))
        receiver = conn.create_receiver("patient", credit=1)
        for _ in range(4):
            assert receiver.receive().delivery_count == 0
            receiver.release(delivered=False)
        assert take(receiver, 1) == ["again"]
        assert "patient.DLQ" not in node_names(broker)


@pytest.mark.parametrize(("address", "dead_letters"), [("graveyard", "graveyard"), ("", None)])
def test_configured_dead_letter_address(address: str, dead_letters: str | None) -> None:
    with broker_with(queues={"jobs": {"dead_letter_address": address}}) as broker, connection(broker) as conn:
        conn.create_sender("jobs").send(Message(body="doomed"))
        receiver = conn.create_receiver("jobs")
        receiver.receive()
        receiver.reject()
        wait_for(lambda: queue_stats(broker, "jobs") == (0, 0), "the rejection", conn=conn)
        assert "jobs.DLQ" not in node_names(broker)
        if dead_letters is None:  # "" disables dead-lettering: the message is dropped
            assert node_names(broker) == {"jobs"}
        else:
            assert take(conn.create_receiver(dead_letters), 1) == ["doomed"]


def test_undeliverable_here_goes_to_another_consumer(broker: ThreadedBroker) -> None:
    with connection(broker) as conn:
        conn.create_sender("picky").send(Message(body="not for me"))
        refuser = conn.create_receiver("picky", name="refuser", credit=5)
        assert refuser.receive().body == "not for me"
        delivery = next_delivery(refuser)
        delivery.local.undeliverable = True
        delivery.update(Delivery.MODIFIED)
        delivery.settle()
        wait_for(lambda: queue_stats(broker, "picky") == (1, 0), "the message to come back", conn=conn)
        assert_nothing_more(refuser)  # it has credit, but the message is not for it any more

        other = conn.create_receiver("picky", name="other")
        message = other.receive()
        other.accept()
        assert (message.body, message.delivery_count) == ("not for me", 0)  # not a failed delivery
        wait_for(lambda: queue_stats(broker, "picky") == (0, 0), "the accept", conn=conn)


# -- node limits ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("limit", [{"max_messages": 2}, {"max_bytes": 2 * 120}])
def test_reject_publish_at_the_limit(limit: dict[str, int]) -> None:
    body = "x" * 100  # each message encodes to a little over 100 bytes
    with broker_with(queues={"small": {**limit, "overflow": "reject-publish"}}) as broker, connection(broker) as conn:
        sender = conn.create_sender("small")
        outcomes = [send_and_wait(conn, sender, Message(body=body, id=i)) for i in range(3)]
        assert [d.remote_state for d in outcomes] == [Delivery.ACCEPTED, Delivery.ACCEPTED, Delivery.REJECTED]
        assert remote_condition(outcomes[2]) == "amqp:resource-limit-exceeded"
        assert queue_stats(broker, "small") == (2, 0)

        receiver = conn.create_receiver("small")  # no prefetch: one credit per receive()
        message = receiver.receive()  # delivered but not settled: still held, still counted
        assert send_and_wait(conn, sender, Message(body=body)).remote_state == Delivery.REJECTED
        receiver.accept()
        wait_for(lambda: queue_stats(broker, "small")[1] == 0, "the accept", conn=conn)
        assert send_and_wait(conn, sender, Message(body=body, id=3)).remote_state == Delivery.ACCEPTED
        assert message.id == 0


def test_drop_head_drops_the_oldest_ready_message() -> None:
    with (
        broker_with(queues={"ring": {"max_messages": 2, "overflow": "drop-head"}}) as broker,
        connection(broker) as conn,
    ):
        sender = conn.create_sender("ring")
        for i in range(5):
            assert send_and_wait(conn, sender, Message(body=i)).remote_state == Delivery.ACCEPTED
        assert queue_stats(broker, "ring") == (2, 0)
        receiver = conn.create_receiver("ring", credit=5)
        assert take(receiver, 2) == [3, 4]
        assert_nothing_more(receiver)


def test_topic_limit_applies_to_each_subscription() -> None:
    with broker_with(topics={"feed": {"max_messages": 1}}) as broker, connection(broker) as conn:
        slow = conn.create_receiver("feed", name="slow", credit=0)
        sender = conn.create_sender("feed")
        assert send_and_wait(conn, sender, Message(body=1)).remote_state == Delivery.ACCEPTED
        full = send_and_wait(conn, sender, Message(body=2))
        assert (full.remote_state, remote_condition(full)) == (Delivery.REJECTED, "amqp:resource-limit-exceeded")
        slow.flow(5)
        assert take(slow, 1) == [1]

        def held() -> int:
            return sum(s.held for s in broker.topic("feed").subscriptions())

        wait_for(lambda: held() == 0, "the accept", conn=conn)
        assert send_and_wait(conn, sender, Message(body=3)).remote_state == Delivery.ACCEPTED
        assert take(slow, 1) == [3]
