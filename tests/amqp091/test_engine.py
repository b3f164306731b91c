"""``Connection091``, the server end of a 0-9-1 connection: every step driven with raw frames, every answer
checked frame by frame (codes, class and method ids), against the spec's rules and RabbitMQ's
``rabbit_reader`` / ``rabbit_channel`` behaviour."""

from __future__ import annotations

import struct

import pytest

from minibroker.amqp091 import definitions as d
from minibroker.amqp091.base import Method
from minibroker.amqp091.codec import encode_table
from minibroker.amqp091.engine import (
    DEFAULT_CAPABILITIES,
    Connection091,
    Phase,
    parse_credentials,
    refused_login_text,
)
from minibroker.amqp091.errors import LocalProtocolError
from minibroker.amqp091.events import (
    ChannelClosed,
    ChannelOpened,
    CommandReceived,
    ConnectionClosed,
    CredentialsReceived,
    FlowRequested,
    OpenRequested,
)
from minibroker.amqp091.frames import (
    AMQP_1_0_SASL_HEADER,
    HEARTBEAT_BYTES,
    PROTOCOL_HEADER,
    BodyFrame,
    HeaderFrame,
    HeartbeatFrame,
    MethodFrame,
    encode_content,
    encode_frame,
    encode_method_frame,
)
from tests.amqp091.peer import PLAIN_GUEST, Peer

R = d.ReplyCode
PUBLISH = d.BasicPublish(0, "", "q", False, False)
PROPS = d.BasicProperties(content_type="text/plain", delivery_mode=2)


def amqplain(table: dict[str, object]) -> bytes:
    return encode_table(table)[4:]  # AMQPLAIN: a table without its size prefix


# -- the protocol header and connection.start ----------------------------------------------------------------
def test_start_offers_version_mechanisms_locale_and_capabilities() -> None:
    start = Peer().start()
    assert (start.version_major, start.version_minor) == (0, 9)
    assert start.mechanisms == b"PLAIN AMQPLAIN"
    assert start.locales == b"en_US"
    assert start.server_properties["product"] == "minibroker"
    assert start.server_properties["capabilities"] == DEFAULT_CAPABILITIES
    assert start.server_properties["capabilities"]["authentication_failure_close"] is True


def test_server_properties_given_override_ours() -> None:
    peer = Peer(server_properties={"version": "1.2", "capabilities": {"direct_reply_to": True}}, mechanisms=("PLAIN",))
    start = peer.start()
    assert start.server_properties["version"] == "1.2"
    assert start.server_properties["capabilities"]["direct_reply_to"] is True
    assert start.server_properties["capabilities"]["publisher_confirms"] is True
    assert start.mechanisms == b"PLAIN"


def test_header_byte_by_byte_then_start() -> None:
    peer = Peer()
    for octet in PROTOCOL_HEADER:
        assert peer.send(bytes([octet])) == []
    (frame,) = peer.frames()
    assert isinstance(frame, MethodFrame)
    assert isinstance(frame.method, d.ConnectionStart)


def test_header_and_start_ok_in_one_read() -> None:
    peer = Peer()
    start_ok = encode_method_frame(0, d.ConnectionStartOk({}, "PLAIN", PLAIN_GUEST, "en_US"))
    assert peer.send(PROTOCOL_HEADER + start_ok) == [CredentialsReceived("PLAIN", "guest")]


@pytest.mark.parametrize(
    ("header", "reply"),
    [
        pytest.param(b"AMQP\x00\x00\x09\x00", PROTOCOL_HEADER, id="0-9-0"),
        pytest.param(b"AMQP\x00\x01\x00\x00", PROTOCOL_HEADER, id="amqp-1.0"),
        pytest.param(b"GET / HTTP/1.1\r\n", AMQP_1_0_SASL_HEADER, id="http"),
    ],
)
def test_wrong_protocol_header_is_answered_then_the_connection_ends(header: bytes, reply: bytes) -> None:
    peer = Peer()
    events = peer.send(header)
    assert peer.engine.data_to_send() == reply
    assert peer.engine.finished
    assert [type(e) for e in events] == [ConnectionClosed]
    assert peer.send(b"more") == []


# -- login ----------------------------------------------------------------------------------------------------
def test_plain_login_deferred_to_the_embedder() -> None:
    peer = Peer()
    events = peer.login()
    assert events == [CredentialsReceived("PLAIN", "guest")]
    assert peer.frames() == []  # nothing until the verdict
    assert peer.engine.take_credentials() == ("guest", "secret")
    with pytest.raises(LocalProtocolError):
        peer.engine.take_credentials()  # once only
    peer.engine.login_verdict(True)
    peer.expect((0, d.ConnectionTune(2047, 131072, 60)))


