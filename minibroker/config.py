"""Configuration: TOML (stdlib ``tomllib``) into frozen dataclasses.

Every key has a default, documented in ``conf/minibroker.toml``. A bad file raises ``ConfigError`` naming
the file, the dotted key and what is wrong; an unknown key is an error, never silently ignored. The value of a
secret key (a password in ``[auth.users]``) is never shown in an error: only its type.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from minibroker.auth import is_hashed, valid_hash
from minibroker.broker import personality as personalities
from minibroker.broker.checkback import ORPHANED
from minibroker.broker.faults import FaultSpec
from minibroker.broker.permissions import Permissions
from minibroker.broker.policy import OVERFLOW_POLICIES, NodePolicy
from minibroker.servicebus.declarations import (
    DeclarationError,
    Declarations,
    parse_emulator_config,
    parse_toml_entities,
)
from minibroker.store import RECOVER_MODES

CLOCK_MODES = ("real", "virtual")
"""``[broker] clock``: what the broker's timers run on (``minibroker.server.clock``)."""


class ConfigError(Exception):
    """A configuration that cannot be used; the message names the file, the key and the problem."""


@dataclass(frozen=True)
class ServerConfig:
    """``[server]``: the AMQP listener and connection limits."""

    host: str = "127.0.0.1"
    port: int = 5672
    container_id: str = "minibroker"
    max_frame_size: int = 65536
    channel_max: int = 255
    idle_timeout: float = 0.0
    """Seconds of silence after which a peer is dropped; 0 disables (heartbeats to the peer still go out)."""
    min_heartbeat_interval: float = 0.5
    """Seconds: heartbeats never go out more often; a peer announcing a shorter idle-time-out is refused."""
    max_message_size: int = 100 * 1024 * 1024
    """Largest message accepted, in bytes; 0 means no limit (then a peer can grow memory without bound)."""
    max_connections: int = 1000
    """Open connections at once (past SASL and open); one more gets its open answered with
    close(amqp:resource-limit-exceeded). Connections still in their handshake count against
    ``max_pending_handshakes`` instead."""
    max_pending_handshakes: int = 256
    """Connections at once still in their handshake (TLS, protocol header, SASL, open); a new socket beyond
    closes the oldest of them."""
    max_sessions: int = 256
    """Sessions at once on one connection."""
    max_links_per_session: int = 1024
    """Links attached at once on one session."""
    handshake_timeout: float = 10.0
    """Seconds a new connection has to get through SASL and open; 0 disables."""


@dataclass(frozen=True)
class TlsConfig:
    """``[tls]``: an amqps listener (AMQP over TLS) besides the plain one."""

    enabled: bool = False
    port: int = 5671
    cert_file: str = ""
    key_file: str = ""
    ca_file: str = ""
    """CA certificates for client certificates; needed when client_auth is not "none"."""
    client_auth: str = "none"
    """"none", "optional" or "required": whether clients present certificates."""
    sasl_external: bool = True
    """Offer SASL EXTERNAL to a client that presented a certificate (its subject CN becomes the user)."""


@dataclass(frozen=True)
class AuthConfig:
    """``[auth]``: SASL. With users configured, PLAIN is checked and ANONYMOUS refused."""

    anonymous: bool = True
    users: dict[str, str] = field(default_factory=dict, repr=False)
    """Users and their passwords, plain or hashed with ``minibroker hash-password`` (not in the repr); an empty
    password matches nothing: a user who logs in with a client certificate only."""
    failure_delay: float = 1.0
    """Seconds a failed SASL authentication waits before its answer (slows password guessing)."""
    hash_threads: int = 2
    """Password hashes checked at once, each in a worker thread (never on the event loop)."""
    max_failures_per_address: int = 10
    """Failed logins a peer address may make at once, and again each ``failure_window``; beyond, its
    attempts are refused unchecked, after a growing delay. 0: no limit."""
    max_failures_per_user: int = 30
    """The same per user name, whatever the addresses the attempts come from. 0: no limit."""
    failure_window: float = 60.0
    """Seconds in which the failure allowances above refill."""
    external_any: bool = False
    """SASL EXTERNAL for any certificate the CA signed; false: only for a common name in ``users``."""
    permissions: dict[str, Permissions] = field(default_factory=dict)
    """``[auth.permissions.USER]``: address patterns the user may send to and receive from."""


