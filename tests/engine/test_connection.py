"""ServerConnection without sockets: bytes from the frame factory in, parsed frames and events out.

Every test drives the engine as a peer would and checks the exact answer on the wire. Negative tests are
tables whose ids name the rule they pin. Time is a plain number handed to the engine.
"""

from __future__ import annotations

import itertools
import tracemalloc
from collections.abc import Iterator
from typing import Any

import proton
import pytest

from minibroker.amqp.definitions import (
    Accepted,
    Attach,
    Begin,
    Close,
    Detach,
    Disposition,
    End,
    Flow,
    Open,
    Rejected,
    Released,
    SaslMechanisms,
    SaslOutcome,
    Target,
    Transfer,
)
from minibroker.amqp.errors import Condition, LocalProtocolError, error
from minibroker.amqp.framing import AMQP_HEADER, SASL_FRAME, SASL_HEADER, TLS_HEADER
from minibroker.amqp.types import Symbol, UInt, UShort
from minibroker.engine.connection import Phase, ServerConnection
from minibroker.engine.endpoints import Link, OutgoingDelivery
from minibroker.engine.events import (
    Authenticated,
    AuthenticationFailed,
    ConnectionClosed,
    ConnectionOpened,
    CredentialsReceived,
    DeliveryUpdated,
    Event,
    IncomingSettled,
    LinkAttached,
    LinkDetached,
    LinkFlow,
    SessionBegun,
    SessionEnded,
    SessionFlow,
    TransferDiscarded,
    TransferReceived,
)
from minibroker.engine.sasl import SaslPolicy
from minibroker.testing import frames
from minibroker.testing.client import Frame, parse_frames, split_header


class Harness:
    """One engine and the peer's side of the wire: feed frames, read back parsed frames."""

    def __init__(self, **settings: Any) -> None:
        self.conn = ServerConnection(**settings)
        self.now = 0.0

    def feed(self, *chunks: bytes) -> list[Event]:
        return self.conn.receive_data(b"".join(chunks), self.now)

    def send(self, performative: Any, channel: int = 0, payload: bytes = b"") -> list[Event]:
        return self.feed(frames.frame(channel, performative, payload))

    def out(self) -> list[Frame]:
        """Frames the engine queued since the last call (no protocol header expected)."""
        return parse_frames(self.conn.data_to_send())

    def out_after_header(self) -> tuple[bytes, list[Frame]]:
        header, rest = split_header(self.conn.data_to_send())
        return header, parse_frames(rest)

    def one(self, kind: type, channel: int | None = None) -> Any:
        """The single frame queued, which must carry a ``kind``; its performative."""
        out = self.out()
        assert len(out) == 1, out
        assert isinstance(out[0].performative, kind), out
        if channel is not None:
            assert out[0].channel == channel, out
        return out[0].performative

    # -- set-ups --------------------------------------------------------------------------------------
    def opened(self, **open_fields: Any) -> Harness:
        self.feed(AMQP_HEADER, frames.frame(0, frames.open_(**open_fields)))
        header, out = self.out_after_header()
        assert header == AMQP_HEADER
        assert [type(f.performative) for f in out] == [Open]
        return self

    def session(self, channel: int = 0, **begin_fields: Any) -> Harness:
        events = self.send(frames.begin(**begin_fields), channel)
        assert [type(e) for e in events] == [SessionBegun]
        self.one(Begin)
        return self

    def receiving_link(self, handle: int = 0, credit: int = 10, channel: int = 0, **fields: Any) -> Link:
        """A link the peer sends on (we are receiver), attached and with ``credit`` granted."""
        (event,) = self.send(frames.attach_sender("q", handle, **fields), channel)
        assert isinstance(event, LinkAttached)
        link = event.link
        self.conn.accept_attach(link, source=link.source, target=link.target)
        if credit:
            self.conn.grant_credit(link, credit)
        self.out()
        return link

    def sending_link(self, handle: int = 0, credit: int = 10, channel: int = 0, **fields: Any) -> Link:
        """A link we send on (the peer is receiver), attached, with ``credit`` from the peer."""
        (event,) = self.send(frames.attach_receiver("q", handle, **fields), channel)
        assert isinstance(event, LinkAttached)
        link = event.link
        self.conn.accept_attach(link, source=link.source, target=link.target)
        self.out()
        if credit:
            self.send(frames.flow(handle=handle, delivery_count=0, link_credit=credit), channel)
        return link


def condition(performative: Any) -> str | None:
    """The error condition carried by a close, end or detach."""
    return None if performative.error is None else str(performative.error.condition)


def closed_event(events: list[Event]) -> ConnectionClosed:
    closed = [e for e in events if isinstance(e, ConnectionClosed)]
    assert len(closed) == 1, events
    return closed[0]


# -- protocol header exchange (§2.2, Part 5 §5.3.1) ---------------------------------------------------
def test_amqp_header_is_answered_with_ours() -> None:
    h = Harness()
    assert h.feed(AMQP_HEADER) == []
    assert h.conn.data_to_send() == AMQP_HEADER
    assert h.conn.phase is Phase.OPEN


def test_header_may_arrive_byte_by_byte() -> None:
    h = Harness()
    for byte in AMQP_HEADER:
        h.feed(bytes([byte]))
    assert h.conn.data_to_send() == AMQP_HEADER


def test_sasl_header_is_answered_with_sasl_header_and_mechanisms() -> None:
    h = Harness()
    h.feed(SASL_HEADER)
    header, out = h.out_after_header()
    assert header == SASL_HEADER
    assert len(out) == 1
    assert out[0].frame_type == SASL_FRAME
    assert out[0].performative == SaslMechanisms(sasl_server_mechanisms=[Symbol("PLAIN"), Symbol("ANONYMOUS")])


@pytest.mark.parametrize(
    "header",
    [
        pytest.param(TLS_HEADER, id="tls-header-unsupported"),
        pytest.param(b"AMQP\x01\x01\x00\x00", id="unknown-protocol-id"),
        pytest.param(b"AMQP\x00\x01\x00\x01", id="unsupported-revision"),
        pytest.param(b"AMQP\x00\x00\x09\x01", id="amqp-0-9-1"),
        pytest.param(b"HTTP/1.1", id="not-amqp"),
    ],
)
def test_unsupported_header_gets_ours_and_the_engine_finishes(header: bytes) -> None:
    # §2.2: "the server MUST reply with a protocol header it supports, then close the socket"
    h = Harness()
    events = h.feed(header + b"trailing bytes are ignored")
    assert h.conn.data_to_send() == AMQP_HEADER
    assert h.conn.finished
    assert closed_event(events).by_peer is False
    assert h.feed(AMQP_HEADER) == []
    assert h.conn.data_to_send() == b""


def test_sasl_required_refuses_a_peer_that_skips_sasl() -> None:
    h = Harness(sasl=SaslPolicy(required=True))
    events = h.feed(AMQP_HEADER)
    assert h.conn.data_to_send() == SASL_HEADER
    assert h.conn.finished
    closed_event(events)


# -- SASL (Part 5 §5.3) -------------------------------------------------------------------------------
def _check(user: str, password: str) -> bool:
    return (user, password) == ("alice", "secret")


