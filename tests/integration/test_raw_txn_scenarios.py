"""``bench.perf``'s raw transaction scenarios (issue 19: the broker's CPU per transaction measured with a client
that is not the bottleneck) and the octets they send (``bench.proton_wire``): python-qpid-proton's own encodings,
and transactions that really commit what they say."""

from __future__ import annotations

import pytest
from proton import Described, Message, symbol

from bench import proton_wire
from bench.perf_raw import raw_txn, raw_txn_accept
from bench.perf_scenarios import ClientOptions
from minibroker.amqp import codec
from minibroker.amqp.definitions import Accepted, Disposition, TransactionalState, Transfer
from minibroker.testing.thread import ThreadedBroker, run_in_thread

TXN_ID = bytes(range(16))


def test_the_coordinator_messages_are_what_python_qpid_proton_encodes() -> None:
    """proton's ``Transaction`` sends ``Message(body=Described(symbol(name), [fields]))`` (proton/_reactor.py,
    ``_send_ctrl``): encoded by proton itself here, compared octet for octet."""
    assert proton_wire.declare() == Message(body=Described(symbol("amqp:declare:list"), [None])).encode()
    for fail in (False, True):
        described = Described(symbol("amqp:discharge:list"), [TXN_ID, fail])
        assert proton_wire.discharge(TXN_ID, fail) == Message(body=described).encode()
    assert proton_wire.message(b"x" * 256) == Message(body=b"x" * 256).encode()


@pytest.mark.parametrize("delivery_id", [0, 7, 255, 256, 70_000])
def test_a_transactional_post_and_accept_decode_to_the_frames_they_stand_for(delivery_id: int) -> None:
    post, end = codec.decode(proton_wire.txn_post(3, delivery_id, TXN_ID, proton_wire.message(b"hi")))
    assert isinstance(post, Transfer)
    assert (post.handle, post.delivery_id, post.delivery_tag) == (3, delivery_id, str(delivery_id).encode())
    assert (post.message_format, post.settled) == (0, None)
    assert post.state == TransactionalState(txn_id=TXN_ID)
    body = proton_wire.txn_post(3, delivery_id, TXN_ID, proton_wire.message(b"hi"))[end:]
    message = Message()
    message.decode(body)  # (proton reads the message the transfer carries)
    assert message.body == b"hi"

    accept, _ = codec.decode(proton_wire.txn_accept(delivery_id, TXN_ID))
    assert isinstance(accept, Disposition)
    assert (accept.role, accept.first, accept.last, accept.settled) == (True, delivery_id, None, False)
    assert accept.state == TransactionalState(txn_id=TXN_ID, outcome=Accepted())


def _options(broker: ThreadedBroker, count: int) -> ClientOptions:
    return ClientOptions(f"127.0.0.1:{broker.port}", "raw.txn", count, 30.0, None, "raw.sync")


@pytest.mark.timeout(60)
def test_raw_transactions_commit_every_post_and_accept_every_delivery(broker: ThreadedBroker) -> None:
    sent = raw_txn(_options(broker, 30), per=10)
    assert (sent["count"], sent["transactions"], sent["timed_out"]) == (30, 3, False)
    assert sent["latency_p50_ms"] > 0
    assert broker.queue("raw.txn").depth == 30  # committed, each once

    taken = raw_txn_accept(_options(broker, 25), per=10)
    assert (taken["count"], taken["transactions"], taken["timed_out"]) == (25, 3, False)  # 10, 10, then 5
    assert broker.queue("raw.txn").depth == 5
    assert broker.queue("raw.txn").acquired == 0  # each accept committed and settled


@pytest.mark.timeout(60)
def test_a_raw_transaction_that_does_not_commit_fails_the_scenario() -> None:
    """The scenario checks each commit's outcome: against a queue with room for one message, a transaction of two
    posts cannot commit (the discharge is rejected), and the run says so instead of reporting a figure."""
    with run_in_thread({"server": {"port": 0}, "queues": {"raw.full": {"max_messages": 1}}}) as broker:
        with pytest.raises(RuntimeError, match="commit failed"):
            raw_txn(ClientOptions(f"127.0.0.1:{broker.port}", "raw.full", 2, 30.0, None, "raw.sync"), per=2)
        assert broker.queue("raw.full").depth == 0
