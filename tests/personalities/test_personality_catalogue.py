"""The catalogue of personalities (personality.py): each one says what it is and where each quirk was read."""

from __future__ import annotations

import re

import pytest

from minibroker.broker.personality import PERSONALITIES, Personality, get

# a repository path (owner/name), an issue (#123, "issue 15") or a specification section (§4.3)
CITATION = re.compile(r"[\w.-]+/[\w.-]+|#\d+|\bissue \d+|§\d")


@pytest.mark.parametrize("personality", PERSONALITIES.values(), ids=list(PERSONALITIES))
def test_every_quirk_is_described_and_cited(personality: Personality) -> None:
    """Each personality has a summary; each quirk a text and a source naming where it was read; ``describe()``
    (what ``minibroker personalities`` prints) shows every quirk."""
    assert personality.summary.strip()
    assert get(personality.name) is personality
    described = personality.describe()
    for quirk in personality.quirks:
        assert quirk.text.strip()
        assert CITATION.search(quirk.source), quirk.source
        assert quirk.text in described


def test_unknown_name_lists_the_known_ones() -> None:
    """``get`` of an unknown name raises ValueError naming every personality."""
    with pytest.raises(ValueError, match="nope") as raised:
        get("nope")
    assert all(name in str(raised.value) for name in PERSONALITIES)
