"""Per-user permissions on address patterns (``[auth.permissions.USER]``).

Patterns are shell-style (``orders.*``, ``*``), matched against the node address a link attaches to. A user
without an entry may do everything (management included), so configuring users alone only adds authentication;
a user with an entry may use the HTTP management API to change things only with ``manage = true``. A refused attach
gets ``amqp:unauthorized-access``.

A dynamic node (a terminus asking the broker for a node with a generated address, ``dynamic.<connection>.<hex>``,
as request/reply clients do for their reply queue) is matched by that generated address: a dynamic source
needs ``receive``, a dynamic target ``send``. Grant ``dynamic.*`` to a user with permissions who needs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase


@dataclass(frozen=True)
class Permissions:
    """What one user may do."""

    send: tuple[str, ...] = ("*",)
    """Address patterns the user may attach sender links to (publish)."""
    receive: tuple[str, ...] = ("*",)
    """Address patterns the user may attach receiver links to (consume, browse, subscribe)."""
    transactions: bool = True
    """Whether the user may attach a transaction coordinator."""
    manage: bool = False
    """Whether the user may change the broker through the HTTP management API (POST and DELETE calls); a user
    with no permissions entry may."""

    def may_send(self, address: str) -> bool:
        return any(fnmatchcase(address, pattern) for pattern in self.send)

    def may_receive(self, address: str) -> bool:
        return any(fnmatchcase(address, pattern) for pattern in self.receive)