def test_amqplain_login() -> None:
    peer = Peer()
    events = peer.login("AMQPLAIN", amqplain({"LOGIN": "alice", "PASSWORD": b"pw"}))
    assert events == [CredentialsReceived("AMQPLAIN", "alice")]
    assert peer.engine.take_credentials() == ("alice", "pw")


@pytest.mark.parametrize(
    ("mechanism", "response"),
    [
        pytest.param("PLAIN", b"guest\0secret", id="plain-one-nul"),
        pytest.param("PLAIN", b"authz\0guest\0secret", id="plain-authzid"),
        pytest.param("PLAIN", b"\0guest\0sec\0ret", id="plain-extra-nul"),
        pytest.param("PLAIN", b"\0gu\xffest\0secret", id="plain-not-utf8"),
        pytest.param("PLAIN", b"", id="plain-empty"),
        pytest.param("AMQPLAIN", b"\x05LOGIN", id="amqplain-truncated"),
        pytest.param("AMQPLAIN", amqplain({"LOGIN": "alice"}), id="amqplain-no-password"),
        pytest.param("AMQPLAIN", amqplain({"LOGIN": 7, "PASSWORD": "pw"}), id="amqplain-login-not-string"),
        pytest.param("AMQPLAIN", amqplain({"LOGIN": "al\0ice", "PASSWORD": "pw"}), id="amqplain-nul"),
        pytest.param("AMQPLAIN", amqplain({"LOGIN": "al\udcffice", "PASSWORD": "pw"}), id="amqplain-not-utf8"),
        pytest.param("AMQPLAIN", amqplain({"LOGIN": "alice", "PASSWORD": b"\xff"}), id="amqplain-bytes-not-utf8"),
    ],
)
def test_malformed_response_is_refused_403(mechanism: str, response: bytes) -> None:
    peer = Peer()
    events = peer.login(mechanism, response)
    close = peer.closed_with(R.ACCESS_REFUSED)
    assert close.reply_text == refused_login_text(mechanism)
    assert events == [ConnectionClosed(R.ACCESS_REFUSED, close.reply_text, by_peer=False)]
    with pytest.raises(LocalProtocolError):
        peer.engine.take_credentials()


def test_unknown_mechanism_is_503_as_rabbitmq() -> None:
    peer = Peer(mechanisms=("PLAIN",))
    peer.login("AMQPLAIN", amqplain({"LOGIN": "a", "PASSWORD": "b"}))
    close = peer.closed_with(R.COMMAND_INVALID, 10, 11)
    assert close.reply_text == "COMMAND_INVALID - unknown authentication mechanism 'AMQPLAIN'"


def test_a_huge_mechanism_name_is_cut_in_the_reply_text() -> None:
    peer = Peer()
    peer.login("X" * 255)
    close = peer.closed_with(R.COMMAND_INVALID, 10, 11)
    assert len(close.reply_text.encode()) == 255


def test_refused_login_closes_403_and_waits_for_close_ok() -> None:
    peer = Peer()
    peer.login()
    peer.engine.take_credentials()
    peer.engine.login_verdict(False)
    close = peer.closed_with(R.ACCESS_REFUSED)
    assert close.reply_text == refused_login_text("PLAIN")
    assert peer.engine.take_events() == [ConnectionClosed(R.ACCESS_REFUSED, close.reply_text, by_peer=False)]
    assert not peer.engine.finished
    assert peer.method(0, d.ConnectionCloseOk()) == []
    assert peer.engine.finished


def test_verdict_after_the_connection_dropped_is_ignored() -> None:
    peer = Peer()
    peer.login()
    peer.send(b"")
    peer.engine.login_verdict(True)
    assert peer.frames() == []


def test_verdict_nobody_awaits_is_our_bug() -> None:
    peer = Peer()
    peer.start()
    with pytest.raises(LocalProtocolError):
        peer.engine.login_verdict(True)
    with pytest.raises(LocalProtocolError):
        peer.engine.open_ok()


# -- the handshake's order ------------------------------------------------------------------------------------
def _at_starting(peer: Peer) -> None:
    peer.start()


def _at_login(peer: Peer) -> None:
    peer.login()


def _at_tuning(peer: Peer) -> None:
    peer.login()
    peer.engine.login_verdict(True)
    peer.frames()


def _at_awaiting_open(peer: Peer) -> None:
    peer.tune()


def _at_opening(peer: Peer) -> None:
    peer.tune()
    peer.method(0, d.ConnectionOpen("/"))


