"""``RabbitModel`` (``broker.rabbit``): queue and exchange operations with RabbitMQ's reply codes and texts
(rabbitmq/rabbitmq-server deps/rabbit/src/rabbit_channel.erl ``handle_method``, ``check_name``,
``check_not_default_exchange``, ``check_exchange_deletion``; rabbit_amqqueue.erl ``assert_equivalence``,
``check_exclusive_access``, ``delete_with``; rabbit_exchange.erl ``check_type``; rabbit_misc.erl ``rs``)."""

from __future__ import annotations

from collections.abc import Callable
from itertools import count
from typing import Any

import pytest

from minibroker.amqp091.definitions import ReplyCode
from minibroker.broker.core import Broker
from minibroker.broker.rabbit import RabbitModel
from tests.broker.txn_driver import World
from tests.rabbit.helpers import fails, peer, rabbit_world

NOT_FOUND, ACCESS_REFUSED = ReplyCode.NOT_FOUND, ReplyCode.ACCESS_REFUSED
RESOURCE_LOCKED, PRECONDITION_FAILED = ReplyCode.RESOURCE_LOCKED, ReplyCode.PRECONDITION_FAILED


def setup() -> tuple[World, RabbitModel, Any, Any]:
    w = rabbit_world()
    return w, w.broker.rabbit, peer(w, "one").conn, peer(w, "two").conn


def test_predeclared_exchanges_in_every_namespace() -> None:
    w = rabbit_world()
    other = w.broker.namespace("other")
    for namespace in (w.broker.default, other):
        assert {name: x.kind for name, x in namespace.exchanges.items()} == {
            "": "direct",
            "amq.direct": "direct",
            "amq.fanout": "fanout",
            "amq.topic": "topic",
            "amq.headers": "headers",
            "amq.match": "headers",
        }
    assert w.broker.rabbit.vhost_exists("/")
    assert w.broker.rabbit.vhost_exists("other")
    assert not w.broker.rabbit.vhost_exists("nope")


def test_declare_queue_then_counts_and_a_1_0_queue_of_the_same_name() -> None:
    w, rabbit, one, _ = setup()
    assert rabbit.declare_queue(one, "orders", durable=True) == ("orders", 0, 0)
    assert "orders" in w.broker.queues
    w.broker.post(w.broker.default, "orders", b"\x00Sw\xa1\x01m")
    assert rabbit.declare_queue(one, "orders", durable=True) == ("orders", 1, 0)
    assert rabbit.declare_queue(one, "orders", passive=True) == ("orders", 1, 0)
    assert rabbit.message_count(one, "orders") == 1
    w.broker.declare_queue("plain")  # made by 1.0 or the embedder: any declaration is taken
    assert rabbit.declare_queue(one, "plain", durable=False, auto_delete=True) == ("plain", 0, 0)


def test_server_named_queue_from_the_injected_ids() -> None:
    broker = Broker()
    ids = (f"id{n}" for n in count())
    rabbit = RabbitModel(broker.nodes, broker.dispatcher, broker.endpoints.delete_node, ids)
    assert rabbit.declare_queue(None, "")[0] == "amq.gen-id0"
    assert rabbit.declare_queue(None, "")[0] == "amq.gen-id1"
    assert {"amq.gen-id0", "amq.gen-id1"} <= set(broker.queues)


def test_passive_declares_of_missing_things_are_404() -> None:
    _, rabbit, one, _ = setup()
    with fails(NOT_FOUND, "NOT_FOUND - no queue 'q' in vhost '/'"):
        rabbit.declare_queue(one, "q", passive=True)
    with fails(NOT_FOUND, "NOT_FOUND - no exchange 'x' in vhost '/'"):
        rabbit.declare_exchange(one, "x", "direct", passive=True)
    with fails(NOT_FOUND, "NOT_FOUND - no queue 'q' in vhost '/'"):
        rabbit.message_count(one, "q")
    with fails(NOT_FOUND, "NOT_FOUND - no queue 'q' in vhost '/'"):
        rabbit.purge_queue(one, "q")


