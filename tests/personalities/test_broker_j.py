"""``broker-j`` against ``minibroker``: each quirk of Qpid Broker-J as it shows on the wire (personality.py).

Every test runs one steps function under both personalities and asserts both answers, so it fails if the
quirk were not implemented (the personality would answer as ``minibroker`` does).
"""

from __future__ import annotations

from typing import Any

from minibroker.amqp.definitions import (
    Attach,
    Coordinator,
    Disposition,
    Error,
    Flow,
    Rejected,
    Source,
    TransactionalState,
)
from minibroker.amqp.errors import Condition
from minibroker.amqp.types import Symbol
from minibroker.broker.personality import TXN_CAPABILITIES
from minibroker.testing import frames
from tests.broker.txn_driver import ACCEPTED_LIST, REJECTED_LIST, Peer, World
from tests.personalities.harness import declare, discharge, peer, post, ready, world

UNKNOWN = b"no\x01pe"
"""An id nobody declared, with an octet Broker-J prints escaped (Binary.toString)."""
TIMEOUT = 10.0


def _controller(w: World, p: Peer, outcomes: list[str] | None) -> Attach:
    """Attach controller ``ctl`` whose source lists ``outcomes`` (None: no outcomes field); the broker's reply."""
    target = Coordinator(capabilities=[Symbol("amqp:local-transactions")])
    p.send(frames.attach_sender(None, p.new_handle("ctl"), "ctl", target=target, source=Source(outcomes=outcomes)))
    return w.settle()[p].attached["ctl"]


def _txn_world(name: str, **settings: Any) -> tuple[World, Peer]:
    """A world of ``name`` with one peer holding controller ``ctl`` (errors as rejected) and producer ``p`` to
    queue ``q``."""
    w = world(name, **settings)
    p = peer(w)
    p.attach_controller("ctl")
    p.attach_producer("p", "q")
    w.settle()
    return w, p


def _controller_frames(w: World, p: Peer) -> list[str]:
    """What the broker sent next about the controller: its dispositions and the link-credit of its flows, in order."""
    seen = w.settle()[p]
    handle = p.session.link("ctl").remote_handle
    shown = []
    for perf in seen.performatives:
        if isinstance(perf, Disposition):
            shown.append(type(perf.state).__name__)
        elif isinstance(perf, Flow) and perf.handle == handle:
            shown.append(f"credit {int(perf.link_credit or 0)}")
    return shown


def test_controller_credit_is_one_given_back_per_answer() -> None:
    """Broker-J grants the coordinator credit 1 and gives it back after each declare or discharge is answered, so
    one control message is outstanding at a time (TxnCoordinatorReceivingLinkEndpoint.start,
    AbstractReceivingLinkEndpoint.updateDispositions); minibroker grants 100 and tops up only at half."""

    def steps(name: str) -> list[list[str]]:
        w = world(name)
        p = peer(w)
        p.attach_controller("ctl")
        attached = _controller_frames(w, p)
        p.declare("ctl")
        declared = _controller_frames(w, p)
        txn_id = w.broker.transactions[0].txn_id
        p.discharge("ctl", txn_id, fail=False)
        return [attached, declared, _controller_frames(w, p)]

    assert steps("minibroker") == [["credit 100"], ["Declared"], ["Accepted"]]
    assert steps("broker-j") == [["credit 1"], ["Declared", "credit 1"], ["Accepted", "credit 1"]]


def _time_out(name: str, *, use: bool) -> tuple[int, int, Error | None, Any, list[str | None]]:
    """Declare at 0 s; post at 5 s if ``use``; open transactions at 11 s and 16 s, the connection's close error,
    the answer to a commit (if the connection is still open) and what ``q`` holds."""
    w, p = _txn_world(name, transaction_timeout=TIMEOUT)
    txn_id = declare(w, p)
    w.advance(5)
    if use:
        post(w, p, "p", "m", txn_id)
    w.advance(6)
    at_11 = len(w.broker.transactions)
    w.advance(5)
    w.settle()
    at_16 = len(w.broker.transactions)
    close = p.client.remote_close
    answer = discharge(w, p, txn_id) if close is None else None
    return at_11, at_16, close.error if close is not None else None, answer, ready(w)


