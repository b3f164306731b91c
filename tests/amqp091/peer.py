"""Scripted 0-9-1 clients for tests: ``Peer`` drives a ``Connection091`` in memory, ``SocketPeer`` a real server over
a socket; raw frames in, decoded frames out."""

from __future__ import annotations

import contextlib
import socket
import time
from collections import deque
from typing import Any, TypeVar

from minibroker.amqp091 import definitions as d
from minibroker.amqp091.base import Method
from minibroker.amqp091.engine import Connection091
from minibroker.amqp091.events import Event
from minibroker.amqp091.frames import (
    PROTOCOL_HEADER,
    BodyFrame,
    Frame,
    FrameReader,
    HeaderFrame,
    HeartbeatFrame,
    MethodFrame,
    encode_content,
    encode_method_frame,
)

M = TypeVar("M", bound=Method)
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


class SocketPeer:
    """A scripted 0-9-1 client over a real socket (blocking, every read with a time-out): frames out from the
    package's encoders, frames in through its ``FrameReader``; heartbeats from the server are skipped."""

    def __init__(self, host: str, port: int, *, timeout: float = 5.0, sock: socket.socket | None = None) -> None:
        self.sock = sock if sock is not None else socket.create_connection((host, port), timeout=timeout)
        self.sock.settimeout(timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no Nagle wait between a test's writes
        self.timeout = timeout
        self._reader = FrameReader(frame_max=0)
        self._frames: deque[Frame] = deque()
        self.eof = False

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def method(self, channel: int, method: Method) -> None:
        self.send(encode_method_frame(channel, method))

    def publish(
        self,
        channel: int,
        body: bytes,
        *,
        exchange: str = "",
        routing_key: str = "",
        properties: d.BasicProperties | None = None,
        mandatory: bool = False,
        immediate: bool = False,
    ) -> bytes:
        """Send one basic.publish with its content (frames of at most 131072 octets); returns the bytes sent."""
        data = encode_content(
            channel,
            d.BasicPublish(exchange=exchange, routing_key=routing_key, mandatory=mandatory, immediate=immediate),
            properties or d.BasicProperties(),
            body,
            131072,
        )
        self.send(data)
        return data

    def frame(self, timeout: float | None = None) -> Frame:
        """The next frame the server sent (not a heartbeat); ``EOFError`` when the server closed the socket."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            while self._frames:
                frame = self._frames.popleft()
                if not isinstance(frame, HeartbeatFrame):
                    return frame
            if self.eof:
                raise EOFError("the server closed the connection")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no frame from the server")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(1 << 16)
            except (ConnectionResetError, BrokenPipeError):
                data = b""
            if not data:
                self.eof = True
            self._frames.extend(self._reader.feed(data))

    def expect(self, channel: int, kind: type[M], timeout: float | None = None) -> M:
        """The next frame is a method of type ``kind`` on ``channel``; return it."""
        frame = self.frame(timeout)
        assert isinstance(frame, MethodFrame), frame
        assert (frame.channel, type(frame.method)) == (channel, kind), frame
        return frame.method  # type: ignore[return-value]

    def content(self, channel: int, kind: type[M]) -> tuple[M, d.BasicProperties, bytes]:
        """A content-carrying method of type ``kind`` with its header and whole body."""
        method = self.expect(channel, kind)
        header = self.frame()
        assert isinstance(header, HeaderFrame), header
        assert header.channel == channel, header
        body = b""
        while len(body) < header.body_size:
            part = self.frame()
            assert isinstance(part, BodyFrame), part
            assert part.channel == channel, part
            body += part.payload
        assert isinstance(header.properties, d.BasicProperties)
        return method, header.properties, body

    def closed(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        """The server closed the connection with exactly this error; answer close-ok and see the socket end."""
        close = self.expect(0, d.ConnectionClose)
        assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
            code,
            text,
            class_id,
            method_id,
        ), close
        self.method(0, d.ConnectionCloseOk())
        self.wait_eof()

    def channel_closed(self, channel: int, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        """The server closed ``channel`` with exactly this error; answer close-ok."""
        close = self.expect(channel, d.ChannelClose)
        assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
            code,
            text,
            class_id,
            method_id,
        ), close
        self.method(channel, d.ChannelCloseOk())

    def wait_eof(self, timeout: float | None = None) -> None:
        """Read (and drop) what the server still sends until it closes the socket."""
        with contextlib.suppress(EOFError):
            self.wait_for_frames(timeout)

    def wait_for_frames(self, timeout: float | None = None) -> None:
        """Read (and drop) frames until the server closes (``EOFError``) or sends nothing for ``timeout``."""
        while True:
            self.frame(timeout)

    # -- the handshake --------------------------------------------------------------------------------------
    def handshake(
        self, user: str = "guest", password: str = "guest", vhost: str = "/", *, heartbeat: int = 0
    ) -> d.ConnectionTune:
        """Header, start-ok (PLAIN), tune-ok, open; returns the server's tune."""
        self.send(PROTOCOL_HEADER)
        self.expect(0, d.ConnectionStart)
        response = b"\0" + user.encode() + b"\0" + password.encode()
        self.method(0, d.ConnectionStartOk({}, "PLAIN", response, "en_US"))
        tune = self.expect(0, d.ConnectionTune)
        self.method(0, d.ConnectionTuneOk(tune.channel_max, tune.frame_max, heartbeat))
        self.method(0, d.ConnectionOpen(vhost))
        self.expect(0, d.ConnectionOpenOk)
        return tune

    def channel(self, number: int) -> None:
        self.method(number, d.ChannelOpen())
        self.expect(number, d.ChannelOpenOk)

    def call(self, channel: int, method: Method, answer: type[M]) -> M:
        """Send ``method`` and return its answer."""
        self.method(channel, method)
        return self.expect(channel, answer)

    def close(self) -> None:
        """connection.close, then close-ok, then the socket."""
        with contextlib.suppress(OSError, EOFError, TimeoutError):
            self.method(0, d.ConnectionClose(200, "bye", 0, 0))
            while not isinstance(self.frame(2.0), MethodFrame):
                pass
        self.sock.close()

    def __enter__(self) -> SocketPeer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