@pytest.mark.parametrize(
    ("policy", "init", "code", "user"),
    [
        pytest.param(SaslPolicy(), frames.sasl_anonymous(), 0, None, id="anonymous-ok"),
        pytest.param(SaslPolicy(), frames.sasl_plain("anyone", "anything"), 0, "anyone", id="plain-any-credentials"),
        pytest.param(
            SaslPolicy(authenticate=_check), frames.sasl_plain("alice", "secret"), 0, "alice", id="plain-checked-ok"
        ),
        pytest.param(
            SaslPolicy(authenticate=_check), frames.sasl_plain("alice", "wrong"), 1, None, id="plain-bad-password"
        ),
        pytest.param(
            SaslPolicy(authenticate=_check), frames.sasl_plain("mallory", "secret"), 1, None, id="plain-unknown-user"
        ),
        pytest.param(SaslPolicy(anonymous=False), frames.sasl_anonymous(), 1, None, id="anonymous-not-offered"),
        pytest.param(
            SaslPolicy(),
            frames.SaslInit(mechanism=Symbol("PLAIN"), initial_response=b"no-separators"),
            1,
            None,
            id="plain-malformed-response",
        ),
        pytest.param(SaslPolicy(), frames.SaslInit(mechanism=Symbol("GSSAPI")), 1, None, id="unknown-mechanism"),
    ],
)
def test_sasl_outcome(policy: SaslPolicy, init: Any, code: int, user: str | None) -> None:
    h = Harness(sasl=policy)
    h.feed(SASL_HEADER)
    h.conn.data_to_send()
    events = h.feed(frames.sasl_frame(init))
    out = h.out()
    assert [(f.frame_type, f.performative) for f in out] == [(SASL_FRAME, SaslOutcome(code=code))]
    if code == 0:
        assert events == [Authenticated(str(init.mechanism), user)]
        assert h.conn.user == user
        assert not h.conn.finished
        # after SASL, the AMQP header exchange and open proceed as usual
        h.feed(AMQP_HEADER, frames.frame(0, frames.open_()))
        header, out = h.out_after_header()
        assert header == AMQP_HEADER
        assert isinstance(out[0].performative, Open)
    else:
        assert h.conn.finished
        assert not any(isinstance(e, Authenticated) for e in events)
        assert closed_event(events).by_peer is False


def test_sasl_required_accepts_a_peer_that_authenticates() -> None:
    h = Harness(sasl=SaslPolicy(required=True, anonymous=False, authenticate=_check))
    h.feed(SASL_HEADER, frames.sasl_frame(frames.sasl_plain("alice", "secret")), AMQP_HEADER)
    header, rest = split_header(h.conn.data_to_send())
    assert header == SASL_HEADER
    sasl_out = parse_frames(rest[: -len(AMQP_HEADER)])
    assert [type(f.performative) for f in sasl_out] == [SaslMechanisms, SaslOutcome]
    assert sasl_out[0].performative.sasl_server_mechanisms == [Symbol("PLAIN")]
    assert sasl_out[1].performative.code == 0
    assert rest.endswith(AMQP_HEADER)
    assert h.conn.phase is Phase.OPEN


def _never(user: str, password: str) -> bool:
    raise AssertionError("a deferred check must not be made by the engine")


def test_deferred_plain_waits_for_the_verdict_and_then_reads_on() -> None:
    """Issue 12 item 3: the engine hands PLAIN credentials over and reads nothing more until the verdict (the
    server hashes in a worker thread); what the peer pipelined meanwhile is parsed after it."""
    h = Harness(sasl=SaslPolicy(required=True, anonymous=False, authenticate=_never, deferred=True))
    h.feed(SASL_HEADER)
    h.conn.data_to_send()
    events = h.feed(
        frames.sasl_frame(frames.sasl_plain("alice", "secret")), AMQP_HEADER, frames.frame(0, frames.open_())
    )
    assert events == [CredentialsReceived("PLAIN", "alice")]
    assert "secret" not in repr(events)
    assert h.conn.awaiting_verdict
    assert h.conn.data_to_send() == b""  # no outcome yet, and the pipelined header is not answered
    assert h.conn.next_deadline() is None  # (no handshake time-out configured here)
    assert h.conn.take_credentials() == ("alice", "secret")
    with pytest.raises(LocalProtocolError):
        h.conn.take_credentials()  # handed over once
    h.conn.sasl_verdict(True)
    events = list(h.conn.resume_events(h.now))
    assert [type(e) for e in events] == [Authenticated, ConnectionOpened]
    assert h.conn.user == "alice"
    sasl, _, amqp = h.conn.data_to_send().partition(AMQP_HEADER)
    assert [f.performative for f in parse_frames(sasl)] == [SaslOutcome(code=0)]
    assert [type(f.performative) for f in parse_frames(amqp)] == [Open]


def test_deferred_plain_verdict_refused_ends_the_connection() -> None:
    h = Harness(sasl=SaslPolicy(required=True, anonymous=False, authenticate=_never, deferred=True))
    h.feed(SASL_HEADER)
    h.conn.data_to_send()
    h.feed(frames.sasl_frame(frames.sasl_plain("alice", "wrong")))
    h.conn.take_credentials()
    h.conn.sasl_verdict(False)
    events = list(h.conn.resume_events(h.now))
    assert [type(e) for e in events] == [AuthenticationFailed, ConnectionClosed]
    assert [f.performative for f in h.out()] == [SaslOutcome(code=1)]
    assert h.conn.finished
    assert h.conn.authentication_failed
    h.conn.sasl_verdict(True)  # a verdict for a connection that is over is ignored
    assert h.conn.user is None


def test_deferred_plain_is_dropped_at_the_handshake_timeout() -> None:
    h = Harness(sasl=SaslPolicy(deferred=True), handshake_timeout=5.0)
    h.feed(SASL_HEADER)
    h.feed(frames.sasl_frame(frames.sasl_plain("alice", "secret")))
    assert h.conn.next_deadline() == 5.0
    h.conn.handle_timeout(5.0)
    assert h.conn.finished
    h.conn.sasl_verdict(True)  # too late: ignored
    assert h.conn.user is None


def test_a_verdict_nobody_waits_for_is_a_local_error() -> None:
    h = Harness()
    with pytest.raises(LocalProtocolError):
        h.conn.sasl_verdict(True)


@pytest.mark.parametrize(("accepted", "offered"), [(True, ["EXTERNAL", "PLAIN"]), (False, ["PLAIN"])])
def test_external_offered_only_to_identities_the_policy_accepts(accepted: bool, offered: list[str]) -> None:
    """Issue 12 item 23: EXTERNAL for a certificate whose name the embedder does not accept is neither offered
    nor, when chosen anyway, successful."""
    policy = SaslPolicy(anonymous=False, external=True, external_accepts=lambda cn: accepted)
    h = Harness(sasl=policy, external_identity="client-7")
    h.feed(SASL_HEADER)
    _header, out = h.out_after_header()
    assert [str(m) for m in out[0].performative.sasl_server_mechanisms] == offered
    h.feed(frames.sasl_frame(frames.SaslInit(mechanism=Symbol("EXTERNAL"))))
    assert h.one(SaslOutcome).code == (0 if accepted else 1)
    assert h.conn.user == ("client-7" if accepted else None)


def test_amqp_frame_instead_of_sasl_init_ends_the_connection() -> None:
    h = Harness()
    h.feed(SASL_HEADER)
    h.conn.data_to_send()
    events = h.feed(frames.frame(0, frames.open_()))
    assert h.conn.finished
    assert h.conn.data_to_send() == b""  # no AMQP close can be sent inside the SASL layer
    assert condition(closed_event(events)) == Condition.NOT_ALLOWED


# -- open negotiation (§2.4, §2.7.1) -------------------------------------------------------------------
def test_open_is_answered_with_our_limits() -> None:
    h = Harness(container_id="broker-1", max_frame_size=4096, channel_max=10, idle_time_out=30.0)
    events = h.feed(AMQP_HEADER, frames.frame(0, frames.open_(channel_max=UShort(3))))
    _, out = h.out_after_header()
    (reply,) = [f.performative for f in out]
    assert reply.container_id == "broker-1"
    assert reply.max_frame_size == 4096
    assert reply.channel_max == 3  # the smaller of ours and the peer's
    assert reply.idle_time_out == 30000
    assert [type(e) for e in events] == [ConnectionOpened]


def test_open_is_answered_on_channel_zero_before_anything_else() -> None:
    h = Harness()
    h.feed(AMQP_HEADER)
    h.conn.data_to_send()
    h.send(frames.open_(container_id="c1"))
    assert h.one(Open, channel=0).container_id == "minibroker"


@pytest.mark.parametrize(
    ("offered", "expected"),
    [
        pytest.param(None, 0xFFFFFFFF, id="absent-means-unlimited"),
        pytest.param(100, 512, id="below-minimum-raised-to-512"),
        pytest.param(1024, 1024, id="as-offered"),
    ],
)
def test_peer_max_frame_size(offered: int | None, expected: int) -> None:
    fields = {} if offered is None else {"max_frame_size": UInt(offered)}
    h = Harness().opened(**fields)
    assert h.conn.remote_max_frame_size == expected


