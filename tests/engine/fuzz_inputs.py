"""Fuzz inputs built from a byte string of choices: client sessions, their mutations, chunkings.

Every decision (which step next, which handle, whether to lie about it) reads the next byte(s) of the
choice string, and a byte of zero always means the ordinary, valid choice; past the end every byte reads
as zero. So hypothesis can draw the whole input as one ``binary()`` (drawing is the costly part of a
fuzz run, and one draw is cheap), a shrunk failure is the shortest string of unusual choices that still
breaks something, and libFuzzer (``fuzz/atheris_engine.py``) can drive the very same builders.

    session(choices)            a client's side of a connection, one element per header or frame
    mutate(units, choices)      frame-level then byte-level mutations of those elements, joined
    chunk_sizes(choices)        how to cut a byte stream into reads
    run(choices)                all of it through ``BrokerRun``, as the libFuzzer entry point does
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from minibroker.amqp.definitions import (
    Accepted,
    AmqpValue,
    ApplicationProperties,
    Close,
    Coordinator,
    Data,
    Declare,
    Detach,
    Discharge,
    End,
    Error,
    Header,
    MessageAnnotations,
    Modified,
    Properties,
    Rejected,
    Released,
    Source,
    Target,
    TransactionalState,
)
from minibroker.amqp.framing import AMQP_HEADER, FRAME_HEADER, SASL_HEADER
from minibroker.amqp.types import Symbol, UInt
from minibroker.testing import frames
from tests.engine.fuzz_harness import PREFILLED, BrokerRun, split, units_of

T = TypeVar("T")

ADDRESSES: list[str | None] = ["q", PREFILLED, "q2", "topic://t", None, "long-" + "x" * 600]
TXN_IDS = [(1).to_bytes(8, "big"), (2).to_bytes(8, "big"), b"nope"]  # the broker's first two txn-ids, and junk
ALPHABET = "abz \u00e9\u20ac\U0001f600"  # one to four UTF-8 bytes a character
SENDER, RECEIVER, COORDINATOR = "sender", "receiver", "coordinator"
"""What a handle is to the client: it sends on it, receives on it, or controls transactions with it."""
MAX_PIECE = 900  # payload bytes per transfer frame: fits the harness broker's max-frame-size of 1024


class Choices:
    """Reads decisions from a byte string; zero (also past its end) means the ordinary choice."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def __repr__(self) -> str:
        return f"Choices({self.data!r})"

    def byte(self) -> int:
        if self.pos >= len(self.data):
            return 0
        self.pos += 1
        return self.data[self.pos - 1]

    def below(self, n: int) -> int:
        """A number in ``range(n)``: 0 for a zero byte."""
        if n <= 256:
            return self.byte() % n
        return int.from_bytes(bytes(self.byte() for _ in range(4)), "big") % n

    def pick(self, items: Sequence[T]) -> T:
        """One of ``items``; the first for a zero byte."""
        return items[self.below(len(items))]

    def maybe(self) -> bool:
        """True half of the time (False for a zero byte)."""
        return self.byte() >= 128

    def rarely(self) -> bool:
        """True one time in ten (False for a zero byte)."""
        return self.byte() >= 230

    def wrong(self, right: int) -> int:
        """``right``, except rarely: then an unknown handle, a skipped id, a huge number."""
        if not self.rarely():
            return right
        return self.pick([(right + 1) & 0xFFFFFFFF, 0, 5, 0xFFFF, 0xFFFFFFFF, self.below(1 << 32)])

    def text(self, max_size: int) -> str:
        return "".join(self.pick(ALPHABET) for _ in range(self.below(max_size + 1)))

    def rest(self) -> bytes:
        """The choices not read yet, as raw bytes."""
        rest = self.data[self.pos :]
        self.pos = len(self.data)
        return rest


