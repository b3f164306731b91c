"""The gateway's inner AMQP 1.0 client (``minibroker.gateway091.inner``) against the real broker core and engine.

No trio, no socket: ``Pump`` moves the client's bytes into a real ``ServerConnection`` (``receive_events``), hands
its events to a real ``Broker`` (``handle``) and brings the engine's answer back (``receive_data``), until neither
side has anything to say, exactly as the gateway will. The broker's state is read through the public inspection
handles (``minibroker.handles``). What goes on the wire is checked with the test kit's parser
(``minibroker.testing.client.parse_frames``), the frames the engine must read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minibroker.amqp import codec
from minibroker.amqp.definitions import (
    Accepted,
    AmqpValue,
    Attach,
    Begin,
    Coordinator,
    Declared,
    Modified,
    Open,
    Properties,
    Rejected,
    Released,
    SaslInit,
    SaslMechanisms,
    SaslOutcome,
    Source,
    Target,
    TransactionalState,
    Transfer,
)
from minibroker.amqp.errors import LocalProtocolError
from minibroker.amqp.framing import AMQP_HEADER, SASL_HEADER, encode_frame
from minibroker.broker.core import Broker
from minibroker.broker.personality import RABBITMQ
from minibroker.broker.settings import BrokerSettings
from minibroker.engine.connection import ServerConnection
from minibroker.engine.sasl import SaslPolicy
from minibroker.gateway091.inner import (
    Attached,
    Closed,
    Credit,
    Delivered,
    Detached,
    Ended,
    InnerClient,
    InnerEvent,
    InnerProtocolError,
    Opened,
    Outcome,
    SaslDone,
)
from minibroker.handles import NamespaceView
from minibroker.testing.client import parse_frames, split_header

T = TypeVar("T")
CH = 3  # the gateway's channel numbers need not start at 0


class View(NamespaceView):
    """The broker's default namespace through the public inspection handles."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def _call(self, fn: Callable[[Broker], T]) -> T:
        return fn(self.broker)

    def _now(self) -> float:
        return 0.0


class Pump:
    """One inner client, its engine and the broker, in memory."""

    def __init__(
        self,
        settings: BrokerSettings | None = None,
        *,
        sasl: SaslPolicy | None = None,
        server_max_frame_size: int = 65536,
        client: InnerClient | None = None,
    ) -> None:
        self.broker = Broker(settings)
        self.server = ServerConnection(sasl=sasl, max_frame_size=server_max_frame_size)
        self.broker.connection_made(self.server)
        self.client = client or InnerClient()
        self.view = View(self.broker)
        self.sent: list[bytes] = []
        """Every chunk of bytes the client wrote."""

    def feed(self, data: bytes) -> list[InnerEvent]:
        """Give the engine ``data`` (bytes the client wrote, taken by the test), then pump."""
        self.broker.handle(self.server, self.server.receive_events(data, 0.0), 0.0)
        return self.client.receive_data(self.server.data_to_send()) + self.pump()

    def pump(self) -> list[InnerEvent]:
        """Move bytes both ways until both ends are quiet; the client's events."""
        events: list[InnerEvent] = []
        for _ in range(10_000):
            data = self.client.data_to_send()
            if data:
                self.sent.append(data)
                self.broker.handle(self.server, self.server.receive_events(data, 0.0), 0.0)
            answer = self.server.data_to_send()
            if answer:
                events += self.client.receive_data(answer)
            if not data and not answer:
                return events
        raise AssertionError("the two ends never went quiet")

    def open(self, user: str | None = None, password: str | None = None) -> None:
        self.client.start(None, user, password)
        assert self.pump() == [SaslDone(True), Opened()]

    def session(self, channel: int = CH) -> None:
        self.client.begin(channel)
        assert self.pump() == []

    def sender(self, target: str | None, channel: int = CH) -> int:
        handle = self.client.attach_sender(channel, target=target)
        events = self.pump()
        assert events == [Attached(channel, handle), Credit(channel, handle, 1000, False)]
        return handle

    def receiver(self, source: str, *, settled: bool = False, channel: int = CH, **fields: Any) -> int:
        handle = self.client.attach_receiver(channel, source=source, settled=settled, **fields)
        assert self.pump() == [Attached(channel, handle)]
        return handle

    def depth(self, queue: str) -> int:
        return self.view.queue(queue).stats().ready

    def bodies(self, queue: str) -> list[Any]:
        return [m.body for m in self.view.queue(queue).peek()]


def message(body: Any, to: str | None = None) -> bytes:
    """An encoded message: optional properties naming ``to``, then an amqp-value ``body``."""
    head = codec.encode(Properties(to=to)) if to is not None else b""
    return head + codec.encode(AmqpValue(body))


