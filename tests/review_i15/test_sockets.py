"""Review of issue 15: a connection closed by the broker's own timer (broker-j's transaction time-out) and by an
unknown txn-id (artemis), over real sockets: the close reaches the client, the broker forgets the connection and its
transactions, and counts no internal error."""

from __future__ import annotations

import contextlib

from minibroker.amqp.definitions import (
    AmqpValue,
    Close,
    Coordinator,
    Declare,
    Disposition,
    Flow,
    Source,
    TransactionalState,
)
from minibroker.amqp.types import Symbol
from minibroker.testing import frames
from minibroker.testing.peer import ScriptedPeer
from minibroker.testing.thread import ThreadedBroker, run_in_thread


def declare_and_post(peer: ScriptedPeer, *, window: bool = False) -> bytes:
    """Declare, then post one message to q in the transaction (``window``: the coordinator gives its credit back
    after each answer, as broker-j does)."""
    peer.open()
    peer.begin()
    target = Coordinator(capabilities=[Symbol("amqp:local-transactions")])
    peer.attach_sender(None, 0, name="txn", source=Source(), target=target)
    peer.expect(Flow)
    peer.transfer(0, 0, frames.message(AmqpValue(Declare())))
    txn_id: bytes = peer.expect(Disposition).state.txn_id
    if window:
        assert peer.expect(Flow).link_credit == 1
    peer.attach_sender("q", 1, name="p")
    peer.expect(Flow)
    peer.transfer(1, 1, frames.message("m"), state=TransactionalState(txn_id=txn_id))
    peer.expect(Disposition)
    return txn_id


def settled_state(broker: ThreadedBroker) -> tuple[int, int, int, int]:
    """(open transactions, connections, staged on q, internal errors), read in the broker's thread."""

    def read(running: object) -> tuple[int, int, int, int]:
        core = running.broker  # type: ignore[attr-defined]
        queue = core.queues.get("q")
        return len(core.transactions), len(core.connections), queue.staged if queue else 0, core.internal_errors

    result: tuple[int, int, int, int] = broker.call(read)
    return result


def wait_for(broker: ThreadedBroker, expected: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    """Wait (re-checking after every change of broker state) until ``settled_state`` is ``expected``; what it is."""
    with contextlib.suppress(TimeoutError):
        broker.wait_for(lambda: settled_state(broker) == expected, timeout=5)
    return settled_state(broker)


def test_broker_j_timer_close_over_sockets() -> None:
    """broker-j, transaction_timeout 0.3 s: the open transaction's connection receives close
    amqp:transaction:timeout from the timer, the socket ends, and the broker keeps nothing of it."""
    config = {"server": {"port": 0}, "broker": {"personality": "broker-j", "transaction_timeout": 0.3}}
    with run_in_thread(config) as broker:
        host, port = broker.url.removeprefix("amqp://").rsplit(":", 1)
        with ScriptedPeer.connect(host, int(port)) as peer:
            declare_and_post(peer, window=True)
            close = peer.expect(Close)
            assert close.error is not None
            assert close.error.condition == Symbol("amqp:transaction:timeout")
            peer.send(Close())
            peer.expect_closed()
        assert wait_for(broker, (0, 0, 0, 0)) == (0, 0, 0, 0)


def test_artemis_unknown_txn_close_over_sockets() -> None:
    """artemis: a post naming an unknown txn-id closes the connection with amqp:internal-error; the broker forgets
    the connection and its transaction, and counts no internal error of its own."""
    config = {"server": {"port": 0}, "broker": {"personality": "artemis"}}
    with run_in_thread(config) as broker:
        host, port = broker.url.removeprefix("amqp://").rsplit(":", 1)
        with ScriptedPeer.connect(host, int(port)) as peer:
            declare_and_post(peer)
            peer.transfer(1, 2, frames.message("x"), state=TransactionalState(txn_id=b"nope"))
            close = peer.expect(Close)
            assert close.error is not None
            assert close.error.condition == Symbol("amqp:internal-error")
            peer.send(Close())
            peer.expect_closed()
        assert wait_for(broker, (0, 0, 0, 0)) == (0, 0, 0, 0)