# -- messages -------------------------------------------------------------------------------------------
def message(c: Choices) -> bytes:
    """An encoded message: optional sections in order, then a body; rarely in a shuffled order."""
    sections: list[Any] = []
    if c.maybe():
        sections.append(
            Header(
                durable=c.pick([None, True, False]),
                priority=c.pick([None, 9, 0, 255]),
                ttl=c.pick([None, 100, 5000, 0]),
                delivery_count=c.pick([None, 1, 3]),
            )
        )
    if c.rarely():
        sections.append(MessageAnnotations({Symbol(c.pick(["x-opt-a", "x-opt-delivery-delay"])): c.below(5)}))
    if c.maybe():
        sections.append(Properties(message_id=c.text(8) or None, to=c.pick([None, "q", "q2", "topic://t", "nowhere"])))
    if c.rarely():
        sections.append(ApplicationProperties({c.pick(["colour", "n"]): c.text(4)}))
    if c.rarely():
        # sections out of order or repeated: the broker keeps message bytes opaque
        sections = sections[::-1] + sections[:1]
    kind = c.below(4)
    body: Any
    if kind == 0:
        body = AmqpValue(c.text(40))
    elif kind == 1:
        size = c.pick([10, 100, 600, 3000, 0])
        body = Data(bytes(i % 251 for i in range(size)))
    elif kind == 2:
        body = AmqpValue(c.below(1 << 32) - (1 << 31))
    else:
        body = AmqpValue([c.text(8) for _ in range(c.below(4))])
    return frames.message(body, *sections)


OUTCOMES = [Accepted(), Released(), Rejected(), Modified(delivery_failed=True), None]


# -- sessions -------------------------------------------------------------------------------------------
class Script:
    """A client session under construction: the frames so far and what a valid client keeps track of."""

    def __init__(self) -> None:
        self.units: list[bytes] = []
        self.links: dict[int, dict[int, str]] = {}  # channel -> handle -> SENDER, RECEIVER or COORDINATOR
        self.delivery_ids: dict[int, int] = {}  # channel -> next delivery id

    def send(self, channel: int, performative: Any, payload: bytes = b"") -> None:
        self.units.append(frames.frame(channel, performative, payload))

    def handles(self, channel: int, kind: str) -> list[int]:
        return [h for h, k in self.links[channel].items() if k == kind]


STEPS = ["transfer", "attach", "flow", "disposition", "transfer", "txn", "detach", "begin", "end", "heartbeat"]


def session(c: Choices) -> list[bytes]:
    """A client's side of a connection, one element per header or frame: mostly valid, sometimes not."""
    script = Script()
    if c.maybe():
        script.units += [SASL_HEADER, frames.sasl_frame(c.pick([frames.sasl_anonymous(), frames.sasl_plain("u", "p")]))]
    script.units.append(AMQP_HEADER)
    max_frame_size = c.pick([None, 512, 700, 4096])
    script.send(0, frames.open_(max_frame_size=None if max_frame_size is None else UInt(max_frame_size)))
    for _ in range(c.below(25)):
        _step(c, script)
    if not c.rarely():
        script.send(0, Close())
    return script.units


def _step(c: Choices, script: Script) -> None:
    kind = c.pick(STEPS)
    if kind == "begin" or not script.links:
        free = min(set(range(len(script.links) + 1)) - set(script.links))
        channel = c.wrong(free) & 0xFFFF
        script.send(channel, frames.begin(incoming_window=c.pick([2048, 1, 3])))
        script.links.setdefault(channel, {})
        script.delivery_ids.setdefault(channel, 0)
        return
    channel = c.pick(sorted(script.links))
    links = script.links[channel]
    if kind == "attach" or not links or (kind == "transfer" and not script.handles(channel, SENDER)):
        _attach(c, script, channel)
    elif kind == "txn" and not script.handles(channel, COORDINATOR):
        _attach(c, script, channel, COORDINATOR)
    elif kind in ("transfer", "txn"):
        _transfer(c, script, channel, kind)
    elif kind == "flow":
        receivers = script.handles(channel, RECEIVER)
        link = bool(receivers) and not c.rarely()
        script.send(
            channel,
            frames.flow(
                handle=c.wrong(c.pick(receivers)) if link else None,
                delivery_count=c.pick([None, 0, 3]) if link else None,
                link_credit=c.pick([5, 1, 0, 1000, 0xFFFFFFFF]) if link else None,
                drain=c.pick([None, True, False]) if link else None,
                echo=c.pick([None, True]),
                incoming_window=c.pick([2048, 0, 1]),
                next_incoming_id=c.pick([0, None, 3]),
            ),
        )
    elif kind == "disposition":
        first = c.below(40) if c.rarely() else c.below(4)
        state = c.pick(OUTCOMES)
        if c.rarely():
            state = TransactionalState(txn_id=c.pick(TXN_IDS), outcome=c.pick(OUTCOMES))
        script.send(
            channel,
            frames.disposition(
                first,
                c.pick([first + 30, None, first + c.below(5)]),
                role=c.pick([frames.RECEIVER, frames.SENDER]),
                settled=not c.maybe(),
                state=state,
            ),
        )
    elif kind == "detach":
        handle = c.wrong(c.pick(sorted(links)))
        script.send(channel, Detach(handle=UInt(handle), closed=c.pick([True, None, False])))
        links.pop(handle, None)
    elif kind == "end":
        script.send(channel, End(error=c.pick([None, Error(condition=Symbol("amqp:internal-error"))])))
        del script.links[channel]
    else:
        script.units.append(frames.heartbeat(channel))