def ready(settings: BrokerSettings | None = None, **kwargs: Any) -> Pump:
    pump = Pump(settings, **kwargs)
    pump.open()
    pump.session()
    return pump


# -- SASL and open ------------------------------------------------------------------------------------------
def split_start(data: bytes) -> tuple[Any, list[Any]]:
    """What ``start`` wrote: the SASL header, one SASL frame, the AMQP header, AMQP frames; the SASL frame's
    performative and those of the AMQP frames."""
    header, rest = split_header(data)
    assert header == SASL_HEADER
    init_size = int.from_bytes(rest[:4], "big")
    (init,) = parse_frames(rest[:init_size])
    assert init.frame_type == 1
    header, rest = split_header(rest[init_size:])
    assert header == AMQP_HEADER
    return init.performative, [f.performative for f in parse_frames(rest)]


def test_start_pipelines_sasl_anonymous_the_amqp_header_and_open() -> None:
    client = InnerClient(container_id="gw-1")
    client.start("vhost-a", None, None)
    init, after = split_start(client.data_to_send())
    assert init == SaslInit(mechanism="ANONYMOUS", initial_response=b"")
    assert after == [Open(container_id="gw-1", hostname="vhost-a")]


def test_anonymous_login_opens_the_connection() -> None:
    pump = Pump()
    pump.client.start(None, None, None)
    assert pump.pump() == [SaslDone(True), Opened()]
    assert pump.server.user is None
    assert pump.server.remote_open is not None


def users(user: str, password: str) -> Callable[[str, str], bool]:
    return lambda u, p: (u, p) == (user, password)


def test_plain_login_with_the_right_password_opens_as_that_user() -> None:
    pump = Pump(sasl=SaslPolicy(anonymous=False, required=True, authenticate=users("ann", "s3cret")))
    pump.client.start(None, "ann", "s3cret")
    data = pump.client.data_to_send()
    init, _ = split_start(data)
    assert init == SaslInit(mechanism="PLAIN", initial_response=b"\x00ann\x00s3cret")
    assert pump.feed(data) == [SaslDone(True), Opened()]
    assert pump.server.user == "ann"


def test_plain_login_with_a_wrong_password_is_refused_and_nothing_more_is_read() -> None:
    pump = Pump(sasl=SaslPolicy(anonymous=False, required=True, authenticate=users("ann", "s3cret")))
    pump.client.start(None, "ann", "wrong")
    assert pump.pump() == [SaslDone(False)]
    assert pump.client.closed
    assert pump.server.finished
    assert pump.server.remote_open is None  # the pipelined open was never acted on


def test_anonymous_login_is_refused_when_only_plain_is_offered() -> None:
    pump = Pump(sasl=SaslPolicy(anonymous=False, required=True, authenticate=users("ann", "s3cret")))
    pump.client.start(None, None, None)
    assert pump.pump() == [SaslDone(False)]
    assert pump.server.finished


def test_open_names_the_hostname_the_gateway_gives() -> None:
    pump = Pump()
    pump.client.start("some-host", None, None)
    pump.pump()
    assert pump.server.remote_open is not None
    assert pump.server.remote_open.hostname == "some-host"


# -- sending ------------------------------------------------------------------------------------------------
def test_unsettled_send_to_a_queue_is_accepted_and_lands_there() -> None:
    pump = ready()
    handle = pump.sender("q")
    first = pump.client.transfer(CH, handle, message("one"), settled=False)
    second = pump.client.transfer(CH, handle, message("two"), settled=False)
    assert (first, second) == (0, 1)
    assert pump.pump() == [
        Outcome(CH, handle, 0, Accepted(), True),
        Outcome(CH, handle, 1, Accepted(), True),
    ]
    assert pump.bodies("q") == ["one", "two"]


def test_a_transfer_frame_is_a_few_bytes_of_header_and_the_payload() -> None:
    pump = ready()
    handle = pump.sender("q")
    payload = message("x" * 100)
    pump.client.transfer(CH, handle, payload, settled=True)
    data = pump.client.data_to_send()
    (frame,) = parse_frames(data)
    assert frame.channel == CH
    assert frame.performative == Transfer(
        handle=0, delivery_id=0, delivery_tag=b"\x00\x00\x00\x00", message_format=0, settled=True
    )
    assert frame.payload == payload
    assert len(data) - len(payload) <= 32
    assert pump.feed(data) == []
    assert pump.bodies("q") == ["x" * 100]


def test_settled_sends_get_no_outcome() -> None:
    pump = ready()
    handle = pump.sender("q")
    for n in range(3):
        pump.client.transfer(CH, handle, message(n), settled=True)
    assert pump.pump() == []
    assert pump.bodies("q") == [0, 1, 2]


