"""Queues declared through the RabbitMQ model, met by 1.0 peers at the frame level (issue 18): queue arguments
(``x-message-ttl`` on the virtual clock, ``x-max-length`` with each ``x-overflow``, ``x-dead-letter-exchange`` on
reject, expiry and overflow: rabbit_dead_letter.erl), exclusive queues (deleted with their connection, locked to
others), auto-delete queues, exclusive consumers (link property ``rabbitmq:exclusive``)."""

from __future__ import annotations

from typing import Any

from minibroker.amqp.definitions import Accepted, Rejected, Source
from minibroker.amqp.types import Symbol
from minibroker.testing import frames
from tests.broker.txn_driver import Peer, World, decode_message
from tests.personalities.harness import answer
from tests.rabbit.helpers import message, peer, rabbit_world, ready

LOCKED = Symbol("amqp:resource-locked")


def queue(w: World, name: str, conn: Any = None, **declare: Any) -> None:
    w.broker.rabbit.declare_queue(conn, name, **declare)


def publish(w: World, p: Peer, address: str, *names: str) -> list[Any]:
    link = f"to-{address}"
    if not p.attached(link):
        p.attach_producer(link, address)
        w.settle()
    return [answer(w, p, p.transfer(link, message(name)))[0] for name in names]


def annotations_of(w: World, name: str) -> dict[str, Any]:
    from minibroker.amqp import codec
    from minibroker.amqp.definitions import MessageAnnotations

    first = w.broker.queues[name].ready[0]
    for section in codec.decode_all(first.payload):
        if isinstance(section, MessageAnnotations):
            return {str(k): v for k, v in section.value.items()}
    return {}


def test_message_ttl_expires_on_the_virtual_clock_to_the_dead_letter_exchange() -> None:
    w = rabbit_world()
    queue(w, "dead")
    w.broker.rabbit.bind_queue(None, "dead", "amq.direct", "q")
    queue(w, "q", arguments={"x-message-ttl": 1000, "x-dead-letter-exchange": "amq.direct"})
    queue(w, "keep")
    w.broker.rabbit.bind_queue(None, "q", "amq.fanout", "")
    w.broker.rabbit.bind_queue(None, "keep", "amq.fanout", "")
    p = peer(w)
    publish(w, p, "/exchanges/amq.fanout", "m1")
    w.advance(0.999)
    assert (ready(w, "q"), ready(w, "keep"), ready(w, "dead")) == (["m1"], ["m1"], [])
    w.advance(0.002)
    # the copy on q expired (its dead-letter routed by the queue's name, as the default exchange reached it) and
    # the copy on keep, a queue with no ttl, stays
    assert (ready(w, "q"), ready(w, "keep"), ready(w, "dead")) == ([], ["m1"], ["m1"])
    found = annotations_of(w, "dead")
    assert found["x-first-death-reason"] == "expired"
    assert found["x-first-death-queue"] == "q"


def test_the_message_ttl_is_the_least_of_the_queues_and_the_messages() -> None:
    from minibroker.amqp.definitions import Header

    w = rabbit_world()
    queue(w, "q", arguments={"x-message-ttl": 10_000})
    p = peer(w)
    p.attach_producer("out", "/queues/q")
    w.settle()
    answer(w, p, p.transfer("out", frames.message("<<short>>", Header(ttl=500))))
    answer(w, p, p.transfer("out", message("long")))
    w.advance(1)
    assert ready(w, "q") == ["long"]
    w.advance(9.5)
    assert ready(w, "q") == []


def test_max_length_drop_head_dead_letters_the_head() -> None:
    w = rabbit_world()
    queue(w, "dead")
    w.broker.rabbit.declare_exchange(None, "dlx", "fanout")
    w.broker.rabbit.bind_queue(None, "dead", "dlx", "")
    queue(w, "q", arguments={"x-max-length": 2, "x-dead-letter-exchange": "dlx"})
    p = peer(w)
    states = publish(w, p, "/queues/q", "m1", "m2", "m3")
    assert all(isinstance(s, Accepted) for s in states)
    assert (ready(w, "q"), ready(w, "dead")) == (["m2", "m3"], ["m1"])
    assert annotations_of(w, "dead")["x-first-death-reason"] == "maxlen"


