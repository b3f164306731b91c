"""Service Bus entities declared before the broker starts (issue 17 item 11): the emulator's ``Config.json`` and
the ``[servicebus]`` section of minibroker's TOML, read into ``EntityProperties`` (``entities.py``).

The emulator's format (github:Azure/azure-service-bus-emulator-installer, ``ServiceBus-Emulator/Config/Config.json``
and ``ServiceBus-Emulator/Schema/Config-schema.json``)::

    UserConfig: {Namespaces: [{Name, Queues: [{Name, Properties}], Topics: [{Name, Properties,
                 Subscriptions: [{Name, Properties, Rules: [{Name, Properties: {FilterType, SqlFilter,
                 CorrelationFilter, Action}}]}]}]}], Logging: {Type}}

The emulator's own file carries ``//`` comments, so they are allowed here (outside strings). Every field the
schema documents is accepted; those minibroker does not implement (``NOT_IMPLEMENTED``) are listed once in a
warning when a file gives them a value. Anything else, or a value of the wrong type, is refused with its JSON
path (``UserConfig.Namespaces[0].Queues[2].Properties.LockDuration``). A property left out keeps Service Bus's
default (``EntityProperties``), not the emulator's schema default. Durations are ISO-8601 (``PT1M``) as the
emulator reads them (``XmlConvert.ToTimeSpan``: a year is 365 days, a month 30).

The TOML form uses the same properties snake-cased (``lock_duration = "PT30S"`` or a number of seconds), under
``[servicebus.queues.NAME]``, ``[servicebus.topics.NAME]`` and ``[servicebus.topics.NAME.subscriptions.SUB]``,
with ``[[...rules]]`` tables of ``name``, ``sql_filter``, ``correlation_filter`` and ``action``.

Pure: no broker import; errors are ``DeclarationError`` with the path, the caller adds the file name.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from minibroker.servicebus.entities import EntityProperties, RuleSpec, key


class DeclarationError(ValueError):
    """A declaration that cannot be used: ``path`` (dotted, with list indexes) and the problem."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


@dataclass(frozen=True)
class Declarations:
    """Declared queues, topics and subscriptions, each with its properties, and the fields given a value that
    have no effect in minibroker (for one warning)."""

    queues: Mapping[str, EntityProperties] = field(default_factory=dict)
    topics: Mapping[str, EntityProperties] = field(default_factory=dict)
    subscriptions: Mapping[tuple[str, str], EntityProperties] = field(default_factory=dict)
    """By ``(topic, subscription)``."""
    not_implemented: tuple[str, ...] = ()
    """``path: field`` of each accepted field without effect."""

    def __bool__(self) -> bool:
        return bool(self.queues or self.topics)

    def entities(self) -> dict[str, EntityProperties]:
        """Every entity's properties by ``entities.key`` of its path (``TOPIC/Subscriptions/NAME``)."""
        found = {key(name): props for name, props in self.queues.items()}
        found.update((key(name), props) for name, props in self.topics.items())
        found.update((key(f"{t}/Subscriptions/{s}"), props) for (t, s), props in self.subscriptions.items())
        return found

    def merged(self, other: Declarations, where: str) -> Declarations:
        """Both sets together; an entity declared in both is refused (``where`` names the second)."""
        taken = {key(name) for name in [*self.queues, *self.topics]}
        for name in [*other.queues, *other.topics]:
            if key(name) in taken:
                raise DeclarationError(where, f"entity {name!r} is declared twice")
        return Declarations(
            {**self.queues, **other.queues},
            {**self.topics, **other.topics},
            {**self.subscriptions, **other.subscriptions},
            self.not_implemented + other.not_implemented,
        )


NOT_IMPLEMENTED = frozenset(
    {
        "ForwardTo",
        "ForwardDeadLetteredMessagesTo",
        "RequiresDuplicateDetection",
        "DuplicateDetectionHistoryTimeWindow",
    }
)
"""Documented properties that are accepted and have no effect yet."""

_DURATION = re.compile(
    r"P(?!$)(?:(\d+)Y)?(?:(\d+)M)?(?:(\d+)D)?(?:T(?=\d)(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?", re.ASCII
)
_UNITS = (365 * 86400, 30 * 86400, 86400, 3600, 60, 1)


def duration(text: str) -> float:
    """Seconds of an ISO-8601 duration (``PT1M``, ``P1DT2H``, ``PT0.5S``); ``ValueError`` for anything else."""
    found = _DURATION.fullmatch(text)
    if found is None:
        raise ValueError(f"{text!r} is not an ISO-8601 duration such as PT1M or PT30S")
    return sum(float(part) * unit for part, unit in zip(found.groups(), _UNITS, strict=True) if part)