def test_sends_made_before_the_broker_answered_wait_for_its_credit() -> None:
    pump = Pump()
    pump.client.start(None, None, None)
    pump.client.begin(CH)
    handle = pump.client.attach_sender(CH, target="q")
    pump.client.transfer(CH, handle, message("early"), settled=False)
    first = pump.client.data_to_send()
    _, after = split_start(first)
    assert [type(p) for p in after] == [Open, Begin, Attach]  # the transfer waits for credit
    assert pump.feed(first) == [
        SaslDone(True),
        Opened(),
        Attached(CH, handle),
        Credit(CH, handle, 999, False),
        Outcome(CH, handle, 0, Accepted(), True),
    ]
    assert pump.bodies("q") == ["early"]


def test_the_anonymous_relay_routes_by_to() -> None:
    pump = ready()
    handle = pump.sender(None)
    pump.client.transfer(CH, handle, message("a", to="qa"), settled=False)
    pump.client.transfer(CH, handle, message("b", to="qb"), settled=True)
    assert pump.pump() == [Outcome(CH, handle, 0, Accepted(), True)]
    assert pump.bodies("qa") == ["a"]
    assert pump.bodies("qb") == ["b"]


def test_the_anonymous_relay_rejects_an_unknown_address_without_auto_create() -> None:
    pump = ready(BrokerSettings(auto_create=False, queues={"known": BrokerSettings().node_defaults}))
    handle = pump.sender(None)
    pump.client.transfer(CH, handle, message("lost", to="nowhere"), settled=False)
    pump.client.transfer(CH, handle, message("kept", to="known"), settled=False)
    events = pump.pump()
    assert [(type(e), e.delivery_id) for e in events] == [(Outcome, 0), (Outcome, 1)]
    rejected, accepted = events
    assert isinstance(rejected, Outcome)
    assert isinstance(rejected.state, Rejected)
    assert rejected.state.error.condition == "amqp:not-found"
    assert isinstance(accepted, Outcome)
    assert accepted.state == Accepted()
    assert pump.bodies("known") == ["kept"]


def test_more_transfers_than_the_credit_and_window_wait_and_all_arrive() -> None:
    pump = ready()
    handle = pump.sender("q")
    ids = [pump.client.transfer(CH, handle, message(n), settled=n % 2 == 0) for n in range(3000)]
    assert ids == list(range(3000))
    first = pump.client.data_to_send()
    assert sum(isinstance(f.performative, Transfer) for f in parse_frames(first)) == 1000  # the credit granted
    events = pump.feed(first)
    assert [e.delivery_id for e in events if isinstance(e, Outcome)] == list(range(1, 3000, 2))
    assert all(e.state == Accepted() for e in events if isinstance(e, Outcome))
    assert pump.depth("q") == 3000
    assert pump.bodies("q")[:3] == [0, 1, 2]
    assert not any(isinstance(e, Closed | Detached) for e in events)


def test_a_message_larger_than_the_brokers_max_frame_size_goes_in_several_frames() -> None:
    pump = ready(server_max_frame_size=512)
    handle = pump.sender("q")
    big = message("y" * 2000)
    pump.client.transfer(CH, handle, big, settled=False)
    data = pump.client.data_to_send()
    frames = parse_frames(data)
    assert len(frames) == 5
    assert all(len(data) <= 512 for data in [f.payload for f in frames])
    assert [f.performative.more for f in frames] == [True, True, True, True, None]
    assert b"".join(f.payload for f in frames) == big
    assert pump.feed(data) == [Outcome(CH, handle, 0, Accepted(), True)]
    assert pump.bodies("q") == ["y" * 2000]


# -- receiving ----------------------------------------------------------------------------------------------
def fill(pump: Pump, queue: str, *bodies: Any) -> None:
    """Put ``bodies`` on ``queue`` through a sender on a session of its own."""
    pump.client.begin(CH + 100)
    sender = pump.client.attach_sender(CH + 100, target=queue)
    for body in bodies:
        pump.client.transfer(CH + 100, sender, message(body), settled=True)
    pump.client.detach(CH + 100, sender)
    pump.client.end(CH + 100)
    events = pump.pump()
    assert events[-2:] == [Detached(CH + 100, sender), Ended(CH + 100)]