def test_vhost_in_texts_is_the_namespace() -> None:
    w = rabbit_world()
    w.broker.namespace("shop")
    p = peer(w, "c", hostname="shop")
    with fails(NOT_FOUND, "NOT_FOUND - no queue 'q' in vhost 'shop'"):
        w.broker.rabbit.declare_queue(p.conn, "q", passive=True)


def test_inequivalent_queue_declarations_are_406() -> None:
    _, rabbit, one, _ = setup()
    rabbit.declare_queue(one, "q", durable=False, arguments={"x-max-length": 5})
    with fails(
        PRECONDITION_FAILED,
        "PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q' in vhost '/': received 'true' but current "
        "is 'false'",
    ):
        rabbit.declare_queue(one, "q", durable=True, arguments={"x-max-length": 5})
    with fails(PRECONDITION_FAILED, None):
        rabbit.declare_queue(one, "q", auto_delete=True, arguments={"x-max-length": 5})
    with fails(
        PRECONDITION_FAILED,
        "PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'q' in vhost '/': received none but "
        "current is the value '5' of type 'long'",
    ):
        rabbit.declare_queue(one, "q")
    # x-queue-type classic and none are one; an argument of no meaning is not compared
    assert rabbit.declare_queue(one, "q", arguments={"x-max-length": 5, "x-queue-type": "classic", "foo": 1})[0] == "q"


def test_inequivalent_exchange_declarations_are_406() -> None:
    _, rabbit, one, _ = setup()
    rabbit.declare_exchange(one, "x", "direct", durable=True)
    rabbit.declare_exchange(one, "x", "direct", durable=True)
    with fails(
        PRECONDITION_FAILED,
        "PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'x' in vhost '/': received 'fanout' but current "
        "is 'direct'",
    ):
        rabbit.declare_exchange(one, "x", "fanout", durable=True)
    with fails(PRECONDITION_FAILED, None):
        rabbit.declare_exchange(one, "x", "direct", durable=False)
    with fails(PRECONDITION_FAILED, "PRECONDITION_FAILED - unknown exchange type 'weird'"):
        rabbit.declare_exchange(one, "y", "weird")
    rabbit.declare_exchange(one, "amq.topic", "topic", durable=True)  # existing amq.*: allowed


@pytest.mark.parametrize("kind", ["queue", "exchange"])
def test_amq_names_are_403(kind: str) -> None:
    _, rabbit, one, _ = setup()
    with fails(ACCESS_REFUSED, f"ACCESS_REFUSED - {kind} name 'amq.mine' contains reserved prefix 'amq.*'"):
        if kind == "queue":
            rabbit.declare_queue(one, "amq.mine")
        else:
            rabbit.declare_exchange(one, "amq.mine", "direct")


def test_default_and_system_exchanges_are_403() -> None:
    _, rabbit, one, _ = setup()
    rabbit.declare_queue(one, "q")
    default = "ACCESS_REFUSED - operation not permitted on the default exchange"
    steps: list[Callable[[], object]] = [
        lambda: rabbit.declare_exchange(one, "", "direct"),
        lambda: rabbit.delete_exchange(one, ""),
        lambda: rabbit.bind_queue(one, "q", "", "q"),
        lambda: rabbit.bind_exchange(one, "", "amq.direct", "k"),
    ]
    for step in steps:
        with fails(ACCESS_REFUSED, default):
            step()
    with fails(ACCESS_REFUSED, "ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '/' not allowed"):
        rabbit.delete_exchange(one, "amq.direct")


def test_exclusive_queue_of_another_connection_is_405() -> None:
    _, rabbit, one, two = setup()
    rabbit.declare_queue(one, "mine", exclusive=True)
    locked = (
        "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'mine' in vhost '/'. It could be "
        "originally declared on another connection or the exclusive property value does not match that of the "
        "original declaration."
    )
    steps: list[Callable[[], object]] = [
        lambda: rabbit.declare_queue(two, "mine", exclusive=True),
        lambda: rabbit.declare_queue(two, "mine", passive=True),
        lambda: rabbit.declare_queue(one, "mine"),  # exclusivity must match, even for its owner
        lambda: rabbit.purge_queue(two, "mine"),
        lambda: rabbit.delete_queue(two, "mine"),
        lambda: rabbit.bind_queue(two, "mine", "amq.direct", "k"),
    ]
    for step in steps:
        with fails(RESOURCE_LOCKED, locked):
            step()
    assert rabbit.declare_queue(one, "mine", exclusive=True) == ("mine", 0, 0)
    rabbit.bind_queue(one, "mine", "amq.direct", "k")


