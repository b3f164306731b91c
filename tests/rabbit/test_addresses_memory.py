"""1.0 clients at the frame level meeting the RabbitMQ model in the default personality (issue 18): RabbitMQ 4
addresses on links and through the anonymous relay (rabbit_amqp_session.erl: ``released`` for an unroutable
message, ``amqp:not-found`` for a missing exchange), routing keys, and transactional posts routed at commit."""

from __future__ import annotations

from typing import Any

from minibroker.amqp.definitions import Accepted, Declared, Rejected, Released, TransactionalState
from minibroker.amqp.types import Symbol
from tests.broker.txn_driver import Peer, World, decode_message
from tests.personalities.harness import answer, discharge
from tests.rabbit.helpers import message, names_in, peer, rabbit_world, ready

NOT_FOUND = Symbol("amqp:not-found")


def bound(w: World, queue: str, exchange: str, key: str, arguments: dict[str, Any] | None = None) -> None:
    rabbit = w.broker.rabbit
    if queue not in w.broker.queues:
        rabbit.declare_queue(None, queue)
    rabbit.bind_queue(None, queue, exchange, key, arguments)


def send(w: World, p: Peer, link: str, data: bytes, state: Any = None) -> Any:
    return answer(w, p, p.transfer(link, data, state=state))[0]


def test_send_to_a_topic_exchange_and_receive_from_the_queue() -> None:
    w = rabbit_world()
    bound(w, "q", "amq.topic", "a.*")
    p = peer(w)
    p.attach_producer("out", "/exchanges/amq.topic/a.b")
    p.attach_consumer("in", "/queues/q", presettled=False, default_outcome=None)
    assert w.settle()[p].detached == []
    assert isinstance(send(w, p, "out", message("m1")), Accepted)
    p.flow("in", 5)
    seen = w.settle()[p]
    assert [c.name for c in seen.completed] == ["m1"]
    decode_message(seen.completed[0].payload)  # the message keeps its bytes


def test_exchange_target_without_key_routes_by_annotation_then_subject() -> None:
    w = rabbit_world()
    bound(w, "by-subject", "amq.direct", "s")
    bound(w, "by-annotation", "amq.direct", "r")
    p = peer(w)
    p.attach_producer("out", "/exchanges/amq.direct")
    w.settle()
    assert isinstance(send(w, p, "out", message("m1", subject="s")), Accepted)
    # x-routing-key (what the 0-9-1 gateway stamps) wins over the subject
    assert isinstance(send(w, p, "out", message("m2", subject="s", annotations={"x-routing-key": "r"})), Accepted)
    assert isinstance(send(w, p, "out", message("m3")), Released)  # the empty key: bound nowhere
    assert (ready(w, "by-subject"), ready(w, "by-annotation")) == (["m1"], ["m2"])


def test_the_relay_routes_v2_addresses_and_releases_the_unroutable() -> None:
    w = rabbit_world()
    bound(w, "q", "amq.fanout", "")
    p = peer(w)
    p.attach_producer("relay", None)
    w.settle()
    assert isinstance(send(w, p, "relay", message("m1", to="/exchanges/amq.fanout")), Accepted)
    assert isinstance(send(w, p, "relay", message("m2", to="/exchanges/amq.default/q")), Accepted)
    assert isinstance(send(w, p, "relay", message("m3", to="/queues/q")), Accepted)
    assert isinstance(send(w, p, "relay", message("m4", to="/exchanges/amq.topic/a.b")), Released)
    assert isinstance(send(w, p, "relay", message("m5", to="/exchanges/amq.default/none")), Released)
    missing = send(w, p, "relay", message("m6", to="/exchanges/nope/k"))
    assert isinstance(missing, Rejected)
    assert (missing.error.condition, missing.error.description) == (NOT_FOUND, "no exchange 'nope' in vhost '/'")
    assert isinstance(send(w, p, "relay", message("m7", to="/queues/none")), Rejected)
    assert ready(w, "q") == ["m1", "m2", "m3"]
    assert set(w.broker.queues) == {"q"}  # nothing was made on the way
    assert w.broker.internal_errors == 0


