"""Configured Service Bus entities and SAS keys (issue 17 items 1, 5 and 11) with the real azure-servicebus SDK: the
emulator's ``Config.json`` (tests/servicebus/data/Config.json) sets lock durations, max delivery counts and message
time-to-live per entity, its topics and subscriptions exist from the start, a wrong SAS key is refused at once, and
no emulator quota (10 connections, 50 entities) applies. Locks and expiry on the virtual clock."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.amqp import AmqpMessageHeader
from azure.servicebus.exceptions import ServiceBusAuthenticationError, ServiceBusError

from minibroker.testing.thread import ThreadedBroker, run_in_thread
from tests.servicebus.conftest import connection_string

pytestmark = pytest.mark.timeout(60)
FIXTURE = Path(__file__).parent / "data" / "Config.json"


@pytest.fixture
def configured() -> Iterator[ThreadedBroker]:
    """A broker given only the emulator's file (no personality named: the file makes it ``servicebus``), on the
    virtual clock."""
    with run_in_thread(
        {"server": {"port": 0}, "broker": {"clock": "virtual"}, "servicebus": {"config": str(FIXTURE)}}
    ) as broker:
        yield broker


@pytest.fixture
def sb(configured: ThreadedBroker) -> Iterator[ServiceBusClient]:
    with ServiceBusClient.from_connection_string(connection_string(configured.port)) as client:
        yield client


def _send(client: ServiceBusClient, queue: str, body: str, **fields: Any) -> None:
    with client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage(body, **fields))


def test_configured_lock_duration(configured: ThreadedBroker, sb: ServiceBusClient) -> None:
    _send(sb, "invoices", "a")
    with sb.get_queue_receiver("invoices") as receiver:
        (first,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert first.locked_until_utc is not None
        assert abs(first.locked_until_utc.timestamp() - (configured.clock.now + 5)) < 1  # PT5S, not 60 s
        configured.clock.advance(6)
        (again,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert (str(again), again.delivery_count) == ("a", 1)
        receiver.complete_message(again)


def test_an_unconfigured_queue_keeps_the_defaults(configured: ThreadedBroker, sb: ServiceBusClient) -> None:
    _send(sb, "plain", "b")
    configured.clock.advance(3600 * 24)  # no time-to-live: still there a day later
    with sb.get_queue_receiver("plain") as receiver:
        (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert message.locked_until_utc is not None
        assert abs(message.locked_until_utc.timestamp() - (configured.clock.now + 60)) < 1
        receiver.complete_message(message)


def test_configured_max_delivery_count(sb: ServiceBusClient) -> None:
    _send(sb, "invoices", "c")
    with sb.get_queue_receiver("invoices") as receiver:
        for _ in range(2):
            (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            receiver.abandon_message(message)
        assert receiver.receive_messages(max_message_count=1, max_wait_time=0.5) == []
    with sb.get_queue_receiver("invoices", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as receiver:
        (dead,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert (str(dead), dead.dead_letter_reason) == ("c", "MaxDeliveryCountExceeded")
        receiver.complete_message(dead)


def test_default_time_to_live_dead_letters_on_expiry(configured: ThreadedBroker, sb: ServiceBusClient) -> None:
    # DefaultMessageTimeToLive PT10M, DeadLetteringOnMessageExpiration true: a message lives its own shorter ttl,
    # else ten minutes (a longer ttl of its own is cut down to the entity's, as Service Bus does)
    _send(sb, "invoices", "none")
    _send(sb, "invoices", "short", time_to_live=timedelta(minutes=5))
    _send(sb, "invoices", "long", time_to_live=timedelta(hours=2))
    with sb.get_queue_receiver("invoices", sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dead_letters:
        configured.clock.advance(301)
        (short,) = dead_letters.receive_messages(max_message_count=3, max_wait_time=5)
        assert str(short) == "short"
        assert short.dead_letter_reason == "TTLExpiredException"
        assert short.dead_letter_source == "invoices"
        dead_letters.complete_message(short)
        configured.clock.advance(300)
        found = dead_letters.receive_messages(max_message_count=3, max_wait_time=5)
        if len(found) < 2:
            found += dead_letters.receive_messages(max_message_count=3, max_wait_time=5)
        assert sorted(str(m) for m in found) == ["long", "none"]
        assert {m.dead_letter_reason for m in found} == {"TTLExpiredException"}
        for message in found:
            dead_letters.complete_message(message)
    assert configured.queue("invoices").depth == 0


def test_declared_topic_and_subscriptions_exist_before_first_use(
    configured: ThreadedBroker, sb: ServiceBusClient
) -> None:
    assert "shipments" in configured.topics
    assert {"invoices", "plain"} <= set(configured.queues)
    # a sender attaching first to a configured topic: a topic, and its subscriptions already take messages
    with sb.get_topic_sender("shipments") as sender:
        message = ServiceBusMessage(
            "crate", subject="north", application_properties={"priority": "high", "weight": 500}
        )
        sender.send_messages(message)
    for name in ("by-region", "large"):
        with sb.get_subscription_receiver("shipments", name) as receiver:
            (got,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            assert str(got) == "crate"
            receiver.complete_message(got)


def test_configured_subscription_lock_duration(configured: ThreadedBroker, sb: ServiceBusClient) -> None:
    with sb.get_topic_sender("shipments") as sender:
        sender.send_messages(ServiceBusMessage("box", subject="north", application_properties={"priority": "high"}))
    with sb.get_subscription_receiver("shipments", "by-region") as receiver:
        (got,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert got.locked_until_utc is not None
        assert abs(got.locked_until_utc.timestamp() - (configured.clock.now + 120)) < 1  # PT2M
        receiver.complete_message(got)


# -- SAS keys -----------------------------------------------------------------------------------------------------
def _with_key(port: int, key: str) -> str:
    return connection_string(port).replace("SharedAccessKey=SAS_KEY_VALUE", f"SharedAccessKey={key}")


@pytest.fixture
def keyed() -> Iterator[ThreadedBroker]:
    config = {"server": {"port": 0}, "servicebus": {"sas_keys": {"RootManageSharedAccessKey": "SAS_KEY_VALUE"}}}
    with run_in_thread(config) as broker:
        yield broker


def test_the_right_sas_key_is_accepted(keyed: ThreadedBroker) -> None:
    with ServiceBusClient.from_connection_string(_with_key(keyed.port, "SAS_KEY_VALUE")) as client:
        _send(client, "guarded", "ok")
        with client.get_queue_receiver("guarded") as receiver:
            (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            receiver.complete_message(message)


@pytest.mark.parametrize(
    "connection",
    [
        lambda port: _with_key(port, "not-the-key"),
        lambda port: connection_string(port).replace("RootManageSharedAccessKey", "SomeOtherPolicy"),
    ],
)
def test_a_wrong_sas_key_is_refused_at_once(keyed: ThreadedBroker, connection: Any) -> None:
    started = time.monotonic()
    client = ServiceBusClient.from_connection_string(connection(keyed.port), retry_total=0)
    with client, pytest.raises(ServiceBusAuthenticationError), client.get_queue_sender("guarded") as sender:
        sender.send_messages(ServiceBusMessage("no"))
    assert time.monotonic() - started < 10  # answered 401 at once, not left to time out
    assert keyed.queue("guarded").depth == 0


# -- no quotas ----------------------------------------------------------------------------------------------------
def test_more_than_ten_connections_and_fifty_entities(sb_broker: ThreadedBroker) -> None:
    clients = [ServiceBusClient.from_connection_string(connection_string(sb_broker.port)) for _ in range(11)]

    def send(i: int) -> None:  # each sender on its own connection of client i % 11; opened in parallel (cheaply)
        with clients[i % 11].get_queue_sender(f"many-{i}") as sender:
            sender.send_messages(ServiceBusMessage("x"))

    senders = [client.get_queue_sender(f"many-{i}") for i, client in enumerate(clients)]
    try:
        with ThreadPoolExecutor(11) as pool:
            list(pool.map(lambda sender: sender.send_messages(ServiceBusMessage("x")), senders))
            assert len(sb_broker.connections) >= 11  # all open at once (the emulator's cap is 10)
            list(pool.map(send, range(11, 52)))  # 52 queues (the emulator's cap is 50 entities)
    finally:
        for sender in senders:
            sender.close()
        for client in clients:
            client.close()
    assert all(sb_broker.queue(f"many-{i}").depth == 1 for i in range(52))


# -- rules from the configuration, end to end -----------------------------------------------------------------------
_PARCELS_JSON = """{
  "UserConfig": {
    "Namespaces": [{
      "Name": "sbemulatorns",
      "Queues": [],
      "Topics": [{
        "Name": "parcels",
        "Subscriptions": [
          {"Name": "heavy", "Rules": [
            {"Name": "weight", "Properties": {"FilterType": "Sql", "SqlFilter": {"SqlExpression": "weight > 100"}}}]},
          {"Name": "eu", "Rules": [
            {"Name": "region", "Properties": {"FilterType": "Correlation",
              "CorrelationFilter": {"Label": "parcel", "Properties": {"region": "eu"}}}}]},
          {"Name": "both", "Rules": [
            {"Name": "tag-heavy", "Properties": {"FilterType": "Sql", "SqlFilter": {"SqlExpression": "weight > 100"},
              "Action": {"SqlExpression": "SET tag = 'heavy'"}}},
            {"Name": "any-eu", "Properties": {"FilterType": "Correlation",
              "CorrelationFilter": {"Properties": {"region": "eu"}}}}]}
        ]
      }]
    }],
    "Logging": {"Type": "Console"}
  }
}
"""
_PARCELS_TOML = """
[servicebus.topics.parcels.subscriptions.heavy]
rules = [{ name = "weight", sql_filter = "weight > 100" }]
[servicebus.topics.parcels.subscriptions.eu]
rules = [{ name = "region", correlation_filter = { label = "parcel", properties = { region = "eu" } } }]
[servicebus.topics.parcels.subscriptions.both]
rules = [
  { name = "tag-heavy", sql_filter = "weight > 100", action = "SET tag = 'heavy'" },
  { name = "any-eu", correlation_filter = { properties = { region = "eu" } } },
]
"""


@pytest.mark.parametrize("form", ["Config.json", "toml"])
def test_configured_rules_route_each_message(form: str, tmp_path: Path) -> None:
    """A topic declared with a SQL-rule subscription, a correlation-rule subscription and one with both (the SQL
    rule with an action), from the emulator's Config.json or from ``[servicebus]`` TOML: each subscription gets
    exactly the messages its rules match, the action's rule its own rewritten copy (``RuleName``)."""
    if form == "toml":
        (tmp_path / "minibroker.toml").write_text(
            '[server]\nport = 0\n[broker]\nclock = "virtual"\n' + _PARCELS_TOML, encoding="utf-8"
        )
        config: Any = tmp_path / "minibroker.toml"
    else:
        (tmp_path / "Config.json").write_text(_PARCELS_JSON, encoding="utf-8")
        config = {"server": {"port": 0}, "servicebus": {"config": str(tmp_path / "Config.json")}}
    parcels = {"us-heavy": ("us", 500), "eu-light": ("eu", 5), "eu-heavy": ("eu", 500), "us-light": ("us", 5)}
    with (
        run_in_thread(config) as broker,
        ServiceBusClient.from_connection_string(connection_string(broker.port)) as client,
    ):
        with client.get_topic_sender("parcels") as sender:
            sender.send_messages(
                [
                    ServiceBusMessage(body, subject="parcel", application_properties={"region": r, "weight": w})
                    for body, (r, w) in parcels.items()
                ]
            )
        got: dict[str, list[tuple[str, Any]]] = {}
        for name, count in (("heavy", 2), ("eu", 2), ("both", 4)):
            with client.get_subscription_receiver("parcels", name) as receiver:
                found: list[tuple[str, Any]] = []
                while len(found) < count:
                    batch = receiver.receive_messages(max_message_count=count - len(found), max_wait_time=5)
                    assert batch, f"{name}: only {found} arrived"
                    for message in batch:
                        found.append((str(message), (message.application_properties or {}).get(b"RuleName")))
                        receiver.complete_message(message)
                assert receiver.peek_messages(10) == [], f"{name}: more than {found}"
                got[name] = sorted(found, key=repr)
    assert got["heavy"] == [("eu-heavy", None), ("us-heavy", None)]
    assert got["eu"] == [("eu-heavy", None), ("eu-light", None)]
    assert got["both"] == sorted(
        [("us-heavy", b"tag-heavy"), ("eu-light", None), ("eu-heavy", None), ("eu-heavy", b"tag-heavy")], key=repr
    )