# -- properties: (JSON name, how its value is read, the EntityProperties field it sets or None) -------------------
def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("expected a string")
    return value


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError("expected true or false")
    return value


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("expected an integer")
    if value < 1:
        raise ValueError("must be at least 1")
    return value


def _seconds(value: Any) -> float:
    """An ISO-8601 duration (the emulator's only form)."""
    if not isinstance(value, str):
        raise TypeError("expected an ISO-8601 duration such as PT1M")
    return _positive(duration(value))


def _seconds_or_number(value: Any) -> float:
    """An ISO-8601 duration or a number of seconds (the TOML form)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return _positive(float(value))
    if not isinstance(value, str):
        raise TypeError("expected an ISO-8601 duration such as PT1M or a number of seconds")
    return _positive(duration(value))


def _positive(seconds: float) -> float:
    if not 0 < seconds < float("inf"):
        raise ValueError("must be a positive duration")
    return seconds


MAXIMUM = {"LockDuration": 300.0}
"""Upper bounds Service Bus puts on a property (a peek-lock lasts at most 5 minutes: the emulator's
``Config-schema.json`` LockDuration "maximum value is PT5M"; Service Bus refuses a longer one)."""

_Property = tuple[Callable[[Any], Any], str | None]
_QUEUE_PROPERTIES: dict[str, _Property] = {
    "LockDuration": (_seconds, "lock_duration"),
    "MaxDeliveryCount": (_count, "max_delivery_count"),
    "RequiresSession": (_boolean, "requires_session"),
    "DefaultMessageTimeToLive": (_seconds, "default_message_ttl"),
    "DeadLetteringOnMessageExpiration": (_boolean, "dead_lettering_on_message_expiration"),
    "ForwardTo": (_string, None),
    "ForwardDeadLetteredMessagesTo": (_string, None),
    "RequiresDuplicateDetection": (_boolean, None),
    "DuplicateDetectionHistoryTimeWindow": (_seconds, None),
}
_TOPIC_PROPERTIES = {
    name: _QUEUE_PROPERTIES[name]
    for name in ("DefaultMessageTimeToLive", "DuplicateDetectionHistoryTimeWindow", "RequiresDuplicateDetection")
}
_SUBSCRIPTION_PROPERTIES = {
    name: spec
    for name, spec in _QUEUE_PROPERTIES.items()
    if name not in ("RequiresDuplicateDetection", "DuplicateDetectionHistoryTimeWindow")
}
_CORRELATION_FIELDS = {
    "CorrelationId": "correlation_id",
    "MessageId": "message_id",
    "To": "to",
    "ReplyTo": "reply_to",
    "Label": "subject",
    "SessionId": "session_id",
    "ReplyToSessionId": "reply_to_session_id",
    "ContentType": "content_type",
}


def snake(name: str) -> str:
    """The TOML spelling of a JSON field name: ``LockDuration`` is ``lock_duration``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class _Reader:
    """Walks one document, naming each place by its path; ``toml`` spells field names snake-cased."""

    def __init__(self, toml: bool) -> None:
        self.toml = toml
        self.not_implemented: list[str] = []

    def name(self, json_name: str) -> str:
        return snake(json_name) if self.toml else json_name

    def table(self, value: Any, path: str, allowed: set[str], required: tuple[str, ...] = ()) -> dict[str, Any]:
        """``value`` as an object with only ``allowed`` keys (JSON spelling), all of ``required``."""
        if not isinstance(value, dict):
            raise DeclarationError(path, f"expected {'a table' if self.toml else 'an object'}, got {_kind(value)}")
        spelled = {self.name(k): k for k in allowed}
        for given in value:
            if given not in spelled:
                known = ", ".join(sorted(spelled)) or "none"
                raise DeclarationError(f"{path}.{given}", f"unknown key (known keys here: {known})")
        for needed in required:
            if self.name(needed) not in value:
                raise DeclarationError(f"{path}.{self.name(needed)}", "is required")
        return {spelled[k]: v for k, v in value.items()}

    def named(self, value: Any, path: str, taken: set[str], *, subscription: bool = False) -> dict[str, Any]:
        """A table of entities by name (the TOML form); a name taken already (without regard to case) refused."""
        if not isinstance(value, dict):
            raise DeclarationError(path, f"expected a table, got {_kind(value)}")
        for name in value:
            self.entity_name(name, f"{path}.{name}", subscription=subscription)
            if key(name) in taken:
                raise DeclarationError(f"{path}.{name}", f"entity {name!r} is declared twice")
            taken.add(key(name))
        return value

    def items(self, value: Any, path: str) -> list[Any]:
        if not isinstance(value, list):
            raise DeclarationError(path, f"expected {'an array' if self.toml else 'a list'}, got {_kind(value)}")
        return value

    def text(self, value: Any, path: str) -> str:
        if not isinstance(value, str) or not value or "\x00" in value:
            raise DeclarationError(path, f"expected a non-empty string, got {_kind(value)}")
        return value

    def entity_name(self, value: Any, path: str, *, subscription: bool = False) -> str:
        """An entity's name: one an address can name (``addresses.py``): no ``$`` part (``$cbs``,
        ``$management``, ``$DeadLetterQueue``), no ``/Subscriptions/`` in a queue or topic, no ``/`` in a
        subscription."""
        name = self.text(value, path)
        parts = name.split("/")
        if any(not part or part.startswith("$") for part in parts):
            raise DeclarationError(path, f"{name!r} is no entity name (an empty part, or one starting with $)")
        if subscription and len(parts) > 1:
            raise DeclarationError(path, f"{name!r}: a subscription's name has no /")
        if "subscriptions" in (part.lower() for part in parts[1:]):
            raise DeclarationError(path, f"{name!r}: /Subscriptions/ names a subscription, not a queue or topic")
        return name

    def properties(self, value: Any, path: str, allowed: Mapping[str, _Property]) -> EntityProperties:
        """``EntityProperties`` from an entity's ``Properties``."""
        given = self.table(value, path, set(allowed))
        changes: dict[str, Any] = {}
        for json_name, raw in given.items():
            read, attribute = allowed[json_name]
            if read is _seconds and self.toml:
                read = _seconds_or_number
            where = f"{path}.{self.name(json_name)}"
            try:
                value = read(raw)
                if value > MAXIMUM.get(json_name, value):
                    raise ValueError(f"must be at most {MAXIMUM[json_name]:g} seconds")
            except (TypeError, ValueError) as exc:
                raise DeclarationError(where, f"{exc}, got {_kind(raw)}") from None
            if json_name in NOT_IMPLEMENTED and value not in ("", False):
                self.not_implemented.append(where)
            if attribute is not None:
                changes[attribute] = value
        return replace(EntityProperties(), **changes)

    def correlation(self, value: Any, path: str) -> dict[str, Any]:
        given = self.table(value, path, {*_CORRELATION_FIELDS, "Properties"})
        if not given:
            raise DeclarationError(path, "a correlation filter needs at least one field")
        found: dict[str, Any] = {}
        for json_name, raw in given.items():
            where = f"{path}.{self.name(json_name)}"
            if json_name == "Properties":
                if not isinstance(raw, dict) or not raw:
                    raise DeclarationError(where, f"expected a non-empty table of properties, got {_kind(raw)}")
                for prop, prop_value in raw.items():
                    if isinstance(prop_value, dict | list) or prop_value is None:
                        problem = f"expected a string, number or boolean, got {_kind(prop_value)}"
                        raise DeclarationError(f"{where}.{prop}", problem)
                found["properties"] = dict(raw)
            else:
                found[_CORRELATION_FIELDS[json_name]] = self.text(raw, where)
        return found


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int | float):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return f"a string ({value[:40]!r})"
    if isinstance(value, list):
        return "a list"
    return "an object"