@pytest.mark.parametrize(
    ("reach", "method"),
    [
        pytest.param(_at_starting, d.ConnectionTuneOk(0, 131072, 60), id="tune-ok-before-start-ok"),
        pytest.param(_at_starting, d.ConnectionOpen("/"), id="open-before-start-ok"),
        pytest.param(_at_starting, d.ConnectionSecureOk(b""), id="secure-ok-never-asked"),
        pytest.param(_at_login, d.ConnectionTuneOk(0, 131072, 60), id="tune-ok-before-tune"),
        pytest.param(_at_tuning, d.ConnectionStartOk({}, "PLAIN", PLAIN_GUEST, ""), id="start-ok-twice"),
        pytest.param(_at_tuning, d.ConnectionOpen("/"), id="open-before-tune-ok"),
        pytest.param(_at_awaiting_open, d.ConnectionTuneOk(0, 131072, 60), id="tune-ok-twice"),
        pytest.param(_at_awaiting_open, d.BasicQos(0, 1, False), id="basic-on-channel-0"),
        pytest.param(_at_opening, d.ConnectionOpen("/"), id="open-twice"),
        pytest.param(_at_opening, d.ConnectionCloseOk(), id="close-ok-unasked"),
    ],
)
def test_method_out_of_order_on_channel_0_is_503(reach: object, method: Method) -> None:
    peer = Peer()
    reach(peer)  # type: ignore[operator]
    peer.frames()
    events = peer.method(0, method)
    close = peer.closed_with(R.COMMAND_INVALID, method.CLASS_ID, method.METHOD_ID)
    assert events[-1] == ConnectionClosed(R.COMMAND_INVALID, close.reply_text, by_peer=False)


def test_method_on_channel_0_after_open_is_503() -> None:
    peer = Peer()
    peer.open()
    peer.method(0, d.ConnectionStartOk({}, "PLAIN", PLAIN_GUEST, ""))
    peer.closed_with(R.COMMAND_INVALID, 10, 11)


def test_channel_frame_during_the_handshake_is_505() -> None:
    peer = Peer()
    peer.tune()
    peer.method(1, d.ChannelOpen())
    peer.closed_with(R.UNEXPECTED_FRAME)


def test_full_handshake_events_and_frames() -> None:
    peer = Peer()
    peer.start()
    assert peer.method(0, d.ConnectionStartOk({"product": "t"}, "PLAIN", PLAIN_GUEST, "en_US")) == [
        CredentialsReceived("PLAIN", "guest")
    ]
    assert peer.engine.client_properties == {"product": "t"}
    peer.engine.take_credentials()
    peer.engine.login_verdict(True)
    peer.expect((0, d.ConnectionTune(2047, 131072, 60)))
    assert peer.method(0, d.ConnectionTuneOk(100, 8192, 30)) == []
    assert (peer.engine.channel_max, peer.engine.frame_max, peer.engine.heartbeat) == (100, 8192, 30)
    assert peer.method(0, d.ConnectionOpen("prod")) == [OpenRequested("prod")]
    assert peer.frames() == []
    peer.engine.open_ok()
    peer.expect((0, d.ConnectionOpenOk()))
    assert peer.engine.phase is Phase.OPEN


# -- tune-ok --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("channel_max", "frame_max", "text"),
    [
        pytest.param(2047, 0, "frame_max = 0 is higher than the maximum allowed value (131072)", id="fm-0"),
        pytest.param(2047, 4095, "frame_max = 4095 is lower than the minimum allowed value (4096)", id="fm-low"),
        pytest.param(
            2047, 131073, "frame_max = 131073 is higher than the maximum allowed value (131072)", id="fm-high"
        ),
        pytest.param(2048, 131072, "channel_max = 2048 is higher than the maximum allowed value (2047)", id="cm-high"),
    ],
)
def test_tune_ok_out_of_bounds_is_530(channel_max: int, frame_max: int, text: str) -> None:
    peer = Peer()
    peer.tune(channel_max=channel_max, frame_max=frame_max)
    close = peer.closed_with(R.NOT_ALLOWED, 10, 30)  # RabbitMQ names connection.tune
    assert close.reply_text == "NOT_ALLOWED - negotiated " + text


def test_tune_ok_channel_max_0_takes_ours() -> None:
    peer = Peer(channel_max=5)
    peer.open(channel_max=0)
    assert peer.engine.channel_max == 5


