"""Review of issue 16 §2 and §3: what time captured frames carry on the virtual clock. They are stamped where the
bytes cross the socket, on real time (as the I/O layer's other timers), so a pcap's timing stays the real one even
after ``broker.clock.advance``; the README says so."""

from __future__ import annotations

import time

from proton import Message

from minibroker.testing.thread import run_in_thread
from tests.integration.helpers import blocking_connection
from tests.test_readme_examples import README


def test_frames_are_stamped_on_real_time_under_the_virtual_clock() -> None:
    """A message scheduled an hour ahead goes out when the virtual clock is advanced an hour; its transfer frame is
    stamped with real time (not an hour ahead), after every frame before it."""
    config = {"server": {"port": 0}, "broker": {"clock": "virtual", "capture": True}}
    with run_in_thread(config) as broker, blocking_connection(broker) as conn:
        receiver = conn.create_receiver("later", credit=1)
        conn.create_sender("later").send(Message(body="x", annotations={"x-opt-delivery-delay": 3_600_000}))
        broker.clock.advance(3600)
        assert receiver.receive(timeout=5).body == "x"
        receiver.accept()
        now = time.time()
        records = broker.frames()
        times = [r["time"] for r in records]
        assert times == sorted(times)
        assert abs(times[-1] - now) < 60
        assert broker.clock.now - times[-1] > 3000
    assert "captured frames carry real time" in README.read_text()
