"""bench/attacks.py at reduced size: each attack on the broker's limits is answered as README "Limits and
security" says, and a bystander connection is served throughout. Full-size figures: ``python -m bench.soak
--only attacks``."""

from __future__ import annotations

import pytest

from bench.attacks import ATTACKS, run_attack

pytestmark = pytest.mark.slow


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_is_answered_and_the_bystander_served(name: str) -> None:
    result = run_attack(name, scale=0.02)
    assert result.ok, result
    assert result.bystander["error"] is None
    assert result.bystander["during"]["round_trips"] > 0
