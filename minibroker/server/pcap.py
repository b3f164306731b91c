"""Captured frames as a pcap file Wireshark and tshark read as AMQP, and back.

Format: classic libpcap (magic ``a1b2c3d4``, microseconds, version 2.4) with ``LINKTYPE_RAW`` (101): each packet
is an IPv4 or IPv6 packet (RFC 791, RFC 8200) carrying a TCP segment (RFC 9293) whose addresses and ports are the
connection's real client and server ones (a connection not on a socket gets ``127.0.0.2`` and a port of its own
against ``127.0.0.1:5672``). Per connection: a SYN, SYN-ACK, ACK handshake at the first frame's time, then one
segment per captured frame (split at ``_MAX_SEGMENT`` bytes), its sequence number counting the bytes its
direction sent, its acknowledgement what the other direction sent, then a FIN from the client side for a closed
connection. Checksums are computed, so no tool flags the packets. Frames dropped by ``capture_limit`` are simply
absent: the sequence numbers count the kept bytes only.

``read_pcap`` reads such a file (and any classic pcap of AMQP over TCP with ``LINKTYPE_RAW`` or
``LINKTYPE_ETHERNET``) back into one ``TcpStream`` per connection, for ``minibroker replay``.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

from minibroker.server.capture import IN, OUT, Address, ConnectionCapture, FrameSplitter

LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101
_GLOBAL = struct.Struct("<IHHiIII")
_RECORD = struct.Struct("<IIII")
_IPV4 = struct.Struct("!BBHHHBBH4s4s")
_IPV6 = struct.Struct("!IHBB16s16s")
_TCP = struct.Struct("!HHIIBBHHH")
_MAX_SEGMENT = 65000
_SYN, _ACK, _FIN, _PSH = 0x02, 0x10, 0x01, 0x08
_ISN = {IN: 1000, OUT: 5000}
"""Initial sequence numbers of the client and the server."""


class PcapError(ValueError):
    """The file is not a pcap this module reads: the message says why."""


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\x00"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return int(~total & 0xFFFF)


def _packet(src: Address, dst: Address, seq: int, ack: int, flags: int, payload: bytes) -> bytes:
    """An IP packet (v4 or v6, as the addresses are) with one TCP segment."""
    source, target = ipaddress.ip_address(src[0]), ipaddress.ip_address(dst[0])
    header = _TCP.pack(src[1], dst[1], seq & 0xFFFFFFFF, ack & 0xFFFFFFFF, 5 << 4, flags, 65535, 0, 0)
    length = len(header) + len(payload)
    if source.version == 4 and target.version == 4:
        pseudo = source.packed + target.packed + struct.pack("!BBH", 0, 6, length)
    else:
        source, target = _v6(source), _v6(target)
        pseudo = source.packed + target.packed + struct.pack("!IxxxB", length, 6)
    checksum = _checksum(pseudo + header + payload)
    segment = header[:16] + struct.pack("!H", checksum) + header[18:] + payload
    if source.version == 4:
        ip = _IPV4.pack(0x45, 0, 20 + length, 0, 0x4000, 64, 6, 0, source.packed, target.packed)
        ip = ip[:10] + struct.pack("!H", _checksum(ip)) + ip[12:]
    else:
        ip = _IPV6.pack(6 << 28, length, 6, 64, source.packed, target.packed)
    return ip + segment


def _v6(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv6Address:
    if isinstance(address, ipaddress.IPv6Address):
        return address
    return ipaddress.IPv6Address(f"::ffff:{address}")


def _endpoints(capture: ConnectionCapture) -> tuple[Address, Address]:
    client = capture.client or ("127.0.0.2", 10000 + capture.conn_id % 50000)
    server = capture.server or ("127.0.0.1", 5672)
    client = (client[0].split("%")[0], client[1])  # an IPv6 scope id is no part of the address
    server = (server[0].split("%")[0], server[1])
    if ipaddress.ip_address(client[0]).version != ipaddress.ip_address(server[0]).version:
        client = (str(_v6(ipaddress.ip_address(client[0]))), client[1])
        server = (str(_v6(ipaddress.ip_address(server[0]))), server[1])
    return client, server


class _Segments:
    """The TCP segments of one connection, each direction's sequence number counting what it sent."""

    def __init__(self, client: Address, server: Address, packets: list[tuple[float, int, bytes]]) -> None:
        self.ends = {IN: (client, server), OUT: (server, client)}
        self.seq = dict(_ISN)
        self.packets = packets
        """(time, order, packet) of every connection written, shared."""

    def add(self, now: float, direction: str, flags: int, payload: bytes = b"") -> None:
        src, dst = self.ends[direction]
        seq = self.seq
        other = OUT if direction == IN else IN
        self.packets.append((now, len(self.packets), _packet(src, dst, seq[direction], seq[other], flags, payload)))
        seq[direction] += len(payload) + (1 if flags & (_SYN | _FIN) else 0)