def test_credit_brings_deliveries_in_order_and_accepted_settles_them() -> None:
    pump = ready()
    fill(pump, "q", "m0", "m1", "m2")
    handle = pump.receiver("q")
    pump.client.flow(CH, handle, 2)
    events = pump.pump()
    assert [(type(e), e.delivery_id) for e in events] == [(Delivered, 0), (Delivered, 1)]
    assert all(isinstance(e, Delivered) and not e.settled for e in events)
    assert [codec.decode(e.payload)[0].value for e in events] == ["m0", "m1"]  # type: ignore[union-attr]
    assert pump.view.queue("q").stats().acquired == 2
    pump.client.settle(CH, 0, 1, Accepted())
    assert pump.pump() == []
    stats = pump.view.queue("q").stats()
    assert (stats.ready, stats.acquired) == (1, 0)


@pytest.mark.parametrize(
    ("state", "ready_after", "count"),
    [
        (Released(), ["m0"], 0),
        (Modified(delivery_failed=True), ["m0"], 1),
        (Rejected(), [], None),
    ],
)
def test_released_modified_and_rejected_do_what_the_outcome_says(
    state: Any, ready_after: list[str], count: Any
) -> None:
    pump = ready()
    fill(pump, "q", "m0")
    handle = pump.receiver("q")
    pump.client.flow(CH, handle, 1)
    assert [type(e) for e in pump.pump()] == [Delivered]
    pump.client.settle(CH, 0, 0, state)
    assert pump.pump() == []
    assert pump.bodies("q") == ready_after
    if count is not None:
        assert [m.delivery_count for m in pump.view.queue("q").peek()] == [count]
    else:
        assert pump.bodies("q.DLQ") == ["m0"]


def test_a_settled_receiver_takes_messages_off_the_queue_at_once() -> None:
    pump = ready()
    fill(pump, "q", "a", "b")
    handle = pump.receiver("q", settled=True)
    pump.client.flow(CH, handle, 10)
    events = pump.pump()
    assert [(type(e), e.settled) for e in events] == [(Delivered, True), (Delivered, True)]  # type: ignore[union-attr]
    stats = pump.view.queue("q").stats()
    assert (stats.ready, stats.acquired) == (0, 0)


def test_a_drain_on_an_empty_queue_comes_back_with_no_credit() -> None:
    pump = ready()
    fill(pump, "q", "only")
    handle = pump.receiver("q")
    pump.client.flow(CH, handle, 1, drain=True)
    events = pump.pump()
    assert [type(e) for e in events] == [Delivered, Credit]
    assert events[1] == Credit(CH, handle, 0, True)
    pump.client.flow(CH, handle, 1, drain=True)
    assert pump.pump() == [Credit(CH, handle, 0, True)]
    assert pump.client.credit(CH, handle) == 0


def test_a_message_larger_than_our_max_frame_size_is_assembled() -> None:
    pump = ready(client=InnerClient(max_frame_size=512))
    body = "z" * 3000
    fill(pump, "q", body)
    handle = pump.receiver("q")
    pump.client.flow(CH, handle, 1)
    (delivered,) = pump.pump()
    assert isinstance(delivered, Delivered)
    assert codec.decode(delivered.payload)[0] == AmqpValue(body)
    assert pump.client.credit(CH, handle) == 0


def test_link_properties_reach_the_broker() -> None:
    pump = ready()
    pump.receiver("q", properties={"rabbitmq:exclusive": True})
    (link,) = [k for s in pump.server.sessions.values() for k in s.links.values() if k.name and k.role is False]
    assert link.attach.properties == {"rabbitmq:exclusive": True}
    assert link.attach.snd_settle_mode == 0
    assert link.attach.rcv_settle_mode == 0


def test_a_small_incoming_window_is_opened_again_as_deliveries_arrive() -> None:
    pump = ready(client=InnerClient(window=8))
    fill(pump, "q", *range(50))
    handle = pump.receiver("q", settled=True)
    pump.client.flow(CH, handle, 100)
    events = pump.pump()
    assert [e.delivery_id for e in events if isinstance(e, Delivered)] == list(range(50))
    assert not any(isinstance(e, Closed | Ended) for e in events)


# -- transactions ------------------------------------------------------------------------------------------
def coordinator(pump: Pump) -> int:
    handle = pump.client.attach_coordinator(CH)
    events = pump.pump()
    assert events[0] == Attached(CH, handle)
    assert isinstance(events[1], Credit)
    return handle


def declare(pump: Pump, controller: int) -> bytes:
    delivery_id = pump.client.declare(CH, controller)
    (outcome,) = pump.pump()
    assert isinstance(outcome, Outcome)
    assert (outcome.handle, outcome.delivery_id, outcome.settled) == (controller, delivery_id, True)
    assert isinstance(outcome.state, Declared)
    txn_id: bytes = outcome.state.txn_id
    return txn_id


