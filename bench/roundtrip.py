"""Send N messages to a queue, then receive them all, with python-qpid-proton; print messages/s.

    python -m bench.roundtrip [--count 10000] [--size 256] [--url amqp://HOST:PORT]

Without --url it starts minibroker as a subprocess (``python -m minibroker --port 0``), so the broker
and the client each have their own process and interpreter. The figures are mostly the client's:
python-qpid-proton's Python layer costs tens of microseconds per message (see bench/README.md).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

from bench.broker_process import BrokerProcess


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


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.roundtrip", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--url", help="an already running AMQP 1.0 broker (host:port)")
    args = parser.parse_args()
    broker = None if args.url else BrokerProcess()
    url = broker.url if broker is not None else args.url
    try:
        handler = SendThenReceive(url, args.count, args.size)
        Container(handler).run()
    finally:
        if broker is not None:
            broker.stop()
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