# -- the emulator's Config.json ----------------------------------------------------------------------------------
def strip_comments(text: str) -> str:
    """``text`` without ``//`` line comments and ``/* */`` block comments outside strings (the emulator's own
    ``Config.json`` has them; its reader allows them)."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        if char == '"':
            end = i + 1
            while end < n and text[end] != '"':
                end += 2 if text[end] == "\\" else 1
            out.append(text[i : end + 1])
            i = end + 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
        else:
            out.append(char)
            i += 1
    return "".join(out)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def parse_emulator_config(text: str) -> Declarations:
    """The entities of an emulator ``Config.json``; ``DeclarationError`` (bad JSON: path ``$``)."""
    import json  # only with a Config.json: the default configuration's start-up does without (issue 19)

    try:
        document = json.loads(strip_comments(text), parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise DeclarationError("$", f"not valid JSON: {exc}") from None
    reader = _Reader(toml=False)
    root = reader.table(document, "$", {"UserConfig"}, ("UserConfig",))
    user = reader.table(root["UserConfig"], "UserConfig", {"Namespaces", "Logging"}, ("Namespaces",))
    if "Logging" in user:
        logging = reader.table(user["Logging"], "UserConfig.Logging", {"Type"})
        if "Type" in logging:
            reader.text(logging["Type"], "UserConfig.Logging.Type")
            reader.not_implemented.append("UserConfig.Logging.Type")
    declared = Declarations()
    for index, raw in enumerate(reader.items(user["Namespaces"], "UserConfig.Namespaces")):
        path = f"UserConfig.Namespaces[{index}]"
        namespace = reader.table(raw, path, {"Name", "Queues", "Topics"}, ("Name",))
        reader.text(namespace["Name"], f"{path}.Name")  # the emulator's is sbemulatorns: minibroker ignores it
        found = _emulator_namespace(reader, namespace, path)
        declared = declared.merged(found, path)
    return replace(declared, not_implemented=tuple(reader.not_implemented))


def _emulator_namespace(reader: _Reader, namespace: dict[str, Any], path: str) -> Declarations:
    queues: dict[str, EntityProperties] = {}
    topics: dict[str, EntityProperties] = {}
    subscriptions: dict[tuple[str, str], EntityProperties] = {}
    names: set[str] = set()

    def named(entry: dict[str, Any], where: str, taken: set[str], *, subscription: bool = False) -> str:
        name = reader.entity_name(entry["Name"], f"{where}.Name", subscription=subscription)
        if key(name) in taken:
            raise DeclarationError(f"{where}.Name", f"{name!r} is declared twice")
        taken.add(key(name))
        return name

    for index, raw in enumerate(reader.items(namespace.get("Queues", []), f"{path}.Queues")):
        where = f"{path}.Queues[{index}]"
        entry = reader.table(raw, where, {"Name", "Properties"}, ("Name",))
        name = named(entry, where, names)
        queues[name] = reader.properties(entry.get("Properties", {}), f"{where}.Properties", _QUEUE_PROPERTIES)
    for index, raw in enumerate(reader.items(namespace.get("Topics", []), f"{path}.Topics")):
        where = f"{path}.Topics[{index}]"
        entry = reader.table(raw, where, {"Name", "Properties", "Subscriptions"}, ("Name",))
        topic = named(entry, where, names)
        topics[topic] = reader.properties(entry.get("Properties", {}), f"{where}.Properties", _TOPIC_PROPERTIES)
        taken: set[str] = set()
        for sub_index, sub_raw in enumerate(reader.items(entry.get("Subscriptions", []), f"{where}.Subscriptions")):
            sub_where = f"{where}.Subscriptions[{sub_index}]"
            sub = reader.table(sub_raw, sub_where, {"Name", "Properties", "Rules"}, ("Name",))
            name = named(sub, sub_where, taken, subscription=True)
            props = reader.properties(sub.get("Properties", {}), f"{sub_where}.Properties", _SUBSCRIPTION_PROPERTIES)
            if "Rules" in sub:
                rules = reader.items(sub["Rules"], f"{sub_where}.Rules")
                props = replace(props, rules=_emulator_rules(reader, rules, f"{sub_where}.Rules"))
            subscriptions[(topic, name)] = props
    return Declarations(queues, topics, subscriptions)


def _emulator_rules(reader: _Reader, rules: list[Any], path: str) -> tuple[RuleSpec, ...]:
    found: list[RuleSpec] = []
    taken: set[str] = set()
    for index, raw in enumerate(rules):
        where = f"{path}[{index}]"
        entry = reader.table(raw, where, {"Name", "Properties"}, ("Name", "Properties"))
        name = reader.text(entry["Name"], f"{where}.Name")
        if key(name) in taken:
            raise DeclarationError(f"{where}.Name", f"rule {name!r} is declared twice")
        taken.add(key(name))
        where = f"{where}.Properties"
        props = reader.table(
            entry["Properties"], where, {"FilterType", "SqlFilter", "CorrelationFilter", "Action"}, ("FilterType",)
        )
        kind = props["FilterType"]
        if kind not in ("Sql", "Correlation"):
            raise DeclarationError(f"{where}.FilterType", f'expected "Sql" or "Correlation", got {_kind(kind)}')
        sql = correlation = action = None
        if kind == "Sql":
            if "CorrelationFilter" in props:
                raise DeclarationError(f"{where}.CorrelationFilter", 'not allowed with FilterType "Sql"')
            if "SqlFilter" not in props:
                raise DeclarationError(f"{where}.SqlFilter", 'is required with FilterType "Sql"')
            sql = _expression(reader, props["SqlFilter"], f"{where}.SqlFilter")
        else:
            if "SqlFilter" in props:
                raise DeclarationError(f"{where}.SqlFilter", 'not allowed with FilterType "Correlation"')
            if "CorrelationFilter" not in props:
                raise DeclarationError(f"{where}.CorrelationFilter", 'is required with FilterType "Correlation"')
            correlation = reader.correlation(props["CorrelationFilter"], f"{where}.CorrelationFilter")
        if "Action" in props:
            action = _expression(reader, props["Action"], f"{where}.Action")
        found.append(RuleSpec(name, sql_filter=sql, correlation_filter=correlation, sql_action=action))
    return tuple(found)


def _expression(reader: _Reader, value: Any, path: str) -> str:
    table = reader.table(value, path, {"SqlExpression"}, ("SqlExpression",))
    return reader.text(table["SqlExpression"], f"{path}.SqlExpression")


# -- the TOML form ------------------------------------------------------------------------------------------------
def parse_toml_entities(queues: Any, topics: Any, path: str) -> Declarations:
    """``[servicebus.queues.NAME]`` and ``[servicebus.topics.NAME]`` (with ``subscriptions.SUB`` and their
    ``[[rules]]``); ``path`` is the section's dotted name (``servicebus``)."""
    reader = _Reader(toml=True)
    declared_queues: dict[str, EntityProperties] = {}
    declared_topics: dict[str, EntityProperties] = {}
    subscriptions: dict[tuple[str, str], EntityProperties] = {}
    taken: set[str] = set()
    for name, raw in reader.named(queues, f"{path}.queues", taken).items():
        declared_queues[name] = reader.properties(raw, f"{path}.queues.{name}", _QUEUE_PROPERTIES)
    for topic, raw in reader.named(topics, f"{path}.topics", taken).items():
        where = f"{path}.topics.{topic}"
        table = raw if isinstance(raw, dict) else reader.table(raw, where, set())
        subs = table.get("subscriptions", {})
        own = {k: v for k, v in table.items() if k != "subscriptions"}
        declared_topics[topic] = reader.properties(own, where, _TOPIC_PROPERTIES)
        for sub, sub_raw in reader.named(subs, f"{where}.subscriptions", set(), subscription=True).items():
            sub_where = f"{where}.subscriptions.{sub}"
            rules = sub_raw.get("rules") if isinstance(sub_raw, dict) else None
            own = {k: v for k, v in sub_raw.items() if k != "rules"} if isinstance(sub_raw, dict) else sub_raw
            props = reader.properties(own, sub_where, _SUBSCRIPTION_PROPERTIES)
            if rules is not None:
                items = reader.items(rules, f"{sub_where}.rules")
                props = replace(props, rules=_toml_rules(reader, items, f"{sub_where}.rules"))
            subscriptions[(topic, sub)] = props
    return Declarations(declared_queues, declared_topics, subscriptions, tuple(reader.not_implemented))