def test_max_length_reject_publish_and_reject_publish_dlx() -> None:
    w = rabbit_world()
    queue(w, "dead")
    w.broker.rabbit.bind_queue(None, "dead", "amq.direct", "gone")
    dlx = {"x-dead-letter-exchange": "amq.direct", "x-dead-letter-routing-key": "gone"}
    queue(w, "plain", arguments={"x-max-length": 1, "x-overflow": "reject-publish", **dlx})
    queue(w, "dlx", arguments={"x-max-length": 1, "x-overflow": "reject-publish-dlx", **dlx})
    p = peer(w)
    first, refused = publish(w, p, "/queues/plain", "p1", "p2")
    assert isinstance(first, Accepted)
    assert isinstance(refused, Rejected)
    assert refused.error.condition == Symbol("amqp:resource-limit-exceeded")
    assert ready(w, "dead") == []  # reject-publish does not dead-letter
    first, refused = publish(w, p, "/queues/dlx", "d1", "d2")
    assert isinstance(refused, Rejected)
    assert (ready(w, "dlx"), ready(w, "dead")) == (["d1"], ["d2"])


def test_rejected_without_requeue_goes_through_the_dead_letter_exchange() -> None:
    w = rabbit_world()
    queue(w, "dead")
    w.broker.rabbit.bind_queue(None, "dead", "amq.topic", "dl.#")
    queue(w, "q", arguments={"x-dead-letter-exchange": "amq.topic", "x-dead-letter-routing-key": "dl.q"})
    p = peer(w)
    publish(w, p, "/queues/q", "m1")
    p.attach_consumer("in", "/queues/q", presettled=False, default_outcome=None)
    p.flow("in", 1)
    (started,) = w.settle()[p].started
    p.dispose(started.delivery_id, Rejected(), settled=True)
    w.settle()
    assert (ready(w, "q"), ready(w, "dead")) == ([], ["m1"])
    found = annotations_of(w, "dead")
    assert (found["x-first-death-reason"], found["x-last-death-queue"]) == ("rejected", "q")
    ((death),) = found["x-opt-deaths"]
    assert {str(k): v for k, v in death.items() if "time" not in str(k)} == {
        "queue": "q",
        "reason": "rejected",
        "count": 1,
        "exchange": "",
        "routing-keys": ["q"],  # the keys it was published with (mc.erl record_death), not the dead-letter key
    }
    assert (found["x-exchange"], found["x-routing-key"]) == ("amq.topic", "dl.q")  # rabbit_dead_letter.erl publish


def test_a_message_dead_lettered_twice_from_one_queue_counts_two_deaths() -> None:
    """q dead-letters to itself (rejected each time): x-opt-deaths keeps one entry for (q, rejected), counted."""
    w = rabbit_world()
    queue(w, "q", arguments={"x-dead-letter-exchange": ""})
    p = peer(w)
    publish(w, p, "/queues/q", "m1")
    p.attach_consumer("in", "/queues/q", presettled=False, default_outcome=None)
    for _ in range(2):
        p.flow("in", 1)
        (started,) = w.settle()[p].started
        p.dispose(started.delivery_id, Rejected(), settled=True)
        w.settle()
    (death,) = annotations_of(w, "q")["x-opt-deaths"]
    assert (death[Symbol("count")], death[Symbol("reason")]) == (2, "rejected")


def test_without_a_dead_letter_exchange_a_rejected_message_is_dropped() -> None:
    """RabbitMQ's policy: no ``<name>.DLQ`` for a queue declared through the model."""
    w = rabbit_world()
    queue(w, "q")
    p = peer(w)
    publish(w, p, "/queues/q", "m1")
    p.attach_consumer("in", "/queues/q", presettled=False, default_outcome=None)
    p.flow("in", 1)
    (started,) = w.settle()[p].started
    p.dispose(started.delivery_id, Rejected(), settled=True)
    w.settle()
    assert set(w.broker.queues) == {"q"}
    assert ready(w, "q") == []


