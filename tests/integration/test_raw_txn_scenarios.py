"""``bench.perf``'s raw transaction scenarios (issue 19: the broker's CPU per transaction measured with a client
that is not the bottleneck) and the octets they send (``bench.proton_wire``): python-qpid-proton's own encodings,
and transactions that really commit what they say."""

from __future__ import annotations

from typing import Any

import pytest
from proton import Described, Message, symbol

from bench import proton_wire
from bench.perf_raw import TxnClient, raw_txn, raw_txn_accept
from bench.perf_scenarios import ClientOptions
from bench.raw import RECV_SIZE, RawClient
from minibroker.amqp import codec
from minibroker.amqp.definitions import Accepted, Disposition, Flow, Rejected, TransactionalState, Transfer
from minibroker.testing.client import parse_frames
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
    post_bytes = proton_wire.txn_post(3, delivery_id, TXN_ID, proton_wire.message(b"hi"), tag=b"12")
    post, end = codec.decode(post_bytes)
    assert isinstance(post, Transfer)
    assert (post.handle, post.delivery_id, post.delivery_tag) == (3, delivery_id, b"12")
    assert (post.message_format, post.settled) == (0, None)
    assert post.state == TransactionalState(txn_id=TXN_ID)
    message = Message()
    message.decode(post_bytes[end:])  # (proton reads the message the transfer carries)
    assert message.body == b"hi"

    for settled in (False, True):
        accept, _ = codec.decode(proton_wire.txn_accept(delivery_id, TXN_ID, settled=settled))
        assert isinstance(accept, Disposition)
        assert (accept.role, accept.first, accept.last, accept.settled) == (True, delivery_id, None, settled)
        assert accept.state == TransactionalState(txn_id=TXN_ID, outcome=Accepted())

    control, end = codec.decode(proton_wire.transfer(1, delivery_id, b"7", proton_wire.declare()))
    assert isinstance(control, Transfer)
    assert tuple(control.field_values()) == (1, delivery_id, b"7", 0, None, None, None, None, None, None, None)
    assert proton_wire.transfer(1, delivery_id, b"7", proton_wire.declare())[end:] == proton_wire.declare()

    flow, _ = codec.decode(proton_wire.flow(delivery_id, 5, 2, delivery_id, 100))
    assert isinstance(flow, Flow)
    window = proton_wire.WINDOW
    assert tuple(flow.field_values()[:9]) == (delivery_id, window, 5, window, 2, delivery_id, 100, None, False)


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


def _requests(broker: ThreadedBroker, connection: int) -> list[bytes]:
    """The AMQP frames connection ``connection`` sent the broker (its capture), from its first transaction on, each
    txn-id the broker declared replaced by ``_TXN``: the octets the broker parsed, comparable between clients."""
    records = broker.frames(connection)
    declared = [r for r in records if r["direction"] == "out" and "declared" in str(r["fields"].get("state"))]
    txn_ids = [bytes.fromhex(r["fields"]["state"]["txn-id"]) for r in declared]
    sent = [bytes.fromhex(r["raw"]) for r in records if r["direction"] == "in" and r["kind"] == "amqp"]
    first = next(i for i, raw in enumerate(sent) if b"amqp:declare:list" in raw)
    found = []
    for raw in sent[first:]:
        for txn_id in txn_ids:
            raw = raw.replace(txn_id, _TXN)
        found.append(raw)
    return found


_TXN = b"T" * 16


