"""Which protocol a new connection speaks, told from its first octets: one port serves AMQP 1.0 and AMQP 0-9-1.

As RabbitMQ does on its one port (``rabbit_reader:handshake``), the protocol header decides: ``AMQP 0 0 9 1`` and the
rest of the 0-9-x family (``AMQP 0 0 minor rev``, ``AMQP 1 1 major minor``) go to the AMQP 0-9-1 gateway, whose
engine serves or refuses them (``amqp091.frames.read_protocol_header``); everything else, the AMQP 1.0, TLS and SASL
headers and any garbage, goes to the AMQP 1.0 engine exactly as before, which answers a bad header itself. The
octets read to decide are handed on unread (``PrefixedStream``).
"""

from __future__ import annotations

from enum import Enum

import trio

_MAGIC = b"AMQP"
_FAMILY_091 = (b"\x00\x00", b"\x01\x01")  # octets 4-5 of the 0-9-x headers (0-9-1 and the older 1 1 0 9 form)


class Protocol(Enum):
    AMQP_1_0 = "AMQP 1.0"
    AMQP_0_9_1 = "AMQP 0-9-1"


def protocol_of(prefix: bytes) -> Protocol | None:
    """The protocol a connection whose first octets are ``prefix`` speaks; None until they can tell."""
    head = prefix[:6]
    if not _MAGIC.startswith(head[:4]):
        return Protocol.AMQP_1_0
    if len(head) < 6:
        if len(head) == 5 and head[4] not in (0, 1):
            return Protocol.AMQP_1_0
        return None
    return Protocol.AMQP_0_9_1 if head[4:6] in _FAMILY_091 else Protocol.AMQP_1_0


async def sniff(stream: trio.abc.Stream, deadline: float) -> tuple[Protocol, bytes]:
    """Read until the protocol is known; the protocol and the octets read. A peer that ends or stays silent
    before it can tell (by ``deadline``, trio time) is the AMQP 1.0 engine's to answer (with what it read)."""
    prefix = b""
    with trio.move_on_at(deadline):
        while (protocol := protocol_of(prefix)) is None:
            try:
                data = await stream.receive_some(8 - len(prefix))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                break
            prefix += data
        else:
            return protocol, prefix
    return Protocol.AMQP_1_0, prefix


class PrefixedStream(trio.abc.Stream):
    """``stream``, whose first ``receive_some`` returns the octets already read from it (``prefix``)."""

    def __init__(self, stream: trio.abc.Stream, prefix: bytes) -> None:
        self.transport_stream = stream
        self._prefix = prefix

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        prefix = self._prefix
        if prefix:
            self._prefix = b""
            return prefix
        return await self.transport_stream.receive_some(max_bytes)

    def take_prefix(self) -> bytes:
        """The octets read to tell the protocol that ``receive_some`` has not returned yet; afterwards none (for a
        reader that reads the transport stream's socket itself, ``minibroker.server.plainsocket``)."""
        prefix, self._prefix = self._prefix, b""
        return prefix

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.transport_stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.transport_stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.transport_stream.aclose()
