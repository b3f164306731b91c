"""The core's node table (``minibroker.broker.nodes``), driven directly."""

from __future__ import annotations

import pytest

from minibroker.broker.core import Broker


@pytest.mark.parametrize("kind", ["queue", "topic"])
def test_a_node_is_never_created_over_another(kind: str) -> None:
    nodes = Broker().nodes
    existing = nodes.create(nodes.default, "taken", "queue")
    with pytest.raises(ValueError, match="already exists"):
        nodes.create(nodes.default, "taken", kind)
    assert nodes.default.node("taken") is existing