def _connections(broker: ThreadedBroker) -> list[int]:
    return sorted({int(r["connection"]) for r in broker.frames()})


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("proton_name", "raw_name", "count"),
    [("txn_1", "raw_txn_1", 3), ("txn_10", "raw_txn_10", 20), ("txn_accept_100", "raw_txn_accept_100", 200)],
)
def test_the_raw_scenario_sends_the_octets_python_qpid_proton_sends(
    proton_name: str, raw_name: str, count: int
) -> None:
    """Observed, not assumed: each scenario against a capturing broker, proton's ``txn_*`` (``bench.perf_proton``)
    and its raw twin, and the frames each connection sent from its first declare on compared octet for octet
    (txn-ids aside, which the broker picks): performatives, their encodings, fields, tags, settled flags, states."""
    from bench.perf_client import run_client

    config = {"server": {"port": 0}, "broker": {"capture": True, "capture_limit": 10_000}}
    with run_in_thread(config) as broker:

        def opts(address: str) -> ClientOptions:
            return ClientOptions(f"127.0.0.1:{broker.port}", address, count, 30.0, None, "sync")

        if "accept" in proton_name:  # (queues filled by a client whose connection is not compared)
            raw_txn(opts("q.proton"), per=100)
            raw_txn(opts("q.raw"), per=100)
        before = set(_connections(broker))
        run_client(proton_name, opts("q.proton"))
        (proton_conn,) = set(_connections(broker)) - before
        run_client(raw_name, opts("q.raw"))
        (raw_conn,) = set(_connections(broker)) - before - {proton_conn}
        proton_sent, raw_sent = _requests(broker, proton_conn), _requests(broker, raw_conn)
    close = b"\x00\x53\x18"  # (the connections end differently: proton closes at once, the raw client waits)
    assert [r.hex() for r in raw_sent if close not in r] == [r.hex() for r in proton_sent if close not in r]


def _record_io(monkeypatch: pytest.MonkeyPatch) -> tuple[list[list[Any]], list[int]]:
    """From now on, every ``RawClient``'s writes (each as the performatives it carries) and the most each read
    asked for."""
    writes: list[list[Any]] = []
    reads: list[int] = []
    flush, receive = RawClient.flush, RawClient.receive

    def recording_flush(self: RawClient) -> None:
        self.out += self.conn.data_to_send()
        if self.out:
            writes.append([frame.performative for frame in parse_frames(bytes(self.out))])
        flush(self)

    def recording_receive(self: RawClient, timeout: float | None = None, size: int = RECV_SIZE) -> list[Any]:
        reads.append(size)
        return receive(self, timeout, size)

    monkeypatch.setattr(RawClient, "flush", recording_flush)
    monkeypatch.setattr(RawClient, "receive", recording_receive)
    return writes, reads


