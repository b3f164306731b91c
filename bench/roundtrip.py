"""Send N messages to a queue, then receive them all, with python-qpid-proton; print messages/s.

    python bench/roundtrip.py [--count 10000] [--size 256] [--url amqp://HOST:PORT]

Without --url it starts minibroker as a subprocess (``python -m minibroker --port 0``), so the broker
and the client each have their own process and interpreter. The figures are mostly the client's:
python-qpid-proton's Python layer costs tens of microseconds per message (see bench/README.md).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from typing import Any

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container


class SendThenReceive(MessagingHandler):  # type: ignore[misc]
    """Sends ``count`` unsettled messages, waits for every accept, then consumes them all."""

    def __init__(self, url: str, count: int, size: int) -> None:
        super().__init__(prefetch=1000, auto_accept=True)
        self.url = url
        self.count = count
        self.body = b"x" * size
        self.sent = self.confirmed = self.received = 0
        self.marks: dict[str, float] = {}

    def on_start(self, event: Any) -> None:
        self.conn = event.container.connect(self.url)
        self.marks["start"] = time.perf_counter()
        event.container.create_sender(self.conn, "bench-roundtrip")

    def on_sendable(self, event: Any) -> None:
        while event.sender.credit and self.sent < self.count:
            event.sender.send(Message(body=self.body))
            self.sent += 1

    def on_accepted(self, event: Any) -> None:
        self.confirmed += 1
        if self.confirmed == self.count:
            self.marks["sent"] = time.perf_counter()
            event.sender.close()
            event.container.create_receiver(self.conn, "bench-roundtrip")

    def on_message(self, event: Any) -> None:
        self.received += 1
        if self.received == self.count:
            self.marks["received"] = time.perf_counter()
            event.connection.close()


def start_broker() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "minibroker", "--port", "0", "--log-level", "warning"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"amqp://(\S+)", line)
    if not match:
        proc.kill()
        raise SystemExit(f"broker did not start: {line!r}")
    return proc, match.group(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--url", help="an already running AMQP 1.0 broker (host:port)")
    args = parser.parse_args()
    proc = None
    url = args.url
    if url is None:
        proc, url = start_broker()
    try:
        handler = SendThenReceive(url, args.count, args.size)
        Container(handler).run()
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
    m = handler.marks
    send_s = m["sent"] - m["start"]
    recv_s = m["received"] - m["sent"]
    total = m["received"] - m["start"]
    print(f"messages: {args.count} x {args.size} bytes, broker {url}")
    print(f"send (confirmed):  {args.count / send_s:10.0f} msg/s  ({send_s:.2f} s)")
    print(f"receive (accept):  {args.count / recv_s:10.0f} msg/s  ({recv_s:.2f} s)")
    print(f"send then receive: {args.count / total:10.0f} msg/s  ({total:.2f} s for all)")


if __name__ == "__main__":
    main()