def test_rule_copies_outlive_a_restart(tmp_path: Path) -> None:
    """With a journal, each copy a subscription took (its rule action's rewritten one too) is recovered after a
    restart, each with its own sequence number."""
    (tmp_path / "Config.json").write_text(_PARCELS_JSON, encoding="utf-8")
    config = {
        "server": {"port": 0},
        "data_dir": str(tmp_path / "data"),
        "servicebus": {"config": str(tmp_path / "Config.json")},
    }
    with (
        run_in_thread(config) as broker,
        ServiceBusClient.from_connection_string(connection_string(broker.port)) as client,
        client.get_topic_sender("parcels") as sender,
    ):
        message = ServiceBusMessage(
            "eu-heavy", subject="parcel", application_properties={"region": "eu", "weight": 500}
        )
        message.raw_amqp_message.header = AmqpMessageHeader(durable=True)  # the SDK sends none: journaled only so
        sender.send_messages(message)
    with (
        run_in_thread(config) as broker,
        ServiceBusClient.from_connection_string(connection_string(broker.port)) as client,
        client.get_subscription_receiver("parcels", "both") as receiver,
    ):
        found = []
        while len(found) < 2:
            batch = receiver.receive_messages(max_message_count=2 - len(found), max_wait_time=5)
            assert batch, f"only {found} arrived"
            for message in batch:
                rule = (message.application_properties or {}).get(b"RuleName")
                found.append((str(message), rule, message.sequence_number))
                receiver.complete_message(message)
        assert receiver.peek_messages(10) == []
    assert sorted(((body, rule) for body, rule, _ in found), key=repr) == [
        ("eu-heavy", None),
        ("eu-heavy", b"tag-heavy"),
    ]
    assert len({seq for _, _, seq in found}) == 2


