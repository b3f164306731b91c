"""A model-based test of channel life (spec, class channel; ``rabbit_reader``'s closing-channel rule): random
sequences of the peer's opens, closes, close-oks, flows and publishes and our closes, checked step by step
against a dictionary of channel states, frames and events exact."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from minibroker.amqp091 import definitions as d
from minibroker.amqp091.base import Method
from minibroker.amqp091.events import (
    ChannelClosed,
    ChannelOpened,
    CommandReceived,
    ConnectionClosed,
    Event,
    FlowRequested,
)
from minibroker.amqp091.frames import encode_content
from tests.amqp091.peer import Peer

R = d.ReplyCode
channels = st.integers(1, 2)  # few, so that steps meet the same channel often
PUBLISH = d.BasicPublish(0, "x", "k", False, False)
PROPS = d.BasicProperties(priority=1)


class ChannelLife(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.connect()

    @precondition(lambda self: self.dead)
    @rule()
    def connect(self) -> None:
        """A fresh connection (at the start, and after a connection error ended the last one)."""
        self.peer = Peer()
        self.peer.open(channel_max=3)
        self.model: dict[int, str] = {}  # channel -> "open" | "closing"
        self.dead = False

    def _fatal(self, events: list[Event], code: R, method: Method | None) -> None:
        ids = (method.CLASS_ID, method.METHOD_ID) if method else (0, 0)
        close = self.peer.closed_with(code, *ids)
        assert events == [ConnectionClosed(code, close.reply_text, by_peer=False)]
        self.dead = True

    def _peer_method(self, channel: int, method: Method, answer: Method | None, event: object | None) -> None:
        """The peer sends a channel-class method the engine answers itself when the channel is open."""
        state = self.model.get(channel)
        events = self.peer.method(channel, method)
        if state is None:
            self._fatal(events, R.CHANNEL_ERROR, method)
        elif state == "closing":
            assert events == []
            self.peer.expect(*([(channel, d.ChannelCloseOk())] if isinstance(method, d.ChannelClose) else []))
        else:
            assert events == ([event] if event else [])
            self.peer.expect(*([(channel, answer)] if answer else []))

    @precondition(lambda self: not self.dead)
    @rule(channel=channels)
    def peer_opens(self, channel: int) -> None:
        state = self.model.get(channel)
        events = self.peer.method(channel, d.ChannelOpen())
        if state == "open":
            self._fatal(events, R.CHANNEL_ERROR, d.ChannelOpen())
        elif state == "closing":
            assert events == []
            self.peer.expect()
        else:
            assert events == [ChannelOpened(channel)]
            self.peer.expect((channel, d.ChannelOpenOk()))
            self.model[channel] = "open"

    @precondition(lambda self: not self.dead)
    @rule(channel=channels)
    def peer_closes(self, channel: int) -> None:
        was_open = self.model.get(channel) == "open"
        self._peer_method(
            channel, d.ChannelClose(200, "ok", 0, 0), d.ChannelCloseOk(), ChannelClosed(channel, 200, "ok", True)
        )
        if was_open:
            del self.model[channel]

    @precondition(lambda self: not self.dead)
    @rule(channel=channels)
    def peer_close_ok(self, channel: int) -> None:
        state = self.model.get(channel)
        events = self.peer.method(channel, d.ChannelCloseOk())
        if state == "closing":
            assert events == []
            self.peer.expect()
            del self.model[channel]
        else:
            code = R.COMMAND_INVALID if state == "open" else R.CHANNEL_ERROR
            self._fatal(events, code, d.ChannelCloseOk())

    @precondition(lambda self: not self.dead)
    @rule(channel=channels, active=st.booleans())
    def peer_flow(self, channel: int, active: bool) -> None:
        self._peer_method(channel, d.ChannelFlow(active), d.ChannelFlowOk(active), FlowRequested(channel, active))

    @precondition(lambda self: not self.dead)
    @rule(channel=channels, body=st.binary(max_size=20))
    def peer_publishes(self, channel: int, body: bytes) -> None:
        state = self.model.get(channel)
        events = self.peer.send(encode_content(channel, PUBLISH, PROPS, body, 4096))
        if state is None:
            self._fatal(events, R.CHANNEL_ERROR, PUBLISH)
        else:
            assert events == ([CommandReceived(channel, PUBLISH, PROPS, body)] if state == "open" else [])
            self.peer.expect()

    @precondition(lambda self: not self.dead)
    @rule(channel=channels)
    def we_close(self, channel: int) -> None:
        state = self.model.get(channel)
        self.peer.engine.close_channel(channel, R.NOT_FOUND, "nope", 50, 10)
        events = self.peer.engine.take_events()
        if state == "open":
            assert events == [ChannelClosed(channel, R.NOT_FOUND, "nope", by_peer=False)]
            self.peer.expect((channel, d.ChannelClose(404, "nope", 50, 10)))
            self.model[channel] = "closing"
        else:
            assert events == []
            self.peer.expect()

    @precondition(lambda self: not self.dead)
    @rule(channel=channels)
    def we_send(self, channel: int) -> None:
        self.peer.engine.send_method(channel, d.BasicQosOk())
        self.peer.expect(*([(channel, d.BasicQosOk())] if self.model.get(channel) == "open" else []))


ChannelLife.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
TestChannelLife = ChannelLife.TestCase
