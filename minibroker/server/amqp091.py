"""AMQP 0-9-1 clients on the AMQP port: the gateway of each one, set up from the configuration (issue 18).

Loaded only when the first AMQP 0-9-1 client connects (``App.serve_stream`` tells the protocols apart by their
header, ``sniff.py``), so a broker serving only AMQP 1.0 never imports the 0-9-1 packages.
"""

from __future__ import annotations

import trio

from minibroker.amqp091.engine import DEFAULT_MAX_MESSAGE_SIZE, Connection091
from minibroker.broker.core import Broker
from minibroker.config import Config
from minibroker.engine.connection import ServerConnection
from minibroker.gateway091.connection import Gateway

FRAME_MAX = 131072
"""The frame-max we offer (RabbitMQ's default)."""
CHANNEL_MAX = 2047
"""The channel-max we offer at most (RabbitMQ's default): fewer when the inner connection takes fewer sessions."""
HEARTBEAT = 60
"""Seconds between heartbeats we propose (RabbitMQ's default); the client may lower it, or turn them off with 0."""


def make_gateway(config: Config, broker: Broker, inner: ServerConnection, started: float) -> Gateway:
    """The gateway for one AMQP 0-9-1 client, whose AMQP 1.0 side is ``inner`` (a connection made like any other)."""
    server = config.server
    engine = Connection091(
        now=started,
        frame_max=FRAME_MAX,
        channel_max=min(CHANNEL_MAX, inner.channel_max, inner.max_sessions),
        heartbeat=HEARTBEAT,
        handshake_timeout=server.handshake_timeout or 10.0,
        max_message_size=server.max_message_size or DEFAULT_MAX_MESSAGE_SIZE,
    )
    inner.idle_time_out = None  # the gateway sends the inner connection no heartbeats: the client's are checked
    inner.gateway = "amqp-0-9-1"
    return Gateway(engine, inner, broker.rabbit, trio.current_time)
