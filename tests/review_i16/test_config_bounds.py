"""Review of issue 16: ``[transactions]`` and ``[broker] capture_limit`` values that would make a broker hold
in-doubt transactions for ever, or its timers spin: refused at load with the key named."""

from __future__ import annotations

import math
from typing import Any

import pytest

from minibroker.config import Config, ConfigError


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("check_immunity", math.nan),
        ("check_immunity", math.inf),
        ("check_interval", math.nan),
        ("check_interval", math.inf),
        ("outcome_retention", math.nan),
    ],
)
def test_non_finite_check_back_times_are_refused(key: str, value: float) -> None:
    """NaN passes ``< 0`` and ``== 0``: a check at NaN never comes, so the transaction is never checked nor
    abandoned (held for ever); an infinite immunity or interval the same."""
    with pytest.raises(ConfigError, match=key):
        Config.from_dict({"transactions": {key: value}})


@pytest.mark.parametrize(("key", "value"), [("capture_limit", 0), ("capture_limit", -1)])
def test_a_capture_limit_below_one_is_refused(key: str, value: Any) -> None:
    """capture_limit frames per connection: 0 or negative is no bound that makes sense (a deque of maxlen 0 keeps
    nothing, a negative one fails at the first connection)."""
    with pytest.raises(ConfigError, match=key):
        Config.from_dict({"broker": {key: value}})