def test_headers_exchange_and_exchange_to_exchange_bindings() -> None:
    w = rabbit_world()
    rabbit = w.broker.rabbit
    rabbit.declare_exchange(None, "h", "headers")
    rabbit.bind_exchange(None, "h", "amq.topic", "#")
    bound(w, "eu", "h", "", {"x-match": "all", "region": "eu", "kind": None})
    bound(w, "any", "h", "", {"x-match": "any", "region": "us", "kind": "x"})
    p = peer(w)
    p.attach_producer("out", "/exchanges/amq.topic/k")
    w.settle()
    assert isinstance(send(w, p, "out", message("m1", headers={"region": "eu", "kind": "y"})), Accepted)
    assert isinstance(send(w, p, "out", message("m2", headers={"region": "us"})), Accepted)
    assert isinstance(send(w, p, "out", message("m3", headers={"region": "eu"})), Released)
    assert (ready(w, "eu"), ready(w, "any")) == (["m1"], ["m2"])


def test_a_missing_exchange_refuses_the_attach_and_a_deleted_one_rejects() -> None:
    w = rabbit_world()
    rabbit = w.broker.rabbit
    rabbit.declare_exchange(None, "x", "fanout")
    p = peer(w)
    p.attach_producer("gone", "/exchanges/x/k")
    p.attach_producer("never", "/exchanges/never/k")
    seen = w.settle()[p]
    assert [(link, err.condition, err.description) for link, err in seen.detached if err] == [
        ("never", NOT_FOUND, "no exchange 'never' in vhost '/'")
    ]
    rabbit.delete_exchange(None, "x")
    state = send(w, p, "gone", message("m"))
    assert isinstance(state, Rejected)
    assert state.error.condition == NOT_FOUND


def test_transactional_post_to_an_exchange_is_routed_at_commit() -> None:
    """The post stages against the exchange; the bindings that hold at commit decide where it goes (RabbitMQ routes
    at tx.commit), and a rollback leaves nothing."""
    w = rabbit_world()
    w.broker.rabbit.declare_queue(None, "q")
    p = peer(w)
    p.attach_producer("out", "/exchanges/amq.direct/k")
    p.attach_controller("ctl")
    w.settle()
    declared = answer(w, p, p.declare("ctl"))[0]
    assert isinstance(declared, Declared)
    txn = declared.txn_id
    state = send(w, p, "out", message("m1"), TransactionalState(txn_id=txn))
    assert isinstance(state, TransactionalState)
    assert isinstance(state.outcome, Accepted)
    assert ready(w, "q") == []
    w.broker.rabbit.bind_queue(None, "q", "amq.direct", "k")  # bound after the post, before the commit
    assert ready(w, "q") == []
    assert isinstance(discharge(w, p, txn)[0], Accepted)
    assert ready(w, "q") == ["m1"]
    declared = answer(w, p, p.declare("ctl"))[0]
    send(w, p, "out", message("m2"), TransactionalState(txn_id=declared.txn_id))
    discharge(w, p, declared.txn_id, fail=True)
    assert ready(w, "q") == ["m1"]


def test_a_commit_fails_when_its_exchange_was_deleted() -> None:
    w = rabbit_world()
    rabbit = w.broker.rabbit
    rabbit.declare_exchange(None, "x", "fanout")
    p = peer(w)
    p.attach_producer("out", "/exchanges/x")
    p.attach_controller("ctl")
    w.settle()
    txn = answer(w, p, p.declare("ctl"))[0].txn_id
    send(w, p, "out", message("m1"), TransactionalState(txn_id=txn))
    rabbit.delete_exchange(None, "x")
    state = discharge(w, p, txn)[0]
    assert isinstance(state, Rejected)
    assert state.error.condition == Symbol("amqp:transaction:rollback")


