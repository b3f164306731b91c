"""The README's table of personalities says what ``minibroker/broker/personality.py`` holds: every quirk's text and
source of every personality appears in that personality's row, so the table cannot drift from the code."""

from __future__ import annotations

import html
from pathlib import Path

import pytest

from minibroker.broker.personality import PERSONALITIES, Personality, markdown_table

README = Path(__file__).resolve().parents[2] / "README.md"


def table_rows() -> dict[str, list[str]]:
    """The rows of the table under "## Broker personalities", unescaped, by personality."""
    text = README.read_text()
    section = text[text.index("## Broker personalities") :]
    section = section[: section.index("\n## ")]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            cells = [html.unescape(cell.strip()) for cell in line.strip("|").split(" | ")]
            rows.setdefault(cells[0].strip("`"), []).append(" | ".join(cells[1:]))
    return rows


@pytest.mark.parametrize("personality", PERSONALITIES.values(), ids=lambda p: p.name)
def test_each_quirk_has_its_row(personality: Personality) -> None:
    """Each quirk's text and source are one row of the personality's (a personality without quirks has a row)."""
    rows = table_rows().get(personality.name)
    assert rows, f"no row for {personality.name} in the README's table"
    for quirk in personality.quirks:
        assert f"{quirk.text} | {quirk.source}" in rows, f"{personality.name}: {quirk.text!r} not in the README"
    assert len(rows) == max(1, len(personality.quirks))


def test_the_table_names_no_other_personality() -> None:
    """No row for a personality the code does not define."""
    assert set(table_rows()) == set(PERSONALITIES)


def test_the_table_is_what_minibroker_personalities_markdown_prints() -> None:
    """The README's table is exactly ``minibroker personalities --markdown`` (regenerate it with that command)."""
    assert markdown_table() in README.read_text()
