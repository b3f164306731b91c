"""Fault injection over HTTP (issue 16 §1): ``/api/faults``, the rules' firings on ``/metrics``, and
``RemoteBroker.faults``, against a real broker in a thread with python-qpid-proton as the client."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from proton import Message

import minibroker
from minibroker.testing.thread import ThreadedBroker
from tests.http.client import call, http_broker
from tests.integration.helpers import blocking_connection


@pytest.fixture
def broker() -> Iterator[ThreadedBroker]:
    with http_broker() as running:
        yield running


def _send(broker: ThreadedBroker, address: str) -> Any:
    """Send one message; the broker's outcome of it (proton's ``SendException`` state when refused)."""
    with blocking_connection(broker) as conn:
        sender = conn.create_sender(address)
        try:
            sender.send(Message(body="x"))
        except Exception as exc:  # proton.utils.SendException: the outcome is on it
            return getattr(exc, "state", exc)
        return "accepted"


def test_post_list_and_delete_rules(broker: ThreadedBroker) -> None:
    answer = call(broker, "POST", "/api/faults", {"point": "transfer", "action": "reject", "address": "q", "times": 0})
    assert answer.status == 201, answer.body
    first = answer.json["id"]
    second = call(broker, "POST", "/api/faults", {"point": "discharge", "action": "reject", "condition": "timeout"})
    assert second.status == 201
    rules = call(broker, "GET", "/api/faults").json
    assert [(r["id"], r["point"], r["action"], r["hits"]) for r in rules] == [
        (first, "transfer", "reject", 0),
        (second.json["id"], "discharge", "reject", 0),
    ]
    assert rules[1]["condition"] == "amqp:transaction:timeout"
    assert rules[0] == {
        "id": first,
        "point": "transfer",
        "action": "reject",
        "times": 0,
        "after": 0,
        "condition": None,
        "description": None,
        "delay": None,
        "address": "q",
        "container_id": None,
        "hits": 0,
    }
    assert call(broker, "DELETE", f"/api/faults/{first}").json == {"removed": first}
    missing = call(broker, "DELETE", f"/api/faults/{first}")
    assert missing.status == 404
    assert missing.json == {"error": f"no fault rule {first}"}
    assert call(broker, "DELETE", "/api/faults/x").status == 400
    assert call(broker, "DELETE", "/api/faults").json == {"removed": 1}
    assert call(broker, "GET", "/api/faults").json == []


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"point": "attach"}, "action: missing"),
        ({"point": "attach", "action": "explode"}, "is no action of point 'attach' (its actions: refuse, detach)"),
        ({"point": "x", "action": "drop"}, "unknown fault point 'x'"),
        ({"point": "attach", "action": "refuse", "condition": "nope"}, "condition: unknown condition 'nope'"),
        ({"point": "attach", "action": "refuse", "times": "2"}, "times: expected an integer"),
        ({"point": "attach", "action": "refuse", "times": True}, "times: expected an integer"),
        ({"point": "attach", "action": "refuse", "colour": 1}, "colour: unknown field"),
        ({"point": "declare", "action": "delay"}, "delay: the action 'delay' needs a delay"),
        (["attach", "refuse"], "expected a JSON object"),
    ],
)
def test_a_bad_rule_is_400(broker: ThreadedBroker, body: Any, message: str) -> None:
    answer = call(broker, "POST", "/api/faults", body)
    assert answer.status == 400
    assert message in answer.json["error"]
    assert call(broker, "GET", "/api/faults").json == []


def test_malformed_json_is_400(broker: ThreadedBroker) -> None:
    answer = call(broker, "POST", "/api/faults", raw=b"{nope")
    assert answer.status == 400
    assert "malformed JSON" in answer.json["error"]


def test_a_rule_fires_and_is_counted_in_the_list_and_the_metrics(broker: ThreadedBroker) -> None:
    rule = call(broker, "POST", "/api/faults", {"point": "transfer", "action": "release", "address": "orders"}).json
    assert _send(broker, "orders") != "accepted"
    assert _send(broker, "orders") == "accepted"
    assert broker.queue("orders").depth == 1
    assert [r["hits"] for r in call(broker, "GET", "/api/faults").json] == [1]
    page = call(broker, "GET", "/metrics").body.decode()
    [family] = [f for f in text_string_to_metric_families(page) if f.name == "minibroker_fault_firings"]
    [sample] = family.samples
    assert sample.labels == {"rule": str(rule["id"]), "point": "transfer", "action": "release"}
    assert sample.value == 1


def test_the_remote_handle_speaks_the_same_api(broker: ThreadedBroker) -> None:
    assert broker.http_url is not None
    remote = minibroker.connect(broker.http_url)
    rule = remote.faults.add("attach", "refuse", address="closed", condition="amqp:not-found")
    [listed] = remote.faults.list()
    assert (listed.id, listed.point, listed.action, listed.condition, listed.hits) == (
        rule,
        "attach",
        "refuse",
        "amqp:not-found",
        0,
    )
    assert broker.faults.list() == [listed]  # the embedded handle sees the same rule
    with pytest.raises(ValueError, match="unknown fault point"):
        remote.faults.add("nowhere", "drop")
    assert remote.faults.remove(rule) is True
    assert remote.faults.remove(rule) is False
    remote.faults.add("deliver", "delay", delay=1.5)
    remote.faults.clear()
    assert remote.faults.list() == []


def test_rules_beyond_the_bound_are_refused(broker: ThreadedBroker) -> None:
    """Every event walks the rules, so a broker holds at most ``MAX_RULES``: one more is refused naming the bound,
    in Python and over HTTP (400)."""
    from minibroker.broker.faults import MAX_RULES

    for _ in range(MAX_RULES):
        broker.faults.add("transfer", "reject", address="elsewhere")
    with pytest.raises(ValueError, match=f"at most {MAX_RULES} fault rules"):
        broker.faults.add("transfer", "reject")
    answer = call(broker, "POST", "/api/faults", {"point": "transfer", "action": "reject"})
    assert answer.status == 400
    assert f"at most {MAX_RULES} fault rules" in str(answer.body)
    assert len(broker.faults.list()) == MAX_RULES