_SESSIONS_JSON = """{
  "UserConfig": {
    "Namespaces": [{
      "Name": "sbemulatorns",
      "Queues": [{"Name": "sessions", "Properties": {"RequiresSession": true}}],
      "Topics": [{"Name": "news", "Subscriptions": [
        {"Name": "ordered", "Properties": {"RequiresSession": true}}, {"Name": "all"}]}]
    }]
  }
}
"""
_SESSIONS_TOML = """
[servicebus.queues.sessions]
requires_session = true
[servicebus.topics.news.subscriptions.ordered]
requires_session = true
[servicebus.topics.news.subscriptions.all]
"""


def _sessions_broker(form: str, tmp_path: Path) -> Any:
    """A broker configured with the session queue ``sessions`` and topic ``news`` (subscription ``ordered``
    requires sessions, ``all`` does not), from Config.json or from ``[servicebus]`` TOML."""
    if form == "toml":
        (tmp_path / "minibroker.toml").write_text(
            '[server]\nport = 0\n[broker]\nclock = "virtual"\n' + _SESSIONS_TOML, encoding="utf-8"
        )
        return run_in_thread(tmp_path / "minibroker.toml")
    (tmp_path / "Config.json").write_text(_SESSIONS_JSON, encoding="utf-8")
    return run_in_thread({"server": {"port": 0}, "servicebus": {"config": str(tmp_path / "Config.json")}})