@dataclass(frozen=True)
class HttpConfig:
    """``[http]``: the HTTP management API, off unless a port is given."""

    host: str = "127.0.0.1"
    """Address of the HTTP listener; not the AMQP one, so exposing AMQP does not expose management."""
    port: int | None = None
    """TCP port; unset: no HTTP listener; 0 picks a free port."""
    max_body_size: int = 1024 * 1024
    """Largest request body accepted, in bytes; a larger one is answered 413."""
    request_timeout: float = 10.0
    """Seconds a client has to send a whole request (head and body); a slower one is answered 408 and closed."""
    max_connections: int = 64
    """HTTP connections served at once; one more takes the place of the one idle longest, or gets 503."""


@dataclass(frozen=True)
class BrokerConfig:
    """``[broker]``: node and transaction policies."""

    auto_create: bool = True
    link_credit: int = 1000
    transaction_timeout: float = 300.0
    """Seconds after which an open transaction is rolled back; 0 means never."""
    max_transactions_per_connection: int = 100
    """Transactions one connection may hold at once (open, or timed out and not yet discharged); a declare beyond
    is rejected."""
    max_staged_bytes: int = 64 * 1024 * 1024
    """Bytes of messages one transaction may post; past it, posts are rejected and the commit fails."""
    max_total_staged_bytes: int = 1024 * 1024 * 1024
    """Bytes of messages all open transactions together may post; past it, as past max_staged_bytes."""
    max_nodes: int = 10000
    """Nodes (queues and topics, all namespaces) beyond which an attach or relay post that would create one is
    refused with amqp:resource-limit-exceeded."""
    max_links: int = 65536
    """Links attached at once on the whole broker; an attach beyond is refused."""
    max_subscriptions_per_topic: int = 1000
    """Subscriptions one topic holds at once; a receiver link that would create one more is refused."""
    max_subscriptions_per_connection: int = 1000
    """Receiver links on topics one connection holds at once; one more is refused."""
    auto_delete_idle: float = 300.0
    """Seconds after which a node created on demand that is empty, without links and without transactional work is
    deleted; 0 means never."""
    max_selector_length: int = 4096
    """Characters of a JMS selector; a longer one is refused on attach with amqp:invalid-field. 0: no limit."""
    max_selector_properties_size: int = 64 * 1024
    """Bytes of a message's header, properties or application-properties section a selector reads; a message with a
    larger one is not selected by a selector that reads a field of that section. 0: no limit."""
    personality: str = "minibroker"
    """The personality of the default namespace and of namespaces created without one (``minibroker
    personalities`` lists them)."""
    capture: bool = False
    """Record every frame of every connection (``--capture``): ``broker.frames()``, the pcap, ``minibroker
    replay``."""
    capture_limit: int = 10000
    """Frames kept per connection when capturing; beyond, the oldest are dropped (and counted)."""
    clock: str = "real"
    """What the broker's timers (transaction time-outs, ttl, scheduled delivery, redelivery delay) run on: "real"
    time, or "virtual" time that moves only when advanced (``POST /api/clock/advance``, ``broker.clock.advance``)."""


@dataclass(frozen=True)
class TransactionsConfig:
    """``[transactions]``: in-doubt transactions with check-back (``minibroker/broker/checkback.py``)."""

    orphaned: str = "rollback"
    """The open transactions of a lost connection: "rollback" (the specification) or "hold" (in doubt, for every
    controller; one may also ask with the coordinator capability ``minibroker:check-back``). Never under strict."""
    check_immunity: float = 60.0
    """Seconds after the loss before the first check message on ``$txn-check``."""
    check_interval: float = 30.0
    """Seconds between checks, and after the last one before the transaction is abandoned (rolled back)."""
    check_max: int = 15
    """Checks sent before an undecided transaction is abandoned."""
    outcome_retention: float = 600.0
    """Seconds the outcome of an ended check-back transaction is remembered for outcome queries."""