def test_frame_reader_follows_the_negotiated_frame_max_with_rabbitmqs_fudge() -> None:
    """rabbit_reader's FRAME_SIZE_FUDGE: a frame up to 8 octets over frame_max passes (clients get it wrong by
    the frame's own 8 octets); one more is 501."""
    peer = Peer()
    peer.open(channels=(1,), frame_max=4096)
    body = b"x" * 4096  # a body frame of 4104 octets: frame_max + 8
    events = peer.send(encode_content(1, PUBLISH, PROPS, body, 4096 + 8))
    assert events == [CommandReceived(1, PUBLISH, PROPS, body)]
    too_big = encode_frame(BodyFrame(1, b"x" * 4097))
    peer.send(encode_method_frame(1, PUBLISH) + encode_frame(HeaderFrame(1, 60, 4097, PROPS)) + too_big)
    close = peer.closed_with(R.FRAME_ERROR)
    assert close.reply_text == "FRAME_ERROR - a frame of 4105 octets exceeds frame-max 4104"


def test_start_ok_over_the_minimum_frame_size_before_tuning_is_501() -> None:
    peer = Peer()
    peer.start()
    peer.method(0, d.ConnectionStartOk({"pad": "x" * 5000}, "PLAIN", PLAIN_GUEST, ""))
    peer.closed_with(R.FRAME_ERROR)


# -- heartbeats and time-outs ---------------------------------------------------------------------------------
def test_heartbeat_sent_after_half_an_interval_of_our_silence() -> None:
    peer = Peer()
    peer.open(heartbeat=10)
    assert peer.engine.next_deadline() == 5.0
    assert peer.tick(4.9) == []
    assert peer.engine.data_to_send() == b""
    assert peer.tick(5.0) == []
    assert peer.engine.data_to_send() == HEARTBEAT_BYTES
    assert peer.engine.next_deadline() == 10.0


def test_peer_silent_for_two_intervals_is_dropped_without_a_close_frame() -> None:
    peer = Peer()
    peer.open(heartbeat=10)
    peer.now = 15.0
    peer.send(HEARTBEAT_BYTES)  # any bytes count as life
    peer.tick(34.9)
    assert not peer.engine.finished
    peer.frames()
    assert peer.engine.next_deadline() == 35.0
    events = peer.tick(35.0)
    assert events == [ConnectionClosed(R.CONNECTION_FORCED, "missed heartbeats from client, timeout: 10s", False)]
    assert peer.engine.finished
    assert peer.frames() == []
    assert peer.engine.next_deadline() is None


def test_heartbeat_0_times_nothing_once_open() -> None:
    peer = Peer()
    peer.open(heartbeat=0)
    assert peer.engine.next_deadline() is None
    assert peer.tick(10_000.0) == []
    assert not peer.engine.finished


def test_handshake_timeout_drops_the_socket() -> None:
    peer = Peer(handshake_timeout=3.0)
    peer.login()
    peer.frames()
    assert peer.engine.next_deadline() == 3.0
    assert peer.tick(2.9) == []
    events = peer.tick(3.0)
    assert events == [ConnectionClosed(R.CONNECTION_FORCED, "handshake timed out", by_peer=False)]
    assert peer.engine.finished
    assert peer.frames() == []
    with pytest.raises(LocalProtocolError):
        peer.engine.take_credentials()  # dropped with the connection


def test_handshake_timeout_stops_at_open_ok() -> None:
    peer = Peer(handshake_timeout=3.0, heartbeat=0)
    peer.open(heartbeat=0)
    assert peer.engine.next_deadline() is None


# -- connection.close -----------------------------------------------------------------------------------------
def test_peer_close_is_answered_with_close_ok_then_finished() -> None:
    peer = Peer()
    peer.open(channels=(1,))
    events = peer.method(0, d.ConnectionClose(200, "bye", 0, 0))
    assert events == [ConnectionClosed(200, "bye", by_peer=True)]
    peer.expect((0, d.ConnectionCloseOk()))
    assert peer.engine.finished


def test_peer_close_during_the_handshake() -> None:
    peer = Peer()
    peer.start()
    assert peer.method(0, d.ConnectionClose(200, "changed my mind", 0, 0)) == [
        ConnectionClosed(200, "changed my mind", by_peer=True)
    ]
    peer.expect((0, d.ConnectionCloseOk()))
    assert peer.engine.finished