@pytest.mark.parametrize("commit", [True, False])
def test_transactional_sends_land_only_when_committed(commit: bool) -> None:
    pump = ready()
    controller = coordinator(pump)
    txn = declare(pump, controller)
    sender = pump.sender("q")
    pump.client.transfer(CH, sender, message("t1"), settled=False, txn_id=txn)
    pump.client.transfer(CH, sender, message("t2"), settled=True, txn_id=txn)
    events = pump.pump()
    assert len(events) == 1
    (staged,) = events
    assert isinstance(staged, Outcome)
    assert staged.state == TransactionalState(txn_id=txn, outcome=Accepted())
    assert pump.depth("q") == 0
    assert pump.view.queue("q").stats().staged == 2
    discharge_id = pump.client.discharge(CH, controller, txn, not commit)
    assert pump.pump() == [Outcome(CH, controller, discharge_id, Accepted(), True)]
    assert pump.bodies("q") == (["t1", "t2"] if commit else [])


def test_a_discharge_sent_while_posts_wait_for_credit_comes_after_them() -> None:
    pump = Pump()
    pump.client.start(None, None, None)
    pump.client.begin(CH)
    controller = pump.client.attach_coordinator(CH)
    sender = pump.client.attach_sender(CH, target="q")
    assert len(pump.pump()) == 6  # sasl, open, two attaches, two credits
    txn = declare(pump, controller)
    for n in range(1200):  # more than the 1000 credit: the last ones wait, and so does the discharge
        pump.client.transfer(CH, sender, message(n), settled=True, txn_id=txn)
    discharge_id = pump.client.discharge(CH, controller, txn, False)
    assert pump.pump()[-1] == Outcome(CH, controller, discharge_id, Accepted(), True)
    assert pump.depth("q") == 1200


@pytest.mark.parametrize("commit", [True, False])
def test_transactional_acceptance_retires_only_when_committed(commit: bool) -> None:
    pump = ready()
    fill(pump, "q", "m0", "m1")
    controller = coordinator(pump)
    txn = declare(pump, controller)
    receiver = pump.receiver("q")
    pump.client.flow(CH, receiver, 2)
    assert len(pump.pump()) == 2
    pump.client.settle(CH, 0, 1, TransactionalState(txn_id=txn, outcome=Accepted()))
    pump.pump()
    discharge_id = pump.client.discharge(CH, controller, txn, not commit)
    events = pump.pump()
    assert Outcome(CH, controller, discharge_id, Accepted(), True) in events
    if commit:
        assert pump.view.queue("q").stats().ready == 0
    else:  # rolled back: back to the queue (still held by our link's unsettled deliveries, or released)
        pump.client.detach(CH, receiver)
        pump.pump()
        assert pump.bodies("q") == ["m0", "m1"]


def test_a_discharge_of_an_unknown_transaction_is_rejected() -> None:
    pump = ready()
    controller = coordinator(pump)
    discharge_id = pump.client.discharge(CH, controller, b"no-such-txn", False)
    (outcome,) = pump.pump()
    assert isinstance(outcome, Outcome)
    assert outcome.delivery_id == discharge_id
    assert isinstance(outcome.state, Rejected)
    assert outcome.state.error.condition == "amqp:transaction:unknown-id"


# -- refusals, detach, end, close ---------------------------------------------------------------------------
def test_an_attach_to_an_unknown_node_is_refused_with_not_found_and_the_handle_is_free_again() -> None:
    pump = ready(BrokerSettings(auto_create=False, queues={"known": BrokerSettings().node_defaults}))
    handle = pump.client.attach_sender(CH, target="missing")
    (refused,) = pump.pump()
    assert isinstance(refused, Attached)
    assert (refused.channel, refused.handle) == (CH, handle)
    assert refused.error is not None
    assert refused.error.condition == "amqp:not-found"
    receiver = pump.client.attach_receiver(CH, source="missing", settled=False)
    (refused,) = pump.pump()
    assert isinstance(refused, Attached)
    assert refused.error is not None
    assert refused.error.condition == "amqp:not-found"
    assert receiver == handle  # both freed: the same lowest handle each time
    assert pump.sender("known") == handle
    with pytest.raises(LocalProtocolError):
        pump.client.transfer(CH, handle + 1, b"", settled=True)


def test_a_coordinator_is_refused_where_the_personality_has_no_transactions() -> None:
    pump = ready(BrokerSettings(personality=RABBITMQ))
    handle = pump.client.attach_coordinator(CH)
    (refused,) = pump.pump()
    assert isinstance(refused, Attached)
    assert refused.handle == handle
    assert refused.error is not None
    assert refused.error.condition == "amqp:not-implemented"