def test_delete_queue_if_unused_and_if_empty() -> None:
    w, rabbit, one, _ = setup()
    rabbit.declare_queue(one, "q")
    w.broker.post(w.broker.default, "q", b"\x00Sw\xa1\x01m")
    with fails(PRECONDITION_FAILED, "PRECONDITION_FAILED - queue 'q' in vhost '/' not empty"):
        rabbit.delete_queue(one, "q", if_empty=True)
    p = peer(w, "consumer")
    p.attach_consumer("c", "/queues/q", presettled=False, default_outcome=None)
    w.settle()
    with fails(PRECONDITION_FAILED, "PRECONDITION_FAILED - queue 'q' in vhost '/' in use"):
        rabbit.delete_queue(one, "q", if_unused=True)
    assert rabbit.delete_queue(one, "q") == 1
    assert "q" not in w.broker.queues
    seen = w.settle()[p]
    assert [(link, str(err.condition)) for link, err in seen.detached if err] == [("c", "amqp:resource-deleted")]
    assert rabbit.delete_queue(one, "q") == 0  # missing: no error


def test_delete_exchange_if_unused_and_its_bindings_go() -> None:
    _, rabbit, one, _ = setup()
    rabbit.declare_exchange(one, "x", "fanout")
    rabbit.declare_queue(one, "q")
    rabbit.bind_queue(one, "q", "x", "")
    rabbit.bind_exchange(one, "x", "amq.fanout", "")
    with fails(PRECONDITION_FAILED, "PRECONDITION_FAILED - exchange 'x' in vhost '/' in use"):
        rabbit.delete_exchange(one, "x", if_unused=True)
    rabbit.delete_exchange(one, "x")
    namespace = rabbit.nodes.default
    assert "x" not in namespace.exchanges
    assert not namespace.exchanges["amq.fanout"].bindings  # the binding to it went too
    rabbit.delete_exchange(one, "x")  # missing: no error


def test_bindings_need_both_ends() -> None:
    _, rabbit, one, _ = setup()
    with fails(NOT_FOUND, "NOT_FOUND - no queue 'q' in vhost '/'"):
        rabbit.bind_queue(one, "q", "amq.direct", "k")
    rabbit.declare_queue(one, "q")
    with fails(NOT_FOUND, "NOT_FOUND - no exchange 'nope' in vhost '/'"):
        rabbit.bind_queue(one, "q", "nope", "k")
    with fails(NOT_FOUND, "NOT_FOUND - no exchange 'nope' in vhost '/'"):
        rabbit.bind_exchange(one, "nope", "amq.direct", "k")
    rabbit.unbind_queue(one, "q", "amq.direct", "never-bound")  # no such binding: no error
    with fails(PRECONDITION_FAILED, None):
        rabbit.bind_queue(one, "q", "amq.headers", "", {"x-match": "some"})


def test_auto_delete_exchange_goes_with_its_last_binding() -> None:
    _, rabbit, one, _ = setup()
    rabbit.declare_exchange(one, "x", "direct", auto_delete=True)
    rabbit.declare_queue(one, "q1")
    rabbit.declare_queue(one, "q2")
    rabbit.bind_queue(one, "q1", "x", "a")
    rabbit.bind_queue(one, "q2", "x", "b")
    rabbit.unbind_queue(one, "q1", "x", "a")
    assert "x" in rabbit.nodes.default.exchanges
    rabbit.delete_queue(one, "q2")  # its bindings go: the exchange has none left
    assert "x" not in rabbit.nodes.default.exchanges