def _attach(c: Choices, script: Script, channel: int, kind: str | None = None) -> None:
    links = script.links[channel]
    handle = c.wrong(min(set(range(len(links) + 1)) - set(links)))
    kind = kind or c.pick([SENDER, RECEIVER, COORDINATOR])
    address = c.pick(ADDRESSES)
    if kind == SENDER:
        attach = frames.attach_sender(address, handle, target=Target(address=address, dynamic=c.rarely() or None))
    elif kind == RECEIVER:
        source = Source(
            address=address,
            dynamic=c.rarely() or None,
            distribution_mode=c.pick([None, Symbol("copy"), Symbol("move")]),
            durable=c.pick([None, UInt(2)]),
            expiry_policy=c.pick([None, Symbol("never")]),
        )
        attach = frames.attach_receiver(address, handle, source=source, rcv_settle_mode=c.pick([None, 1, 0]))
    else:
        attach = frames.attach_sender(None, handle, target=Coordinator())
    script.send(channel, attach)
    links[handle] = kind
    if kind == RECEIVER and not c.rarely():
        # a consumer grants credit at once, so the broker has somewhere to send what it holds
        script.send(channel, frames.flow(handle=handle, delivery_count=0, link_credit=c.pick([5, 1, 1000])))
        if c.maybe():  # and settles what came, whatever it was
            script.send(channel, frames.disposition(0, 100, settled=c.maybe(), state=c.pick(OUTCOMES)))