@dataclass(frozen=True)
class ServiceBusConfig:
    """``[servicebus]``: entities of the ``servicebus`` personality, declared here or in the Service Bus emulator's
    ``Config.json``, and the SAS keys ``$cbs`` checks tokens against (``minibroker.servicebus``)."""

    config: str = ""
    """The emulator's ``Config.json`` (relative to the TOML file); its entities join those declared here."""
    sas_keys: dict[str, str] = field(default_factory=dict, repr=False)
    """Shared access keys by name; set: a put-token to ``$cbs`` must carry a token one of them signed (401
    otherwise); empty: any token is accepted."""
    entities: Declarations = field(default_factory=Declarations)
    """``[servicebus.queues.NAME]``, ``[servicebus.topics.NAME]`` (with ``subscriptions.SUB``) and the entities
    of ``config``, created at start in every namespace of the ``servicebus`` personality."""

    @property
    def configured(self) -> bool:
        """Whether anything is configured (then the default personality is ``servicebus``)."""
        return bool(self.config or self.sas_keys or self.entities)


@dataclass(frozen=True)
class Config:
    """The whole configuration."""

    server: ServerConfig = field(default_factory=ServerConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    transactions: TransactionsConfig = field(default_factory=TransactionsConfig)
    node_defaults: NodePolicy = field(default_factory=NodePolicy)
    """``[node_defaults]``: the policy of nodes created on demand, and the base of declared ones."""
    queues: dict[str, NodePolicy] = field(default_factory=dict)
    """``[queues.NAME]``: queues created at start-up (in every namespace), each key defaulting to node_defaults."""
    topics: dict[str, NodePolicy] = field(default_factory=dict)
    """``[topics.NAME]``: topics created at start-up, like queues."""
    log_level: str = "info"
    trace_frames: bool = False
    data_dir: str | None = None
    """Directory of the journal that keeps durable messages and committed transactions; unset: memory only."""
    data_sync: str = "always"
    """With a data_dir: "always" fsyncs before answering accepted (group commit); "never" does not wait."""
    data_recover: str = "strict"
    """With a data_dir: "strict" refuses to start on a corrupt journal (exit 2, naming segment and offset);
    "skip-corrupt" skips the corrupt records (a copy of the segment is kept in ``quarantine/``)."""
    faults: tuple[FaultSpec, ...] = ()
    """``[[faults]]``: fault injection rules in force from the start (``minibroker.broker.faults``)."""
    servicebus: ServiceBusConfig = field(default_factory=ServiceBusConfig)
    """``[servicebus]``: Service Bus entities and SAS keys. Configuring any makes ``servicebus`` the personality
    unless ``[broker] personality`` names one."""

    @classmethod
    def load(cls, path: str | Path, *, servicebus_config: str | Path | None = None) -> Config:
        """Read a TOML file; ``servicebus_config`` (``--servicebus-config``) replaces its ``[servicebus] config``."""
        import tomllib  # only with a config file: the default configuration's start-up does without (issue 19)

        path = Path(path)
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such file") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
        if servicebus_config is not None:
            section = raw.setdefault("servicebus", {})
            if isinstance(section, dict):  # (else the section's own error is reported)
                section["config"] = str(Path(servicebus_config).absolute())
        return cls.from_dict(raw, source=str(path), base=path.parent)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], *, source: str = "<dict>", base: str | Path | None = None) -> Config:
        """Build from a dict shaped like the TOML file; relative file names are relative to ``base`` (default: the
        working directory)."""
        config: Config = _build(cls, raw, source, "", Path(base) if base is not None else Path())
        return config

    def replace(self, **changes: Any) -> Config:
        """A copy with top-level or ``section__key`` fields changed (``server__port=0``)."""
        sections: dict[str, dict[str, Any]] = {}
        top: dict[str, Any] = {}
        for key, value in changes.items():
            if "__" in key:
                section, name = key.split("__", 1)
                sections.setdefault(section, {})[name] = value
            else:
                top[key] = value
        for section, values in sections.items():
            top[section] = dataclasses.replace(getattr(self, section), **values)
        return dataclasses.replace(self, **top)