def test_percent_encoded_names_and_a_1_0_attach_to_a_declared_queue() -> None:
    w = rabbit_world()
    w.broker.rabbit.declare_queue(None, "orders/eu")
    bound(w, "orders/eu", "amq.direct", "a/b")
    p = peer(w)
    p.attach_producer("out", "/exchanges/amq.direct/a%2Fb")
    p.attach_producer("plain", "orders/eu")  # a plain address reaches the declared queue too
    w.settle()
    send(w, p, "out", message("m1"))
    send(w, p, "plain", message("m2"))
    assert ready(w, "orders/eu") == ["m1", "m2"]
    assert names_in([m.payload for m in w.broker.queues["orders/eu"].ready]) == ["m1", "m2"]


def test_exchange_addresses_in_the_rabbitmq_personality_route_by_bindings() -> None:
    w = rabbit_world("rabbitmq")
    bound(w, "q", "amq.topic", "#")
    p = peer(w)
    p.attach_producer("out", "/exchanges/amq.topic/x.y")
    w.settle()
    assert isinstance(send(w, p, "out", message("m")), Accepted)
    assert ready(w, "q") == ["m"]


def test_an_internal_exchange_takes_no_posts() -> None:
    """rabbit_amqp_session.erl ``check_internal_exchange``: an internal exchange refuses a producer's attach and a
    relay post (amqp:unauthorized-access); it still routes what another exchange passes to it."""
    w = rabbit_world()
    rabbit = w.broker.rabbit
    rabbit.declare_exchange(None, "inner", "fanout", internal=True)
    rabbit.bind_exchange(None, "inner", "amq.fanout", "")
    bound(w, "q", "inner", "")
    p = peer(w)
    p.attach_producer("direct", "/exchanges/inner")
    p.attach_producer("relay", None)
    p.attach_producer("outer", "/exchanges/amq.fanout")
    seen = w.settle()[p]
    text = "forbidden to publish to internal exchange 'inner' in vhost '/'"
    unauthorized = Symbol("amqp:unauthorized-access")
    assert [(link, err.condition, err.description) for link, err in seen.detached if err] == [
        ("direct", unauthorized, text)
    ]
    state = send(w, p, "relay", message("m1", to="/exchanges/inner"))
    assert isinstance(state, Rejected)
    assert state.error.condition == unauthorized
    assert isinstance(send(w, p, "outer", message("m2")), Accepted)
    assert ready(w, "q") == ["m2"]


def test_an_exchange_post_reaches_the_queues_with_room_and_is_rejected_for_a_full_one() -> None:
    """rabbitmq.com/docs/maxlength: a message routed to several queues and refused by one (reject-publish) is still
    enqueued on the others; the publisher hears the refusal (rabbit_amqp_session.erl ``rejected(_, maxlen)``:
    amqp:resource-limit-exceeded "queue 'full' exceeded maximum length")."""
    w = rabbit_world()
    rabbit = w.broker.rabbit
    rabbit.declare_queue(None, "full", arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
    rabbit.declare_queue(None, "roomy")
    rabbit.bind_queue(None, "full", "amq.fanout", "")
    rabbit.bind_queue(None, "roomy", "amq.fanout", "")
    p = peer(w)
    p.attach_producer("out", "/exchanges/amq.fanout")
    w.settle()
    state = send(w, p, "out", message("m1"))
    assert isinstance(state, Rejected)
    assert (str(state.error.condition), state.error.description) == (
        "amqp:resource-limit-exceeded",
        "queue 'full' exceeded maximum length",
    )
    assert {str(k): v for k, v in state.error.info.items()} == {"queue": "full", "reason": "maxlen"}
    assert (ready(w, "full"), ready(w, "roomy")) == ([], ["m1"])