def test_time_out_counts_from_first_operation_and_closes_the_connection() -> None:
    """Broker-J times a transaction from its first operation and then closes the connection with
    amqp:transaction:timeout 'Open transaction timed out' (TxnCoordinatorReceivingLinkEndpoint.doTimeoutAction;
    QueueManagingVirtualHost); minibroker times it from the declare, rolls it back and answers a later
    discharge with amqp:transaction:timeout, the connection staying open."""
    timed_out = (Condition.TRANSACTION_TIMEOUT, "the transaction timed out and was rolled back")

    for use in (False, True):
        at_11, at_16, close, answer, messages = _time_out("minibroker", use=use)
        assert (at_11, at_16, close, messages) == (0, 0, None, [])
        assert isinstance(answer[0], Rejected)
        assert (answer[0].error.condition, answer[0].error.description) == timed_out

    # a declared transaction that is never used never times out
    assert _time_out("broker-j", use=False)[:3] == (1, 1, None)
    at_11, at_16, close, answer, messages = _time_out("broker-j", use=True)
    assert (at_11, at_16, answer, messages) == (1, 0, None, [])
    assert close is not None
    assert (close.condition, close.description) == (Condition.TRANSACTION_TIMEOUT, "Open transaction timed out")


def test_txn_ids_are_four_octets_lowest_free_on_the_connection() -> None:
    """Broker-J's txn-ids are 4-octet integers, the lowest the connection does not use (Session_1_0
    .integerToTransactionId, AMQPConnection_1_0Impl.createIdentifiedTransaction); minibroker's are unique 16-octet
    values, never reused."""

    def steps(name: str) -> list[bytes]:
        w, p = _txn_world(name)
        first = declare(w, p)
        discharge(w, p, first)
        ids = [first, declare(w, p), declare(w, p)]
        other = peer(w, "other")
        other.attach_controller("ctl")
        w.settle()
        return [*ids, declare(w, other)]

    ids = steps("minibroker")
    assert {len(i) for i in ids} == {16}
    assert len(set(ids)) == 4
    assert steps("broker-j") == [b"\0\0\0\0", b"\0\0\0\0", b"\0\0\0\1", b"\0\0\0\0"]


def _unknown_discharge(name: str, outcomes: list[str] | None) -> tuple[Any, list[tuple[str, Error | None]]]:
    """Discharge an unknown id on a controller whose source lists ``outcomes``: the answer, and links detached."""
    w = world(name)
    p = peer(w)
    _controller(w, p, outcomes)
    delivery_id = p.discharge("ctl", UNKNOWN, fail=False)
    seen = w.settle()[p]
    return seen.answers.get(delivery_id), seen.detached


def test_errors_travel_as_rejected_only_when_the_controller_lists_rejected() -> None:
    """§4.3 exactly, as Broker-J (TxnCoordinatorReceivingLinkEndpoint.receiveDelivery): a controller whose source
    lists no outcomes gets the error by a detach of its link; minibroker leniently answers rejected. With
    amqp:rejected:list listed both answer rejected."""
    answer, detached = _unknown_discharge("minibroker", None)
    assert answer is not None
    assert isinstance(answer[0], Rejected)
    assert answer[0].error.condition == Condition.UNKNOWN_TXN_ID
    assert detached == []

    answer, detached = _unknown_discharge("broker-j", None)
    assert answer is None
    assert [(link, e.condition if e else None) for link, e in detached] == [("ctl", Condition.UNKNOWN_TXN_ID)]

    for name in ("minibroker", "broker-j"):
        answer, detached = _unknown_discharge(name, [ACCEPTED_LIST, REJECTED_LIST])
        assert answer is not None
        assert isinstance(answer[0], Rejected)
        assert detached == []