def test_our_close_discards_everything_until_close_ok() -> None:
    peer = Peer()
    peer.open(channels=(1,))
    peer.engine.close(R.CONNECTION_FORCED, "shutdown", 0, 0)
    peer.expect((0, d.ConnectionClose(320, "shutdown", 0, 0)))
    assert peer.engine.take_events() == [ConnectionClosed(320, "shutdown", by_peer=False)]
    junk = encode_content(1, PUBLISH, PROPS, b"x", 4096) + encode_method_frame(2, d.ChannelOpen())
    assert peer.send(junk + encode_method_frame(0, d.ConnectionOpen("/"))) == []
    assert peer.frames() == []
    assert not peer.engine.finished
    peer.engine.send_method(1, d.BasicQosOk())  # dropped: the connection is closing
    assert peer.frames() == []
    assert peer.method(0, d.ConnectionCloseOk()) == []
    assert peer.engine.finished


def test_our_close_crossing_the_peers_close() -> None:
    peer = Peer()
    peer.open()
    peer.engine.close(R.CONNECTION_FORCED, "shutdown")
    peer.frames()
    assert peer.method(0, d.ConnectionClose(200, "bye", 0, 0)) == [ConnectionClosed(320, "shutdown", False)]
    peer.expect((0, d.ConnectionCloseOk()))
    assert peer.engine.finished


def test_our_close_times_out() -> None:
    peer = Peer(close_timeout=5.0)
    peer.open(heartbeat=0)
    peer.now = 1.0
    peer.send(HEARTBEAT_BYTES)  # the engine's clock is the last time it was given
    peer.engine.close(R.CONNECTION_FORCED, "shutdown")
    assert peer.engine.next_deadline() == 6.0
    peer.engine.close(R.CONNECTION_FORCED, "again")  # ignored
    peer.now = 2.0
    assert peer.send(HEARTBEAT_BYTES) == [ConnectionClosed(320, "shutdown", False)]  # our commands' events too
    assert peer.tick(5.9) == []
    assert not peer.engine.finished
    peer.tick(6.0)
    assert peer.engine.finished


def test_garbage_while_closing_ends_the_connection_quietly() -> None:
    peer = Peer()
    peer.open()
    peer.engine.close(R.CONNECTION_FORCED, "shutdown")
    peer.frames()
    peer.engine.take_events()
    assert peer.send(b"\x09garbage") == []
    assert peer.engine.finished
    assert peer.frames() == []


def test_socket_end_reports_the_close_once() -> None:
    peer = Peer()
    peer.open(channels=(1,))
    assert peer.send(b"") == [ConnectionClosed(R.CONNECTION_FORCED, "the peer closed the socket", by_peer=True)]
    assert peer.engine.finished
    assert peer.send(b"") == []
    assert peer.tick(1000.0) == []


# -- channels -------------------------------------------------------------------------------------------------
def test_channel_open_and_peer_close_then_the_number_is_free() -> None:
    peer = Peer()
    peer.open()
    assert peer.method(1, d.ChannelOpen()) == [ChannelOpened(1)]
    peer.expect((1, d.ChannelOpenOk()))
    assert peer.method(1, d.ChannelClose(200, "done", 0, 0)) == [ChannelClosed(1, 200, "done", by_peer=True)]
    peer.expect((1, d.ChannelCloseOk()))
    assert peer.method(1, d.ChannelOpen()) == [ChannelOpened(1)]
    peer.expect((1, d.ChannelOpenOk()))


def test_channel_open_twice_is_504() -> None:
    peer = Peer()
    peer.open(channels=(1,))
    events = peer.method(1, d.ChannelOpen())
    close = peer.closed_with(R.CHANNEL_ERROR, 20, 10)
    assert close.reply_text == "CHANNEL_ERROR - second 'channel.open' seen on channel 1"
    assert events == [ConnectionClosed(R.CHANNEL_ERROR, close.reply_text, False)]


def test_channel_above_channel_max_is_504() -> None:
    peer = Peer()
    peer.open(channel_max=10, channels=(10,))
    peer.method(11, d.ChannelOpen())
    peer.closed_with(R.CHANNEL_ERROR, 20, 10)


@pytest.mark.parametrize(
    ("frame", "ids"),
    [
        pytest.param(encode_method_frame(3, d.QueueDeclare(0, "q")), (50, 10), id="method"),
        pytest.param(encode_method_frame(3, d.ChannelClose(200, "", 0, 0)), (20, 40), id="channel-close"),
        pytest.param(encode_frame(HeaderFrame(3, 60, 0, PROPS)), (0, 0), id="content-header"),
    ],
)
def test_frame_on_a_channel_not_open_is_504(frame: bytes, ids: tuple[int, int]) -> None:
    peer = Peer()
    peer.open(channels=(1,))
    peer.send(frame)
    close = peer.closed_with(R.CHANNEL_ERROR, *ids)
    assert close.reply_text == "CHANNEL_ERROR - channel 3 is not open"