_SECTIONS: dict[str, type] = {
    "server": ServerConfig,
    "auth": AuthConfig,
    "broker": BrokerConfig,
    "node_defaults": NodePolicy,
    "tls": TlsConfig,
    "http": HttpConfig,
    "transactions": TransactionsConfig,
}
_LOG_LEVELS = ("debug", "info", "warning", "error")


_KINDS: tuple[tuple[type, str], ...] = (
    (bool, "a boolean"),
    (int, "an integer"),
    (float, "a number"),
    (str, "a string"),
    (list, "a list"),
    (dict, "a table"),
)


def _shown(value: Any, secret: bool) -> str:
    """``value`` as an error message may show it: only its kind when it is secret."""
    if not secret:
        return repr(value)
    kind = next((name for cls, name in _KINDS if isinstance(value, cls)), "a value")
    return f"{kind} (not shown: the key is secret)"


def _is_secret(cls: type, key: str) -> bool:
    """Keys whose values are never shown: passwords (``[auth.users]``) and anything named like key material."""
    return (cls is AuthConfig and key == "users") or any(w in key for w in ("password", "secret", "private"))


def _table(value: Any, where: str, secret: bool = False) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a table, got {_shown(value, secret)}")
    return value


def _check_type(value: Any, expected: Any, where: str, secret: bool = False) -> Any:
    got = f"got {_shown(value, secret)}"
    if expected in ("float", float):
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{where}: expected a number, {got}")
    if expected in ("int", int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected an integer, {got}")
    if expected in ("bool", bool):
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true or false, {got}")
    if expected in ("str", str):
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, {got}")
    if expected == "int | None":
        return None if value is None else _check_type(value, int, where, secret)
    if expected == "str | None":
        return None if value is None else _check_type(value, str, where, secret)
    if expected == "float | None":
        return None if value is None else _check_type(value, float, where, secret)
    if expected == "tuple[str, ...]":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: expected a list of strings, {got}")
        return tuple(value)
    if expected == "dict[str, str]":
        _table(value, where, secret)
        return {k: _check_type(v, str, f"{where}.{k}", secret) for k, v in value.items()}
    raise ConfigError(f"{where}: unsupported setting type {expected}")  # pragma: no cover


def _build(cls: type, raw: Any, source: str, prefix: str, directory: Path = Path()) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: {prefix.rstrip('.') or 'top level'}: expected a table, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        where = f"{source}: {prefix}{key}"
        spec = fields.get(key)
        if spec is None:
            known = ", ".join(sorted(fields)) or "none"
            raise ConfigError(f"{where}: unknown key (known keys here: {known})")
        if cls is AuthConfig and key == "permissions":
            values[key] = {
                user: _build(Permissions, _table(entry, f"{where}.{user}"), source, f"auth.permissions.{user}.")
                for user, entry in _table(value, where).items()
            }
        elif cls is Config and key in _SECTIONS:
            values[key] = _build(_SECTIONS[key], value, source, f"{key}.")
        elif cls is Config and key == "faults":
            values[key] = _faults(value, where)
        elif cls is Config and key == "servicebus":
            values[key] = _servicebus(value, source, directory)
        elif cls is Config and key in ("queues", "topics"):
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: expected a table of {key}")
            base = raw.get("node_defaults", {})
            if not isinstance(base, dict):
                base = {}
            values[key] = {
                name: _build(NodePolicy, {**base, **_table(node, f"{where}.{name}")}, source, f"{key}.{name}.")
                for name, node in value.items()
            }
        else:
            values[key] = _check_type(value, spec.type, where, _is_secret(cls, key))
    if cls is Config and values.get("servicebus", ServiceBusConfig()).configured:
        broker = raw.get("broker")
        if not (isinstance(broker, dict) and "personality" in broker):
            values["broker"] = dataclasses.replace(values.get("broker", BrokerConfig()), personality="servicebus")
    config = cls(**values)
    _validate(config, source, prefix)
    return config


def _servicebus(raw: Any, source: str, directory: Path) -> ServiceBusConfig:
    """``[servicebus]``: its keys, its declared entities and those of the emulator file it names."""
    section = _table(raw, f"{source}: servicebus")
    known = ("config", "sas_keys", "queues", "topics")
    for key in section:
        if key not in known:
            raise ConfigError(f"{source}: servicebus.{key}: unknown key (known keys here: {', '.join(sorted(known))})")
    config = _check_type(section.get("config", ""), str, f"{source}: servicebus.config")
    keys = _check_type(section.get("sas_keys", {}), "dict[str, str]", f"{source}: servicebus.sas_keys", secret=True)
    for name, value in keys.items():
        if not name or not value:
            raise ConfigError(f"{source}: servicebus.sas_keys.{name}: a key name and its key must not be empty")
    try:
        entities = parse_toml_entities(section.get("queues", {}), section.get("topics", {}), "servicebus")
    except DeclarationError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    if config:
        path = directory / config
        where = f"{source}: servicebus.config: {path}"
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"{where}: no such file") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{where}: cannot read: {exc}") from None
        try:
            entities = entities.merged(parse_emulator_config(text), "UserConfig.Namespaces")
        except DeclarationError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        config = str(path)
    return ServiceBusConfig(config=config, sas_keys=keys, entities=entities)


