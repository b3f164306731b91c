"""RabbitMQ's queue arguments as configuration keys of a node (``[queues.NAME]``, ``[node_defaults]``):
``message_ttl``, ``dead_letter_exchange``, ``dead_letter_routing_key``, ``max_priority``."""

from __future__ import annotations

from pathlib import Path

import pytest

from minibroker.broker.core import Broker, BrokerSettings
from minibroker.config import Config, ConfigError
from tests.broker.txn_driver import World
from tests.personalities.harness import answer
from tests.rabbit.helpers import message, peer, ready


def load(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return Config.load(path)


def test_configured_queue_takes_the_arguments(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        '[queues.orders]\nmessage_ttl = 1.5\ndead_letter_exchange = "amq.direct"\n'
        'dead_letter_routing_key = "dead"\nmax_priority = 0\n[queues.dead]\n',
    )
    w = World(Broker(BrokerSettings(node_defaults=config.node_defaults, queues=dict(config.queues))))
    w.broker.rabbit.bind_queue(None, "dead", "amq.direct", "dead")
    p = peer(w)
    p.attach_producer("out", "orders")
    w.settle()
    answer(w, p, p.transfer("out", message("m1")))
    w.advance(1.4)
    assert ready(w, "orders") == ["m1"]
    w.advance(0.2)
    assert (ready(w, "orders"), ready(w, "dead")) == ([], ["m1"])


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("message_ttl = -1", "message_ttl"),
        ('message_ttl = "1"', "message_ttl"),
        ("message_ttl = nan", "message_ttl"),
        ("max_priority = 256", "max_priority"),
        ("dead_letter_exchange = 1", "dead_letter_exchange"),
    ],
)
def test_bad_values_are_named(tmp_path: Path, text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        load(tmp_path, f"[queues.q]\n{text}\n")
