"""Write the hand-made inputs of the regression corpus: ``python tests/engine/corpus/make.py``.

Each file is a byte stream from a client, as it would arrive on the socket; ``test_corpus.py`` replays it
in several chunkings. Inputs the fuzzer found are written here too, reduced by hand, so that the file
says what they are. Existing files are overwritten; keep every file under 64 KiB.
"""

from __future__ import annotations

from pathlib import Path

from minibroker.amqp.definitions import (
    AmqpValue,
    Close,
    Coordinator,
    Declare,
    Discharge,
    Header,
    Properties,
    TransactionalState,
)
from minibroker.amqp.framing import AMQP_HEADER, SASL_FRAME, SASL_HEADER, TLS_HEADER
from minibroker.amqp.types import Symbol, UInt
from minibroker.testing import frames

HERE = Path(__file__).parent
OPEN = AMQP_HEADER + frames.frame(0, frames.open_())
BEGUN = OPEN + frames.frame(0, frames.begin())
PRODUCER = BEGUN + frames.frame(0, frames.attach_sender("q", 0))
CONSUMER = BEGUN + frames.frame(0, frames.attach_receiver("prefilled", 0))
GARBAGE = bytes((n * 37 + 11) % 256 for n in range(1024))  # deterministic, every byte value


def _array_count(count: int) -> bytes:
    """An attach whose offered-capabilities is an array32 claiming ``count`` symbols in 8 bytes."""
    good = frames.frame(0, frames.attach_sender("q", 1, offered_capabilities=[Symbol("x")]))
    array = b"\xe0\x04\x01\xa3\x01x"
    assert good.endswith(array)
    body = b"\xf0" + (8).to_bytes(4, "big") + count.to_bytes(4, "big") + b"\xa3\x01x"
    frame = good[: -len(array)] + body
    return (len(frame)).to_bytes(4, "big") + frame[4:]


def _nested_lists(depth: int) -> bytes:
    """A performative (an open) whose container-id is a list inside a list ... ``depth`` deep."""
    inner = b"\x45"
    for _ in range(depth):
        inner = b"\xd0" + (len(inner) + 4).to_bytes(4, "big") + (1).to_bytes(4, "big") + inner
    return frames.raw_frame(
        body=b"\x00\x53\x10\xd0" + (len(inner) + 4).to_bytes(4, "big") + b"\x00\x00\x00\x01" + inner
    )


def _txn() -> bytes:
    txn_id = (1).to_bytes(8, "big")
    data = BEGUN + frames.frame(0, frames.attach_sender(None, 0, target=Coordinator()))
    data += frames.frame(0, frames.attach_sender("q", 1))
    data += frames.frame(0, frames.transfer(0, 0), frames.message(AmqpValue(Declare())))
    state = TransactionalState(txn_id=txn_id)
    data += frames.frame(0, frames.transfer(1, 1, state=state), frames.message("in a transaction"))
    data += GARBAGE[:100]  # and the connection breaks with the transaction open
    return data