@pytest.mark.parametrize("form", ["Config.json", "toml"])
def test_configured_requires_session(form: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """``RequiresSession`` (``requires_session``) on a queue and on a subscription: a plain receiver and a message
    without a session id are refused, a session receiver gets its session's messages; no warning lists it."""
    with (
        caplog.at_level(logging.WARNING, logger="minibroker"),
        _sessions_broker(form, tmp_path) as broker,
        ServiceBusClient.from_connection_string(connection_string(broker.port), retry_total=0) as client,
    ):
        with pytest.raises(ServiceBusError), client.get_queue_sender("sessions") as sender:
            sender.send_messages(ServiceBusMessage("no session"), timeout=10)
        for plain in (client.get_queue_receiver("sessions"), client.get_subscription_receiver("news", "ordered")):
            with pytest.raises(ServiceBusError), plain as receiver:
                receiver.receive_messages(max_message_count=1, max_wait_time=1)
        with client.get_queue_sender("sessions") as sender:
            sender.send_messages(ServiceBusMessage("q", session_id="s"))
        with client.get_topic_sender("news") as sender:
            sender.send_messages(ServiceBusMessage("t", session_id="s"))
        for session in (
            client.get_queue_receiver("sessions", session_id="s"),
            client.get_subscription_receiver("news", "ordered", session_id="s"),
        ):
            with session as receiver:
                (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
                assert message.session_id == "s"
                receiver.complete_message(message)
    warned = [r.getMessage() for r in caplog.records]
    assert not [w for w in warned if "RequiresSession" in w or "requires_session" in w]


@pytest.mark.parametrize("form", ["Config.json", "toml"])
def test_a_message_without_session_id_is_dead_lettered_in_a_session_subscription(form: str, tmp_path: Path) -> None:
    """A message without a session id published to a topic: a subscription that requires sessions dead-letters
    its copy (reason "Session id is null.", as Azure/azure-service-bus#196 reports Service Bus doing), the
    others take it as usual."""
    with (
        _sessions_broker(form, tmp_path) as broker,
        ServiceBusClient.from_connection_string(connection_string(broker.port), retry_total=0) as client,
    ):
        with client.get_topic_sender("news") as sender:
            sender.send_messages(ServiceBusMessage("loose"), timeout=10)
        with client.get_subscription_receiver("news", "all") as receiver:
            (message,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            assert str(message) == "loose"
            receiver.complete_message(message)
        dead_letters = client.get_subscription_receiver("news", "ordered", sub_queue=ServiceBusSubQueue.DEAD_LETTER)
        with dead_letters as receiver:
            (dead,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
            assert (str(dead), dead.dead_letter_reason) == ("loose", "Session id is null.")
            assert dead.dead_letter_error_description is not None
            assert "session identifier is null" in dead.dead_letter_error_description
            assert dead.dead_letter_source == "news/Subscriptions/ordered"
            receiver.complete_message(dead)

        def held(running: Any) -> dict[str, int]:
            topic = running.broker.nodes.default.node("news")
            return {sub.name.rsplit(":", 1)[-1]: sub.held for sub in topic.subscriptions.values()}

        assert broker.call(held) == {"ordered": 0, "all": 0}  # nothing left behind in the subscriptions
