"""A scripted 0-9-1 client for driving ``Connection091`` in tests: raw frames in, decoded frames out."""

from __future__ import annotations

from typing import Any

from minibroker.amqp091 import definitions as d
from minibroker.amqp091.base import Method
from minibroker.amqp091.engine import Connection091
from minibroker.amqp091.events import Event
from minibroker.amqp091.frames import PROTOCOL_HEADER, Frame, FrameReader, MethodFrame, encode_method_frame

PLAIN_GUEST = b"\0guest\0secret"


class Peer:
    """One engine and the client end of its wire; ``now`` is the test's clock."""

    def __init__(self, **options: Any) -> None:
        self.now = 0.0
        self.engine = Connection091(now=self.now, **options)
        self._reader = FrameReader(frame_max=0)

    def send(self, data: bytes) -> list[Event]:
        return self.engine.receive_data(data, self.now)

    def method(self, channel: int, method: Method) -> list[Event]:
        return self.send(encode_method_frame(channel, method))

    def frames(self) -> list[Frame]:
        """What the engine sent since the last call, decoded."""
        return self._reader.feed(self.engine.data_to_send())

    def expect(self, *methods: tuple[int, Method]) -> None:
        """The engine sent exactly these method frames since the last look."""
        assert self.frames() == [MethodFrame(channel, method) for channel, method in methods]

    def tick(self, now: float) -> list[Event]:
        self.now = now
        return self.engine.handle_timeout(now)

    # -- the handshake, step by step --------------------------------------------------------------------------
    def start(self) -> d.ConnectionStart:
        assert self.send(PROTOCOL_HEADER) == []
        (frame,) = self.frames()
        assert isinstance(frame, MethodFrame)
        assert isinstance(frame.method, d.ConnectionStart)
        return frame.method

    def login(self, mechanism: str = "PLAIN", response: bytes = PLAIN_GUEST) -> list[Event]:
        self.start()
        return self.method(0, d.ConnectionStartOk({}, mechanism, response, "en_US"))

    def tune(self, channel_max: int = 2047, frame_max: int = 131072, heartbeat: int = 60) -> list[Event]:
        self.login()
        self.engine.take_credentials()
        self.engine.login_verdict(True)
        self.frames()
        return self.method(0, d.ConnectionTuneOk(channel_max, frame_max, heartbeat))

    def open(self, *, channels: tuple[int, ...] = (), **tune: int) -> None:
        assert self.tune(**tune) == []
        self.method(0, d.ConnectionOpen("/"))
        self.engine.open_ok()
        self.expect((0, d.ConnectionOpenOk()))
        for channel in channels:
            self.method(channel, d.ChannelOpen())
            self.expect((channel, d.ChannelOpenOk()))

    def closed_with(self, code: d.ReplyCode, class_id: int = 0, method_id: int = 0) -> d.ConnectionClose:
        """The engine sent exactly one frame, connection.close with these code and ids; return it."""
        (frame,) = self.frames()
        assert isinstance(frame, MethodFrame)
        assert frame.channel == 0
        close = frame.method
        assert isinstance(close, d.ConnectionClose)
        assert (close.reply_code, close.class_id, close.method_id) == (code, class_id, method_id), close
        return close