def test_heartbeat_is_sent_at_half_the_peer_idle_time_out() -> None:
    h = Harness().opened(idle_time_out=UInt(10_000))
    assert h.conn.next_deadline() == pytest.approx(5.0)
    assert h.conn.handle_timeout(4.9) == []
    assert h.conn.data_to_send() == b""
    assert h.conn.handle_timeout(5.0) == []
    assert h.conn.data_to_send() == frames.heartbeat()
    # the next one is due half a time-out after the last byte we sent
    assert h.conn.next_deadline() == pytest.approx(10.0)
    h.now = 7.0
    h.session()  # sending the begin counts as traffic
    assert h.conn.next_deadline() == pytest.approx(12.0)


@pytest.mark.parametrize(
    ("idle_time_out_ms", "interval"),
    [
        pytest.param(1000, 0.5, id="half-the-peer-s"),
        pytest.param(150, 0.1, id="never-more-often-than-the-floor"),
        pytest.param(100, 0.1, id="at-the-floor"),
    ],
)
def test_heartbeats_never_go_out_more_often_than_the_floor(idle_time_out_ms: int, interval: float) -> None:
    h = Harness(min_heartbeat_interval=0.1).opened(idle_time_out=UInt(idle_time_out_ms))
    sent = []
    now = 0.0
    while now < 10.0:
        deadline = h.conn.next_deadline()
        assert deadline is not None
        now = deadline
        h.conn.handle_timeout(now)
        if h.conn.data_to_send() == frames.heartbeat():
            sent.append(now)
    assert sent[0] == pytest.approx(interval)
    assert min(b - a for a, b in itertools.pairwise(sent)) == pytest.approx(interval)
    assert interval <= idle_time_out_ms / 1000  # always within what the peer asked for


@pytest.mark.parametrize("idle_time_out_ms", [1, 99])
def test_an_idle_time_out_below_the_floor_is_refused(idle_time_out_ms: int) -> None:
    # §2.4.5: "If a peer can not, for any reason support a proposed idle timeout, then it SHOULD close the
    # connection using a close frame with an error explaining why"
    h = Harness(min_heartbeat_interval=0.1)
    events = h.feed(AMQP_HEADER, frames.frame(0, frames.open_(idle_time_out=UInt(idle_time_out_ms))))
    _, out = h.out_after_header()
    assert [type(f.performative) for f in out] == [Open, Close]
    close = out[1].performative
    assert condition(close) == Condition.RESOURCE_LIMIT_EXCEEDED
    assert close.error.description == f"idle-time-out of {idle_time_out_ms} ms is below the broker's minimum of 100 ms"
    assert [type(e) for e in events] == [ConnectionClosed]
    # no heartbeat follows our close: the only deadline is the wait for the peer's close
    assert h.conn.next_deadline() == pytest.approx(2.0)
    h.conn.handle_timeout(1.0)
    assert h.conn.data_to_send() == b""


@pytest.mark.parametrize(
    ("ours", "peers_ms", "expected"),
    [
        pytest.param(None, None, (None, None), id="neither"),
        pytest.param(3.0, None, (3.0, 7.0), id="our-idle-time-out"),
        pytest.param(None, 10_000, (5.0, 5.0), id="heartbeat"),
        pytest.param(3.0, 10_000, (3.0, 5.0), id="idle-time-out-first"),
        pytest.param(20.0, 10_000, (5.0, 5.0), id="heartbeat-first"),
    ],
)
def test_an_open_connections_deadline_is_its_earliest(
    ours: float | None, peers_ms: int | None, expected: tuple[float | None, float | None]
) -> None:
    """§2.4.5: the next deadline of an open connection is its next heartbeat (half the peer's idle-time-out after
    the last byte we sent) or the end of our idle time-out (after the last byte received), whichever comes first;
    then again after the peer has sent something at 4.0 (read without a list per call: issue 19)."""
    fields = {} if peers_ms is None else {"idle_time_out": UInt(peers_ms)}
    h = Harness(idle_time_out=ours).opened(**fields)
    assert h.conn.next_deadline() == expected[0]
    h.conn.receive_data(frames.heartbeat(), 4.0)
    assert h.conn.next_deadline() == expected[1]


def test_no_floor_serves_any_idle_time_out() -> None:
    h = Harness(min_heartbeat_interval=0.0).opened(idle_time_out=UInt(1))
    assert h.conn.next_deadline() == pytest.approx(0.0005)


def test_no_deadline_without_idle_time_outs() -> None:
    h = Harness().opened()
    assert h.conn.next_deadline() is None


def test_our_idle_time_out_closes_a_silent_peer() -> None:
    h = Harness(idle_time_out=2.0).opened()
    h.now = 1.5
    h.feed(frames.heartbeat())  # a heartbeat is traffic: the clock restarts
    assert h.conn.next_deadline() == pytest.approx(3.5)
    assert h.conn.handle_timeout(3.4) == []
    events = h.conn.handle_timeout(3.5)
    close = h.one(Close)
    assert condition(close) == Condition.RESOURCE_LIMIT_EXCEEDED
    assert condition(closed_event(events)) == Condition.RESOURCE_LIMIT_EXCEEDED


# -- sessions (§2.5) ------------------------------------------------------------------------------------
def test_begin_and_end() -> None:
    h = Harness().opened()
    (event,) = h.send(frames.begin(next_outgoing_id=7), channel=3)
    assert isinstance(event, SessionBegun)
    assert event.session.next_incoming_id == 7
    begin = h.one(Begin, channel=0)  # our first free channel
    assert begin.remote_channel == 3
    h.send(frames.begin(), channel=4)
    assert h.one(Begin, channel=1).remote_channel == 4

    (ended,) = h.send(End(), channel=3)
    assert isinstance(ended, SessionEnded)
    assert ended.error is None
    assert h.one(End, channel=0) == End()
    assert list(h.conn.sessions) == [4]


def test_session_end_detaches_its_links() -> None:
    h = Harness().opened().session()
    h.receiving_link(0)
    h.sending_link(1)
    events = h.send(End(error=error(Condition.INTERNAL_ERROR, "bye")))
    assert [type(e) for e in events] == [LinkDetached, LinkDetached, SessionEnded]
    assert not any(e.closed for e in events if isinstance(e, LinkDetached))  # detached, not closed
    assert condition(events[-1]) == Condition.INTERNAL_ERROR


# -- links (§2.6) -------------------------------------------------------------------------------------
def test_attach_sender_accept_and_grant_credit() -> None:
    h = Harness().opened().session()
    (event,) = h.send(frames.attach_sender("orders", 0, "s1", snd_settle_mode=2))
    assert isinstance(event, LinkAttached)
    link = event.link
    assert (link.name, link.is_sender, link.input_handle) == ("s1", False, 0)
    assert h.out() == []  # the broker core decides
    h.conn.accept_attach(link, source=link.source, target=Target(address="orders"))
    h.conn.grant_credit(link, 100)
    attach, flow = (f.performative for f in h.out())
    assert isinstance(attach, Attach)
    assert (attach.name, attach.role, attach.handle) == ("s1", True, 0)
    assert attach.target == Target(address="orders")
    assert attach.snd_settle_mode == 2
    assert isinstance(flow, Flow)
    assert (flow.handle, flow.link_credit, flow.delivery_count) == (0, 100, 0)


def test_attach_receiver_accept() -> None:
    h = Harness().opened().session()
    (event,) = h.send(frames.attach_receiver("orders", 5, "r1"))
    link = event.link
    assert link.is_sender
    h.conn.accept_attach(link, source=link.source, target=link.target)
    attach = h.one(Attach)
    assert (attach.role, attach.handle, attach.initial_delivery_count) == (False, 0, 0)  # our handle is 0


def test_refuse_attach_answers_null_terminus_then_detach() -> None:
    h = Harness().opened().session()
    (event,) = h.send(frames.attach_sender("nowhere", 0))
    h.conn.refuse_attach(event.link, error(Condition.NOT_FOUND, "no such node"))
    attach, detach = (f.performative for f in h.out())
    assert isinstance(attach, Attach)
    assert attach.target is None  # §2.6.3: a null terminus says the link is refused
    assert isinstance(detach, Detach)
    assert detach.closed is True
    assert condition(detach) == Condition.NOT_FOUND
    assert [type(e) for e in h.conn.take_events()] == [LinkDetached]
    # the peer's answering detach is the end of the handshake, not an error (§2.6.2)
    assert h.send(Detach(handle=UInt(0), closed=True)) == []
    assert h.out() == []
    assert 0 in h.conn.sessions
    # and the handle may be used again
    (again,) = h.send(frames.attach_sender("q", 0))
    assert isinstance(again, LinkAttached)


