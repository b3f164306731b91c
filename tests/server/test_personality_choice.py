"""Choosing a personality when embedding: ``[broker] personality`` is the broker's (its default namespace's), and
``create_namespace(personality=...)`` gives one namespace another, on the trio runner and the thread runner."""

from __future__ import annotations

import pytest
import trio

import minibroker
from minibroker.broker.personality import STRICT, names
from minibroker.testing.thread import ThreadedBroker, run_in_thread


async def test_the_configured_personality_is_the_default_namespaces_and_new_ones_by_default() -> None:
    async with minibroker.serve({"server": {"port": 0}, "broker": {"personality": "strict"}}) as running:
        assert running.broker.settings.personality.name == "strict"
        assert running.broker.default.personality.name == "strict"
        assert running.personality == "strict"
        with trio.fail_after(5):
            created = await running.create_namespace("plain")
        assert running.broker.namespaces["plain"].personality.name == "strict"
        assert created.personality == "strict"


async def test_running_broker_creates_a_namespace_with_the_personality_named() -> None:
    async with minibroker.serve({"server": {"port": 0}}) as running:
        assert running.broker.default.personality.name == "minibroker"
        with trio.fail_after(5):
            strict = await running.create_namespace("s", personality="strict")
            by_value = await running.create_namespace(personality=STRICT)
            default = await running.create_namespace("d")
        assert running.broker.namespaces["s"].personality.name == "strict"
        assert strict.personality == "strict"
        assert running.broker.namespaces[by_value.namespace_name].personality is STRICT
        assert running.broker.namespaces["d"].personality.name == "minibroker"
        assert default.personality == "minibroker"
        assert running.personality == "minibroker"


async def test_running_broker_refuses_an_unknown_personality_naming_the_known_ones() -> None:
    async with minibroker.serve({"server": {"port": 0}}) as running:
        with pytest.raises(ValueError, match="unknown personality 'nobody'") as info:
            await running.create_namespace("n", personality="nobody")
        assert ", ".join(names()) in str(info.value)
        assert "n" not in running.broker.namespaces


async def test_an_existing_namespace_is_not_silently_given_another_personality() -> None:
    async with minibroker.serve({"server": {"port": 0}}) as running:
        with trio.fail_after(5):
            await running.create_namespace("s", personality="strict")
            with pytest.raises(ValueError, match="exists with personality 'strict'"):
                await running.create_namespace("s", personality="minibroker")
            again = await running.create_namespace("s", personality="strict")  # the same: as before, a listener
        assert again.personality == "strict"


def test_threaded_broker_creates_a_namespace_with_the_personality_named(broker: ThreadedBroker) -> None:
    strict = broker.create_namespace("s", personality="strict")
    default = broker.create_namespace()
    assert broker.call(lambda running: running.broker.namespaces["s"].personality.name) == "strict"
    assert strict.personality == "strict"
    assert default.personality == "minibroker"
    assert broker.personality == "minibroker"
    with pytest.raises(ValueError, match="unknown personality 'nobody'"):
        broker.create_namespace("n", personality="nobody")
    assert broker.call(lambda running: "n" in running.broker.namespaces) is False


def test_threaded_broker_started_with_a_personality() -> None:
    with run_in_thread({"server": {"port": 0}, "broker": {"personality": "strict"}}) as broker:
        assert broker.personality == "strict"
        assert broker.create_namespace(personality="minibroker").personality == "minibroker"
