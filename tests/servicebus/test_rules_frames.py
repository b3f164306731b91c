"""Subscription rules at the frame level (the in-memory driver): ``add-rule``, ``remove-rule`` and
``enumerate-rules`` on ``TOPIC/Subscriptions/NAME/$management`` encoded as the JS SDK sends and reads them
(``core/managementClient.ts`` ``addRule`` / ``removeRule`` / ``getRules``), and what the rules let through."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest

from minibroker.amqp import codec, sections
from minibroker.amqp.definitions import (
    Accepted,
    AmqpValue,
    ApplicationProperties,
    Header,
    Properties,
    TransactionalState,
)
from minibroker.amqp.types import Described, Int, Timestamp, UInt, ULong
from minibroker.broker.policy import NodePolicy
from minibroker.broker.topic import Topic
from minibroker.servicebus.entities import EntityProperties, RuleSpec
from minibroker.servicebus.rules import Rule
from tests.broker.txn_driver import Peer, World
from tests.personalities.harness import declare, discharge, peer, world

pytestmark = pytest.mark.timeout(30)

SUBSCRIPTION = "events/Subscriptions/audit"
NODE = f"amqps://127.0.0.1:5672/{SUBSCRIPTION}/$management"
REPLY_TO = "a-reply-to-guid"  # the JS SDK's reply-to: a link address of its own, not the node


def _request(operation: str, body: dict[str, Any], message_id: Any = None) -> bytes:
    """A request as the JS SDK sends it: a string message-id, reply-to its own address, ``operation``."""
    return (
        codec.encode(Properties(message_id=message_id or str(uuid.uuid4()), reply_to=REPLY_TO))
        + codec.encode(ApplicationProperties({"operation": operation, "com.microsoft:tracking-id": "t"}))
        + codec.encode(AmqpValue(body))
    )


def _message(subject: str | None = None, **properties: Any) -> bytes:
    return (
        codec.encode(Properties(message_id=str(uuid.uuid4()), subject=subject))
        + codec.encode(ApplicationProperties(properties))
        + codec.encode(AmqpValue("body"))
    )


def _rules_world(personality: str = "servicebus") -> tuple[World, Peer]:
    w = world(personality)
    p = peer(w)
    p.attach_consumer("audit", SUBSCRIPTION, presettled=True, default_outcome=None)
    p.attach_producer("events-in", "events")
    p.attach_producer("mgmt-req", NODE)
    p.attach_consumer("mgmt-resp", NODE, presettled=False, default_outcome=None)
    w.settle()
    p.flow("mgmt-resp", 100)
    w.settle()
    return w, p


def _ask(w: World, p: Peer, operation: str, body: dict[str, Any]) -> tuple[dict[Any, Any], Any]:
    """Send one request; the (application-properties, body value) of its answer."""
    message_id = str(uuid.uuid4())
    before = len([c for c in p.observed.completed if c.link == "mgmt-resp"])
    p.transfer("mgmt-req", _request(operation, body, message_id))
    observed = w.settle()[p]
    answers = [c for c in observed.completed if c.link == "mgmt-resp"]
    assert len(answers) == 1 or before, answers
    properties, pos = codec.decode(answers[-1].payload)
    application, pos = codec.decode(answers[-1].payload, pos)
    value, _ = codec.decode(answers[-1].payload, pos)
    assert isinstance(properties, Properties)
    assert properties.correlation_id == message_id
    assert isinstance(application, ApplicationProperties)
    assert isinstance(value, AmqpValue)
    return application.value, value.value


def _add(w: World, p: Peer, name: Any, description: Any) -> dict[Any, Any]:
    status, _ = _ask(w, p, "com.microsoft:add-rule", {"rule-name": name, "rule-description": description})
    return status


def _sql(expression: str) -> dict[str, Any]:
    return {"sql-filter": {"expression": expression}}


def _delivered(w: World, p: Peer, *messages: bytes) -> list[Any]:
    """Publish ``messages`` to the topic; the subjects of those the subscription got."""
    for message in messages:
        p.transfer("events-in", message)
    p.flow("audit", len(messages) + 1)
    observed = w.settle()[p]
    got = []
    for completed in observed.completed:
        if completed.link == "audit":
            (properties,) = [
                codec.decode(completed.payload, s.start)[0]
                for s in sections.walk(completed.payload)
                if s.code == sections.PROPERTIES
            ]
            got.append(properties.subject)
    return got


def _names(value: Any) -> list[str]:
    return [entry["rule-description"].value[2] for entry in value["rules"]]


def test_enumerate_rules_gives_default_as_js_reads_it() -> None:
    w, p = _rules_world()
    status, value = _ask(w, p, "com.microsoft:enumerate-rules", {"top": Int(2**31 - 1), "skip": Int(0)})
    assert status["statusCode"] == status["status-code"] == 200
    (entry,) = value["rules"]
    description = entry["rule-description"]
    assert isinstance(description, Described)
    assert description.descriptor == ULong(0x0000013700000004)
    rule_filter, action, name, created = description.value
    assert (rule_filter.descriptor, rule_filter.value) == (ULong(0x0000001370000007), [])  # the true filter
    assert (action.descriptor, action.value) == (ULong(0x0000013700000005), [])  # the empty rule action
    assert name == "$Default"
    assert isinstance(created, Timestamp)


def test_add_sql_rule_filters_and_enumerates() -> None:
    w, p = _rules_world()
    assert _add(w, p, "red", _sql("color = 'red' AND sys.Label LIKE 'o%'"))["statusCode"] == 200
    assert _ask(w, p, "com.microsoft:remove-rule", {"rule-name": "$Default"})[0]["statusCode"] == 200
    got = _delivered(
        w, p, _message("one", color="red"), _message("two", color="blue"), _message("x3", color="red"), _message("o4")
    )
    assert got == ["one"]
    _, value = _ask(w, p, "com.microsoft:enumerate-rules", {"top": Int(10), "skip": Int(0)})
    (entry,) = value["rules"]
    sql_filter = entry["rule-description"].value[0]
    assert sql_filter.descriptor == ULong(0x0000001370000006)
    assert sql_filter.value[0] == "color = 'red' AND sys.Label LIKE 'o%'"


def test_correlation_rule_as_js_sends_it() -> None:
    w, p = _rules_world()
    description = {
        "correlation-filter": {
            "correlation-id": None,
            "message-id": None,
            "to": None,
            "reply-to": None,
            "label": "hit",
            "session-id": None,
            "reply-to-session-id": None,
            "content-type": None,
            "properties": {"region": "eu"},
        }
    }
    assert _add(w, p, "corr", description)["statusCode"] == 200
    _ask(w, p, "com.microsoft:remove-rule", {"rule-name": "$Default"})
    got = _delivered(
        w, p, _message("hit", region="eu"), _message("hit", region="us"), _message("miss", region="eu"), _message("hit")
    )
    assert got == ["hit"]
    _, value = _ask(w, p, "com.microsoft:enumerate-rules", {"top": Int(10), "skip": Int(0)})
    (entry,) = value["rules"]
    correlation = entry["rule-description"].value[0]
    assert correlation.descriptor == ULong(0x0000001370000009)
    assert correlation.value == [None, None, None, None, "hit", None, None, None, {"region": "eu"}]


def test_any_rule_matching_delivers_once() -> None:
    w, p = _rules_world()
    _add(w, p, "a", _sql("n > 1"))
    _add(w, p, "b", _sql("n > 2"))
    _ask(w, p, "com.microsoft:remove-rule", {"rule-name": "$Default"})
    assert _delivered(w, p, _message("one", n=1), _message("three", n=3)) == ["three"]


def test_default_removed_delivers_nothing_and_enumerate_is_204() -> None:
    w, p = _rules_world()
    status, _ = _ask(w, p, "com.microsoft:remove-rule", {"rule-name": "$Default"})
    assert status["statusCode"] == 200
    assert _delivered(w, p, _message("one")) == []
    status, value = _ask(w, p, "com.microsoft:enumerate-rules", {"top": Int(10), "skip": Int(0)})
    assert status["statusCode"] == status["status-code"] == 204
    assert value is None


def test_skip_and_top() -> None:
    w, p = _rules_world()
    for name in ("a", "b", "c"):
        _add(w, p, name, _sql("1=1"))
    _, value = _ask(w, p, "com.microsoft:enumerate-rules", {"top": Int(2), "skip": Int(1)})
    assert _names(value) == ["a", "b"]
    assert _ask(w, p, "com.microsoft:enumerate-rules", {"top": Int(2), "skip": Int(9)})[0]["statusCode"] == 204


def test_remove_unknown_rule_is_404_not_found() -> None:
    w, p = _rules_world()
    for name in ("nope", None, 7, "$Default\x00"):
        status, _ = _ask(w, p, "com.microsoft:remove-rule", {"rule-name": name})
        assert status["statusCode"] == 404
        assert status["errorCondition"] == "amqp:not-found"
        # the wording the JS SDK needs to raise MessagingEntityNotFound (core-amqp errors.ts translate)
        assert re.fullmatch(r"The messaging entity .* could not be found\.", status["statusDescription"]), status
        assert "'events/Subscriptions/audit/Rules/" in status["statusDescription"]
        assert "\x00" not in status["statusDescription"]


def test_duplicate_rule_is_409_already_exists() -> None:
    w, p = _rules_world()
    status = _add(w, p, "$Default", _sql("1=1"))
    assert status["statusCode"] == status["status-code"] == 409
    assert status["errorCondition"] == "com.microsoft:entity-already-exists"


@pytest.mark.parametrize(
    ("name", "description"),
    [
        ("bad", _sql("color = ")),
        ("bad", _sql("newid() = 1")),
        ("bad", _sql("sys.NoSuchProperty = 1")),
        ("bad", _sql("(" * 60 + "1=1" + ")" * 60)),
        ("bad", _sql("a = 'x' OR " * 500 + "1=1")),  # over max_selector_length (4096)
        ("bad", _sql("NOT " * 60 + "1=1")),
        ("bad", {"sql-filter": {"expression": 5}}),
        ("bad", {"sql-filter": "1=1"}),
        ("bad", {"sql-filter": {"expression": "1=1"}, "correlation-filter": {"label": "x"}}),
        ("bad", {}),
        ("bad", "1=1"),
        ("bad", None),
        ("bad", {"correlation-filter": {"label": 5}}),
        ("bad", {"correlation-filter": {"properties": [1, 2]}}),
        ("bad", {"correlation-filter": {}}),
        ("bad", {"sql-filter": {"expression": "1=1"}, "sql-rule-action": {"expression": "SET sys.Label = 'x'"}}),
        ("bad", {"sql-filter": {"expression": "1=1"}, "sql-rule-action": {"expression": "SET a ="}}),
        ("bad", {"sql-filter": {"expression": "1=1"}, "sql-rule-action": {"expression": 5}}),
        ("bad", {"sql-filter": {"expression": "1=1"}, "sql-rule-action": "SET a = 1"}),
        ("a\x00b", _sql("1=1")),
        ("", _sql("1=1")),
        (None, _sql("1=1")),
        (5, _sql("1=1")),
        ("x" * 51, _sql("1=1")),
    ],
)
def test_bad_add_rule_is_400(name: Any, description: Any) -> None:
    w, p = _rules_world()
    status = _add(w, p, name, description)
    assert status["statusCode"] == status["status-code"] == 400, status
    _, value = _ask(w, p, "com.microsoft:enumerate-rules", {"top": Int(10), "skip": Int(0)})
    assert _names(value) == ["$Default"]


def test_rules_on_a_queue_are_404() -> None:
    w = world("servicebus")
    p = peer(w)
    node = "orders/$management"
    p.attach_producer("orders-in", "orders")
    p.attach_producer("mgmt-req", node)
    p.attach_consumer("mgmt-resp", node, presettled=False, default_outcome=None)
    w.settle()
    p.flow("mgmt-resp", 10)
    w.settle()
    p.transfer("mgmt-req", _request("com.microsoft:enumerate-rules", {"top": Int(1), "skip": Int(0)}))
    (completed,) = [c for c in w.settle()[p].completed if c.link == "mgmt-resp"]
    _, pos = codec.decode(completed.payload)
    application, _ = codec.decode(completed.payload, pos)
    assert application.value["statusCode"] == 404


def test_configured_rules_apply_from_the_start() -> None:
    """A subscription's ``RuleSpec`` rules (entity properties, as the config sets them) are its rules."""
    w = world("servicebus")
    w.broker.nodes.default.servicebus_entities["events/subscriptions/audit"] = EntityProperties(
        rules=(RuleSpec("only-eu", correlation_filter={"properties": {"region": "eu"}}),)
    )
    p = peer(w)
    p.attach_consumer("audit", SUBSCRIPTION, presettled=True, default_outcome=None)
    p.attach_producer("events-in", "events")
    w.settle()
    assert _delivered(w, p, _message("eu", region="eu"), _message("us", region="us")) == ["eu"]


