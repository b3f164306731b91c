"""AMQP 0-9-1 on the wire (with RabbitMQ's extensions): generated method and property classes, the codec
of arguments, field tables and content headers, frames, the protocol header and a sans-IO frame reader.

PURE: no trio, no I/O, no other minibroker package (import-linter's layers in pyproject.toml).
"""
