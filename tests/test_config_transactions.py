"""``[transactions]`` (issue 16 §4, in-doubt transactions with check-back): documented in the example file with its
defaults, validated with errors naming the file and key, and handed to the broker core as it says."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from minibroker.broker.checkback import CheckBackSettings
from minibroker.config import Config, ConfigError, TransactionsConfig
from minibroker.server.app import check_back_settings

EXAMPLE = Path(__file__).resolve().parents[1] / "conf" / "minibroker.toml"


def test_the_example_documents_every_key_with_its_default() -> None:
    text = EXAMPLE.read_text()
    assert "\n[transactions]\n" in text
    for field in dataclasses.fields(TransactionsConfig):
        assert f"\n{field.name} =" in text, field.name
    assert Config.load(EXAMPLE).transactions == TransactionsConfig()


def test_the_core_gets_what_the_file_says() -> None:
    config = Config.from_dict({"transactions": {"orphaned": "hold", "check_max": 3, "check_immunity": 5}})
    assert check_back_settings(config) == CheckBackSettings(orphaned="hold", check_immunity=5, check_max=3)
    assert check_back_settings(Config()) == CheckBackSettings()


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        ({"orphaned": "keep"}, "orphaned: 'keep' is not one of rollback, hold"),
        ({"orphaned": 1}, "orphaned: expected a string"),
        ({"check_immunity": -1}, "check_immunity: must not be negative"),
        ({"check_interval": 0}, "check_interval: must be positive"),
        ({"check_max": 0}, "check_max: must be at least 1"),
        ({"check_max": 1.5}, "check_max: expected an integer"),
        ({"outcome_retention": -5}, "outcome_retention: must not be negative"),
        ({"check_every": 3}, "check_every: unknown key"),
    ],
)
def test_bad_values_name_the_file_and_key(tmp_path: Path, table: dict[str, object], problem: str) -> None:
    path = tmp_path / "bad.toml"
    lines = [f"{key} = {value!r}".replace("'", '"') for key, value in table.items()]
    path.write_text("[transactions]\n" + "\n".join(lines) + "\n")
    with pytest.raises(ConfigError) as info:
        Config.load(path)
    assert str(info.value).startswith(f"{path}: transactions.")
    assert problem in str(info.value)