def test_exclusive_queue_goes_with_its_connection_and_is_locked_to_others() -> None:
    w = rabbit_world()
    owner, other = peer(w, "owner"), peer(w, "other")
    queue(w, "mine", owner.conn, exclusive=True)
    w.broker.rabbit.bind_queue(owner.conn, "mine", "amq.fanout", "")
    other.attach_consumer("in", "/queues/mine", presettled=False, default_outcome=None)
    other.attach_producer("out", "/queues/mine")  # sending to it is allowed, as in RabbitMQ
    seen = w.settle()[other]
    assert [(link, err.condition) for link, err in seen.detached if err] == [("in", LOCKED)]
    owner.attach_consumer("in", "/queues/mine", presettled=False, default_outcome=None)
    assert w.settle()[owner].detached == []
    owner.close()
    w.settle()
    assert "mine" not in w.broker.queues
    assert not w.broker.default.exchanges["amq.fanout"].bindings
    assert w.broker.internal_errors == 0


def test_auto_delete_queue_goes_with_its_last_consumer() -> None:
    w = rabbit_world()
    queue(w, "auto", auto_delete=True)
    p = peer(w)
    p.attach_consumer("c1", "/queues/auto", presettled=False, default_outcome=None)
    p.attach_consumer("c2", "/queues/auto", presettled=False, default_outcome=None)
    w.settle()
    p.detach("c1")
    w.settle()
    assert "auto" in w.broker.queues
    p.detach("c2")
    w.settle()
    assert "auto" not in w.broker.queues


def test_auto_delete_queue_without_a_consumer_yet_stays() -> None:
    w = rabbit_world()
    queue(w, "auto", auto_delete=True)
    p = peer(w)
    publish(w, p, "/queues/auto", "m1")
    assert ready(w, "auto") == ["m1"]


def exclusive_attach(p: Peer, name: str, address: str) -> None:
    source = Source(address=address)
    properties = {Symbol("rabbitmq:exclusive"): True}
    p.send(frames.attach_receiver(address, p.new_handle(name), name, source=source, properties=properties))


def test_exclusive_consumer_holds_the_queue_alone() -> None:
    w = rabbit_world()
    queue(w, "q")
    p = peer(w)
    p.attach_consumer("plain", "/queues/q", presettled=False, default_outcome=None)
    exclusive_attach(p, "ex1", "/queues/q")
    seen = w.settle()[p]
    assert [(link, err.condition) for link, err in seen.detached if err] == [("ex1", LOCKED)]
    p.detach("plain")
    exclusive_attach(p, "ex2", "/queues/q")
    assert w.settle()[p].detached == []
    p.attach_consumer("late", "/queues/q", presettled=False, default_outcome=None)
    seen = w.settle()[p]
    assert [(link, err.condition) for link, err in seen.detached if err] == [("late", LOCKED)]
    p.detach("ex2")
    w.settle()
    p.attach_consumer("after", "/queues/q", presettled=False, default_outcome=None)
    assert w.settle()[p].detached == []
    publish(w, p, "/queues/q", "m1")
    p.flow("after", 1)
    (done,) = w.settle()[p].completed
    decode_message(done.payload)


def test_x_expires_deletes_a_queue_unused_that_long() -> None:
    """rabbit_amqqueue.erl ``check_expires_arg``: a queue with no consumer, not re-declared, for ``x-expires`` ms
    (broker clock) is deleted; a consumer keeps it, and its time counts again from when the last one went."""
    w = rabbit_world()
    queue(w, "q", arguments={"x-expires": 1000})
    w.advance(0.6)
    queue(w, "q", arguments={"x-expires": 1000})  # re-declared: used
    w.advance(0.6)
    assert "q" in w.broker.queues
    p = peer(w)
    p.attach_consumer("in", "/queues/q", presettled=False, default_outcome=None)
    w.settle()
    w.advance(5)
    assert "q" in w.broker.queues
    p.detach("in")
    w.settle()
    w.advance(0.999)
    assert "q" in w.broker.queues
    w.advance(0.002)
    assert "q" not in w.broker.queues


def priorities(w: World, name: str, *sent: tuple[str, int | None]) -> list[str | None]:
    from minibroker.amqp.definitions import Header, Properties

    p = peer(w)
    p.attach_producer("out", name)
    w.settle()
    for label, priority in sent:
        sections = [Header(priority=priority)] if priority is not None else []
        answer(w, p, p.transfer("out", frames.message(f"<<{label}>>", *sections, Properties())))
    return ready(w, name.removeprefix("/queues/"))


