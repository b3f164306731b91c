"""Review of issue 17 item 1 with the JavaScript SDK (``@azure/service-bus`` 7.9 through node): with SAS keys
configured, the SDK's own tokens (signed with the connection string's key, for the audience it names) are taken,
so sends and receives work as without keys (the Python SDK's are in tests/servicebus/test_config.py)."""

from __future__ import annotations

import pytest

from minibroker.testing.thread import run_in_thread
from tests.servicebus.conftest import connection_string
from tests.servicebus.node_sdk import Line, NodeSdk

pytestmark = pytest.mark.timeout(60, func_only=True)  # the one-time npm install is outside this bound


def _play(js_sdk: NodeSdk, key: str, scenarios: list[str]) -> dict[str, list[Line]]:
    """``scenarios`` played against a broker whose one SAS key (RootManageSharedAccessKey) is ``key``."""
    config = {
        "server": {"port": 0},
        "broker": {"personality": "servicebus"},
        "servicebus": {"sas_keys": {"RootManageSharedAccessKey": key}},
    }
    with run_in_thread(config) as broker:
        return js_sdk.play(connection_string(broker.port), scenarios, {})


def test_the_js_sdk_with_configured_sas_keys(js_sdk: NodeSdk) -> None:
    played = _play(js_sdk, "SAS_KEY_VALUE", ["send_kinds", "topic"])
    assert set(played) == {"send_kinds", "topic"}
    for scenario, lines in played.items():
        assert lines, scenario
        assert all("error" not in line for line in lines), (scenario, lines)


def test_the_js_sdk_with_another_key_is_unauthorized(js_sdk: NodeSdk) -> None:
    (line,) = _play(js_sdk, "another key", ["send_kinds"])["send_kinds"]
    assert line["code"] == "UnauthorizedAccess"
    assert "signature does not match" in line["error"]