@pytest.mark.parametrize(
    "method",
    [d.ChannelOpenOk(), d.ChannelCloseOk(), d.ChannelFlowOk(True), d.ConnectionOpen("/")],
    ids=lambda m: m.NAME,
)
def test_misplaced_method_on_an_open_channel_is_503(method: Method) -> None:
    peer = Peer()
    peer.open(channels=(1,))
    peer.method(1, method)
    peer.closed_with(R.COMMAND_INVALID, method.CLASS_ID, method.METHOD_ID)


def test_channel_flow_is_answered_by_the_engine() -> None:
    peer = Peer()
    peer.open(channels=(1,))
    assert peer.method(1, d.ChannelFlow(False)) == [FlowRequested(1, False)]
    peer.expect((1, d.ChannelFlowOk(False)))
    assert peer.method(1, d.ChannelFlow(True)) == [FlowRequested(1, True)]
    peer.expect((1, d.ChannelFlowOk(True)))


def test_our_channel_close_discards_until_close_ok() -> None:
    peer = Peer()
    peer.open(channels=(1, 2))
    peer.engine.close_channel(1, R.NOT_FOUND, "NOT_FOUND - no queue 'q'", 50, 10)
    peer.expect((1, d.ChannelClose(404, "NOT_FOUND - no queue 'q'", 50, 10)))
    assert peer.engine.take_events() == [ChannelClosed(1, 404, "NOT_FOUND - no queue 'q'", by_peer=False)]
    peer.engine.send_method(1, d.BasicQosOk())  # dropped: closing
    assert peer.frames() == []
    # a publish with its content, a channel.open, a flow: all discarded; other channels go on
    discarded = encode_content(1, PUBLISH, PROPS, b"abc", 4096) + encode_method_frame(1, d.ChannelFlow(True))
    kept = encode_method_frame(2, d.BasicQos(0, 1, False))
    assert peer.send(discarded + kept) == [CommandReceived(2, d.BasicQos(0, 1, False))]
    assert peer.frames() == []
    # the peer's own close crossing ours is answered; the channel stays closing
    assert peer.method(1, d.ChannelClose(200, "", 0, 0)) == []
    peer.expect((1, d.ChannelCloseOk()))
    assert peer.method(1, d.ChannelCloseOk()) == []
    assert peer.method(1, d.ChannelOpen()) == [ChannelOpened(1)]
    peer.expect((1, d.ChannelOpenOk()))


def test_close_channel_of_a_channel_not_open_is_ignored() -> None:
    peer = Peer()
    peer.open()
    peer.engine.close_channel(7, R.NOT_FOUND, "x")
    assert peer.frames() == []
    assert peer.engine.take_events() == []


# -- commands and content -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "method",
    [
        d.ExchangeDeclare(0, "x", "topic"),
        d.ExchangeBind(0, "a", "b", "k"),
        d.QueueDeclare(0, "q", durable=True, arguments={"x-max-length": 5}),
        d.QueueDelete(0, "q"),
        d.BasicQos(0, 10, False),
        d.BasicConsume(0, "q", "tag"),
        d.BasicAck(5, True),
        d.BasicRecoverAsync(True),
        d.ConfirmSelect(False),
        d.TxSelect(),
        d.TxCommit(),
    ],
    ids=lambda m: m.NAME,
)
def test_other_classes_are_reported_uninterpreted(method: Method) -> None:
    peer = Peer()
    peer.open(channels=(1,))
    assert peer.method(1, method) == [CommandReceived(1, method)]
    assert peer.frames() == []


@pytest.mark.parametrize("method", [PUBLISH, d.BasicReturn(312, "NO_ROUTE", "x", "k"), d.BasicDeliver("t", 1)],
                         ids=lambda m: m.NAME)  # fmt: skip
def test_content_is_assembled_across_frames_and_reads(method: Method) -> None:
    peer = Peer()
    peer.open(channels=(1,), frame_max=4096)
    body = bytes(range(256)) * 40  # three body frames at frame_max 4096
    data = encode_content(1, method, PROPS, body, 4096)
    events = [event for cut in range(0, len(data), 1000) for event in peer.send(data[cut : cut + 1000])]
    assert events == [CommandReceived(1, method, PROPS, body)]


def test_empty_body_has_no_body_frame() -> None:
    peer = Peer()
    peer.open(channels=(1,))
    events = peer.send(encode_method_frame(1, PUBLISH) + encode_frame(HeaderFrame(1, 60, 0, PROPS)))
    assert events == [CommandReceived(1, PUBLISH, PROPS, b"")]