def test_other_personalities_have_no_rules() -> None:
    """A topic of another personality gives every subscription every message, and nothing makes rules."""
    w = world("minibroker", topics={"events": NodePolicy()})
    p = peer(w)
    p.attach_consumer("audit", "events", presettled=True, default_outcome=None)
    p.attach_producer("events-in", "events")
    w.settle()
    assert _delivered(w, p, _message("one")) == ["one"]
    topic = w.broker.nodes.default.topics["events"]
    assert isinstance(topic, Topic)
    assert [s.rules for s in topic.subscriptions.values()] == [None]


def test_rule_operations_need_no_receiver() -> None:
    """The JS SDK's rule manager opens only the management link: add-rule makes the topic and the subscription,
    which takes matching messages until a receiver comes."""
    w = world("servicebus")
    p = peer(w)
    p.attach_producer("mgmt-req", NODE)
    p.attach_consumer("mgmt-resp", NODE, presettled=False, default_outcome=None)
    w.settle()
    p.flow("mgmt-resp", 100)
    w.settle()
    assert _add(w, p, "eu", {"correlation-filter": {"properties": {"region": "eu"}}})["statusCode"] == 200
    assert _ask(w, p, "com.microsoft:remove-rule", {"rule-name": "$Default"})[0]["statusCode"] == 200
    p.attach_producer("events-in", "events")
    p.attach_consumer("audit", SUBSCRIPTION, presettled=True, default_outcome=None)
    w.settle()
    assert _delivered(w, p, _message("eu", region="eu"), _message("us", region="us")) == ["eu"]