def test_a_declared_queue_without_x_max_priority_is_fifo() -> None:
    """A RabbitMQ classic queue without ``x-max-priority`` ignores priorities; a plain minibroker queue honours
    them (AMQP 1.0 header.priority)."""
    sent = (("low", 1), ("high", 9), ("none", None))
    w = rabbit_world()
    queue(w, "q")
    assert priorities(w, "/queues/q", *sent) == ["low", "high", "none"]
    w = rabbit_world()
    w.broker.declare_queue("plain")
    assert priorities(w, "plain", *sent) == ["high", "none", "low"]


def test_x_max_priority_caps_priorities_and_no_priority_is_zero() -> None:
    w = rabbit_world()
    queue(w, "q", arguments={"x-max-priority": 5})
    got = priorities(w, "/queues/q", ("none", None), ("nine", 9), ("three", 3), ("five", 5))
    assert got == ["nine", "five", "three", "none"]  # 9 is capped to 5: after nothing, FIFO with "five"


def test_exclusive_queue_goes_when_its_connection_is_lost() -> None:
    w = rabbit_world()
    owner, other = peer(w, "owner"), peer(w, "other")
    queue(w, "mine", owner.conn, exclusive=True)
    other.attach_producer("out", "/queues/mine")
    owner.attach_consumer("in", "/queues/mine", presettled=False, default_outcome=None)
    w.settle()
    owner.eof()
    seen = w.settle()[other]
    assert "mine" not in w.broker.queues
    assert [(link, str(err.condition)) for link, err in seen.detached if err] == [("out", "amqp:resource-deleted")]
    assert w.broker.rabbit.declared == {}
    assert w.broker.internal_errors == 0


def test_single_active_consumer_takes_everything_until_it_goes() -> None:
    """x-single-active-consumer: one consumer gets the messages, the others wait; when it goes the oldest waiting
    one takes over (RabbitMQ's single active consumer)."""
    w = rabbit_world()
    queue(w, "q", arguments={"x-single-active-consumer": True})
    sender, c = peer(w, "sender"), peer(w, "consumers")
    sender.attach_producer("out", "/queues/q")
    for name in ("c1", "c2", "c3"):
        c.attach_consumer(name, "/queues/q", presettled=True, default_outcome=None)
        c.flow(name, 10)
    w.settle()
    assert w.broker.rabbit.declare_queue(None, "q", arguments={"x-single-active-consumer": True}) == ("q", 0, 3)

    def send(*names: str) -> list[tuple[str, str | None]]:
        got: list[tuple[str, str | None]] = []
        for name in names:
            sender.transfer("out", message(name), settled=True)
            got += [(done.link, done.name) for done in w.settle()[c].completed]
        return got

    assert send("m1", "m2") == [("c1", "m1"), ("c1", "m2")]
    c.detach("c1")
    w.settle()
    assert send("m3") == [("c2", "m3")]
    c.attach_consumer("c4", "/queues/q", presettled=True, default_outcome=None)
    c.flow("c4", 10)
    c.detach("c2")
    w.settle()
    assert send("m4") == [("c3", "m4")]
    c.detach("c3")
    w.settle()
    assert send("m5") == [("c4", "m5")]


def test_length_limits_count_ready_messages_only() -> None:
    """rabbitmq.com/docs/maxlength: "the number of messages in the ready state are used. Messages unacknowledged by
    consumers do not count towards the limit"."""
    w = rabbit_world()
    queue(w, "q", arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    p = peer(w)
    publish(w, p, "/queues/q", "m1")
    p.attach_consumer("in", "/queues/q", presettled=False, default_outcome=None)
    p.flow("in", 1)
    assert len(w.settle()[p].started) == 1  # m1 is out, unacknowledged
    accepted, refused = publish(w, p, "/queues/q", "m2", "m3")
    assert isinstance(accepted, Accepted)
    assert isinstance(refused, Rejected)
    assert ready(w, "q") == ["m2"]
