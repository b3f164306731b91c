"""Review of issue 16: the README's in-doubt example must show an idempotent producer recovering from
``lose-outcome`` (issue 16, "Done when"), run as written against a real broker."""

from __future__ import annotations

import pytest

from minibroker.testing.thread import run_in_thread
from tests.test_readme_examples import python_block


@pytest.mark.timeout(60)
def test_the_readme_example_recovers_from_lose_outcome() -> None:
    """The example's own lose-outcome rule fires: the commit is applied and the connection cut without an
    answer; the producer comes back, its query answers ``committed``, and the order is not sent again."""
    with run_in_thread({"server": {"port": 0}, "transactions": {"orphaned": "hold"}}) as broker:
        code = python_block("### In-doubt transactions with check-back")
        scope = {"url": broker.url, "broker": broker}
        exec(compile(code, "README.md (in-doubt)", "exec"), scope)
        assert scope["state"] == "committed"
        assert [(r.action, r.hits) for r in broker.faults.list()] == [("lose-outcome", 1)]
        assert broker.transactions == []
        assert broker.queue("orders").depth == 1  # exactly once
        assert broker.txn_stats.committed == 1


def test_every_code_fence_of_the_readme_is_closed() -> None:
    """An unclosed ``` (the Fault injection curl block) turns every section after it into code."""
    from tests.test_readme_examples import README

    fences = [line for line in README.read_text().splitlines() if line.startswith("```")]
    assert len(fences) % 2 == 0
    assert all(line == "```" for line in fences[1::2])  # each closing fence is bare


@pytest.mark.timeout(60)
def test_the_readme_example_sends_again_an_order_lost_before_its_post() -> None:
    """The connection is cut as the order's post arrives (a ``transfer`` ``drop-connection`` rule added first):
    the transaction is in doubt holding no post. Committing it (the example as it was) would lose the order; the
    example sees ``posts`` 0, rolls it back and sends the order again: it is there once."""
    with run_in_thread({"server": {"port": 0}, "transactions": {"orphaned": "hold"}}) as broker:
        broker.faults.add("transfer", "drop-connection", address="orders")
        code = python_block("### In-doubt transactions with check-back")
        scope = {"url": broker.url, "broker": broker}
        exec(compile(code, "README.md (in-doubt)", "exec"), scope)
        assert scope["state"] == "rolled-back"
        assert broker.transactions == []
        assert broker.queue("orders").depth == 1  # sent again, once
        assert broker.txn_stats.rolled_back == 1