def test_interleaved_contents_on_two_channels() -> None:
    peer = Peer()
    peer.open(channels=(1, 2))
    one = [
        encode_method_frame(1, PUBLISH),
        encode_frame(HeaderFrame(1, 60, 2, PROPS)),
        encode_frame(BodyFrame(1, b"ab")),
    ]
    two = [
        encode_method_frame(2, PUBLISH),
        encode_frame(HeaderFrame(2, 60, 1, PROPS)),
        encode_frame(BodyFrame(2, b"c")),
    ]
    events = peer.send(b"".join(a + b for a, b in zip(one, two, strict=True)))
    assert events == [CommandReceived(1, PUBLISH, PROPS, b"ab"), CommandReceived(2, PUBLISH, PROPS, b"c")]


@pytest.mark.parametrize(
    "frames",
    [
        pytest.param([encode_frame(HeaderFrame(1, 60, 1, PROPS))], id="header-without-method"),
        pytest.param([encode_frame(BodyFrame(1, b"x"))], id="body-without-method"),
        pytest.param([encode_method_frame(1, PUBLISH), encode_method_frame(1, d.TxCommit())], id="method-not-header"),
        pytest.param([encode_method_frame(1, PUBLISH), encode_frame(HeaderFrame(1, 60, 2, PROPS)),
                      encode_method_frame(1, d.ChannelClose(200, "", 0, 0))], id="close-mid-body"),
        pytest.param([encode_frame(BodyFrame(0, b"x"))], id="body-on-channel-0"),
    ],
)  # fmt: skip
def test_content_frames_out_of_place_are_505(frames: list[bytes]) -> None:
    peer = Peer()
    peer.open(channels=(1,))
    peer.send(b"".join(frames))
    close = peer.closed_with(R.UNEXPECTED_FRAME, *((60, 40) if len(frames) > 1 else (0, 0)))
    assert close.reply_text.startswith("UNEXPECTED_FRAME - ")


def test_body_longer_than_its_header_said_is_501() -> None:
    peer = Peer()
    peer.open(channels=(1,))
    peer.send(
        encode_method_frame(1, PUBLISH) + encode_frame(HeaderFrame(1, 60, 1, PROPS)) + encode_frame(BodyFrame(1, b"ab"))
    )
    peer.closed_with(R.FRAME_ERROR, 60, 40)


def test_message_over_max_size_closes_the_channel_406_and_skips_its_body() -> None:
    peer = Peer(max_message_size=10)
    peer.open(channels=(1, 2))
    big = encode_content(1, PUBLISH, PROPS, b"x" * 11, 4096)
    events = peer.send(big + encode_method_frame(2, d.TxSelect()))
    text = "PRECONDITION_FAILED - message size 11 is larger than configured max size 10"
    assert events == [ChannelClosed(1, 406, text, by_peer=False), CommandReceived(2, d.TxSelect())]
    peer.expect((1, d.ChannelClose(406, text, 60, 40)))
    assert peer.send(encode_content(1, PUBLISH, PROPS, b"x" * 10, 4096)) == []  # discarded while closing
    peer.method(1, d.ChannelCloseOk())
    peer.method(1, d.ChannelOpen())
    peer.frames()
    assert peer.send(encode_content(1, PUBLISH, PROPS, b"x" * 10, 4096)) == [
        CommandReceived(1, PUBLISH, PROPS, b"x" * 10)
    ]


# -- output ---------------------------------------------------------------------------------------------------
def test_send_content_is_cut_by_the_negotiated_frame_max() -> None:
    peer = Peer()
    peer.open(channels=(1,), frame_max=4096)
    deliver = d.BasicDeliver("ctag", 1, False, "", "q")
    body = b"y" * 5000
    peer.engine.send_content(1, deliver, PROPS, body)
    assert peer.engine.output_size == len(encode_content(1, deliver, PROPS, body, 4096))
    assert peer.frames() == [
        MethodFrame(1, deliver),
        HeaderFrame(1, 60, 5000, PROPS),
        BodyFrame(1, b"y" * 4088),
        BodyFrame(1, b"y" * 912),
    ]
    assert not peer.engine.has_output


def test_send_method_to_a_channel_not_open_is_dropped() -> None:
    peer = Peer()
    peer.open(channels=(1,))
    peer.engine.send_method(2, d.BasicQosOk())
    peer.engine.send_content(2, d.BasicGetOk(1, False, "", "q", 0), PROPS, b"")
    assert peer.frames() == []
    peer.engine.send_method(1, d.BasicQosOk())
    peer.expect((1, d.BasicQosOk()))


