"""``[[faults]]`` tables in the config file (issue 16 §1): read into rules, validated at load with errors that name
the file and the key, and in force from the start in a running broker."""

from __future__ import annotations

from pathlib import Path

import pytest

from minibroker.broker.faults import FaultSpec
from minibroker.config import Config, ConfigError
from minibroker.testing.thread import run_in_thread
from tests.integration.helpers import blocking_connection

RULES = """
[[faults]]
point = "discharge"
action = "lose-outcome"

[[faults]]
point = "transfer"
action = "reject"
address = "orders"
condition = "amqp:not-allowed"
times = 0
after = 2

[[faults]]
point = "deliver"
action = "delay"
delay = 1.5
container_id = "slow"
"""


def test_rules_are_read(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(RULES)
    assert Config.load(path).faults == (
        FaultSpec("discharge", "lose-outcome"),
        FaultSpec("transfer", "reject", times=0, after=2, condition="amqp:not-allowed", address="orders"),
        FaultSpec("deliver", "delay", delay=1.5, container_id="slow"),
    )
    assert Config().faults == ()


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[[faults]]\npoint = "attach"\naction = "boom"\n', "faults[0].action: 'boom' is no action of point 'attach'"),
        ('[[faults]]\npoint = "nope"\naction = "drop"\n', "faults[0].point: unknown fault point 'nope'"),
        ('[[faults]]\naction = "drop"\n', "faults[0].point: missing"),
        ('[[faults]]\npoint = "attach"\naction = "refuse"\nwhen = 1\n', "faults[0].when: unknown field"),
        ('[[faults]]\npoint = "attach"\naction = "refuse"\ntimes = "x"\n', "faults[0].times: expected an integer"),
        (
            '[[faults]]\npoint = "attach"\naction = "refuse"\n[[faults]]\npoint = "post"\naction = "reject"\n'
            'condition = "oops"\n',
            "faults[1].condition: unknown condition 'oops'",
        ),
        ('faults = "all"\n', "faults: expected an array of tables"),
        ("faults = [1]\n", "faults[0]: expected a table"),
    ],
)
def test_a_bad_rule_names_the_file_and_the_key(tmp_path: Path, toml: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as raised:
        Config.load(path)
    assert str(raised.value).startswith(f"{path}: faults")
    assert message in str(raised.value)


def test_configured_rules_are_in_force_from_the_start() -> None:
    config = {"server": {"port": 0}, "faults": [{"point": "attach", "action": "refuse", "address": "closed"}]}
    with run_in_thread(config) as broker:
        [rule] = broker.faults.list()
        assert (rule.point, rule.action, rule.address, rule.hits) == ("attach", "refuse", "closed", 0)
        with blocking_connection(broker) as conn, pytest.raises(Exception, match="not-allowed"):
            conn.create_sender("closed")
        assert broker.faults.list()[0].hits == 1