def test_our_attach_frames_say_what_the_design_asks() -> None:
    client = InnerClient(container_id="gw")
    client.begin(0)
    client.data_to_send()
    client.attach_sender(0, target=None, name="relay")
    client.attach_coordinator(0, name="txn")
    client.attach_receiver(0, source="q", settled=True, name="c")
    relay, txn, consumer = (f.performative for f in parse_frames(client.data_to_send()))
    assert relay == Attach(
        name="relay", handle=0, role=False, source=Source(), target=Target(), initial_delivery_count=0
    )
    assert txn == Attach(
        name="txn",
        handle=1,
        role=False,
        source=Source(outcomes=["amqp:accepted:list", "amqp:rejected:list"]),
        target=Coordinator(capabilities=["amqp:local-transactions"]),
        initial_delivery_count=0,
    )
    assert consumer == Attach(
        name="c", handle=2, role=True, snd_settle_mode=1, rcv_settle_mode=0, source=Source(address="q"), target=Target()
    )


def test_detach_end_and_close_are_answered() -> None:
    pump = ready()
    handle = pump.sender("q")
    pump.client.detach(CH, handle)
    assert pump.pump() == [Detached(CH, handle)]
    assert pump.server.link_count == 0
    pump.client.end(CH)
    assert pump.pump() == [Ended(CH)]
    assert pump.server.session_count == 0
    pump.client.begin(CH)  # the channel is free again
    assert pump.pump() == []
    pump.client.close()
    assert pump.pump() == [Closed()]
    assert pump.client.closed
    assert pump.server.finished


def test_a_link_the_broker_detaches_is_answered_and_reported_with_the_reason() -> None:
    pump = ready()
    fill(pump, "q", "m")
    handle = pump.receiver("q")
    assert pump.view.queue("q").delete()
    events = pump.pump()
    assert len(events) == 1
    (detached,) = events
    assert isinstance(detached, Detached)
    assert detached.handle == handle
    assert detached.error is not None
    assert pump.server.link_count == 0
    assert pump.receiver("q") == handle  # the handle is free again (auto-create makes a new q)


def test_a_close_by_the_broker_is_answered_and_reported() -> None:
    pump = ready()
    pump.sender("q")
    pump.server.close()
    events = pump.pump()
    assert len(events) == 1
    (closed,) = events
    assert isinstance(closed, Closed)
    assert closed.error is not None
    assert pump.client.closed
    assert pump.server.finished


def test_an_unknown_channel_or_handle_is_the_callers_mistake() -> None:
    client = InnerClient()
    with pytest.raises(LocalProtocolError):
        client.attach_sender(1, target="q")
    client.begin(1)
    with pytest.raises(LocalProtocolError):
        client.begin(1)
    with pytest.raises(LocalProtocolError):
        client.flow(1, 0, 10)
    with pytest.raises(LocalProtocolError):
        client.detach(1, 7)
    handle = client.attach_receiver(1, source="q", settled=False)
    client.detach(1, handle)
    with pytest.raises(LocalProtocolError):  # detached by us: nothing more on it
        client.flow(1, handle, 1)
    client.end(1)
    client.end(1)  # (again: nothing)
    for after_end in (
        lambda: client.settle(1, 0, 0, Accepted()),
        lambda: client.attach_sender(1, target="q"),
        lambda: client.begin(1),  # not before the broker's end answers ours
    ):
        with pytest.raises(LocalProtocolError):
            after_end()
    with pytest.raises(LocalProtocolError):
        client.end(2)


# -- a model: random sends, grants and settlements ----------------------------------------------------------
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.booleans(), st.integers(1, 3)),
        st.tuples(st.just("grant"), st.integers(0, 5), st.booleans()),
        st.tuples(st.just("settle"), st.sampled_from(["accepted", "released", "modified"]), st.integers(1, 4)),
        st.tuples(st.just("big"), st.booleans(), st.just(1)),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS)