def test_subscription_outlives_a_closing_detach() -> None:
    w, p = _rules_world()
    _add(w, p, "eu", {"correlation-filter": {"properties": {"region": "eu"}}})
    _ask(w, p, "com.microsoft:remove-rule", {"rule-name": "$Default"})
    p.detach("audit", closed=True)
    w.settle()
    p.transfer("events-in", _message("eu", region="eu"))
    p.transfer("events-in", _message("us", region="us"))
    p.attach_consumer("audit2", SUBSCRIPTION, presettled=True, default_outcome=None)
    w.settle()
    p.flow("audit2", 10)
    got = [c for c in w.settle()[p].completed if c.link == "audit2"]
    assert len(got) == 1


def _properties_delivered(w: World, p: Peer, link: str, message: bytes) -> list[dict[Any, Any]]:
    """Publish ``message``; the application-properties of what ``link`` got."""
    p.transfer("events-in", message)
    p.flow(link, 5)
    found = []
    for completed in w.settle()[p].completed:
        if completed.link == link:
            (application,) = [
                codec.decode(completed.payload, s.start)[0]
                for s in sections.walk(completed.payload)
                if s.code == sections.APPLICATION_PROPERTIES
            ]
            found.append(application.value)
    return found


def test_rule_action_rewrites_that_subscriptions_copy() -> None:
    w, p = _rules_world()
    p.attach_consumer("other", "events/Subscriptions/other", presettled=True, default_outcome=None)
    w.settle()
    description = {
        "sql-filter": {"expression": "color = 'red'"},
        "sql-rule-action": {"expression": "SET color = 'crimson'; SET n = n * 2; REMOVE secret"},
    }
    assert _add(w, p, "tint", description)["statusCode"] == 200
    _ask(w, p, "com.microsoft:remove-rule", {"rule-name": "$Default"})
    p.transfer("events-in", _message("m", color="red", n=21, secret="s"))
    p.flow("audit", 5)
    p.flow("other", 5)
    observed = w.settle()[p]
    by_link = {}
    for completed in observed.completed:
        (application,) = [
            codec.decode(completed.payload, s.start)[0]
            for s in sections.walk(completed.payload)
            if s.code == sections.APPLICATION_PROPERTIES
        ]
        by_link[completed.link] = application.value
    assert by_link["audit"] == {"color": "crimson", "n": 42, "RuleName": "tint"}
    assert by_link["other"] == {"color": "red", "n": 21, "secret": "s"}  # $Default, no action: as sent
    _, value = _ask(w, p, "com.microsoft:enumerate-rules", {"top": Int(10), "skip": Int(0)})
    action = value["rules"][0]["rule-description"].value[1]
    assert action.descriptor == ULong(0x0000013700000006)
    assert action.value[0] == "SET color = 'crimson'; SET n = n * 2; REMOVE secret"