def test_coordinator_reply_carries_no_capabilities() -> None:
    """Broker-J's coordinator target carries no capabilities (TxnCoordinatorReceivingLinkEndpoint.establishLink);
    minibroker lists the three it provides."""

    def capabilities(name: str) -> Any:
        w = world(name)
        reply = _controller(w, peer(w), [ACCEPTED_LIST, REJECTED_LIST])
        assert isinstance(reply.target, Coordinator)
        return reply.target.capabilities

    assert capabilities("minibroker") == list(TXN_CAPABILITIES)
    assert capabilities("broker-j") is None


def test_unknown_id_and_failed_commit_descriptions() -> None:
    """Broker-J's discharge errors (TxnCoordinatorReceivingLinkEndpoint.discharge): 'Unknown transactionId <id>' and
    amqp:transaction:rollback 'The transaction was rolled back due to an earlier issue ...'; minibroker's own
    descriptions name the id in hex and the cause."""

    def steps(name: str) -> tuple[Error, Error]:
        w, p = _txn_world(name)
        unknown, _ = discharge(w, p, UNKNOWN)
        txn_id = declare(w, p)
        post(w, p, "p", "m", txn_id)
        assert w.broker.delete_node(w.broker.default, "q")
        failed, _ = discharge(w, p, txn_id)
        assert isinstance(unknown, Rejected)
        assert isinstance(failed, Rejected)
        return unknown.error, failed.error

    unknown, failed = steps("minibroker")
    assert (unknown.condition, unknown.description) == (Condition.UNKNOWN_TXN_ID, "unknown transaction id 6e6f017065")
    assert (failed.condition, failed.description) == (
        Condition.TRANSACTION_ROLLBACK,
        "transaction rolled back: node 'q' was deleted",
    )

    unknown, failed = steps("broker-j")
    assert (unknown.condition, unknown.description) == (Condition.UNKNOWN_TXN_ID, r"Unknown transactionId no\x01pe")
    assert failed.condition == Condition.TRANSACTION_ROLLBACK
    assert failed.description is not None
    assert failed.description.startswith("The transaction was rolled back due to an earlier issue ")


def test_a_transfer_naming_an_unknown_txn_id_detaches_its_link() -> None:
    """Broker-J validates each transfer's txn-id and detaches the producer link with amqp:transaction:unknown-id
    (AbstractReceivingLinkEndpoint.validateTransfer); minibroker rejects the transfer and keeps the link."""

    def steps(name: str) -> tuple[Any, list[tuple[str, Error | None]]]:
        w, p = _txn_world(name)
        delivery_id = p.transfer("p", b"\x00Sw\xa1\x01m", state=TransactionalState(txn_id=UNKNOWN))
        seen = w.settle()[p]
        return seen.answers.get(delivery_id, (None, False))[0], seen.detached

    state, detached = steps("minibroker")
    assert isinstance(state, Rejected)
    assert state.error is not None
    assert state.error.condition == Condition.UNKNOWN_TXN_ID
    assert detached == []

    state, detached = steps("broker-j")
    assert state is None
    ((link, err),) = detached
    assert link == "p"
    assert err is not None
    assert err.condition == Condition.UNKNOWN_TXN_ID
    assert err.description == "Transfer has an unknown transaction-id 'no\\x01pe'."


def test_an_aborted_control_transfer_gives_its_credit_back() -> None:
    """A controller that aborts a declare half sent (§2.6.14) used its one credit: the broker gives it back, so the
    next declare can be sent and is answered (without it a Broker-J controller would wait for credit forever)."""
    w = world("broker-j")
    p = peer(w)
    p.attach_controller("ctl")
    assert _controller_frames(w, p) == ["credit 1"]
    p.begin_transfer("ctl", b"\x00Sw\xa1\x07partial")
    p.send(frames.transfer(p.handle("ctl"), None, more=False, aborted=True))
    assert _controller_frames(w, p) == ["credit 1"]
    assert len(declare(w, p)) == 4
    assert len(w.broker.transactions) == 1
