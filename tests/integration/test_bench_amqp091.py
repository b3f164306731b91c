"""``bench.amqp091``: the 0-9-1 / 1.0 comparison runs end to end with tiny counts (no timing asserted: the figures
are produced and every scenario moved the messages it was asked to), and its confirm tally counts as RabbitMQ's
``multiple`` confirms mean."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench import amqp091
from bench.raw091 import ConfirmTally

PROTOCOLS = ("amqp091", "amqp10")


@given(st.integers(1, 60).flatmap(lambda n: st.tuples(st.just(n), st.permutations(range(1, n + 1)),
                                                      st.lists(st.booleans(), min_size=n, max_size=n))))  # fmt: skip
def test_the_confirm_tally_counts_every_tag_a_single_or_multiple_confirm_covers(
    case: tuple[int, list[int], list[bool]],
) -> None:
    n, order, multiples = case
    tally = ConfirmTally()
    covered: set[int] = set()
    for tag, multiple in zip(order, multiples, strict=True):
        tally.add(tag, multiple=multiple)
        covered |= set(range(1, tag + 1)) if multiple else {tag}
        assert tally.count == len(covered)
    assert tally.count == n


@pytest.mark.timeout(120)
def test_the_command_measures_every_pair_and_moves_the_counts_it_reports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "amqp091.json"
    assert amqp091.main(["--count", "40", "--runs", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    (run,) = report["runs"]
    assert set(run) == {pair.name for pair in amqp091.PAIRS}
    for protocol in PROTOCOLS:
        assert run["confirm_100"][protocol]["count"] == run["confirm_1000"][protocol]["count"] == 40
        for size in (1, 10, 100):
            figures = run[f"tx_{size}"][protocol]
            txns = max(1, int(40 * (0.1 if size == 1 else 0.5 if size == 10 else 1)) // size)
            assert (figures["txns"], figures["count"]) == (txns, txns * size)
        sent = sum(run[name][protocol]["count"] for name in run if name != "consume")
        assert run["consume"][protocol]["count"] == run["consume"][protocol]["expected"] == sent
    assert run["confirm_100"]["amqp091"]["nacked"] == 0
    for name, row in report["summary"].items():
        assert all(row[f"{p}_msg_s"] for p in PROTOCOLS), name
        assert all(row[f"{p}_broker_us"] is not None for p in PROTOCOLS), name
        assert (row["ratio_msg_s"] or 0) > 0
        assert name in printed
