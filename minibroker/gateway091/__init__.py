"""AMQP 0-9-1 served through an in-process AMQP 1.0 connection to the broker core (issue 18).

PURE: no trio, no sockets, no clock. ``connection`` is the gateway (the wire of one 0-9-1 client), ``inner`` the
sans-IO 1.0 client it drives its inner ``ServerConnection`` with, ``convert`` maps messages between the two
protocols as RabbitMQ 4 does; ``publish``, ``consume`` and ``declare`` serve the 0-9-1 methods.
"""