def test_refused_handle_is_in_use_until_the_peer_answers_our_detach() -> None:
    h = Harness().opened().session()
    (event,) = h.send(frames.attach_sender("nowhere", 0))
    h.conn.refuse_attach(event.link, error(Condition.NOT_FOUND, "no such node"))
    h.out()
    h.conn.take_events()
    # §2.7.3: the peer's handle is released by its own detach only; an attach before it names a handle in use
    events = h.send(frames.attach_sender("q", 0))
    assert condition(h.one(End)) == Condition.HANDLE_IN_USE
    assert [type(e) for e in events] == [SessionEnded]


@pytest.mark.parametrize("peer_handle_max", [None, 1, 7])
def test_attach_above_our_handle_max_closes_the_connection_with_framing_error(peer_handle_max: int | None) -> None:
    h = Harness(max_links=4).opened()
    fields = {} if peer_handle_max is None else {"handle_max": UInt(peer_handle_max)}
    h.send(frames.begin(**fields))
    handle_max = h.one(Begin).handle_max
    assert handle_max == min(3, 0xFFFFFFFF if peer_handle_max is None else peer_handle_max)
    for handle in range(handle_max + 1):  # every handle up to handle-max names a link
        (event,) = h.send(frames.attach_sender("q", handle))
        assert isinstance(event, LinkAttached)
        h.conn.accept_attach(event.link)
        assert h.one(Attach).handle <= handle_max  # and ours stay within the peer's range
    # §2.7.2: "A peer that receives a handle outside the supported range MUST close the connection with the
    # framing-error error-code"
    events = h.send(frames.attach_sender("q", handle_max + 1))
    close = h.out()[-1].performative
    assert isinstance(close, Close)
    assert condition(close) == Condition.FRAMING_ERROR
    assert closed_event(events).error == close.error


def test_peer_detach() -> None:
    h = Harness().opened().session()
    link = h.receiving_link(0)
    events = h.send(Detach(handle=UInt(0), closed=True))
    assert events == [LinkDetached(link, True, None)]
    assert h.one(Detach) == Detach(handle=UInt(0), closed=True)
    assert h.conn.sessions[0].links == {}


def test_flow_grants_credit_to_a_link_we_send_on() -> None:
    h = Harness().opened().session()
    link = h.sending_link(0, credit=0)
    events = h.send(frames.flow(handle=0, delivery_count=0, link_credit=5))
    assert events == [LinkFlow(link, None)]
    assert link.credit == 5
    assert h.conn.can_send(link)
    for _ in range(2):
        h.conn.deliver(link, b"m", settled=True)
    assert link.credit == 3
    # §2.6.7: link-credit(snd) = delivery-count(rcv) + link-credit(rcv) - delivery-count(snd)
    h.send(frames.flow(handle=0, delivery_count=1, link_credit=5))
    assert link.credit == 4
    h.send(frames.flow(handle=0, delivery_count=2, link_credit=0))
    assert link.credit == 0
    assert not h.conn.can_send(link)


def test_flow_echo_is_answered() -> None:
    h = Harness().opened().session()
    h.sending_link(0, credit=0)
    h.out()
    h.send(frames.flow(handle=0, link_credit=3, echo=True))
    flow = h.one(Flow)
    assert (flow.handle, flow.link_credit) == (0, 3)


def test_an_echo_on_a_sending_link_is_answered_once_its_event_is_handled() -> None:
    """§2.7.4: the answer to an echo carries what the caller did while handling the flow (here, one delivery and
    ``set_available``), because it goes out only when the next frame is parsed, or the read ends."""
    h = Harness().opened().session()
    link = h.sending_link(0, credit=0)
    h.out()
    events = h.conn.receive_events(frames.frame(0, frames.flow(handle=0, link_credit=3, echo=True)), h.now)
    event = next(events)
    assert isinstance(event, LinkFlow)
    assert h.out() == []  # not answered yet
    h.conn.deliver(link, b"m", settled=True)
    h.conn.set_available(link, 7)
    assert list(events) == []
    transfer, flow = (f.performative for f in h.out())
    assert isinstance(transfer, Transfer)
    assert isinstance(flow, Flow)
    assert (flow.handle, flow.delivery_count, flow.link_credit, flow.available) == (0, 1, 2, 7)


def test_a_drain_answers_the_echo_of_its_flow() -> None:
    h = Harness().opened().session()
    link = h.sending_link(0, credit=0)
    h.out()
    events = h.conn.receive_events(frames.frame(0, frames.flow(handle=0, link_credit=3, drain=True, echo=True)), h.now)
    next(events)
    h.conn.complete_drain(link)
    assert list(events) == []
    flow = h.one(Flow)  # one flow, not two
    assert (flow.delivery_count, flow.link_credit, flow.drain) == (3, 0, True)


def test_session_flow_without_handle() -> None:
    h = Harness().opened().session()
    events = h.send(frames.flow(incoming_window=10))
    assert [type(e) for e in events] == [SessionFlow]
    assert h.conn.sessions[0].remote_incoming_window == 10


def test_drain_is_completed_with_a_flow_that_uses_up_the_credit() -> None:
    h = Harness().opened().session()
    link = h.sending_link(0, credit=0)
    h.send(frames.flow(handle=0, delivery_count=0, link_credit=5, drain=True))
    assert link.drain
    h.conn.deliver(link, b"one", settled=True)
    h.out()
    h.conn.complete_drain(link)
    flow = h.one(Flow)
    # §2.6.7: the sender advances delivery-count by the credit left, and reports drain
    assert (flow.delivery_count, flow.link_credit, flow.drain) == (5, 0, True)
    assert (link.credit, link.drain) == (0, False)
    h.conn.complete_drain(link)  # a second call is a no-op
    assert h.out() == []


# -- transfers in (§2.6.12-14) -----------------------------------------------------------------------
def test_single_frame_transfer() -> None:
    h = Harness().opened().session()
    link = h.receiving_link(0)
    body = frames.message("hello")
    (event,) = h.send(frames.transfer(0, 0, tag=b"t0"), payload=body)
    assert isinstance(event, TransferReceived)
    assert (event.link, event.payload, event.delivery.tag, event.delivery.settled) == (link, body, b"t0", False)
    assert h.conn.sessions[0].incoming_unsettled == {0: event.delivery}
    assert link.credit == 9


def test_settled_transfer_is_not_kept_unsettled() -> None:
    h = Harness().opened().session()
    h.receiving_link(0)
    (event,) = h.send(frames.transfer(0, 0, settled=True), payload=b"x")
    assert event.delivery.settled
    assert h.conn.sessions[0].incoming_unsettled == {}


def test_multi_frame_transfer_is_reassembled() -> None:
    h = Harness().opened().session()
    h.receiving_link(0)
    whole = frames.message("x" * 3000)
    parts = [whole[:1000], whole[1000:2000], whole[2000:]]
    assert h.send(frames.transfer(0, 0, more=True), payload=parts[0]) == []
    assert h.send(frames.transfer(0, None, more=True), payload=parts[1]) == []
    (event,) = h.send(frames.transfer(0, None), payload=parts[2])
    assert isinstance(event, TransferReceived)
    assert event.payload == whole
    assert event.delivery.delivery_id == 0


def test_aborted_multi_frame_transfer_is_dropped() -> None:
    h = Harness().opened().session()
    link = h.receiving_link(0)
    h.send(frames.transfer(0, 0, more=True), payload=b"part")
    # reported, so the broker can make good the credit it used (and a transaction knows it was no post)
    assert h.send(frames.transfer(0, None, aborted=True)) == [TransferDiscarded(link, [], aborted=True)]
    (event,) = h.send(frames.transfer(0, 1), payload=b"next")
    assert event.payload == b"next"
    assert link.credit == 8  # the aborted delivery used its credit


