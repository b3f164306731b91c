"""A raw AMQP 0-9-1 client on a socket for the review's probes: commands written in one send (pipelined, as a
client may), frames read back decoded. Built on ``minibroker.amqp091.frames`` (the wire format only)."""

from __future__ import annotations

import socket
from typing import Any

from minibroker.amqp091 import definitions as d
from minibroker.amqp091.base import Method
from minibroker.amqp091.frames import PROTOCOL_HEADER, FrameReader, MethodFrame, encode_content, encode_method_frame


class Raw091:
    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port), timeout=5)
        self.reader = FrameReader(frame_max=0)
        self.frames: list[Any] = []
        self.passed: list[Any] = []
        """The frames read before the one the last ``expect`` returned (since that call)."""
        self.sock.sendall(PROTOCOL_HEADER)
        self.expect(d.ConnectionStart)
        self.send(0, d.ConnectionStartOk(client_properties={}, mechanism="PLAIN", response=b"\0guest\0guest"))
        tune = self.expect(d.ConnectionTune)
        self.send(0, d.ConnectionTuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0))
        self.send(0, d.ConnectionOpen(virtual_host="/"))
        self.expect(d.ConnectionOpenOk)

    def send(self, channel: int, method: Method) -> None:
        self.sock.sendall(encode_method_frame(channel, method))

    def pipelined(self, *parts: bytes) -> None:
        self.sock.sendall(b"".join(parts))

    @staticmethod
    def method(channel: int, method: Method) -> bytes:
        return encode_method_frame(channel, method)

    @staticmethod
    def content(channel: int, method: Method, body: bytes) -> bytes:
        return encode_content(channel, method, d.BasicProperties(), body, 131072)

    def expect(self, kind: type[Any], channel: int | None = None) -> Any:
        """Read frames until a method frame of ``kind`` (on ``channel``) arrives; return its method."""
        while True:
            for i, frame in enumerate(self.frames):
                wanted = channel is None or frame.channel == channel
                if isinstance(frame, MethodFrame) and isinstance(frame.method, kind) and wanted:
                    self.passed = self.frames[:i]
                    del self.frames[: i + 1]
                    return frame.method
            data = self.sock.recv(65536)
            if not data:
                raise EOFError(f"closed while waiting for {kind.__name__}; had {self.frames}")
            self.frames.extend(self.reader.feed(data))

    def close(self) -> None:
        self.sock.close()
