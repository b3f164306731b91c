"""amqplib (node's AMQP 0-9-1 client, 0.10, promise API) against the AMQP port.

The ``amqplib`` fixture installs amqplib once with npm into ``tests/amqp091/.node`` (git-ignored, reused on later
runs) and plays one scenario of ``js/amqplib_scenarios.js`` per call: each prints what amqplib showed it as JSON
lines, asserted on here. A machine without node or npm fails these tests: they are never skipped. amqplib has no
channel transactions (no ``tx.*`` in its API), so none are played here; ``test_pika.py`` and ``test_aio_pika.py``
have them.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from minibroker.testing.thread import ThreadedBroker
from tests.npm_install import ensure_package, node_and_npm

pytestmark = pytest.mark.timeout(30, func_only=True)  # the one-time npm install is outside this bound

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "js" / "amqplib_scenarios.js"
CACHE = HERE / ".node"
"""npm ``--prefix`` of the install: amqplib lands in ``CACHE / "node_modules"``."""
RUN_TIMEOUT = 20.0
"""Upper bound of one node run (the script has its own 10 s guard)."""

Lines = dict[str, dict[str, Any]]
Play = Callable[[ThreadedBroker, str], Lines]


@pytest.fixture(scope="session")
def amqplib() -> Play:
    """amqplib, installed once, behind a callable that plays one scenario and returns its lines by ``what``."""
    node, npm = node_and_npm("the amqplib tests")
    ensure_package(npm, CACHE, "amqplib", "amqplib@0.10", "0.10.")
    env = {**os.environ, "NODE_PATH": str(CACHE / "node_modules")}

    def play(broker: ThreadedBroker, scenario: str) -> Lines:
        spec = json.dumps({"url": broker.amqp091_url, "scenario": scenario})
        try:
            proc = subprocess.run(
                [node, str(SCRIPT), spec], capture_output=True, text=True, timeout=RUN_TIMEOUT, env=env, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"amqplib still running after {RUN_TIMEOUT} s: {scenario}\n{exc.stderr!r}") from exc
        lines = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
        if proc.returncode != 0 or not lines or lines[-1] != {"done": True}:
            raise AssertionError(f"amqplib exited {proc.returncode} in {scenario}\n{proc.stderr}\n{proc.stdout}")
        found: Lines = {}
        for line in lines[:-1]:
            what = line.pop("what")
            assert what not in found, f"{scenario} printed {what!r} twice"
            found[what] = line
        return found

    return play


def test_publish_consume_ack(amqplib: Play, minibroker: ThreadedBroker) -> None:
    lines = amqplib(minibroker, "publish_consume_ack")
    assert lines["declared"] == {"queue": "orders", "messageCount": 0, "consumerCount": 0}
    assert lines["delivered"] == {
        "body": '{"id": 1}',
        "exchange": "",
        "routingKey": "orders",
        "redelivered": False,
        "messageCount": None,
        "contentType": "application/json",
        "headers": {"kind": "order", "n": 7},
        "deliveryMode": 2,
        "messageId": "m-1",
        "tagged": True,
    }
    assert lines["after"] == {"messageCount": 0, "consumerCount": 0}
    assert minibroker.queue("orders").depth == 0


def test_confirm_channel_acks_and_nacks(amqplib: Play, minibroker: ThreadedBroker) -> None:
    lines = amqplib(minibroker, "confirms")
    assert lines["confirmed"] == {"results": ["ack"] * 20}
    assert lines["small"] == {"results": ["ack", "nack"], "waited": "rejected"}  # x-overflow reject-publish
    assert lines["depth"] == {"messageCount": 20}


def test_prefetch(amqplib: Play, minibroker: ThreadedBroker) -> None:
    lines = amqplib(minibroker, "prefetch")
    assert lines["held"] == {"bodies": ["0", "1"], "more": 0}
    assert lines["then"] == {"bodies": ["2", "3"], "more": 0}
    assert minibroker.queue("limited").depth == 1


def test_get(amqplib: Play, minibroker: ThreadedBroker) -> None:
    lines = amqplib(minibroker, "get")
    got = lines["got"]["got"]
    assert [(m["body"], m["messageCount"], m["redelivered"], m["routingKey"]) for m in got] == [
        ("0", 2, False, "counted"),
        ("1", 1, False, "counted"),
        ("2", 0, False, "counted"),
    ]
    assert lines["empty"] == {"got": False}


def test_exchanges(amqplib: Play, minibroker: ThreadedBroker) -> None:
    lines = amqplib(minibroker, "exchanges")
    assert lines["routed"]["found"] == {
        "d1": ["a"],
        "d2": ["b"],
        "f1": ["k", "audit"],
        "f2": ["k", "audit"],
        "t1": ["stock.ibm.nyse"],
        "t2": ["stock.ibm.nyse", "stock.ibm"],
        "h-all": ["1"],
        "h-any": ["1", "2"],
    }


def test_nack_requeue_and_reject(amqplib: Play, minibroker: ThreadedBroker) -> None:
    lines = amqplib(minibroker, "nack_requeue")
    again = lines["again"]["got"]
    assert [(m["body"], m["redelivered"]) for m in again] == [("a", True), ("b", True)]
    assert (lines["last"]["got"]["body"], lines["last"]["got"]["redelivered"]) == ("b", True)
    assert lines["empty"] == {"got": False}
    assert minibroker.queue("work").depth == 0


def test_mandatory_unroutable_is_returned_then_acked(amqplib: Play, minibroker: ThreadedBroker) -> None:
    lines = amqplib(minibroker, "returned")
    returned = lines["returned"]
    assert (returned["body"], returned["routingKey"], returned["replyCode"], returned["replyText"]) == (
        "lost",
        "nowhere",
        312,
        "NO_ROUTE",
    )
    assert lines["confirmed"] == {"confirmed": "ack"}


def test_channel_errors_surface_as_amqplib_errors(amqplib: Play, minibroker: ThreadedBroker) -> None:
    lines = amqplib(minibroker, "channel_error")
    rejected = lines["rejected"]
    assert (rejected["code"], rejected["classId"], rejected["methodId"]) == (404, 50, 10)  # queue.declare
    assert "NOT_FOUND - no queue 'nowhere'" in rejected["message"]
    assert [e["code"] for e in lines["errors"]["errors"]] == [404]
    error = lines["publish error"]["error"]
    assert error["code"] == 404
    assert "no-such-exchange" in error["message"]
    assert lines["after"] == {"queue": "elsewhere"}
