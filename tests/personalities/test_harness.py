"""The harness itself: each personality's world really runs under it."""

from __future__ import annotations

import pytest

from minibroker.broker.personality import names
from tests.personalities.harness import peer, world


@pytest.mark.parametrize("name", names())
def test_every_personality_runs_a_connection(name: str) -> None:
    w = world(name)
    p = peer(w)
    assert w.broker.default.personality.name == name
    assert p.client.remote_open is not None
