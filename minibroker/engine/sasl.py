"""SASL negotiation, server side (Part 5 §5.3).

The server offers its mechanisms, takes one ``sasl-init``, and answers ``sasl-outcome``. Checking a
password is the embedder's decision, so this module stays pure: either handed in as a quick
``authenticate(user, password) -> bool``, or, with ``deferred``, taken out of the engine and answered later
with a verdict (the server hashes passwords in a worker thread, never on its event loop). Passwords are
never put in an exception, an event or a trace.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from minibroker.amqp.definitions import SaslInit

ANONYMOUS = "ANONYMOUS"
PLAIN = "PLAIN"
EXTERNAL = "EXTERNAL"

SASL_OK = 0  # §5.3.3.6 sasl-code
SASL_AUTH = 1
SASL_SYS_PERM = 3


def _accept_anyone(user: str, password: str) -> bool:
    return True


def _any_identity(identity: str) -> bool:
    return True


@dataclass(frozen=True)
class SaslPolicy:
    """Which mechanisms are offered and how PLAIN credentials are checked."""

    anonymous: bool = True
    plain: bool = True
    required: bool = False
    """A peer that skips SASL is refused (true whenever users are configured)."""
    authenticate: Callable[[str, str], bool] = field(default=_accept_anyone, repr=False)

    external: bool = False
    """Offer EXTERNAL when the TLS layer authenticated the peer with a client certificate."""
    external_accepts: Callable[[str], bool] = field(default=_any_identity, repr=False)
    """Which certificate identities may log in with EXTERNAL; EXTERNAL is not offered to the others."""
    deferred: bool = False
    """PLAIN credentials are not checked by ``authenticate``: the engine reports ``CredentialsReceived`` and
    waits for the embedder's ``sasl_verdict`` (a slow check must not block whoever drives the engine)."""

    @property
    def mechanisms(self) -> list[str]:
        """Mechanisms in the order we offer them (without EXTERNAL, which needs a certificate)."""
        return [m for m, on in ((PLAIN, self.plain), (ANONYMOUS, self.anonymous)) if on]

    def mechanisms_for(self, external_identity: str | None) -> list[str]:
        """Mechanisms offered to a peer, EXTERNAL first when it presented a certificate."""
        offer = self.external and external_identity and self.external_accepts(external_identity)
        return ([EXTERNAL] if offer else []) + self.mechanisms


def parse_plain(response: bytes) -> tuple[str, str] | None:
    """Split a PLAIN initial response (RFC 4616: authzid NUL authcid NUL passwd) into user and password."""
    parts = response.split(b"\x00")
    if len(parts) != 3:
        return None
    try:
        return parts[1].decode("utf-8"), parts[2].decode("utf-8")
    except UnicodeDecodeError:
        return None


def deferred_credentials(
    policy: SaslPolicy, init: SaslInit, external_identity: str | None = None
) -> tuple[str, str] | None:
    """The user and password of a ``sasl-init`` whose verdict is the embedder's to give later, or None when
    ``outcome_for`` decides it at once (another mechanism, no deferral, or a malformed response)."""
    if not policy.deferred or str(init.mechanism) != PLAIN or PLAIN not in policy.mechanisms:
        return None
    return parse_plain(init.initial_response or b"")


def outcome_for(policy: SaslPolicy, init: SaslInit, external_identity: str | None = None) -> tuple[int, str | None]:
    """Decide a ``sasl-init``: the sasl-code to answer, and the authenticated user (None if anonymous)."""
    mechanism = str(init.mechanism)
    if mechanism not in policy.mechanisms_for(external_identity):
        return SASL_AUTH, None
    if mechanism == EXTERNAL:
        return SASL_OK, external_identity
    if mechanism == ANONYMOUS:
        return SASL_OK, None
    credentials = parse_plain(init.initial_response or b"")
    if credentials is None:
        return SASL_AUTH, None
    user, password = credentials
    if not policy.authenticate(user, password):
        return SASL_AUTH, None
    return SASL_OK, user