def test_random_sends_and_receives_keep_ids_and_credit_in_step_with_the_broker(ops: list[tuple[Any, Any, Any]]) -> None:
    pump = ready(server_max_frame_size=1024, client=InnerClient(max_frame_size=1024, window=16))
    sender = pump.sender("q")
    receiver = pump.receiver("q")
    next_id = 0
    outcomes: list[int] = []
    expected_outcomes: list[int] = []
    next_in = 0
    held: list[int] = []  # delivered to us, unsettled
    in_queue = 0
    granted = 0
    received_since_grant = 0
    for op, a, b in ops:
        if op in ("send", "big"):
            for _ in range(b):
                body = ("x" * 3000) if op == "big" else "m"
                delivery_id = pump.client.transfer(CH, sender, message(body), settled=a)
                assert delivery_id == next_id
                next_id += 1
                if not a:
                    expected_outcomes.append(delivery_id)
                in_queue += 1
        elif op == "grant":
            pump.client.flow(CH, receiver, a, drain=b)
            granted, received_since_grant = a, 0
        else:
            take, held = held[:b], held[b:]
            if take:
                state = {"accepted": Accepted(), "released": Released(), "modified": Modified(delivery_failed=True)}[a]
                pump.client.settle(CH, take[0], take[-1], state)  # (held ids are consecutive: settled in order)
                if a == "accepted":
                    in_queue -= len(take)
        for event in pump.pump():
            assert not isinstance(event, Closed | Ended | Detached | Attached), event
            if isinstance(event, Outcome):
                assert event.handle == sender
                assert event.state == Accepted()
                outcomes.append(event.delivery_id)
            elif isinstance(event, Delivered):
                assert event.handle == receiver
                assert event.delivery_id == next_in  # consecutive, as the engine numbers them
                next_in += 1
                received_since_grant += 1
                assert received_since_grant <= granted
                held.append(event.delivery_id)
        # our credit and counts agree with the engine's view of the same links
        (session,) = pump.server.sessions.values()
        links = {link.name: link for link in session.links.values()}
        engine_sender = next(k for k in links.values() if k.role is True)  # it receives what we send
        engine_receiver = next(k for k in links.values() if k.role is False)
        assert pump.client.credit(CH, sender) == engine_sender.credit
        assert pump.client.credit(CH, receiver) == engine_receiver.credit
        assert session.next_delivery_id == next_in
    assert outcomes == expected_outcomes
    stats = pump.view.queue("q").stats()
    assert stats.ready + stats.acquired == in_queue
    assert stats.acquired == len(held)


# -- what the engine may do that the gateway never asks for ---------------------------------------------------
def test_a_delivery_the_broker_aborts_is_dropped_and_the_next_one_arrives() -> None:
    pump = ready(client=InnerClient(max_frame_size=512, window=2))
    fill(pump, "q", "a" * 3000, "next")
    handle = pump.receiver("q")
    pump.client.flow(CH, handle, 2)
    data = pump.client.data_to_send()
    pump.broker.handle(pump.server, pump.server.receive_events(data, 0.0), 0.0)
    (session,) = pump.server.sessions.values()
    delivery = session.outgoing_unsettled[0]  # (the second waits behind it)
    assert not delivery.complete  # held back by our window of 2 frames
    pump.server.abort(delivery)
    events = pump.client.receive_data(pump.server.data_to_send()) + pump.pump()
    assert [type(e) for e in events] == [Delivered]
    (delivered,) = events
    assert isinstance(delivered, Delivered)
    assert codec.decode(delivered.payload)[0] == AmqpValue("next")
    assert delivered.delivery_id == 1


def test_a_session_the_broker_ends_is_answered_and_reported_with_the_reason() -> None:
    pump = Pump()
    pump.server.max_sessions = 1
    pump.open()
    pump.session(1)
    pump.client.begin(2)
    (ended,) = pump.pump()
    assert isinstance(ended, Ended)
    assert ended.channel == 2
    assert ended.error is not None
    assert ended.error.condition == "amqp:resource-limit-exceeded"
    assert pump.server.session_count == 1
    pump.client.begin(2)  # our channel is free again
    (ended,) = pump.pump()
    assert isinstance(ended, Ended)


def test_close_waits_for_the_sends_before_it() -> None:
    pump = Pump()
    pump.client.start(None, None, None)
    pump.client.begin(CH)
    handle = pump.client.attach_sender(CH, target="q")
    for n in range(5):
        pump.client.transfer(CH, handle, message(n), settled=True)
    pump.client.close()
    events = pump.pump()
    assert events[-1] == Closed()
    assert pump.bodies("q") == [0, 1, 2, 3, 4]
    assert pump.server.finished


@pytest.mark.parametrize(
    "garbage",
    [
        b"HTTP/1.1",  # no AMQP header
        SASL_HEADER + b"\x00\x00\x00\x04\x02\x00\x00\x00",  # a frame shorter than its header
        SASL_HEADER + b"\x00\x00\x00\x0c\x02\x01\x00\x00\xff\x00\x00\x00",  # a body that is no encoding
    ],
)
def test_bytes_that_are_not_amqp_are_a_bug_and_say_so(garbage: bytes) -> None:
    client = InnerClient()
    with pytest.raises(InnerProtocolError):
        client.receive_data(garbage)