def test_transfer_in_the_same_bytes_as_open_and_begin() -> None:
    h = Harness()
    events = h.feed(
        AMQP_HEADER,
        frames.frame(0, frames.open_()),
        frames.frame(0, frames.begin()),
        frames.frame(0, frames.attach_sender("q", 0)),
    )
    assert [type(e) for e in events] == [ConnectionOpened, SessionBegun, LinkAttached]


# -- transfers out: splitting at the peer's max-frame-size (§2.7.5, §2.6.14) ------------------------------
@pytest.mark.parametrize("size", [0, 1, 400, 511, 512, 5000, 70_000])
def test_deliver_splits_at_the_peer_max_frame_size(size: int) -> None:
    h = Harness().opened(max_frame_size=UInt(512))
    h.session()
    link = h.sending_link(0)
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    h.conn.deliver(link, payload, settled=False)
    raw = h.conn.data_to_send()
    out = parse_frames(raw)
    sizes = []
    pos = 0
    for _ in out:
        sizes.append(int.from_bytes(raw[pos : pos + 4], "big"))
        pos += sizes[-1]
    assert max(sizes) <= 512
    transfers = [f.performative for f in out]
    assert all(isinstance(t, Transfer) for t in transfers)
    assert [bool(t.more) for t in transfers] == [True] * (len(out) - 1) + [False]
    assert transfers[0].delivery_id == 0
    assert transfers[0].delivery_tag is not None
    assert all(t.delivery_id is None for t in transfers[1:])
    assert b"".join(f.payload for f in out) == payload


def test_deliver_waits_for_the_peer_incoming_window() -> None:
    h = Harness().opened().session()
    link = h.sending_link(0)
    h.send(frames.flow(next_incoming_id=0, incoming_window=1))
    h.conn.deliver(link, b"one", settled=True)
    h.conn.deliver(link, b"two", settled=True)
    assert [f.payload for f in h.out()] == [b"one"]
    h.send(frames.flow(next_incoming_id=1, incoming_window=5))
    assert [f.payload for f in h.out()] == [b"two"]


# -- dispositions (§2.7.6) ---------------------------------------------------------------------------
def _three_unsettled(h: Harness) -> tuple[Link, list[OutgoingDelivery]]:
    link = h.sending_link(0)
    deliveries = [h.conn.deliver(link, b"m%d" % i, settled=False) for i in range(3)]
    h.out()
    return link, deliveries


def test_one_disposition_settles_a_range_of_deliveries() -> None:
    h = Harness().opened().session()
    _, deliveries = _three_unsettled(h)
    events = h.send(frames.disposition(0, 2, state=Accepted()))
    assert events == [DeliveryUpdated(deliveries, Accepted(), True)]
    assert all(d.remote_settled for d in deliveries)
    assert h.conn.sessions[0].outgoing_unsettled == {}


def test_unsettled_disposition_keeps_the_deliveries() -> None:
    h = Harness().opened().session()
    _, deliveries = _three_unsettled(h)
    (event,) = h.send(frames.disposition(1, settled=False, state=Accepted()))
    assert event.deliveries == [deliveries[1]]
    assert not event.settled
    assert len(h.conn.sessions[0].outgoing_unsettled) == 3


def test_disposition_for_unknown_deliveries_is_ignored() -> None:
    h = Harness().opened().session()
    _three_unsettled(h)
    assert h.send(frames.disposition(7, 9, state=Accepted())) == []
    assert h.out() == []


def test_settle_sends_one_disposition_per_consecutive_run() -> None:
    h = Harness().opened().session()
    _, deliveries = _three_unsettled(h)
    h.conn.settle([deliveries[0], deliveries[1]], Accepted())
    assert h.one(Disposition) == Disposition(role=False, first=UInt(0), last=UInt(1), settled=True, state=Accepted())
    link = deliveries[0].link
    more = [h.conn.deliver(link, b"x", settled=False) for _ in range(2)]  # ids 3 and 4
    h.out()
    h.conn.settle([deliveries[2], more[1]], Rejected())
    dispositions = [f.performative for f in h.out()]
    assert [(d.first, d.last) for d in dispositions] == [(2, None), (4, None)]
    assert all(d.state == Rejected() for d in dispositions)


# -- commands used wrongly, aborts, held-back frames (issue 11: the broker asks, the engine decides) --------
def test_misused_commands_raise_a_local_error() -> None:
    h = Harness().opened().session()
    _, deliveries = _three_unsettled(h)
    h.conn.settle([deliveries[0]], Accepted())
    with pytest.raises(LocalProtocolError, match="we settled it"):
        h.conn.settle([deliveries[0]], Accepted())
    h.send(frames.disposition(1, state=Accepted()))  # the peer settles the second
    with pytest.raises(LocalProtocolError, match="the peer settled it"):
        h.conn.settle([deliveries[1]], Released())
    with pytest.raises(LocalProtocolError, match="completely sent"):
        h.conn.abort(deliveries[2])
    link = deliveries[2].link
    with pytest.raises(LocalProtocolError, match="only an attach not yet answered"):
        h.conn.accept_attach(link)
    empty = h.sending_link(1, credit=0)
    with pytest.raises(LocalProtocolError, match="cannot deliver"):
        h.conn.deliver(empty, b"no credit", settled=True)
    assert h.out() == []  # nothing was written by the refused commands


def _held_back(h: Harness, window: int, size: int = 2000) -> tuple[Link, OutgoingDelivery]:
    """A delivery split in frames of which only ``window`` go out: the peer's incoming window holds the rest."""
    h.opened(max_frame_size=512).session()
    link = h.sending_link(0)
    h.send(frames.flow(next_incoming_id=0, incoming_window=window))
    delivery = h.conn.deliver(link, bytes(size), settled=False)
    return link, delivery


def test_aborting_a_delivery_not_completely_sent() -> None:
    h = Harness()
    _link, delivery = _held_back(h, window=2)
    sent = h.out()
    assert len(sent) == 2
    assert all(f.performative.more for f in sent)
    assert not delivery.complete
    h.conn.abort(delivery)
    assert h.out() == []  # the aborted transfer waits for the window like the frames it replaces
    h.send(frames.flow(next_incoming_id=2, incoming_window=100))
    (aborted,) = h.out()  # one transfer instead of the held-back frames, and no disposition for it (§2.6.14)
    assert aborted.performative == Transfer(handle=UInt(0), more=False, aborted=True)
    assert (delivery.settled, delivery.complete) == (True, True)
    assert h.conn.sessions[0].outgoing_unsettled == {}


def test_aborting_a_delivery_before_its_first_frame_names_it() -> None:
    h = Harness()
    link, _first = _held_back(h, window=1, size=100)  # one frame: the window lets it out
    second = h.conn.deliver(link, bytes(2000), settled=False)  # none of its frames fit
    assert [f.performative.delivery_id for f in h.out()] == [0]
    h.conn.abort(second)
    h.send(frames.flow(next_incoming_id=1, incoming_window=100))
    (aborted,) = h.out()
    assert aborted.performative == Transfer(
        handle=UInt(0), delivery_id=UInt(1), delivery_tag=second.tag, more=False, aborted=True
    )


def test_settling_a_delivery_not_completely_sent_lets_it_finish() -> None:
    """The broker settles (accepted, say) a delivery whose last frames the window holds back: they still go."""
    h = Harness()
    _link, delivery = _held_back(h, window=2)
    assert len(h.out()) == 2
    h.conn.settle([delivery], Accepted())
    assert [type(f.performative) for f in h.out()] == [Disposition]
    h.send(frames.flow(next_incoming_id=2, incoming_window=100))
    rest = h.out()
    assert rest[-1].performative.more is not True
    assert not any(f.performative.aborted for f in rest)


def test_frames_held_back_for_a_detached_link_are_never_sent() -> None:
    h = Harness()
    _link, delivery = _held_back(h, window=1)
    h.out()
    h.send(Detach(handle=UInt(0), closed=True))
    assert [type(f.performative) for f in h.out()] == [Detach]
    assert (delivery.settled, delivery.complete) == (True, True)  # nothing more can be settled or sent
    h.send(frames.flow(next_incoming_id=1, incoming_window=100))
    assert h.out() == []