def _faults(value: Any, where: str) -> tuple[FaultSpec, ...]:
    """The ``[[faults]]`` tables, each a rule (``FaultSpec``); an error names the table's index and the field."""
    if not isinstance(value, list):
        raise ConfigError(f"{where}: expected an array of tables ([[faults]])")
    rules = []
    for index, raw in enumerate(value):
        table = _table(raw, f"{where}[{index}]")
        try:
            rules.append(FaultSpec.from_mapping(table))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}[{index}].{exc}") from None
    return tuple(rules)


def _validate(config: Any, source: str, prefix: str) -> None:
    def bad(key: str, problem: str) -> ConfigError:
        return ConfigError(f"{source}: {prefix}{key}: {problem}")

    if isinstance(config, ServerConfig):
        if not 0 <= config.port <= 65535:
            raise bad("port", f"{config.port} is not a TCP port (0-65535)")
        if config.max_frame_size < 512:
            raise bad("max_frame_size", f"{config.max_frame_size} is below the AMQP minimum of 512")
        if not 0 <= config.channel_max <= 65535:
            raise bad("channel_max", f"{config.channel_max} is not in 0-65535")
        if config.idle_timeout < 0:
            raise bad("idle_timeout", "must not be negative")
        if config.min_heartbeat_interval < 0:
            raise bad("min_heartbeat_interval", "must not be negative")
        if config.max_message_size < 0:
            raise bad("max_message_size", "must not be negative")
        for key in ("max_connections", "max_pending_handshakes", "max_sessions", "max_links_per_session"):
            if getattr(config, key) < 1:
                raise bad(key, "must be at least 1")
        if config.handshake_timeout < 0:
            raise bad("handshake_timeout", "must not be negative")
    elif isinstance(config, AuthConfig):
        for user, stored in config.users.items():
            if is_hashed(stored) and not valid_hash(stored):
                raise bad(f"users.{user}", "is not a valid hash (make one with `minibroker hash-password`)")
        if config.failure_delay < 0:
            raise bad("failure_delay", "must not be negative")
        if config.hash_threads < 1:
            raise bad("hash_threads", "must be at least 1")
        for key in ("max_failures_per_address", "max_failures_per_user"):
            if getattr(config, key) < 0:
                raise bad(key, "must not be negative")
        if config.failure_window <= 0:
            raise bad("failure_window", "must be positive")
    elif isinstance(config, TlsConfig):
        if config.client_auth not in ("none", "optional", "required"):
            raise bad("client_auth", f"{config.client_auth!r} is not one of none, optional, required")
        if config.enabled:
            for key in ("cert_file", "key_file") + (("ca_file",) if config.client_auth != "none" else ()):
                value = getattr(config, key)
                if not value:
                    raise bad(key, "is required when tls is enabled")
                if not Path(value).is_file():
                    raise bad(key, f"no such file: {value}")
        if not 0 <= config.port <= 65535:
            raise bad("port", f"{config.port} is not a TCP port (0-65535)")
    elif isinstance(config, HttpConfig):
        if config.port is not None and not 0 <= config.port <= 65535:
            raise bad("port", f"{config.port} is not a TCP port (0-65535)")
        for key in ("max_body_size", "max_connections"):
            if getattr(config, key) < 1:
                raise bad(key, "must be at least 1")
        if config.request_timeout <= 0:
            raise bad("request_timeout", "must be positive")
    elif isinstance(config, BrokerConfig):
        if config.link_credit < 1:
            raise bad("link_credit", "must be at least 1")
        if config.transaction_timeout < 0:
            raise bad("transaction_timeout", "must not be negative")
        if config.max_transactions_per_connection < 1:
            raise bad("max_transactions_per_connection", "must be at least 1")
        for key in (
            "max_staged_bytes",
            "max_total_staged_bytes",
            "max_nodes",
            "max_links",
            "max_subscriptions_per_topic",
            "max_subscriptions_per_connection",
        ):
            if getattr(config, key) < 1:
                raise bad(key, "must be at least 1")
        if config.auto_delete_idle < 0:
            raise bad("auto_delete_idle", "must not be negative")
        if config.capture_limit < 1:
            raise bad("capture_limit", "must be at least 1")
        for key in ("max_selector_length", "max_selector_properties_size"):
            if getattr(config, key) < 0:
                raise bad(key, "must not be negative")
        if config.personality not in personalities.names():
            known = ", ".join(personalities.names())
            raise bad("personality", f"unknown personality {config.personality!r} (known: {known})")
        if config.clock not in CLOCK_MODES:
            raise bad("clock", f"{config.clock!r} is not one of {', '.join(CLOCK_MODES)}")
    elif isinstance(config, TransactionsConfig):
        if config.orphaned not in ORPHANED:
            raise bad("orphaned", f"{config.orphaned!r} is not one of {', '.join(ORPHANED)}")
        for key in ("check_immunity", "check_interval", "outcome_retention"):
            if not math.isfinite(getattr(config, key)):  # (NaN passes the checks below: never checked, held for ever)
                raise bad(key, "must be a finite number of seconds")
            if getattr(config, key) < 0:
                raise bad(key, "must not be negative")
        if config.check_interval == 0:
            raise bad("check_interval", "must be positive")
        if config.check_max < 1:
            raise bad("check_max", "must be at least 1")
    elif isinstance(config, NodePolicy):
        for key in ("max_messages", "max_bytes", "max_delivery_attempts"):
            if getattr(config, key) < 0:
                raise bad(key, "must not be negative")
        if config.overflow not in OVERFLOW_POLICIES:
            raise bad("overflow", f"{config.overflow!r} is not one of {', '.join(OVERFLOW_POLICIES)}")
        if config.redelivery_delay < 0:
            raise bad("redelivery_delay", "must not be negative")
        ttl = config.message_ttl
        if ttl is not None and not (math.isfinite(ttl) and ttl >= 0):
            raise bad("message_ttl", "must be a finite number of seconds, not negative")
        if config.max_priority is not None and not 0 <= config.max_priority <= 255:
            raise bad("max_priority", "must be from 0 to 255 (RabbitMQ's x-max-priority)")
    elif isinstance(config, Config) and config.log_level not in _LOG_LEVELS:
        raise bad("log_level", f"{config.log_level!r} is not one of {', '.join(_LOG_LEVELS)}")
    elif isinstance(config, Config) and config.data_sync not in ("always", "never"):
        raise bad("data_sync", f"{config.data_sync!r} is not one of always, never")
    elif isinstance(config, Config) and config.data_recover not in RECOVER_MODES:
        raise bad("data_recover", f"{config.data_recover!r} is not one of {', '.join(RECOVER_MODES)}")