def test_rule_action_runs_only_when_its_filter_matches() -> None:
    w, p = _rules_world()
    _add(w, p, "tag", {"sql-filter": {"expression": "n > 10"}, "sql-rule-action": {"expression": "SET big = TRUE"}})
    assert _properties_delivered(w, p, "audit", _message("small", n=1)) == [{"n": 1}]  # through $Default
    # $Default's copy as sent, and the action's own copy
    big = _properties_delivered(w, p, "audit", _message("big", n=11))
    assert big == [{"n": 11}, {"n": 11, "big": True, "RuleName": "tag"}]


def test_rules_per_subscription_are_bounded() -> None:
    """As in Service Bus, at most 2000 rules a subscription: the next add-rule is refused (quota exceeded)."""
    w, p = _rules_world()
    subscription = w.broker.nodes.default.topics["events"].subscriptions[("", "audit")]
    rules = w.broker.dispatcher.subscription_rules(subscription)
    for n in range(1999):
        w.broker.dispatcher.add_rule(subscription, Rule(RuleSpec(f"r{n}"), lambda view: True), 0)
    status = _add(w, p, "one-too-many", _sql("1=1"))
    assert status["statusCode"] == 403
    assert status["errorCondition"] == "amqp:resource-limit-exceeded"
    assert len(rules) == 2000


