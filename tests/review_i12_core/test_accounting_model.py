"""Model-based check that the broker-wide counters of issue 12 (items 5, 15) go back to zero.

``max_links``, ``max_subscriptions_per_connection``, ``max_total_staged_bytes``: a count that leaks makes the
broker refuse for ever. Random clients attach every kind of link (queue and topic consumers, durable, shared,
dynamic, refused ones, producers, controllers), post transactionally, and end it all every way there is
(detach closed or not, commit, rollback, time-out, controller gone, connection closed, socket dropped, node
deleted under the link). Checked: after every step the link count is the number of links the clients hold,
the topic links per connection likewise, the staged bytes are the sum over open transactions; at the end,
with every client gone, everything is 0 and a fresh client can still attach up to the limit.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from minibroker.amqp.definitions import Accepted, Declared, Source, TransactionalState
from minibroker.amqp.types import Described, Symbol, UInt
from minibroker.broker.core import Broker, BrokerSettings
from minibroker.broker.selector import SELECTOR_DESCRIPTORS
from minibroker.testing import frames
from tests.broker.txn_driver import World

SELECTOR = next(d for d in SELECTOR_DESCRIPTORS if isinstance(d, str))
KINDS = ["queue", "topic", "durable", "shared", "dynamic", "bad-selector", "producer", "dyn-producer", "controller"]


class Accounting(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.world: World | None = None
        self.peers: dict[str, Any] = {}
        self.links: dict[str, dict[str, str]] = {}  # peer -> link name -> kind
        self.txns: dict[str, dict[bytes, int]] = {}  # peer -> txn id -> staged bytes
        self.n = 0

    @initialize()
    def start(self) -> None:
        self.world = World(Broker(BrokerSettings(transaction_timeout=10.0, max_staged_bytes=10_000)))

    def _settle(self) -> None:
        assert self.world is not None
        seen = self.world.settle()
        for name, peer in list(self.peers.items()):
            obs = seen.get(peer)
            if obs is None:
                continue
            for link, _err in obs.detached:
                kind = self.links[name].pop(link, None)
                if kind == "controller":
                    self.txns[name].clear()  # its transactions roll back
            if obs.closed or not peer.alive:
                self._gone(name)

    def _gone(self, name: str) -> None:
        self.peers.pop(name, None)
        self.links.pop(name, None)
        self.txns.pop(name, None)

    @precondition(lambda self: len(self.peers) < 3)
    @rule()
    def connect(self) -> None:
        assert self.world is not None
        self.n += 1
        name = f"peer{self.n}"
        self.peers[name] = self.world.connect(name)
        self.links[name] = {}
        self.txns[name] = {}
        self._settle()

    def _peer(self, data: st.DataObject) -> str:
        return data.draw(st.sampled_from(sorted(self.peers)))

    @precondition(lambda self: self.peers)
    @rule(data=st.data(), kind=st.sampled_from(KINDS), sub=st.sampled_from(["s1", "s2"]))
    def attach(self, data: st.DataObject, kind: str, sub: str) -> None:
        name = self._peer(data)
        peer = self.peers[name]
        self.n += 1
        link = f"{sub}|{self.n}" if kind == "shared" else (sub if kind == "durable" else f"l{self.n}")
        if peer.attached(link):
            return
        if kind == "queue":
            peer.attach_consumer(link, "q", presettled=False, default_outcome=None)
        elif kind == "bad-selector":
            bad = {Symbol("s"): Described(SELECTOR, "color = ")}
            peer.attach_consumer(link, "q", presettled=False, default_outcome=None, source_filter=bad)
        elif kind == "topic":
            peer.attach_consumer(link, "topic://t", presettled=False, default_outcome=None)
        elif kind in ("durable", "shared"):
            caps = [Symbol("shared")] if kind == "shared" else None
            source = Source(address="topic://t", durable=UInt(2), expiry_policy=Symbol("never"), capabilities=caps)
            peer.send(frames.attach_receiver("topic://t", peer.new_handle(link), link, source=source))
        elif kind == "dynamic":
            peer.attach_consumer(link, None, presettled=False, default_outcome=None, dynamic=True)
        elif kind == "producer":
            peer.attach_producer(link, "q")
        elif kind == "dyn-producer":
            peer.attach_producer(link, None, dynamic=True)
        else:
            peer.attach_controller(link)
        self.links[name][link] = kind
        self._settle()

    @precondition(lambda self: any(self.links.values()))
    @rule(data=st.data(), closed=st.booleans())
    def detach(self, data: st.DataObject, closed: bool) -> None:
        name = data.draw(st.sampled_from(sorted(n for n, ls in self.links.items() if ls)))
        peer = self.peers[name]
        link = data.draw(st.sampled_from(sorted(self.links[name])))
        kind = self.links[name].pop(link)
        peer.detach(link, closed=closed)
        if kind == "controller":
            self.txns[name].clear()
        self._settle()

    def _controllers(self) -> list[tuple[str, str]]:
        return sorted((n, link) for n, ls in self.links.items() for link, k in ls.items() if k == "controller")

    @precondition(lambda self: self._controllers())
    @rule(data=st.data())
    def declare(self, data: st.DataObject) -> None:
        name, link = data.draw(st.sampled_from(self._controllers()))
        peer = self.peers[name]
        delivery_id = peer.declare(link)
        assert self.world is not None
        seen = self.world.settle()[peer]
        state = seen.answers.get(delivery_id, (None,))[0]
        if isinstance(state, Declared):
            self.txns[name][bytes(state.txn_id)] = 0

    def _producers_with_txn(self) -> list[tuple[str, str]]:
        return sorted(
            (n, link) for n, ls in self.links.items() for link, k in ls.items() if k == "producer" and self.txns.get(n)
        )

    @precondition(lambda self: self._producers_with_txn())
    @rule(data=st.data(), size=st.sampled_from([10, 3000, 6000]))
    def post(self, data: st.DataObject, size: int) -> None:
        name, link = data.draw(st.sampled_from(self._producers_with_txn()))
        peer = self.peers[name]
        txn_id = data.draw(st.sampled_from(sorted(self.txns[name])))
        message = frames.message("<<p>>" + "." * size)
        delivery_id = peer.transfer(link, message, state=TransactionalState(txn_id=txn_id))
        assert self.world is not None
        seen = self.world.settle()[peer]
        state, _ = seen.answers[delivery_id]
        assert isinstance(state, TransactionalState), state
        if isinstance(state.outcome, Accepted):
            self.txns[name][txn_id] += len(message)

    @precondition(lambda self: any(self.txns.values()))
    @rule(data=st.data(), fail=st.booleans())
    def discharge(self, data: st.DataObject, fail: bool) -> None:
        name = data.draw(st.sampled_from(sorted(n for n, t in self.txns.items() if t)))
        txn_id = data.draw(st.sampled_from(sorted(self.txns[name])))
        controllers = [link for n, link in self._controllers() if n == name]
        if not controllers:
            return
        peer = self.peers[name]
        peer.discharge(controllers[0], txn_id, fail=fail)
        del self.txns[name][txn_id]
        self._settle()

    @rule()
    def time_passes(self) -> None:
        assert self.world is not None
        self.world.advance(11.0)  # past the transaction time-out: every open transaction rolls back
        for txns in self.txns.values():
            txns.clear()
        self._settle()

    @precondition(lambda self: self.peers)
    @rule(data=st.data(), how=st.sampled_from(["close", "eof"]))
    def end(self, data: st.DataObject, how: str) -> None:
        name = self._peer(data)
        peer = self.peers[name]
        if how == "close":
            peer.close()
        else:
            peer.eof()
        self._gone(name)
        self._settle()

    @invariant()
    def counts(self) -> None:
        if self.world is None:
            return
        broker = self.world.broker
        held = sum(len(ls) for ls in self.links.values())
        refused = sum(1 for ls in self.links.values() for k in ls.values() if k == "bad-selector")
        assert broker.endpoints.links == held - refused, (broker.endpoints.links, self.links)
        staged = sum(sum(t.values()) for t in self.txns.values())
        assert broker.coordinator.staged_bytes == staged, (broker.coordinator.staged_bytes, self.txns)
        topic_links = {
            peer.conn: sum(1 for k in self.links[n].values() if k in ("topic", "durable", "shared"))
            for n, peer in self.peers.items()
        }
        assert broker.endpoints.topic_links == {c: v for c, v in topic_links.items() if v}, broker.endpoints.topic_links

    def teardown(self) -> None:
        if self.world is None:
            return
        for peer in list(self.peers.values()):
            peer.close()
        self.world.settle()
        broker = self.world.broker
        assert broker.endpoints.links == 0
        assert broker.coordinator.staged_bytes == 0
        assert broker.endpoints.topic_links == {}


TestAccounting = pytest.mark.timeout(900)(Accounting.TestCase)
TestAccounting.settings = settings(
    max_examples=int(__import__("os").environ.get("EXAMPLES", "200")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
