"""Probe of issue 19's arrival fast path with a data dir: a durable message (header.durable, Part 3 §3.2.1) takes
the general path and is journaled; a non-durable one (python-qpid-proton's empty list0 header, one shared Header
record, or none) takes the short one and is not; after a restart exactly the durable ones come back, in order."""

from __future__ import annotations

from pathlib import Path

import pytest

from minibroker.amqp.definitions import Accepted, Disposition, Header, Transfer
from minibroker.testing import frames
from minibroker.testing.memory import memory_broker
from tests.broker.test_transactions_frames import body, client

pytestmark = pytest.mark.timeout(60)

EMPTY = b"\x00\x53\x70\x45\x00\x53\x73\x45"  # python-qpid-proton's empty header and properties


async def test_only_durable_messages_survive_a_restart(tmp_path: Path) -> None:
    kinds = ["durable", "proton", "bare", "durable", "proton", "durable"]
    async with memory_broker(data_dir=tmp_path) as mb:
        c = await client(mb)
        await c.sender("dq", 1)
        for n, kind in enumerate(kinds):
            text = f"{kind}-{n}"
            if kind == "durable":
                payload = frames.message(text, Header(durable=True))
            elif kind == "proton":
                payload = EMPTY + frames.message(text)
            else:
                payload = frames.message(text)
            await c.post(1, payload)
            assert isinstance((await c.peer.expect(Disposition)).state, Accepted)
        assert mb.queue("dq").depth == len(kinds)
    async with memory_broker(data_dir=tmp_path) as mb:
        c = await client(mb)
        await c.receiver("dq", 1)
        await c.credit(1, 10)
        expected = [f"{kind}-{n}" for n, kind in enumerate(kinds) if kind == "durable"]
        got = [await c.peer.expect_frame(Transfer) for _ in expected]
        assert [body(f.payload) for f in got] == expected
        await c.peer.expect_nothing(0.5)
        for f in got:
            await c.peer.disposition(f.performative.delivery_id, state=Accepted())
        await mb.settle()