def _three_transfers(read_ahead: bool) -> tuple[Harness, Link, Iterator[Event]]:
    """A producer link with credit, and the events of three transfers on it arriving in one read."""
    h = Harness().opened().session()
    (attached,) = h.send(frames.attach_sender("q", 0))
    link = attached.link
    h.conn.accept_attach(link, source=link.source, target=link.target, read_ahead=read_ahead)
    h.conn.grant_credit(link, 10)
    h.out()
    data = b"".join(frames.frame(0, frames.transfer(0, i), b"m%d" % i) for i in range(3))
    return h, link, h.conn.receive_events(data, 0.0)


@pytest.mark.parametrize("read_ahead", [False, True])
def test_events_come_frame_by_frame_unless_the_link_reads_ahead(read_ahead: bool) -> None:
    """The next frame is parsed only once the event before has been taken, so a command given in between is in
    force for it; transfers on a link accepted with ``read_ahead`` are parsed in one go (while it has credit),
    the events still in order."""
    _, link, events = _three_transfers(read_ahead)
    first = next(events)
    assert isinstance(first, TransferReceived)
    assert link.credit == (7 if read_ahead else 9)
    assert [type(e) for e in events] == [TransferReceived, TransferReceived]


def test_nothing_read_ahead_is_handed_over_after_our_close() -> None:
    h, _, events = _three_transfers(read_ahead=True)
    assert isinstance(next(events), TransferReceived)
    h.conn.close(error(Condition.INTERNAL_ERROR, "enough"))  # while handling the first of three read ahead
    assert not any(isinstance(e, TransferReceived) for e in events)


def test_an_error_too_long_for_the_peer_frame_size_is_cut_not_fatal() -> None:
    h = Harness().opened(max_frame_size=512).session()
    link = h.receiving_link(0)
    h.conn.detach(link, error(Condition.NOT_FOUND, "x" * 2000))
    (frame,) = h.out()
    assert isinstance(frame.performative, Detach)
    description = frame.performative.error.description
    assert description.endswith("...")
    assert 0 < len(description) < 512
    assert h.conn.phase is Phase.OPENED


def test_a_command_between_frames_is_in_force_for_the_next() -> None:
    """A transfer in the same read after a detach we give while handling the frame before is dropped (§2.6.2)."""
    h = Harness().opened().session()
    link = h.receiving_link(0)
    data = b"".join(frames.frame(0, frames.transfer(0, i), b"m%d" % i) for i in range(2))
    events = h.conn.receive_events(data, 0.0)
    assert isinstance(next(events), TransferReceived)
    h.conn.detach(link, error(Condition.NOT_ALLOWED, "enough"))
    assert [type(e) for e in events] == [LinkDetached]  # the second transfer was read after the detach


def test_throttling_is_reported_once() -> None:
    h = Harness().opened().session()
    link = h.sending_link(0, credit=100)
    h.send(frames.flow(next_incoming_id=0, incoming_window=0))
    sent = 0
    while h.conn.can_send(link):  # until the engine holds back too much for a peer that opens no window
        h.conn.deliver(link, b"x", settled=True)
        sent += 1
    assert 0 < sent < 100
    assert h.conn.take_throttled() is True
    assert h.conn.take_throttled() is False


def test_dispose_incoming_ranges_and_peer_settlement() -> None:
    h = Harness().opened().session()
    link = h.receiving_link(0, rcv_settle_mode=1)
    received = [h.send(frames.transfer(0, i), payload=b"m")[0].delivery for i in range(3)]
    h.conn.dispose_incoming(received, Accepted(), settled=False)
    disposition = h.one(Disposition)
    assert (disposition.role, disposition.first, disposition.last, disposition.settled) == (True, 0, 2, False)
    assert len(h.conn.sessions[0].incoming_unsettled) == 3
    # rcv-settle-mode second: the sender settles, then the receiver may forget (§2.8.3)
    (event,) = h.send(frames.disposition(0, 2, role=frames.SENDER, state=Accepted()))
    assert event == IncomingSettled(received, Accepted())
    assert link.rcv_settle_mode == 1


# -- close (§2.4.3) ----------------------------------------------------------------------------------
def test_peer_close_with_error() -> None:
    h = Harness().opened().session()
    events = h.send(Close(error=error(Condition.INTERNAL_ERROR, "client crashed")))
    assert h.one(Close) == Close()
    event = closed_event(events)
    assert event.by_peer
    assert condition(event) == Condition.INTERNAL_ERROR
    assert h.conn.finished
    assert [type(e) for e in events] == [SessionEnded, ConnectionClosed]


def test_our_close_waits_for_the_peer_close() -> None:
    h = Harness().opened()
    h.conn.close(error(Condition.CONNECTION_FORCED, "shutting down"))
    assert condition(h.one(Close)) == Condition.CONNECTION_FORCED
    assert h.conn.phase is Phase.CLOSE_SENT
    assert closed_event(h.conn.take_events()).by_peer is False
    assert h.send(frames.begin()) == []  # §2.4.3: only close matters now
    assert h.out() == []
    assert h.send(Close()) == []  # the ConnectionClosed event was already given
    assert h.conn.finished
    assert h.out() == []


def test_our_close_gives_up_on_a_silent_peer() -> None:
    h = Harness().opened()
    h.conn.close()
    h.out()
    deadline = h.conn.next_deadline()
    assert deadline is not None
    h.conn.handle_timeout(deadline)
    assert h.conn.finished


def test_end_of_stream_finishes_the_connection() -> None:
    h = Harness().opened().session()
    session = h.conn.sessions[0]
    link = h.receiving_link(0)
    events = h.feed(b"")
    assert events == [LinkDetached(link, False, None), SessionEnded(session), ConnectionClosed(None, by_peer=True)]
    assert h.conn.finished
    assert h.out() == []


# -- malformed input: connection errors (§2.3, §2.8.15-16) --------------------------------------------
MALFORMED = [
    pytest.param(frames.raw_frame(size=4), Condition.FRAMING_ERROR, id="size-below-8"),
    pytest.param(frames.raw_frame(size=7, body=b"\x00"), Condition.FRAMING_ERROR, id="size-7"),
    pytest.param(frames.raw_frame(size=65537), Condition.FRAMING_ERROR, id="size-above-max-frame-size"),
    pytest.param(frames.raw_frame(size=0xFFFFFFFF), Condition.FRAMING_ERROR, id="size-4GiB"),
    pytest.param(frames.raw_frame(doff=1, body=bytes(8)), Condition.FRAMING_ERROR, id="doff-1"),
    pytest.param(frames.raw_frame(doff=0), Condition.FRAMING_ERROR, id="doff-0"),
    pytest.param(frames.raw_frame(doff=4, body=b"\x00"), Condition.FRAMING_ERROR, id="doff-past-frame-end"),
    pytest.param(frames.undecodable_frame(), Condition.DECODE_ERROR, id="body-does-not-decode"),
    pytest.param(frames.raw_frame(body=b"\x00\x53\x12\xc0\x01"), Condition.DECODE_ERROR, id="truncated-list"),
    pytest.param(frames.frame(0, Attach(handle=UInt(0), role=False)), Condition.DECODE_ERROR, id="attach-no-name"),
    pytest.param(frames.frame(0, frames.begin(), frame_type=SASL_FRAME), Condition.FRAMING_ERROR, id="sasl-frame"),
    pytest.param(frames.frame(0, frames.begin(), frame_type=7), Condition.FRAMING_ERROR, id="unknown-frame-type"),
    pytest.param(frames.frame(3, frames.flow()), Condition.NOT_ALLOWED, id="flow-on-channel-without-session"),
    pytest.param(frames.frame(1, frames.transfer(0, 0)), Condition.NOT_ALLOWED, id="transfer-without-session"),
    pytest.param(frames.frame(1, End()), Condition.NOT_ALLOWED, id="end-without-session"),
    pytest.param(frames.frame(0, frames.open_()), Condition.NOT_ALLOWED, id="second-open"),
    pytest.param(frames.frame(0, frames.begin()), Condition.NOT_ALLOWED, id="begin-on-a-busy-channel"),
    pytest.param(frames.frame(9, frames.begin(remote_channel=UShort(0))), Condition.NOT_ALLOWED, id="begin-remote"),
    pytest.param(frames.frame(300, frames.begin()), Condition.NOT_ALLOWED, id="begin-above-channel-max"),
]


