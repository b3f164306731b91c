"""AMQP 0-9-1 served through an in-process AMQP 1.0 connection (issue 18).

PURE: no trio, no sockets, no clock. ``inner`` is the sans-IO 1.0 client the gateway drives its inner
``ServerConnection`` with.
"""