def _three_copy_rules(w: World, p: Peer) -> None:
    """``audit``'s rules: $Default and ``n > 0`` (no action: one copy between them), ``x`` and ``y`` (with
    actions: one copy each) all match a message with ``n`` = 1; ``z`` (an action) does not."""
    _add(w, p, "plain", _sql("n > 0"))
    for name, when in (("x", "n = 1"), ("y", "n < 5"), ("z", "n = 7")):
        action = {"expression": f"SET by = '{name}'"}
        assert _add(w, p, name, {"sql-filter": {"expression": when}, "sql-rule-action": action})["statusCode"] == 200


def test_each_matching_rule_with_an_action_gives_a_copy_named_by_rule_name() -> None:
    w, p = _rules_world()
    _three_copy_rules(w, p)
    assert _properties_delivered(w, p, "audit", _message("m", n=1)) == [
        {"n": 1},
        {"n": 1, "by": "x", "RuleName": "x"},
        {"n": 1, "by": "y", "RuleName": "y"},
    ]


@pytest.mark.parametrize("commit", [True, False])
def test_a_transactional_post_stages_every_rule_copy(commit: bool) -> None:
    """A post to the topic in a transaction: the commit puts all three copies on the subscription (each its
    own record), a rollback none."""
    w, p = _rules_world()
    _three_copy_rules(w, p)
    txn_id = declare(w, p)
    p.transfer("events-in", _message("m", n=1), state=TransactionalState(txn_id=txn_id))
    w.settle()
    subscription = w.broker.nodes.default.topics["events"].subscriptions[("", "audit")]
    assert subscription.depth == 0  # staged: nothing yet
    state, _ = discharge(w, p, txn_id, fail=not commit)
    assert isinstance(state, Accepted), state
    assert subscription.depth == (3 if commit else 0)
    p.flow("audit", 10)
    got = []
    for completed in w.settle()[p].completed:
        if completed.link == "audit":
            (application,) = [
                codec.decode(completed.payload, s.start)[0]
                for s in sections.walk(completed.payload)
                if s.code == sections.APPLICATION_PROPERTIES
            ]
            got.append(application.value.get("RuleName"))
    assert got == ([None, "x", "y"] if commit else [])
    assert subscription.depth == 0


@pytest.mark.parametrize(
    "description",
    [
        _sql("color = @color"),
        {"sql-filter": {"expression": "1=1"}, "sql-rule-action": {"expression": "SET color = @color"}},
        {"sql-filter": {"expression": "color = @color", "parameters": {"@color": "red"}}},
    ],
)
def test_sql_parameters_are_refused_clearly(description: dict[str, Any]) -> None:
    """Neither the JS SDK (``managementClient.ts`` ``addRule``: only ``expression``) nor the .NET SDK
    (``AmqpMessageConverter.GetSqlRuleFilterMap`` / ``GetRuleActionMap``: only ``expression``) sends SQL
    parameters over AMQP, so an ``@name`` reference can never be bound: a 400 that says so."""
    w, p = _rules_world()
    status = _add(w, p, "p", description)
    assert status["statusCode"] == 400, status
    assert "SQL parameter '@color'" in status["statusDescription"], status


def test_every_rule_copy_expires_with_its_message() -> None:
    """Each copy has its own place (sequence number) in the subscription, yet all expire at the message's time:
    none is left behind (in Service Bus, dead-lettered or dropped: here the subscription keeps no expired copy)."""
    w, p = _rules_world()
    _three_copy_rules(w, p)
    message = codec.encode(Header(ttl=UInt(10_000))) + _message("m", n=1)
    p.transfer("events-in", message)
    w.settle()
    subscription = w.broker.nodes.default.topics["events"].subscriptions[("", "audit")]
    assert subscription.depth == 3
    assert len({m.seq for m in subscription.ready}) == 3
    w.advance(11)
    w.settle()
    assert subscription.depth == 0
