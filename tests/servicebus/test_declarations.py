"""Declared Service Bus entities (``minibroker/servicebus/declarations.py``): the emulator's ``Config.json`` loads
as it is (comments and all), the TOML form means the same, and bad input is refused with its path; the SAS token
check of ``$cbs`` (``minibroker/servicebus/cbs.py``) against tokens the SDK's own generator makes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from azure.servicebus._pyamqp.utils import generate_sas_token

from minibroker.servicebus.cbs import check_token
from minibroker.servicebus.declarations import (
    DeclarationError,
    duration,
    parse_emulator_config,
    parse_toml_entities,
    strip_comments,
)
from minibroker.servicebus.entities import EntityProperties, RuleSpec

FIXTURE = Path(__file__).parent / "data" / "Config.json"


def test_the_emulator_format_loads_with_its_comments() -> None:
    declared = parse_emulator_config(FIXTURE.read_text())
    assert set(declared.queues) == {"invoices", "plain"}
    assert declared.queues["invoices"] == EntityProperties(
        lock_duration=5.0, max_delivery_count=2, default_message_ttl=600.0, dead_lettering_on_message_expiration=True
    )
    assert declared.queues["plain"] == EntityProperties()
    assert declared.topics["shipments"].default_message_ttl == 3600.0
    region = declared.subscriptions[("shipments", "by-region")]
    assert (region.lock_duration, region.max_delivery_count) == (120.0, 4)
    assert region.rules == (
        RuleSpec("north-only", correlation_filter={"subject": "north", "properties": {"priority": "high"}}),
    )
    assert declared.subscriptions[("shipments", "large")].rules == (
        RuleSpec("weight", sql_filter="weight > 100", sql_action="SET handling = 'crane'"),
    )
    entities = declared.entities()
    assert entities["shipments/subscriptions/by-region"] is region
    assert entities["invoices"].lock_duration == 5.0
    # given a value, without effect: listed for the warning (empty ForwardTo and false flags are no value)
    assert declared.not_implemented == (
        "UserConfig.Logging.Type",
        "UserConfig.Namespaces[0].Queues[0].Properties.DuplicateDetectionHistoryTimeWindow",
    )


def test_comments_are_stripped_outside_strings_only() -> None:
    text = '{"a": "x // not a comment /* nor this */", // gone\n "b": 1 /* gone */}'
    assert json.loads(strip_comments(text)) == {"a": "x // not a comment /* nor this */", "b": 1}
    assert json.loads(strip_comments('{"a": "quote \\" // still a string"}')) == {"a": 'quote " // still a string'}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("PT1M", 60), ("PT5S", 5), ("PT0.5S", 0.5), ("P1DT2H", 93600), ("PT1H30M", 5400), ("P1Y", 365 * 86400)],
)
def test_iso_durations(text: str, seconds: float) -> None:
    assert duration(text) == seconds


@pytest.mark.parametrize("text", ["", "P", "PT", "1M", "PT1", "PT-5S", "pt1m", "PT1M ", "P1W", "PT\x005S", "PT\u0661S"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="ISO-8601"):
        duration(text)


def _config(queue_properties: object = None, **namespace: object) -> str:
    queue: dict[str, object] = {"Name": "q"}
    if queue_properties is not None:
        queue["Properties"] = queue_properties
    ns: dict[str, object] = {"Name": "sbemulatorns", "Queues": [queue], "Topics": []}
    ns.update(namespace)
    return json.dumps({"UserConfig": {"Namespaces": [ns], "Logging": {"Type": "File"}}})


@pytest.mark.parametrize(
    ("text", "path", "problem"),
    [
        ("{", "$", "not valid JSON"),
        ("[]", "$", "expected an object"),
        ('{"UserConfig": {}}', "UserConfig.Namespaces", "is required"),
        ('{"UserConfig": {"Namespaces": [], "Colour": 1}}', "UserConfig.Colour", "unknown key"),
        ('{"UserConfig": {"Namespaces": {}}}', "UserConfig.Namespaces", "expected a list"),
        ('{"UserConfig": {"Namespaces": [{"Queues": []}]}}', "UserConfig.Namespaces[0].Name", "is required"),
        (_config({"LockDuration": "1 minute"}), "Queues[0].Properties.LockDuration", "ISO-8601"),
        (_config({"LockDuration": 60}), "Queues[0].Properties.LockDuration", "expected an ISO-8601 duration"),
        (_config({"LockDuration": "PT0S"}), "Queues[0].Properties.LockDuration", "positive"),
        (_config({"MaxDeliveryCount": "3"}), "Queues[0].Properties.MaxDeliveryCount", "expected an integer"),
        (_config({"MaxDeliveryCount": 0}), "Queues[0].Properties.MaxDeliveryCount", "at least 1"),
        (_config({"MaxDeliveryCount": True}), "Queues[0].Properties.MaxDeliveryCount", "expected an integer"),
        (_config({"RequiresSession": "no"}), "Queues[0].Properties.RequiresSession", "expected true or false"),
        (_config({"lockDuration": "PT1M"}), "Queues[0].Properties.lockDuration", "unknown key"),
        (_config([]), "Queues[0].Properties", "expected an object"),
        (_config(None, Queues=[{"Name": ""}]), "Queues[0].Name", "non-empty string"),
        (_config(None, Queues=[{"Name": "a\x00b"}]), "Queues[0].Name", "non-empty string"),
        (_config(None, Queues=[{"Name": "a"}, {"Name": "A"}]), "Queues[1].Name", "declared twice"),
        (_config(None, Queues=[{"Name": "$cbs"}]), "Queues[0].Name", "no entity name"),
        (_config(None, Queues=[{"Name": "a/$management"}]), "Queues[0].Name", "no entity name"),
        (_config(None, Queues=[{"Name": "a//b"}]), "Queues[0].Name", "no entity name"),
        (_config(None, Queues=[{"Name": "t/subscriptions/s"}]), "Queues[0].Name", "names a subscription"),
        (
            _config(None, Topics=[{"Name": "t", "Subscriptions": [{"Name": "a/b"}]}]),
            "Subscriptions[0].Name",
            "has no /",
        ),
        (_config(None, Topics=[{"Name": "q"}]), "Topics[0].Name", "declared twice"),
        (
            _config(None, Topics=[{"Name": "t", "Properties": {"LockDuration": "PT1M"}}]),
            "Topics[0].Properties.LockDuration",
            "unknown key",
        ),
        (
            _config(None, Topics=[{"Name": "t", "Subscriptions": [{"Name": "s", "Rules": [{"Name": "r"}]}]}]),
            "Subscriptions[0].Rules[0].Properties",
            "is required",
        ),
    ],
)
def test_bad_emulator_config_names_the_json_path(text: str, path: str, problem: str) -> None:
    with pytest.raises(DeclarationError) as info:
        parse_emulator_config(text)
    assert info.value.path.endswith(path), info.value.path
    assert problem in info.value.problem


def _rule(properties: object) -> str:
    subscription = {"Name": "s", "Rules": [{"Name": "r", "Properties": properties}]}
    return _config(None, Queues=[], Topics=[{"Name": "t", "Subscriptions": [subscription]}])


@pytest.mark.parametrize(
    ("properties", "field", "problem"),
    [
        ({"FilterType": "Regex"}, "FilterType", 'expected "Sql" or "Correlation"'),
        ({"FilterType": "Sql"}, "SqlFilter", "is required"),
        ({"FilterType": "Sql", "SqlFilter": {}}, "SqlFilter.SqlExpression", "is required"),
        ({"FilterType": "Sql", "SqlFilter": {"SqlExpression": 3}}, "SqlFilter.SqlExpression", "non-empty string"),
        ({"FilterType": "Correlation"}, "CorrelationFilter", "is required"),
        ({"FilterType": "Correlation", "CorrelationFilter": {}}, "CorrelationFilter", "at least one field"),
        ({"FilterType": "Correlation", "CorrelationFilter": {"Subject": "x"}}, "CorrelationFilter.Subject", "unknown"),
        (
            {"FilterType": "Correlation", "CorrelationFilter": {"Properties": {"p": {"deep": 1}}}},
            "CorrelationFilter.Properties.p",
            "expected a string, number or boolean",
        ),
        (
            {"FilterType": "Sql", "SqlFilter": {"SqlExpression": "1=1"}, "CorrelationFilter": {"To": "x"}},
            "CorrelationFilter",
            "not allowed",
        ),
        (
            {"FilterType": "Sql", "SqlFilter": {"SqlExpression": "1=1"}, "Action": {}},
            "Action.SqlExpression",
            "required",
        ),
    ],
)
def test_bad_rules_name_the_json_path(properties: object, field: str, problem: str) -> None:
    with pytest.raises(DeclarationError) as info:
        parse_emulator_config(_rule(properties))
    assert info.value.path.endswith(f"Rules[0].Properties.{field}"), info.value.path
    assert problem in info.value.problem


def test_documented_but_unimplemented_fields_are_listed() -> None:
    declared = parse_emulator_config(_config({"ForwardTo": "elsewhere", "RequiresDuplicateDetection": True}))
    assert declared.not_implemented == (
        "UserConfig.Logging.Type",
        "UserConfig.Namespaces[0].Queues[0].Properties.ForwardTo",
        "UserConfig.Namespaces[0].Queues[0].Properties.RequiresDuplicateDetection",
    )


def test_the_toml_form_means_the_same() -> None:
    declared = parse_toml_entities(
        {"invoices": {"lock_duration": 5, "max_delivery_count": 2, "default_message_time_to_live": "PT10M"}},
        {
            "shipments": {
                "default_message_time_to_live": "PT1H",
                "subscriptions": {
                    "large": {
                        "lock_duration": "PT2M",
                        "rules": [{"name": "weight", "sql_filter": "weight > 100", "action": "SET a = 1"}],
                    },
                    "north": {"rules": [{"name": "n", "correlation_filter": {"label": "north"}}]},
                },
            }
        },
        "servicebus",
    )
    assert declared.queues["invoices"] == EntityProperties(
        lock_duration=5.0, max_delivery_count=2, default_message_ttl=600.0
    )
    assert declared.topics["shipments"].default_message_ttl == 3600.0
    large = declared.subscriptions[("shipments", "large")]
    assert large.lock_duration == 120.0
    assert large.rules == (RuleSpec("weight", sql_filter="weight > 100", sql_action="SET a = 1"),)
    assert declared.subscriptions[("shipments", "north")].rules == (
        RuleSpec("n", correlation_filter={"subject": "north"}),
    )


@pytest.mark.parametrize(
    ("queues", "topics", "path", "problem"),
    [
        ({"q": {"LockDuration": "PT1M"}}, {}, "servicebus.queues.q.LockDuration", "unknown key"),
        ({"q": {"lock_duration": -1}}, {}, "servicebus.queues.q.lock_duration", "positive"),
        ({"q": {"lock_duration": float("nan")}}, {}, "servicebus.queues.q.lock_duration", "positive"),
        ({"q": 3}, {}, "servicebus.queues.q", "expected a table"),
        ({"orders/$DeadLetterQueue": {}}, {}, "servicebus.queues.orders/$DeadLetterQueue", "no entity name"),
        ({}, {"t": {"subscriptions": {"a/b": {}}}}, "servicebus.topics.t.subscriptions.a/b", "has no /"),
        ({"q": {}}, {"Q": {}}, "servicebus.topics.Q", "declared twice"),
        ({}, {"t": {"subscriptions": {"s": {"rules": [{"name": "r"}]}}}}, "rules[0]", "exactly one of"),
        ({}, {"t": {"subscriptions": {"s": {"rules": [{"sql_filter": "1=1"}]}}}}, "rules[0].name", "is required"),
        ({}, {"t": {"subscriptions": {"s": {"rules": [{"name": "r", "sql": "1=1"}]}}}}, "rules[0].sql", "unknown key"),
        ({}, {"t": {"subscriptions": {"s": {"rules": {}}}}}, "subscriptions.s.rules", "expected an array"),
    ],
)
def test_bad_toml_entities_name_the_key(queues: object, topics: object, path: str, problem: str) -> None:
    with pytest.raises(DeclarationError) as info:
        parse_toml_entities(queues, topics, "servicebus")
    assert info.value.path.endswith(path), info.value.path
    assert problem in info.value.problem


# -- SAS tokens -------------------------------------------------------------------------------------------------
KEYS = {"RootManageSharedAccessKey": "c2VjcmV0"}
AUDIENCE = "sb://127.0.0.1:5672/orders"


def test_a_token_the_sdk_signs_with_the_key_passes() -> None:
    token = generate_sas_token(AUDIENCE, "RootManageSharedAccessKey", KEYS["RootManageSharedAccessKey"], 2000)
    assert check_token(token, KEYS, now=1999.0, audience=AUDIENCE) is None
    assert check_token(token.encode(), KEYS, now=1999.0, audience=AUDIENCE) is None


@pytest.mark.parametrize(
    ("token", "problem"),
    [
        (generate_sas_token(AUDIENCE, "RootManageSharedAccessKey", "wrong", 2000), "signature does not match"),
        (generate_sas_token(AUDIENCE, "Other", KEYS["RootManageSharedAccessKey"], 2000), "no shared access key named"),
        (generate_sas_token(AUDIENCE, "RootManageSharedAccessKey", KEYS["RootManageSharedAccessKey"], 1000), "expired"),
        ("Bearer abc", "not a shared access signature"),
        (None, "not a shared access signature"),
        (b"\xff", "not UTF-8"),
        ("SharedAccessSignature sr=a&sig=b&se=1", "lacks one of"),
        ("SharedAccessSignature sr=a&sr=b&sig=b&se=1&skn=x", "malformed"),
        ("SharedAccessSignature sr=a&sig=b&se=1e9&skn=RootManageSharedAccessKey", "expiry"),
        ("SharedAccessSignature sr=a&sig=b&se=" + "9" * 400 + "&skn=RootManageSharedAccessKey", "expiry"),
    ],
)
def test_bad_tokens_are_refused_with_a_reason(token: object, problem: str) -> None:
    refused = check_token(token, KEYS, now=1500.0, audience=AUDIENCE)
    assert refused is not None
    assert problem in refused