@pytest.mark.parametrize(
    ("arguments", "reason"),
    [
        ({"x-message-ttl": -1}, "{value_negative,-1}"),
        ({"x-message-ttl": "10"}, '"expected integer, got longstr"'),
        ({"x-message-ttl": True}, '"expected integer, got bool"'),
        ({"x-message-ttl": 315_360_000_001}, "{value_too_large,315360000001}"),
        ({"x-dead-letter-routing-key": "k"}, "routing_key_but_no_dlx_defined"),
        ({"x-expires": 0}, "{value_zero,0}"),
        ({"x-max-length": -5}, "{value_negative,-5}"),
        ({"x-max-priority": 256}, "{max_value_exceeded,256}"),
        ({"x-overflow": "explode"}, "{invalid_overflow,'explode'}"),
        ({"x-dead-letter-exchange": 7}, "{unacceptable_type,long}"),
        ({"x-queue-type": "stream"}, "{unsupported_queue_type,'stream'}"),
        ({"x-single-active-consumer": 1}, '{unacceptable_type,"expected boolean"}'),
    ],
)
def test_bad_queue_arguments_are_406(arguments: dict[str, Any], reason: str) -> None:
    w, rabbit, one, _ = setup()
    key = next(iter(arguments))
    with fails(PRECONDITION_FAILED, f"PRECONDITION_FAILED - invalid arg '{key}' for queue 'q' in vhost '/': {reason}"):
        rabbit.declare_queue(one, "q", arguments=arguments)
    assert "q" not in w.broker.queues


def test_arguments_of_another_queue_type_are_406() -> None:
    _, rabbit, one, _ = setup()
    with fails(
        PRECONDITION_FAILED,
        "PRECONDITION_FAILED - invalid arg 'x-delivery-limit' for queue 'q' in vhost '/' of queue type "
        "rabbit_classic_queue",
    ):
        rabbit.declare_queue(one, "q", arguments={"x-delivery-limit": 3})
    rabbit.declare_queue(one, "q", durable=True, arguments={"x-queue-type": "quorum", "x-delivery-limit": 3})
    assert rabbit.nodes.default.queues["q"].policy.max_delivery_attempts == 3


def test_declared_queues_take_rabbitmqs_policy() -> None:
    _, rabbit, one, _ = setup()
    rabbit.declare_queue(one, "q")
    policy = rabbit.nodes.default.queues["q"].policy
    assert (policy.max_delivery_attempts, policy.dead_letter_target("q"), policy.overflow) == (0, "", "drop-head")


def test_purge_counts_ready_messages() -> None:
    w, rabbit, one, _ = setup()
    rabbit.declare_queue(one, "q")
    for _ in range(3):
        w.broker.post(w.broker.default, "q", b"\x00Sw\xa1\x01m")
    assert rabbit.purge_queue(one, "q") == 3
    assert rabbit.message_count(one, "q") == 0


def test_bindings_with_nested_and_odd_arguments_are_one_each() -> None:
    """Arguments holding tables, arrays, bytes or NUL are kept as they are; binding twice alike is one binding."""
    _, rabbit, one, _ = setup()
    rabbit.declare_queue(one, "q\x00")
    odd = {"x-match": "any", "t": {"n": [1, {"deep": b"\x00"}]}, "a": [1, 2], "f": 1.5}
    rabbit.bind_queue(one, "q\x00", "amq.headers", "k\x00", odd)
    rabbit.bind_queue(one, "q\x00", "amq.headers", "k\x00", dict(reversed(list(odd.items()))))
    assert len(rabbit.nodes.default.exchanges["amq.headers"].bindings) == 1
    rabbit.unbind_queue(one, "q\x00", "amq.headers", "k\x00", odd)
    assert not rabbit.nodes.default.exchanges["amq.headers"].bindings


@pytest.mark.parametrize(
    "arguments",
    [
        {"x-max-length": {"a": 1}},
        {"x-overflow": ["drop-head"]},
        {"x-queue-type": {"t": 1}},
        {"x-message-ttl": float("nan")},
        {"x-message-ttl": float("inf")},
        {"x-dead-letter-exchange": b"\x00"},
    ],
)
def test_arguments_of_wrong_types_are_406_never_a_crash(arguments: dict[str, Any]) -> None:
    _, rabbit, one, _ = setup()
    with fails(PRECONDITION_FAILED):
        rabbit.declare_queue(one, "q", arguments=arguments)


def test_a_huge_length_limit_is_a_limit() -> None:
    _, rabbit, one, _ = setup()
    rabbit.declare_queue(one, "q", arguments={"x-max-length-bytes": 10**40})
    assert rabbit.nodes.default.queues["q"].policy.max_bytes == 10**40
