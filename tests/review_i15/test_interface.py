"""Review of issue 15: choosing a personality through every interface with names and values that are not
personalities (the embedded handles, the HTTP API); none may create a namespace that then fails its connections."""

from __future__ import annotations

from typing import Any

import pytest
import trio

import minibroker
from minibroker.broker.personality import names
from tests.http.client import call, http_broker


@pytest.mark.parametrize("bad", [5, b"artemis", ["artemis"], {"name": "artemis"}, True])
async def test_running_broker_refuses_a_personality_that_is_no_name_nor_personality(bad: Any) -> None:
    """``RunningBroker.create_namespace(personality=<not a str, not a Personality>)`` raises (TypeError or
    ValueError) and creates no namespace, rather than making one whose every connection is an internal error."""
    async with minibroker.serve({"server": {"port": 0}}) as running:
        with trio.fail_after(5), pytest.raises((TypeError, ValueError)):
            await running.create_namespace("n", personality=bad)
        assert "n" not in running.broker.namespaces
        assert running.broker.internal_errors == 0


def test_threaded_broker_refuses_a_personality_that_is_no_name_nor_personality() -> None:
    """The thread runner's ``create_namespace`` refuses a non-name the same way, before the broker's thread."""
    from minibroker.testing.thread import run_in_thread

    with run_in_thread({"server": {"port": 0}}) as broker:
        with pytest.raises((TypeError, ValueError)):
            broker.create_namespace("n", personality=5)  # type: ignore[arg-type]
        assert broker.call(lambda running: "n" in running.broker.namespaces) is False


@pytest.mark.parametrize("bad", [5, ["artemis"], {"n": 1}, "", "Artemis", "bogus", True, None])
def test_http_create_namespace_with_a_bad_personality_is_400(bad: Any) -> None:
    """POST /api/namespaces with a personality that names none (or is not a string) is 400 naming the known ones,
    and creates nothing; null is the broker's default (201)."""
    with http_broker() as broker:
        answer = call(broker, "POST", "/api/namespaces", {"name": "n", "personality": bad})
        if bad is None:
            assert answer.status == 201
            assert answer.json["personality"] == "minibroker"
            return
        assert answer.status == 400, answer.body
        for name in names():
            assert name in answer.body.decode()
        assert broker.call(lambda running: "n" in running.broker.namespaces) is False