def test_embedder_misuse_raises() -> None:
    peer = Peer()
    peer.start()
    with pytest.raises(LocalProtocolError):
        peer.engine.send_method(1, d.BasicQosOk())  # not open yet
    peer = Peer()
    peer.open(channels=(1,))
    with pytest.raises(LocalProtocolError):
        peer.engine.send_method(1, d.ChannelFlow(False))
    with pytest.raises(LocalProtocolError):
        peer.engine.send_method(1, d.BasicDeliver("t", 1))
    with pytest.raises(LocalProtocolError):
        peer.engine.send_content(1, d.BasicQosOk(), PROPS, b"")
    with pytest.raises(ValueError, match="mechanisms"):
        Connection091(now=0.0, mechanisms=("EXTERNAL",))


# -- pieces ---------------------------------------------------------------------------------------------------
def test_parse_credentials() -> None:
    assert parse_credentials("PLAIN", b"\0u\0") == ("u", "")
    assert parse_credentials("PLAIN", "\0ü\0p w".encode()) == ("ü", "p w")
    assert parse_credentials("AMQPLAIN", amqplain({"LOGIN": b"u", "PASSWORD": "p", "X": 1})) == ("u", "p")
    assert parse_credentials("AMQPLAIN", struct.pack(">I", 5)) is None


def test_heartbeat_frames_are_ignored_everywhere() -> None:
    peer = Peer()
    peer.start()
    assert peer.send(HEARTBEAT_BYTES) == []
    assert peer.frames() == []
    peer.send(encode_frame(HeartbeatFrame()))
    assert peer.engine.phase is Phase.STARTING


def test_frames_before_a_bad_one_in_the_same_read_are_handled() -> None:
    """RabbitMQ reads frame by frame: a publish that arrived whole is routed even if garbage follows it."""
    peer = Peer()
    peer.open(channels=(1,))
    events = peer.send(encode_content(1, PUBLISH, PROPS, b"kept", 4096) + b"\x09junk-after")
    assert events[0] == CommandReceived(1, PUBLISH, PROPS, b"kept")
    assert [type(e) for e in events] == [CommandReceived, ConnectionClosed]
    peer.closed_with(R.FRAME_ERROR)


def test_mechanism_of_invalid_utf8_is_quoted_without_crashing() -> None:
    """The codec reads a shortstr's invalid UTF-8 as surrogate escapes; our reply text quoting it must still
    encode, cut at 255 octets."""
    peer = Peer()
    peer.login("\udcff" * 255)  # 255 octets 0xff on the wire
    close = peer.closed_with(R.COMMAND_INVALID, 10, 11)
    assert close.reply_text.startswith("COMMAND_INVALID - unknown authentication mechanism '\udcff")
    assert len(close.reply_text.encode("utf-8", "surrogateescape")) == 255


def test_embedder_text_with_a_lone_surrogate_still_encodes() -> None:
    peer = Peer()
    peer.open(channels=(1,))
    peer.engine.close_channel(1, R.NOT_FOUND, "no queue '\ud800'")
    peer.expect((1, d.ChannelClose(404, "no queue '?'", 0, 0)))


def test_closing_and_channel_state_for_the_embedder() -> None:
    peer = Peer()
    peer.open(channels=(1, 2))
    assert not peer.engine.closing
    assert peer.engine.is_channel_open(1)
    assert not peer.engine.is_channel_open(3)
    peer.engine.close_channel(2, R.NOT_FOUND, "gone")
    assert not peer.engine.is_channel_open(2)  # closing: no longer the embedder's
    peer.engine.close(R.CONNECTION_FORCED, "bye")
    assert peer.engine.closing
    assert not peer.engine.is_channel_open(1)
    peer.method(0, d.ConnectionCloseOk())
    assert peer.engine.closing
    assert peer.engine.finished


def test_open_refused_by_the_embedder_with_530() -> None:
    """An unknown vhost: RabbitMQ closes with 530 "vhost NAME not found" (``is_over_vhost_connection_limit``)."""
    peer = Peer()
    peer.tune()
    assert peer.method(0, d.ConnectionOpen("nope")) == [OpenRequested("nope")]
    assert peer.engine.vhost == "nope"
    peer.engine.close(R.NOT_ALLOWED, "NOT_ALLOWED - vhost nope not found", 10, 40)
    peer.expect((0, d.ConnectionClose(530, "NOT_ALLOWED - vhost nope not found", 10, 40)))
    peer.engine.open_ok()  # too late: ignored
    assert peer.frames() == []
    assert peer.method(0, d.ConnectionCloseOk()) == [ConnectionClosed(530, "NOT_ALLOWED - vhost nope not found", False)]
    assert peer.engine.finished