@pytest.mark.parametrize(("data", "expected"), MALFORMED)
def test_malformed_input_closes_the_connection(data: bytes, expected: Condition) -> None:
    h = Harness().opened().session()
    events = h.feed(data)
    close = h.one(Close, channel=0)
    assert condition(close) == expected
    assert condition(closed_event(events)) == expected
    assert [type(e) for e in events] == [SessionEnded, ConnectionClosed]
    if expected == Condition.FRAMING_ERROR:
        # the byte stream is out of step, so no close from the peer could be read: finished at once
        assert h.conn.finished
    else:
        assert h.conn.phase is Phase.CLOSE_SENT
        assert h.send(frames.begin(), channel=5) == []  # §2.4.3: after our close, only close matters
    # the peer's close completes the handshake; nothing more is written
    assert h.send(Close()) == []
    assert h.conn.finished
    assert h.out() == []


def test_oversized_frame_is_refused_from_its_header_alone() -> None:
    h = Harness(max_frame_size=1024).opened()
    h.feed(frames.raw_frame(size=1025)[:8])  # the body never needs to arrive
    assert condition(h.one(Close)) == Condition.FRAMING_ERROR


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(frames.frame(0, frames.begin()), id="begin-before-open"),
        pytest.param(frames.raw_frame(size=3), id="framing-error-before-open"),
    ],
)
def test_error_before_open_sends_open_then_close(data: bytes) -> None:
    # §2.4.1: a close must follow an open, so the engine sends its open first
    h = Harness()
    h.feed(AMQP_HEADER, data)
    _, out = h.out_after_header()
    assert [type(f.performative) for f in out] == [Open, Close]
    assert condition(out[1].performative) is not None


def test_open_on_a_nonzero_channel() -> None:
    h = Harness()
    h.feed(AMQP_HEADER, frames.frame(1, frames.open_()))
    _, out = h.out_after_header()
    assert condition(out[-1].performative) == Condition.NOT_ALLOWED


def test_heartbeats_on_any_channel_are_ignored() -> None:
    h = Harness().opened()
    assert h.feed(frames.heartbeat(), frames.heartbeat(7)) == []
    assert h.out() == []


# -- malformed input: session and link errors (§2.8.17-18) --------------------------------------------
def test_transfer_on_unattached_handle_ends_the_session() -> None:
    h = Harness().opened().session()
    events = h.send(frames.transfer(4, 0), payload=b"x")
    end = h.one(End, channel=0)
    assert condition(end) == Condition.UNATTACHED_HANDLE
    assert [type(e) for e in events] == [SessionEnded]
    assert h.conn.phase is Phase.OPENED  # the connection lives on


@pytest.mark.parametrize(
    ("performative", "expected"),
    [
        pytest.param(Detach(handle=UInt(4)), Condition.UNATTACHED_HANDLE, id="detach-unattached-handle"),
        pytest.param(frames.flow(handle=4, link_credit=1), Condition.UNATTACHED_HANDLE, id="flow-unattached-handle"),
        pytest.param(frames.attach_sender("q", 0), Condition.HANDLE_IN_USE, id="attach-handle-in-use"),
    ],
)
def test_session_errors(performative: Any, expected: Condition) -> None:
    h = Harness().opened().session()
    h.receiving_link(0)
    h.send(performative)
    assert condition(h.one(End)) == expected


def test_peer_end_after_our_session_error_is_not_a_connection_error() -> None:
    h = Harness().opened().session()
    h.send(frames.transfer(4, 0), payload=b"x")
    h.out()
    # frames the peer sent before it saw our end are dropped, and its end closes the handshake (§2.5.2)
    assert h.send(frames.flow(handle=4)) == []
    assert h.send(End()) == []
    assert h.out() == []
    assert h.conn.phase is Phase.OPENED
    h.session()  # the channel is free again


def test_transfer_without_credit_detaches_the_link() -> None:
    h = Harness().opened().session()
    link = h.receiving_link(0, credit=0)
    events = h.send(frames.transfer(0, 0), payload=b"x")
    detach = h.one(Detach)
    assert (detach.handle, detach.closed) == (0, True)
    assert condition(detach) == Condition.TRANSFER_LIMIT_EXCEEDED
    assert [type(e) for e in events] == [LinkDetached]
    assert events[0].link is link
    # transfers in flight are dropped; the peer's detach completes the handshake (§2.6.2)
    assert h.send(frames.transfer(0, 1), payload=b"y") == []
    assert h.send(Detach(handle=UInt(0), closed=True)) == []
    assert h.out() == []
    assert 0 in h.conn.sessions


def test_message_above_max_message_size_detaches_the_link() -> None:
    h = Harness(max_message_size=100).opened().session()
    h.receiving_link(0)
    h.send(frames.transfer(0, 0, more=True), payload=bytes(60))
    h.send(frames.transfer(0, None), payload=bytes(60))
    assert condition(h.one(Detach)) == Condition.MESSAGE_SIZE_EXCEEDED


def test_endless_empty_continuation_frames_meet_the_frame_bound_of_max_message_size() -> None:
    # issue 12: empty frames with more=true were free, so a 1 kB limit let 4M frames grow the broker's memory; a
    # message may take at most max(1024, max_message_size // 256) frames
    h = Harness(max_message_size=1000).opened().session()
    h.receiving_link(0)
    h.send(frames.transfer(0, 0, more=True), payload=b"x")
    sent, detaches = 1, []
    while not detaches and sent < 2000:
        h.send(frames.transfer(0, None, more=True))
        sent += 1
        detaches = [f.performative for f in h.out() if isinstance(f.performative, Detach)]  # (session flows too)
    assert condition(detaches[0]) == Condition.MESSAGE_SIZE_EXCEEDED
    assert "more than 1024 frames" in str(detaches[0].error.description)
    assert sent == 1025  # the frame past the bound, not a byte past the limit


def test_the_frame_bound_grows_with_max_message_size() -> None:
    h = Harness(max_message_size=1 << 20).opened().session()  # 4096 frames: one per 256 bytes
    h.receiving_link(0)
    events = h.send(frames.transfer(0, 0, more=True), payload=b"x")
    for _ in range(4094):
        events += h.send(frames.transfer(0, None, more=True))
    events += h.send(frames.transfer(0, None), payload=b"y")  # the 4096th frame: taken
    assert [type(e) for e in events] == [TransferReceived]
    assert events[0].payload == b"xy"
    assert [f.performative for f in h.out() if not isinstance(f.performative, Flow)] == []


@pytest.mark.parametrize("frame_payload", [1, 100, 256, 300, 999])
def test_a_message_of_exactly_max_message_size_in_frames_of_any_size_is_taken(frame_payload: int) -> None:
    # §2.7.3: only a message larger than max-message-size is refused; bytes are counted exactly, whatever the frames
    h = Harness(max_message_size=1000).opened().session()
    h.receiving_link(0)
    message = bytes(range(250)) * 4
    chunks = [message[i : i + frame_payload] for i in range(0, len(message), frame_payload)]
    events = []
    for i, chunk in enumerate(chunks):
        more = i < len(chunks) - 1
        events += h.send(frames.transfer(0, 0 if i == 0 else None, more=more), payload=chunk)
    assert [type(e) for e in events] == [TransferReceived]
    assert events[0].payload == message
    assert h.out() == []


def test_one_byte_past_max_message_size_in_small_frames_detaches_the_link() -> None:
    h = Harness(max_message_size=1000).opened().session()
    h.receiving_link(0)
    for i in range(10):
        h.send(frames.transfer(0, 0 if i == 0 else None, more=True), payload=bytes(100))
    assert h.out() == []  # exactly 1000 bytes so far
    h.send(frames.transfer(0, None), payload=b"x")
    detach = h.one(Detach)
    assert condition(detach) == Condition.MESSAGE_SIZE_EXCEEDED
    assert "more than 1000 bytes" in str(detach.error.description)


