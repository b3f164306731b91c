"""``[servicebus]`` and ``--servicebus-config`` (issue 17 item 11): the documented example loads, the emulator's
``Config.json`` is read relative to the TOML file, a Service Bus configuration makes ``servicebus`` the personality
unless one is named, and every kind of bad input exits 2 naming the files, the key and the JSON path."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minibroker.cli import build_parser, resolve_config
from minibroker.config import Config, ConfigError
from minibroker.testing.thread import run_in_thread

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "conf" / "minibroker.toml"
FIXTURE = ROOT / "tests" / "servicebus" / "data" / "Config.json"


def _servicebus_example() -> str:
    """The ``[servicebus]`` part of the example file, its commented examples uncommented."""
    text = EXAMPLE.read_text()
    part = text[text.index("\n[servicebus]\n") : text.index("# Fault injection")]
    lines = [line[2:] if line.startswith("# ") and ("=" in line or line.startswith("# [")) else line
             for line in part.splitlines()]  # fmt: skip
    return "\n".join(lines)


def test_the_example_documents_every_key_and_its_examples_load(tmp_path: Path) -> None:
    text = EXAMPLE.read_text()
    for documented in ("config =", "[servicebus.sas_keys]", "[servicebus.queues]", "[servicebus.topics]"):
        assert documented in text
    for name in ("lock_duration", "max_delivery_count", "default_message_time_to_live", "requires_session",
                 "dead_lettering_on_message_expiration", "sql_filter", "correlation_filter", "action"):  # fmt: skip
        assert f"{name} =" in text, name
    path = tmp_path / "c.toml"
    path.write_text(_servicebus_example().replace('config = ""', ""))
    config = Config.load(path)
    assert config.servicebus.entities.queues["orders"].lock_duration == 30.0
    assert config.servicebus.entities.subscriptions[("events", "audit")].lock_duration == 45.0
    assert config.servicebus.sas_keys == {"RootManageSharedAccessKey": "SAS_KEY_VALUE"}
    assert config.broker.personality == "servicebus"


def test_an_empty_section_is_no_configuration() -> None:
    assert Config.from_dict({"servicebus": {}}).broker.personality == "minibroker"
    assert not Config().servicebus.configured


def test_the_emulator_file_is_read_relative_to_the_toml_file(tmp_path: Path) -> None:
    (tmp_path / "emulator").mkdir()
    (tmp_path / "emulator" / "Config.json").write_text(FIXTURE.read_text())
    path = tmp_path / "c.toml"
    path.write_text('[servicebus]\nconfig = "emulator/Config.json"\n[servicebus.queues.extra]\nlock_duration = 7\n')
    config = Config.load(path)
    assert set(config.servicebus.entities.queues) == {"extra", "invoices", "plain"}
    assert config.servicebus.entities.queues["invoices"].max_delivery_count == 2
    assert config.broker.personality == "servicebus"


@pytest.mark.parametrize(("named", "expected"), [("strict", "strict"), ("minibroker", "minibroker")])
def test_a_named_personality_is_kept(named: str, expected: str) -> None:
    raw = {"broker": {"personality": named}, "servicebus": {"config": str(FIXTURE)}}
    assert Config.from_dict(raw).broker.personality == expected


GOOD_QUEUE = '{"UserConfig": {"Namespaces": [{"Name": "sbemulatorns", "Queues": [%s], "Topics": []}]}}'


@pytest.mark.parametrize(
    ("toml", "json_text", "key", "problem"),
    [
        ("[servicebus]\ncolour = 1\n", None, "servicebus.colour", "unknown key"),
        ("[servicebus]\nconfig = 3\n", None, "servicebus.config", "expected a string"),
        ("servicebus = 3\n", None, "servicebus", "expected a table"),
        ('[servicebus]\nconfig = "absent.json"\n', None, "servicebus.config", "no such file"),
        ("[servicebus.sas_keys]\nroot = 3\n", None, "servicebus.sas_keys.root", "(not shown: the key is secret)"),
        ('[servicebus.sas_keys]\nroot = ""\n', None, "servicebus.sas_keys.root", "must not be empty"),
        ('[servicebus.queues.q]\nlock_duration = "1m"\n', None, "servicebus.queues.q.lock_duration", "ISO-8601"),
        ("[servicebus.queues.q]\nmax_delivery_count = 0\n", None, "servicebus.queues.q.max_delivery_count", "at least"),
        ("[servicebus.queues.q]\nLockDuration = 1\n", None, "servicebus.queues.q.LockDuration", "unknown key"),
        ('[servicebus]\nconfig = "c.json"\n', "{not json", "servicebus.config", "$: not valid JSON"),
        (
            '[servicebus]\nconfig = "c.json"\n',
            GOOD_QUEUE % '{"Name": "q", "Properties": {"LockDuration": "soon"}}',
            "servicebus.config",
            "UserConfig.Namespaces[0].Queues[0].Properties.LockDuration: ",
        ),
        (
            '[servicebus]\nconfig = "c.json"\n',
            GOOD_QUEUE % '{"Name": "q", "Properties": {"MaxDeliveryCount": "3"}}',
            "servicebus.config",
            "Properties.MaxDeliveryCount: expected an integer",
        ),
        (
            '[servicebus]\nconfig = "c.json"\n',
            GOOD_QUEUE % '{"Name": "q", "Extra": 1}',
            "servicebus.config",
            "UserConfig.Namespaces[0].Queues[0].Extra: unknown key",
        ),
        (
            '[servicebus]\nconfig = "c.json"\n[servicebus.queues.Q]\n',
            GOOD_QUEUE % '{"Name": "q"}',
            "servicebus.config",
            "declared twice",
        ),
    ],
)
def test_bad_servicebus_config_names_file_key_and_problem(
    tmp_path: Path, toml: str, json_text: str | None, key: str, problem: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    if json_text is not None:
        (tmp_path / "c.json").write_text(json_text)
    with pytest.raises(ConfigError) as info:
        Config.load(path)
    message = str(info.value)
    assert message.startswith(f"{path}: {key}")
    assert problem in message
    if json_text is not None:
        assert str(tmp_path / "c.json") in message


# -- the command line ----------------------------------------------------------------------------------------------
def test_servicebus_config_flag_and_environment(tmp_path: Path) -> None:
    for args, env in (
        (["--servicebus-config", str(FIXTURE)], {}),
        ([], {"MINIBROKER_SERVICEBUS_CONFIG": str(FIXTURE)}),
    ):
        config = resolve_config(build_parser().parse_args(args), env)
        assert config.broker.personality == "servicebus"
        assert set(config.servicebus.entities.queues) == {"invoices", "plain"}
    named = resolve_config(
        build_parser().parse_args(["--servicebus-config", str(FIXTURE), "--personality", "strict"]), {}
    )
    assert named.broker.personality == "strict"
    toml = tmp_path / "c.toml"
    toml.write_text('[servicebus]\nconfig = "elsewhere.json"\n[servicebus.queues.extra]\n')
    both = resolve_config(build_parser().parse_args(["--config", str(toml), "--servicebus-config", str(FIXTURE)]), {})
    assert both.servicebus.config == str(FIXTURE)  # the command line's file replaces the TOML file's
    assert set(both.servicebus.entities.queues) == {"extra", "invoices", "plain"}


@pytest.mark.parametrize(("content", "problem"), [(None, "no such file"), ("{,}", "not valid JSON")])
def test_a_bad_servicebus_config_exits_2(tmp_path: Path, content: str | None, problem: str) -> None:
    path = tmp_path / "Config.json"
    if content is not None:
        path.write_text(content)
    result = subprocess.run(
        [sys.executable, "-m", "minibroker", "--port", "0", "--servicebus-config", str(path)],
        capture_output=True, text=True, timeout=20, env=dict(os.environ), check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert str(path) in result.stderr
    assert "servicebus.config" in result.stderr
    assert problem in result.stderr
    assert result.stdout == ""


def test_the_readme_example_loads(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Service Bus") :]
    example = section[section.index("```toml\n") + len("```toml\n") :]
    example = "\n".join(line.strip() for line in example[: example.index("```")].splitlines())
    (tmp_path / "Config.json").write_text(FIXTURE.read_text())
    (tmp_path / "c.toml").write_text(example)
    config = Config.load(tmp_path / "c.toml")
    assert config.servicebus.entities.queues["orders"].lock_duration == 30.0
    assert config.servicebus.entities.subscriptions[("events", "audit")].lock_duration == 45.0
    assert "invoices" in config.servicebus.entities.queues
    assert config.broker.personality == "servicebus"


def test_fields_without_effect_are_listed_once_at_start(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "Config.json"
    path.write_text(FIXTURE.read_text().replace('"ForwardTo": ""', '"ForwardTo": "plain"'))
    with (
        caplog.at_level(logging.WARNING, logger="minibroker"),
        run_in_thread({"server": {"port": 0}, "servicebus": {"config": str(path)}}),
    ):
        pass
    warnings = [r.getMessage() for r in caplog.records if "without effect" in r.getMessage()]
    assert len(warnings) == 1
    assert "UserConfig.Namespaces[0].Queues[0].Properties.ForwardTo" in warnings[0]
    assert "UserConfig.Logging.Type" in warnings[0]