def test_a_wide_handle_and_a_long_txn_id_take_the_wider_encodings() -> None:
    pump = ready()
    handles = [pump.client.attach_sender(CH, target="q") for _ in range(300)]
    assert len(pump.pump()) == 600
    last = handles[-1]
    assert last == 299  # a uint of 4 octets in the pre-encoded transfer
    unknown = pump.client.transfer(CH, last, message("t"), settled=False, txn_id=b"x" * 300)  # a list32 transfer
    plain = pump.client.transfer(CH, last, message("p"), settled=False)
    rejected, accepted = pump.pump()
    assert isinstance(rejected, Outcome)
    assert (rejected.handle, rejected.delivery_id) == (last, unknown)
    assert isinstance(rejected.state, Rejected)
    assert rejected.state.error.condition == "amqp:transaction:unknown-id"
    assert accepted == Outcome(CH, last, plain, Accepted(), True)
    assert pump.bodies("q") == ["p"]


# -- reading: any cut of the stream, any garbage --------------------------------------------------------------
def scripted(client: InnerClient) -> None:
    """Commands whose answers make a varied stream: SASL, open, sessions, attaches, credit, a multi-frame
    delivery, outcomes, a refusal, a detach."""
    client.start(None, None, None)
    client.begin(CH)
    sender = client.attach_sender(CH, target="q")
    for n in range(3):
        client.transfer(CH, sender, message(n), settled=False)
    client.transfer(CH, sender, message("w" * 1500), settled=False)
    receiver = client.attach_receiver(CH, source="q", settled=False)
    client.flow(CH, receiver, 10)
    client.attach_coordinator(CH)
    client.attach_sender(CH, target="not-here")
    client.detach(CH, sender)


def only_q() -> BrokerSettings:
    return BrokerSettings(auto_create=False, queues={"q": BrokerSettings().node_defaults})


def recorded() -> tuple[list[InnerEvent], bytes]:
    """The events of ``scripted`` against the broker, and the bytes the engine wrote in a second, identical run."""
    pump = Pump(only_q(), client=InnerClient(max_frame_size=512))
    scripted(pump.client)
    events = pump.pump()
    stream = bytearray()
    again = Pump(only_q(), client=InnerClient(max_frame_size=512))
    scripted(again.client)
    for _ in range(100):
        data = again.client.data_to_send()
        if data:
            again.broker.handle(again.server, again.server.receive_events(data, 0.0), 0.0)
        answer = again.server.data_to_send()
        stream += answer
        if answer:
            again.client.receive_data(answer)
        if not data and not answer:
            break
    return events, bytes(stream)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 200), max_size=60))
def test_the_stream_cut_anywhere_gives_the_same_events(cuts: list[int]) -> None:
    events, stream = recorded()
    # (the stream is varied: a multi-frame delivery, a refusal, a detach)
    assert any(isinstance(e, Delivered) and len(e.payload) > 1500 for e in events)
    assert any(isinstance(e, Attached) and e.error is not None for e in events)
    assert any(isinstance(e, Detached) for e in events)
    client = InnerClient(max_frame_size=512)
    scripted(client)
    got: list[InnerEvent] = []
    pos = 0
    for size in cuts:
        got += client.receive_data(stream[pos : pos + size])
        pos += size
    got += client.receive_data(stream[pos:])
    assert got == events


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.booleans())
def test_garbage_from_the_engine_either_reads_or_raises_inner_protocol_error(garbage: bytes, after_open: bool) -> None:
    client = InnerClient()
    client.start(None, None, None)
    client.begin(0)
    client.attach_sender(0, target="q")
    if after_open:  # garbage where frames are read, else where the first header is
        mechanisms = encode_frame(0, SaslMechanisms(sasl_server_mechanisms=["ANONYMOUS"]), frame_type=1)
        outcome = encode_frame(0, SaslOutcome(code=0), frame_type=1)
        assert client.receive_data(SASL_HEADER + mechanisms + outcome + AMQP_HEADER) == [SaslDone(True)]
    with contextlib.suppress(InnerProtocolError):
        client.receive_data(garbage)


def test_a_transactional_post_in_several_frames_is_staged_and_committed() -> None:
    pump = ready(server_max_frame_size=512)
    controller = coordinator(pump)
    txn = declare(pump, controller)
    sender = pump.sender("q")
    pump.client.transfer(CH, sender, message("b" * 2000), settled=False, txn_id=txn)
    data = pump.client.data_to_send()
    assert len(parse_frames(data)) == 5
    (staged,) = pump.feed(data)
    assert isinstance(staged, Outcome)
    assert staged.state == TransactionalState(txn_id=txn, outcome=Accepted())
    assert pump.view.queue("q").stats().staged == 1
    pump.client.discharge(CH, controller, txn, False)
    (committed,) = pump.pump()
    assert isinstance(committed, Outcome)
    assert committed.state == Accepted()
    assert pump.bodies("q") == ["b" * 2000]