def test_empty_continuation_frames_cost_no_memory_even_without_a_size_limit() -> None:
    h = Harness().opened().session()  # no max-message-size: neither bytes nor frames are limited
    h.receiving_link(0)
    h.send(frames.transfer(0, 0, more=True), payload=b"abc")
    empties = frames.frame(0, frames.transfer(0, None, more=True)) * 1000
    tracemalloc.start()
    try:
        h.feed(empties)
        h.out()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(10):
            h.feed(empties)
            h.out()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 16 * 1024, f"10,000 empty frames held {grown} bytes"  # a reference each would be 80 kB
    (event,) = h.send(frames.transfer(0, None), payload=b"def")
    assert event.payload == b"abcdef"


def test_tiny_continuation_frames_cost_their_bytes_only_without_a_size_limit() -> None:
    # no frame bound without max-message-size: one-byte frames must not cost an object each (~40 bytes a byte)
    h = Harness().opened().session()
    h.receiving_link(0)
    h.send(frames.transfer(0, 0, more=True), payload=b"a")
    tiny = frames.frame(0, frames.transfer(0, None, more=True), b"b") * 1000
    tracemalloc.start()
    try:
        h.feed(tiny)
        h.out()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(10):
            h.feed(tiny)
            h.out()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 10_000 + 16 * 1024, f"10,000 one-byte frames held {grown} bytes"
    (event,) = h.send(frames.transfer(0, None), payload=b"c")
    assert event.payload == b"a" + b"b" * 11_000 + b"c"


# -- proton's sans-IO engine as a second, real peer -------------------------------------------------------
class ProtonPeer:
    """A python-qpid-proton ``Connection``/``Transport`` pumped in memory against a ServerConnection.

    A tiny stand-in for the broker core answers the engine's events: attaches are accepted, producer
    links get credit, and every incoming message is accepted.
    """

    def __init__(self, server: ServerConnection, *, sasl: str | None = None) -> None:
        self.server = server
        self.transport = proton.Transport()
        self.connection = proton.Connection()
        self.connection.container = "proton-peer"
        if sasl is not None:
            self.connection.user = "alice"
            self.connection.password = "secret"
            mechanisms = self.transport.sasl()
            mechanisms.allowed_mechs(sasl)
            mechanisms.allow_insecure_mechs = True
        self.transport.bind(self.connection)
        self.events: list[Event] = []
        self.received: list[bytes] = []
        self._to_proton = b""

    def pump(self) -> None:
        """Move bytes both ways until neither engine has anything more to say."""
        for _ in range(1000):
            moved = False
            pending = self.transport.pending()
            if pending > 0:
                data = self.transport.peek(pending)
                self.transport.pop(pending)
                self._answer(self.server.receive_data(data, 0.0))
                moved = True
            self._to_proton += self.server.data_to_send()
            room = self.transport.capacity()
            if self._to_proton and room > 0:
                self.transport.push(self._to_proton[:room])
                self._to_proton = self._to_proton[room:]
                moved = True
            if not moved:
                return
        raise AssertionError("the two engines never went quiet")

    def _answer(self, events: list[Event]) -> None:
        self.events += events
        for event in events:
            if isinstance(event, LinkAttached):
                link = event.link
                self.server.accept_attach(link, source=link.source, target=link.target)
                if not link.is_sender:
                    self.server.grant_credit(link, 10)
            elif isinstance(event, TransferReceived):
                self.received.append(event.payload)
                self.server.dispose_incoming([event.delivery], Accepted())


def _proton_open_sender(peer: ProtonPeer) -> proton.Sender:
    peer.connection.open()
    session = peer.connection.session()
    session.open()
    sender = session.sender("proton-sender")
    sender.target.address = "q"
    sender.open()
    peer.pump()
    return sender


@pytest.mark.parametrize("sasl", [None, "ANONYMOUS", "PLAIN"])
def test_proton_sends_a_message_and_sees_our_disposition(sasl: str | None) -> None:
    server = ServerConnection()
    peer = ProtonPeer(server, sasl=sasl)
    sender = _proton_open_sender(peer)
    active = proton.Endpoint.LOCAL_ACTIVE | proton.Endpoint.REMOTE_ACTIVE
    assert peer.connection.state == active
    assert sender.state == active
    assert sender.credit == 10
    assert peer.connection.remote_container == "minibroker"
    if sasl == "PLAIN":
        assert server.user == "alice"

    body = proton.Message(body="hello from proton").encode()
    delivery = sender.delivery(b"tag-1")
    sender.send(body)
    sender.advance()
    peer.pump()
    assert peer.received == [body]
    assert delivery.remote_state == proton.Delivery.ACCEPTED
    assert delivery.settled
    assert sender.credit == 9


def test_proton_receives_a_large_message_split_to_its_frame_size() -> None:
    server = ServerConnection()
    peer = ProtonPeer(server)
    peer.transport.max_frame_size = 1024
    peer.connection.open()
    session = peer.connection.session()
    session.open()
    receiver = session.receiver("proton-receiver")
    receiver.source.address = "q"
    receiver.open()
    peer.pump()
    receiver.flow(1)
    peer.pump()
    (link,) = server.sessions[0].links.values()
    assert link.credit == 1
    body = proton.Message(body="x" * 10_000).encode()
    server.deliver(link, body, settled=False)
    peer.pump()
    delivery = receiver.current
    assert delivery is not None
    assert not delivery.partial
    assert receiver.recv(delivery.pending) == body
    assert server.remote_max_frame_size == 1024
    delivery.update(proton.Delivery.ACCEPTED)
    delivery.settle()
    peer.pump()
    updates = [e for e in peer.events if isinstance(e, DeliveryUpdated)]
    assert len(updates) == 1
    assert updates[0].settled
    assert isinstance(updates[0].state, Accepted)


def test_proton_close_with_error_reaches_the_engine() -> None:
    server = ServerConnection()
    peer = ProtonPeer(server)
    _proton_open_sender(peer)
    peer.connection.condition = proton.Condition("amqp:internal-error", "done here")
    peer.connection.close()
    peer.pump()
    event = closed_event(peer.events)
    assert event.by_peer
    assert condition(event) == "amqp:internal-error"
    assert server.finished
    assert peer.connection.state & proton.Endpoint.REMOTE_CLOSED


# -- the frame kit itself --------------------------------------------------------------------------------
def test_frame_factory_round_trip() -> None:
    data = (
        frames.frame(3, frames.transfer(1, 7, more=True), b"payload")
        + frames.heartbeat(2)
        + frames.sasl_frame(frames.sasl_anonymous())
    )
    transfer, beat, sasl = parse_frames(data)
    assert (transfer.channel, transfer.performative, transfer.payload) == (
        3,
        frames.transfer(1, 7, more=True),
        b"payload",
    )
    assert (beat.channel, beat.is_heartbeat) == (2, True)
    assert (sasl.frame_type, sasl.performative) == (SASL_FRAME, frames.sasl_anonymous())


def test_raw_frame_header_fields() -> None:
    assert frames.raw_frame() == frames.heartbeat()
    assert frames.raw_frame(size=9, doff=3, type=1, channel=258, body=b"ab") == b"\x00\x00\x00\x09\x03\x01\x01\x02ab"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(frames.heartbeat()[:5], "5 bytes left", id="partial-header"),
        pytest.param(frames.frame(0, Close())[:-1], "bytes left", id="partial-body"),
        pytest.param(frames.raw_frame(size=4), "malformed frame header", id="size-below-8"),
        pytest.param(frames.undecodable_frame(), "does not decode", id="undecodable"),
    ],
)
def test_parse_frames_refuses_what_is_not_whole_frames(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_frames(data)


def test_the_bytes_are_taken_when_given_and_parsed_as_the_events_are_taken() -> None:
    """``receive_events`` keeps the bytes at once (a read whose events are taken later, with the next read's, loses
    nothing); its frames are parsed only as the events are taken, in order."""
    h = Harness().opened().session()
    link = h.receiving_link(0)
    first = h.conn.receive_events(frames.frame(0, frames.transfer(0, 0), b"m0"), 0.0)
    assert link.credit == 10  # nothing parsed yet
    second = h.conn.receive_events(frames.frame(0, frames.transfer(0, 1), b"m1"), 0.0)
    assert [e.payload for e in first if isinstance(e, TransferReceived)] == [b"m0", b"m1"]
    assert list(second) == []
