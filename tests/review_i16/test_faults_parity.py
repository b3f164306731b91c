"""Review of issue 16 §1: Python, HTTP and config take the same fields with the same validation, and a firing is
counted alike in ``list()``, ``GET /api/faults`` and ``/metrics``."""

from __future__ import annotations

from typing import Any

import pytest

from minibroker.broker.faults import FaultSpec
from minibroker.config import Config, ConfigError
from minibroker.testing.peer import ScriptedPeer
from minibroker.testing.thread import run_in_thread
from tests.http.client import call, http_broker

FULL = {
    "point": "discharge",
    "action": "reject",
    "times": 3,
    "after": 2,
    "condition": "timeout",
    "description": "slow",
    "delay": 1.5,
    "address": "$coordinator",
    "container_id": "app",
}

BAD: list[dict[str, Any]] = [
    {"point": "deliver", "action": "reject"},
    {"point": "transfer", "action": "delay"},
    {"point": "transfer", "action": "delay", "delay": -1},
    {"point": "transfer", "action": "reject", "times": True},
    {"point": "transfer", "action": "reject", "after": "1"},
    {"point": "transfer", "action": "reject", "condition": "nope"},
    {"point": "transfer", "action": "reject", "address": 1},
    {"point": "transfer", "action": "reject", "colour": "red"},
    {"action": "reject"},
]


def test_the_same_rule_reads_the_same_everywhere() -> None:
    """Every field given through Python, HTTP and ``[[faults]]`` is listed identically (condition expanded)."""
    with http_broker(faults=[FULL]) as broker:
        fields = {k: v for k, v in FULL.items() if k not in ("point", "action")}
        broker.faults.add(FULL["point"], FULL["action"], **fields)
        assert call(broker, "POST", "/api/faults", FULL).status == 201
        listed = call(broker, "GET", "/api/faults").json
        assert [rule["id"] for rule in listed] == [1, 2, 3]
        shapes = [{k: v for k, v in rule.items() if k != "id"} for rule in listed]
        assert shapes[0] == shapes[1] == shapes[2]
        assert shapes[0]["condition"] == "amqp:transaction:timeout"
        assert shapes[0]["hits"] == 0


@pytest.mark.parametrize("raw", BAD)
def test_a_bad_rule_is_refused_alike_by_python_http_and_config(raw: dict[str, Any]) -> None:
    """The same bad rule: ValueError from Python, 400 over HTTP, ConfigError from the config, one message."""
    with pytest.raises((ValueError, TypeError)) as python:
        FaultSpec.from_mapping(raw)
    with pytest.raises(ConfigError) as config:
        Config.from_dict({"faults": [raw]})
    assert str(python.value) in str(config.value)
    with http_broker() as broker:
        answer = call(broker, "POST", "/api/faults", raw)
        assert answer.status == 400
        assert str(python.value) in answer.json["error"]
        assert call(broker, "GET", "/api/faults").json == []


def test_a_firing_is_counted_in_list_api_and_metrics() -> None:
    """One firing: hits 1 in list(), in GET /api/faults and minibroker_fault_firings_total{rule,point,action}."""
    with run_in_thread({"server": {"port": 0}, "http": {"port": 0}}) as broker:
        rule = broker.faults.add("connection", "drop", times=0)
        with (
            ScriptedPeer.connect("127.0.0.1", broker.port) as peer,
            pytest.raises(AssertionError, match="connection closed by the broker"),
        ):
            peer.open(container_id="x")  # answered by a drop: no open, no close frame
        broker.wait_for(lambda: broker.faults.list()[0].hits == 1)
        assert call(broker, "GET", "/api/faults").json[0]["hits"] == 1
        metrics = call(broker, "GET", "/metrics").body.decode()
        line = f'minibroker_fault_firings_total{{rule="{rule}",point="connection",action="drop"}} 1'
        assert line in metrics, [m for m in metrics.splitlines() if "fault" in m]