def _transfer(c: Choices, script: Script, channel: int, kind: str) -> None:
    state: Any = None
    if kind == "txn":
        handles = script.handles(channel, COORDINATOR)
        if c.maybe():
            payload = frames.message(AmqpValue(Discharge(txn_id=c.pick(TXN_IDS), fail=c.maybe())))
        else:
            payload = frames.message(AmqpValue(Declare()))
    else:
        handles = script.handles(channel, SENDER)
        payload = message(c)
        if c.rarely() or c.rarely():
            state = TransactionalState(txn_id=c.pick(TXN_IDS))
    handle = c.wrong(c.pick(handles))
    delivery_id = c.wrong(script.delivery_ids[channel])
    script.delivery_ids[channel] = (delivery_id + 1) & 0xFFFFFFFF
    settled = c.pick([None, True, False])
    pieces = c.pick([1, 2, 3, 40])  # 40: a long run of more=true
    step = min(MAX_PIECE, max(1, -(-len(payload) // pieces)))
    aborted = c.rarely()
    for n, at in enumerate(range(0, max(len(payload), 1), step)):
        last = at + step >= len(payload)
        transfer = frames.transfer(
            handle,
            delivery_id if n == 0 else None,
            more=not last or None,
            settled=settled,
            state=state if n == 0 else None,
            aborted=True if last and aborted else None,
        )
        script.send(channel, transfer, payload[at : at + step])


# -- mutations ------------------------------------------------------------------------------------------
FRAME_MUTATIONS = ["dup", "drop", "swap", "splice", "size", "doff", "type", "channel"]
BYTE_MUTATIONS = ["flip", "insert", "delete", "truncate"]
HEADER_VALUES: dict[str, tuple[int, list[int]]] = {  # frame-header field index, interesting values
    "size": (0, [0, 7, 8, 9, 511, 1025, 0xFFFFFFFF]),
    "doff": (1, [0, 1, 3, 255]),
    "type": (2, [1, 2, 255]),
    "channel": (3, [1, 7, 255, 256, 0xFFFF]),
}


def _set_field(unit: bytes, index: int, value: int) -> bytes:
    """``unit`` with one frame-header field (0 size, 1 doff, 2 type, 3 channel) replaced."""
    if len(unit) < 8 or unit.startswith(b"AMQP"):
        return unit
    fields = list(FRAME_HEADER.unpack_from(unit))
    fields[index] = value
    return FRAME_HEADER.pack(*fields) + unit[8:]


def mutate(units: list[bytes], c: Choices) -> bytes:
    """``units`` put through up to three frame-level, then three byte-level mutations, joined."""
    units = list(units)
    for _ in range(c.below(4)):
        if not units:
            break
        i, j = c.below(len(units)), c.below(len(units))
        op = c.pick(FRAME_MUTATIONS)
        if op == "dup":
            units.insert(j, units[i])
        elif op == "drop":
            del units[i]
        elif op == "swap":
            units[i], units[j] = units[j], units[i]
        elif op == "splice":
            units[i] = units[i][: c.below(len(units[i]) + 1)] + units[j][c.below(len(units[j]) + 1) :]
        else:
            index, values = HEADER_VALUES[op]
            value = c.pick(values) if c.maybe() else c.below(1 << (32 if index == 0 else 16 if index == 3 else 8))
            units[i] = _set_field(units[i], index, value)
    data = bytearray(b"".join(units))
    for _ in range(c.below(4)):
        pos = c.below(len(data) + 1)
        op = c.pick(BYTE_MUTATIONS)
        if op == "flip" and pos < len(data):
            data[pos] ^= 1 << c.below(8)
        elif op == "insert":
            data[pos:pos] = bytes(c.byte() for _ in range(1 + c.below(16)))
        elif op == "delete":
            del data[pos : pos + 1 + c.below(16)]
        elif op == "truncate":
            del data[pos:]
    return bytes(data)


def chunk_sizes(c: Choices) -> list[int]:
    """Read sizes for a byte stream: 1 to 2048 bytes each, cycled."""
    return [1 + c.below(2048) for _ in range(1 + c.below(8))]


ADVANCES = [0.0, 0.0, 0.5, 3.0, 45.0]
"""Seconds between reads: mostly none; sometimes past the close grace, a transaction or the handshake time-out."""


def run(c: Choices) -> BrokerRun:
    """One fuzz case from choices alone: broker settings, the input (garbage after a valid prefix, a
    valid session, or a mutated one), its chunking and the time between chunks; fed, then end of stream."""
    broker = BrokerRun(
        sasl_required=c.maybe(),
        link_credit=c.pick([100, 1, 2]),
        prefill=c.pick([3, 0, 40]),
        idle_time_out=c.pick([None, 10.0]),
    )
    advances = [c.pick(ADVANCES) for _ in range(1 + c.below(4))]
    mode = c.below(3)
    if mode == 0:
        units = session(c)
    elif mode == 1:
        stream = mutate(session(c), c)
        units = split(stream, chunk_sizes(c)) if c.maybe() else units_of(stream)
    else:
        sizes = chunk_sizes(c)
        prefix = c.pick([b"", AMQP_HEADER, SASL_HEADER, AMQP_HEADER + frames.frame(0, frames.open_())])
        units = split(prefix + c.rest(), sizes)
    for n, chunk in enumerate(units):
        if chunk:
            broker.feed(chunk, advances[n % len(advances)])
    broker.eof()
    return broker


__all__ = ["ADDRESSES", "Choices", "chunk_sizes", "message", "mutate", "run", "session"]
