"""Who may call the management API: HTTP Basic credentials of a configured user, and ``manage`` to change things.

Passwords are checked by the same checker as SASL PLAIN (``verify``: the server's ``LoginChecker``, hashing in
worker threads, failed attempts throttled per address and per user), and a failure waits as long as a failed
SASL login does. Credentials are never logged. A user with no ``[auth.permissions]`` entry may do everything;
one with an entry may POST or DELETE only with ``manage = true``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable, Mapping

import trio

from minibroker.broker.permissions import Permissions
from minibroker.http.server import Request, Response

Verify = Callable[[str, str, str | None], Awaitable[tuple[bool, float]]]
"""``(user, password, peer address) -> (whether they are right, seconds to wait before answering)``."""

CHALLENGE = (("www-authenticate", 'Basic realm="minibroker"'),)
MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def credentials(request: Request) -> tuple[str, str] | None:
    """The user and password of a Basic ``Authorization`` header, or None when there is none readable."""
    header = request.header("authorization")
    if header is None:
        return None
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, colon, password = decoded.partition(":")
    return (user, password) if colon else None


async def authorize(request: Request, verify: Verify | None, permissions: Mapping[str, Permissions]) -> Response | None:
    """None when the request may go on; else the answer: 401 (no or wrong credentials) or 403 (not ``manage``)."""
    given = credentials(request)
    if given is None or verify is None:
        return Response.error(401, "credentials required (HTTP Basic)", CHALLENGE)
    user, password = given
    ok, delay = await verify(user, password, request.peer)
    if not ok:
        await trio.sleep(delay)
        return Response.error(401, "wrong user or password", CHALLENGE)
    allowed = permissions.get(user)
    if request.method in MUTATING and allowed is not None and not allowed.manage:
        return Response.error(403, f"user {user!r} may not manage the broker (manage = false)")
    return None
