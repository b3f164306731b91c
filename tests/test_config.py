"""Config: the documented example loads, every default matches it, and each kind of bad input names the
file, the dotted key and the problem."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from minibroker.broker.personality import names
from minibroker.config import Config, ConfigError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "conf" / "minibroker.toml"


def test_example_config_is_the_defaults() -> None:
    assert Config.load(EXAMPLE) == Config()


def test_example_documents_every_key() -> None:
    text = EXAMPLE.read_text()
    for section in ("server", "auth", "broker", "node_defaults", "tls", "http"):
        assert f"[{section}]" in text
        for field in dataclasses.fields(getattr(Config(), section)):
            documented = (f"\n{field.name} =", f"\n# {field.name} =", f"\n[{section}.{field.name}]")
            assert any(d in text for d in documented), field.name
    for field in dataclasses.fields(Config):
        if field.name == "servicebus":  # a section (its keys: tests/test_config_servicebus.py)
            assert "\n[servicebus]\n" in text
        elif field.name not in ("server", "auth", "broker", "node_defaults", "queues", "topics", "tls", "http"):
            assert f"{field.name} =" in text or f"[[{field.name}]]" in text, field.name


def test_values_are_read(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        'log_level = "debug"\n[server]\nport = 0\nidle_timeout = 2\n[auth.users]\nalice = "pw"\n'
        "[broker]\nauto_create = false\n[queues.orders]\n"
    )
    config = Config.load(path)
    assert config.server.port == 0
    assert config.server.idle_timeout == 2.0
    assert config.auth.users == {"alice": "pw"}
    assert config.broker.auto_create is False
    assert set(config.queues) == {"orders"}
    assert config.log_level == "debug"


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        ("colour = 1\n", "colour", "unknown key"),
        ("[server]\nprot = 1\n", "server.prot", "unknown key"),
        ('[server]\nport = "x"\n', "server.port", "expected an integer"),
        ("[server]\nport = 70000\n", "server.port", "not a TCP port"),
        ("[server]\nmax_frame_size = 100\n", "server.max_frame_size", "below the AMQP minimum"),
        ("[broker]\ntransaction_timeout = -1\n", "broker.transaction_timeout", "must not be negative"),
        ('[auth]\nanonymous = "yes"\n', "auth.anonymous", "expected true or false"),
        ("[auth.users]\nalice = 3\n", "auth.users.alice", "expected a string"),
        ('log_level = "loud"\n', "log_level", "is not one of"),
        ("server = 3\n", "server", "expected a table"),
        ("[queues.orders]\nsize = 1\n", "queues.orders.size", "unknown key"),
        ('[topics.t]\noverflow = "spill"\n', "topics.t.overflow", "is not one of"),
        ("[node_defaults]\nmax_messages = -1\n", "node_defaults.max_messages", "must not be negative"),
        ("[queues]\norders = 1\n", "queues.orders", "expected a table"),
        ('[broker]\npersonality = "nobody"\n', "broker.personality", "unknown personality 'nobody'"),
        ("[broker]\npersonality = 1\n", "broker.personality", "expected a string"),
        ('[broker]\nclock = "sundial"\n', "broker.clock", "'sundial' is not one of real, virtual"),
        ("[broker]\nclock = true\n", "broker.clock", "expected a string"),
    ],
)
def test_bad_config_names_file_key_and_problem(tmp_path: Path, text: str, key: str, problem: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        Config.load(path)
    message = str(info.value)
    assert str(path) in message
    assert f" {key}:" in message
    assert problem in message


def test_personality_is_read_and_an_unknown_one_lists_the_known(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[broker]\npersonality = "strict"\n')
    assert Config.load(path).broker.personality == "strict"
    assert Config().broker.personality == "minibroker"
    path.write_text('[broker]\npersonality = "Strict"\n')
    with pytest.raises(ConfigError) as info:
        Config.load(path)
    message = str(info.value)
    assert str(path) in message
    assert " broker.personality:" in message
    assert f"known: {', '.join(names())}" in message


def test_clock_is_real_by_default_and_virtual_when_told(tmp_path: Path) -> None:
    assert Config().broker.clock == "real"
    path = tmp_path / "c.toml"
    path.write_text('[broker]\nclock = "virtual"\n')
    assert Config.load(path).broker.clock == "virtual"


def test_not_toml(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[server\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        Config.load(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        Config.load(tmp_path / "absent.toml")


def test_from_dict_and_replace() -> None:
    config = Config.from_dict({"server": {"port": 0}})
    assert config.server.port == 0
    changed = config.replace(server__host="0.0.0.0", log_level="error")
    assert (changed.server.host, changed.server.port, changed.log_level) == ("0.0.0.0", 0, "error")