CORPUS: dict[str, bytes] = {
    # -- frame headers
    "frame-size-4GiB": OPEN + frames.raw_frame(size=0xFFFFFFFF),
    "frame-size-7": OPEN + frames.raw_frame(size=7, body=b"\x00"),
    "frame-size-0-before-open": AMQP_HEADER + frames.raw_frame(size=0),
    "doff-0": OPEN + frames.raw_frame(doff=0),
    "doff-255": OPEN + frames.raw_frame(doff=255, body=bytes(64)),
    # -- encodings
    "array-huge-count": BEGUN + _array_count(0xFFFFFFFF),
    "array-count-one-too-many": BEGUN + _array_count(2),
    "deeply-nested-lists": OPEN[:8] + _nested_lists(2000),
    "deeply-nested-descriptors": OPEN + frames.raw_frame(body=b"\x00" * 60000 + b"\x40\x40"),
    # -- transfers
    "transfer-more-forever": PRODUCER
    + b"".join(frames.frame(0, frames.transfer(0, 0 if n == 0 else None, more=True), bytes(100)) for n in range(480)),
    "transfer-then-abort-forever": PRODUCER
    + b"".join(
        frames.frame(0, frames.transfer(0, n, more=True), bytes(50))
        + frames.frame(0, frames.transfer(0, None, aborted=True))
        for n in range(300)
    ),
    "messages-sections-out-of-order": PRODUCER
    + frames.frame(0, frames.transfer(0, 0), frames.message("x", Properties(to="q"), Header(priority=9)))
    + frames.frame(0, frames.transfer(0, 1), frames.message("y", Header(), Header()))
    + frames.frame(0, frames.transfer(0, 2), b"\xff\xfe"),
    # -- the wrong layer
    "sasl-frame-after-open": OPEN + frames.sasl_frame(frames.sasl_anonymous()),
    "amqp-frame-during-sasl": SASL_HEADER + frames.frame(0, frames.open_()),
    "sasl-init-twice": SASL_HEADER + frames.sasl_frame(frames.sasl_anonymous()) * 2 + OPEN,
    "sasl-unknown-frame-type": SASL_HEADER + frames.frame(0, frames.sasl_anonymous(), frame_type=SASL_FRAME + 5),
    # -- headers and garbage
    "header-then-garbage": AMQP_HEADER + GARBAGE,
    "sasl-header-then-garbage": SASL_HEADER + GARBAGE,
    "open-then-garbage": OPEN + GARBAGE,
    "tls-header": TLS_HEADER + GARBAGE[:200],
    "http-request": b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
    # -- found by the fuzzer (reduced): input left buffered after the engine finished or closed
    "bad-header-then-more": b"AMQP\x00\x01\x00\x01" + GARBAGE * 2,
    "close-after-undecodable-frame": BEGUN + frames.undecodable_frame() + frames.frame(0, Close()) + GARBAGE[:300],
    # -- found by the fuzzer: attach and transfer in one read (a detach went out before the attach)
    "attach-and-transfer-in-one-read": BEGUN
    + frames.frame(0, frames.attach_sender("q", 0))
    + frames.frame(0, frames.transfer(0, 0), frames.message("too soon")),
    # -- found by the fuzzer: an answer larger than the peer's max-frame-size went out anyway
    "attach-echo-beyond-peer-max-frame-size": AMQP_HEADER
    + frames.frame(0, frames.open_(max_frame_size=UInt(512)))
    + frames.frame(0, frames.begin())
    + frames.frame(0, frames.attach_receiver("long-" + "x" * 600, 0)),
    # -- sessions, links, dispositions at their limits
    "begin-on-every-channel": OPEN + b"".join(frames.frame(c, frames.begin()) for c in range(300)),
    "begin-on-channel-65535": OPEN + frames.frame(0xFFFF, frames.begin()),
    "flow-echo-storm": BEGUN + frames.frame(0, frames.flow(echo=True)) * 400,
    "consumer-credit-4G-drain": CONSUMER
    + frames.frame(0, frames.flow(handle=0, delivery_count=0, link_credit=0xFFFFFFFF, drain=True)),
    "disposition-whole-range": CONSUMER
    + frames.frame(0, frames.flow(handle=0, delivery_count=0, link_credit=10))
    + frames.frame(0, frames.disposition(0, 0xFFFFFFFF))
    + frames.frame(0, frames.disposition(0xFFFFFFF0, 5)),
    "handle-4G": BEGUN
    + frames.frame(0, frames.attach_sender("q", 0xFFFFFFFF))
    + frames.frame(0, frames.flow(handle=0xFFFFFFFF)),
    "transaction-then-garbage": _txn(),
    "discharge-unknown-txn": BEGUN
    + frames.frame(0, frames.attach_sender(None, 0, target=Coordinator()))
    + frames.frame(0, frames.transfer(0, 0), frames.message(AmqpValue(Discharge(txn_id=b"nope")))),
    "open-max-frame-size-0": AMQP_HEADER
    + frames.frame(0, frames.open_(max_frame_size=UInt(0)))
    + frames.frame(0, frames.begin()),
}


def main() -> None:
    for name, data in CORPUS.items():
        assert len(data) < 64 * 1024, (name, len(data))
        (HERE / f"{name}.bin").write_bytes(data)
    print(f"wrote {len(CORPUS)} files to {HERE}")


if __name__ == "__main__":
    main()