def _toml_rules(reader: _Reader, rules: list[Any], path: str) -> tuple[RuleSpec, ...]:
    """``[[...rules]]`` tables: ``name``, one of ``sql_filter`` (text) and ``correlation_filter`` (a table), and
    an optional ``action`` (text)."""
    found: list[RuleSpec] = []
    taken: set[str] = set()
    for index, raw in enumerate(rules):
        where = f"{path}[{index}]"
        if not isinstance(raw, dict):
            raise DeclarationError(where, f"expected a table, got {_kind(raw)}")
        for given in raw:
            if given not in ("name", "sql_filter", "correlation_filter", "action"):
                known = "action, correlation_filter, name, sql_filter"
                raise DeclarationError(f"{where}.{given}", f"unknown key (known keys here: {known})")
        if "name" not in raw:
            raise DeclarationError(f"{where}.name", "is required")
        name = reader.text(raw["name"], f"{where}.name")
        if key(name) in taken:
            raise DeclarationError(f"{where}.name", f"rule {name!r} is declared twice")
        taken.add(key(name))
        if ("sql_filter" in raw) == ("correlation_filter" in raw):
            raise DeclarationError(where, "needs exactly one of sql_filter and correlation_filter")
        sql = reader.text(raw["sql_filter"], f"{where}.sql_filter") if "sql_filter" in raw else None
        correlation = (
            reader.correlation(raw["correlation_filter"], f"{where}.correlation_filter")
            if "correlation_filter" in raw
            else None
        )
        action = reader.text(raw["action"], f"{where}.action") if "action" in raw else None
        found.append(RuleSpec(name, sql_filter=sql, correlation_filter=correlation, sql_action=action))
    return tuple(found)