@pytest.mark.timeout(60)
def test_raw_posts_and_their_discharge_are_one_write(broker: ThreadedBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    """proton's ``TxnSend`` writes a transaction's posts and its discharge in one write, after the declare's own
    (``strace`` of ``bench.perf_client txn_10``: a write of 11 transfers): the broker reads them at once."""
    writes, _ = _record_io(monkeypatch)
    raw_txn(_options(broker, 30), per=10)
    transfers = [len([p for p in w if isinstance(p, Transfer)]) for w in writes]
    assert transfers[-6:] == [1, 11] * 3  # (declare; ten posts and the discharge), three times
    assert broker.queue("raw.txn").depth == 30


@pytest.mark.timeout(60)
def test_a_post_not_accepted_fails_the_scenario_even_if_the_commit_is(
    broker: ThreadedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A post the broker answers otherwise than accepted in the transaction is not committed work, whatever the
    discharge's answer: the run fails. (No broker configuration commits then, so the client is shown a rejected
    post here: each transactional-state it reads loses its outcome.)"""
    on_frame = TxnClient.on_frame

    def rejecting(self: TxnClient, frame: Any) -> None:
        state = getattr(frame.performative, "state", None)
        if isinstance(state, TransactionalState):
            frame.performative.state = TransactionalState(txn_id=state.txn_id, outcome=Rejected())
        on_frame(self, frame)

    monkeypatch.setattr(TxnClient, "on_frame", rejecting)
    with pytest.raises(RuntimeError, match="transactional post was answered"):
        raw_txn(_options(broker, 2), per=2)


@pytest.mark.timeout(60)
def test_a_run_out_of_time_reports_only_the_transactions_done(broker: ThreadedBroker) -> None:
    sent = raw_txn(ClientOptions(f"127.0.0.1:{broker.port}", "raw.txn", 30, 0.0, None, "raw.sync"), per=10)
    assert (sent["count"], sent["transactions"], sent["timed_out"]) == (0, 0, True)
    taken = raw_txn_accept(ClientOptions(f"127.0.0.1:{broker.port}", "raw.txn", 30, 0.0, None, "raw.sync"), per=10)
    assert (taken["count"], taken["transactions"], taken["timed_out"]) == (0, 0, True)
    assert broker.queue("raw.txn").depth == 0


@pytest.mark.timeout(60)
def test_raw_accepts_are_written_as_proton_writes_them_a_read_at_a_time(
    broker: ThreadedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """proton's reactor reads at most 8 KiB (``proton_wire.READ_SIZE``) and writes the accepts of the deliveries
    each read completed before it reads again, the discharge with the last of them (``strace`` of
    ``bench.perf_client txn_accept_100``: accepts written 27, 27, 27, then 19 with the discharge): the broker
    takes a transaction's accepts in several reads, not one, and the raw scenario must make it do the same."""
    raw_txn(_options(broker, 200), per=100)
    writes, reads = _record_io(monkeypatch)
    taken = raw_txn_accept(_options(broker, 200), per=100)
    assert taken["count"] == 200
    assert broker.queue("raw.txn").depth == 0

    accepts = [[p for p in w if isinstance(p, Disposition)] for w in writes]
    grouped = [(len(a), any(isinstance(p, Transfer) for p in w)) for a, w in zip(accepts, writes, strict=True) if a]
    assert all(d.settled and isinstance(d.state, TransactionalState) for a in accepts for d in a)
    per_read = proton_wire.READ_SIZE // 301  # (a transfer of ENCODED is 301 octets with a small delivery-id)
    for transaction in (grouped[: len(grouped) // 2], grouped[len(grouped) // 2 :]):
        assert sum(n for n, _ in transaction) == 100
        assert len(transaction) >= 4
        assert all(n <= per_read + 1 for n, _ in transaction)
        assert [discharged for _, discharged in transaction] == [False] * (len(transaction) - 1) + [True]
    assert sum(size <= proton_wire.READ_SIZE for size in reads) >= 2 * 4  # (the declares' answers: any size)


@pytest.mark.timeout(60)
def test_raw_transactions_larger_than_the_credit_go_on_as_credit_comes() -> None:
    """With less credit than a transaction's posts (``link_credit`` 5, 10 per transaction) proton's ``TxnSend``
    sends as far as credit goes and the rest when the broker grants more; so must the raw scenario (it waited for
    10 credit it would never get, then failed ten seconds later)."""
    with run_in_thread({"server": {"port": 0}, "broker": {"link_credit": 5}}) as broker:
        sent = raw_txn(ClientOptions(f"127.0.0.1:{broker.port}", "raw.txn", 20, 30.0, None, "raw.sync"), per=10)
        assert (sent["count"], sent["transactions"]) == (20, 2)
        assert broker.queue("raw.txn").depth == 20


@pytest.mark.timeout(60)
def test_a_refused_declare_fails_the_scenario_at_once_saying_why() -> None:
    """A declare the broker rejects (a fault rule: the second declare) ends the run with the broker's error, not
    with a time-out on a txn-id that never comes."""
    rule = {"point": "declare", "action": "reject", "times": 1, "after": 1}
    with run_in_thread({"server": {"port": 0}, "faults": [rule]}) as broker:
        options = ClientOptions(f"127.0.0.1:{broker.port}", "raw.txn", 5, 30.0, None, "raw.sync")
        with pytest.raises(RuntimeError, match=r"declare failed: .*resource-limit-exceeded"):
            raw_txn(options, per=1)
        assert broker.queue("raw.txn").depth == 1


@pytest.mark.timeout(60)
def test_raw_txn_accept_fails_when_the_queue_holds_fewer_than_asked(broker: ThreadedBroker) -> None:
    """Five messages queued, ten asked for: the run fails saying how many came, it reports no figure."""
    raw_txn(_options(broker, 5), per=5)
    with pytest.raises(TimeoutError, match="5 of the 10 deliveries"):
        raw_txn_accept(_options(broker, 10), per=10)