def write_pcap(captures: Iterable[ConnectionCapture]) -> bytes:
    """The pcap of ``captures`` (see the module's docstring); their packets interleaved in time order."""
    packets: list[tuple[float, int, bytes]] = []
    for capture in captures:
        frames = list(capture.frames)
        if not frames:
            continue
        segments = _Segments(*_endpoints(capture), packets)
        start = frames[0][0]
        segments.add(start, IN, _SYN)
        segments.add(start, OUT, _SYN | _ACK)
        segments.add(start, IN, _ACK)
        for now, direction, raw in frames:
            for offset in range(0, len(raw), _MAX_SEGMENT):
                segments.add(now, direction, _PSH | _ACK, raw[offset : offset + _MAX_SEGMENT])
        if capture.closed:
            segments.add(frames[-1][0], IN, _FIN | _ACK)
    packets.sort(key=lambda item: (item[0], item[1]))
    out = bytearray(_GLOBAL.pack(0xA1B2C3D4, 2, 4, 0, 0, 262144, LINKTYPE_RAW))
    for now, _order, packet in packets:
        seconds = int(now)
        out += _RECORD.pack(seconds, int((now - seconds) * 1_000_000), len(packet), len(packet))
        out += packet
    return bytes(out)


@dataclass
class TcpStream:
    """One TCP connection read from a pcap: its ends, and its frames in the order the packets came."""

    client: Address
    server: Address
    frames: list[tuple[float, str, bytes]] = field(default_factory=list)
    """(time, "in" or "out", raw frame)."""


def read_pcap(data: bytes) -> list[TcpStream]:
    """The TCP connections of a classic pcap, each cut into AMQP frames; ``PcapError`` when it is not one."""
    if len(data) < _GLOBAL.size:
        raise PcapError("too short for a pcap file")
    magic = data[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        order = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        order = ">"
    else:
        raise PcapError("not a classic pcap file (pcapng is not read: convert it with editcap -F pcap)")
    nano = magic in (b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")
    linktype = struct.unpack_from(order + "I", data, 20)[0] & 0xFFFF
    if linktype not in (LINKTYPE_RAW, LINKTYPE_ETHERNET):
        raise PcapError(f"link type {linktype} is not read (only raw IP, 101, and Ethernet, 1)")
    record = struct.Struct(order + "IIII")
    streams: dict[frozenset[Address], tuple[TcpStream, dict[str, FrameSplitter], dict[str, int]]] = {}
    pos = _GLOBAL.size
    while pos < len(data):
        if pos + record.size > len(data):
            raise PcapError(f"a packet record is cut short at byte {pos}")
        seconds, fraction, captured, _length = record.unpack_from(data, pos)
        pos += record.size
        packet = data[pos : pos + captured]
        if len(packet) < captured:
            raise PcapError(f"a packet is cut short at byte {pos}")
        pos += captured
        if linktype == LINKTYPE_ETHERNET:
            if len(packet) < 14 or packet[12:14] not in (b"\x08\x00", b"\x86\xdd"):
                continue
            packet = packet[14:]
        segment = _tcp(packet)
        if segment is None:
            continue
        src, dst, seq, flags, payload = segment
        key = frozenset((src, dst))
        entry = streams.get(key)
        if entry is None:
            if not payload and not flags & _SYN:
                continue
            # the SYN's sender is the client; without a handshake, whoever speaks first (AMQP: the client)
            client, server = (src, dst) if (flags & _SYN and not flags & _ACK) or payload else (dst, src)
            entry = (TcpStream(client, server), {IN: FrameSplitter(), OUT: FrameSplitter()}, {})
            streams[key] = entry
        stream, splitters, expected = entry
        direction = IN if src == stream.client else OUT
        if flags & _SYN:
            expected[direction] = seq + 1
            continue
        if not payload:
            continue
        next_seq = expected.get(direction)
        if next_seq is not None and (seq - next_seq) & 0x80000000:
            continue  # a retransmission of bytes already read
        expected[direction] = (seq + len(payload)) & 0xFFFFFFFF
        now = seconds + fraction / (1e9 if nano else 1e6)
        stream.frames.extend((now, direction, piece) for piece in splitters[direction].feed(payload))
    return [entry[0] for entry in streams.values()]


def _tcp(packet: bytes) -> tuple[Address, Address, int, int, bytes] | None:
    """(source, destination, seq, flags, payload) of an IP packet's TCP segment; None for anything else."""
    if not packet:
        return None
    version = packet[0] >> 4
    if version == 4 and len(packet) >= 20:
        header = (packet[0] & 0x0F) * 4
        total = struct.unpack_from("!H", packet, 2)[0]
        if packet[9] != 6:
            return None
        src_ip = str(ipaddress.IPv4Address(packet[12:16]))
        dst_ip = str(ipaddress.IPv4Address(packet[16:20]))
        body = packet[header:total]
    elif version == 6 and len(packet) >= 40:
        if packet[6] != 6:
            return None  # extension headers are not followed
        length = struct.unpack_from("!H", packet, 4)[0]
        src_ip = str(ipaddress.IPv6Address(packet[8:24]))
        dst_ip = str(ipaddress.IPv6Address(packet[24:40]))
        body = packet[40 : 40 + length]
    else:
        return None
    if len(body) < 20:
        return None
    sport, dport, seq, _ack, offset, flags, _window, _sum, _urgent = _TCP.unpack_from(body)
    return (src_ip, sport), (dst_ip, dport), seq, flags, body[(offset >> 4) * 4 :]


__all__ = ["LINKTYPE_RAW", "PcapError", "TcpStream", "read_pcap", "write_pcap"]
