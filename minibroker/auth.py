"""Passwords for SASL PLAIN: stored plain or hashed (PBKDF2-SHA256), checked in constant time.

    minibroker hash-password          # reads a password, prints "pbkdf2_sha256$600000$<salt>$<hash>"

A configured password that starts with ``pbkdf2_sha256$`` is a hash; anything else is compared as is.
"""

from __future__ import annotations

import getpass
import hashlib
import hmac
import secrets
import sys
from collections.abc import Sequence

SCHEME = "pbkdf2_sha256"
ITERATIONS = 600_000


def hash_password(password: str, *, iterations: int = ITERATIONS, salt: bytes | None = None) -> str:
    """A storable hash of ``password``."""
    salt = salt if salt is not None else secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations)
    return f"{SCHEME}${iterations}${salt.hex()}${digest.hex()}"


def is_hashed(stored: str) -> bool:
    return stored.startswith(SCHEME + "$")


def check_password(stored: str, password: str) -> bool:
    """Whether ``password`` matches ``stored`` (a hash from ``hash_password`` or a plain password)."""
    if not is_hashed(stored):
        return hmac.compare_digest(stored.encode("utf-8"), password.encode("utf-8"))
    try:
        _scheme, iterations, salt, digest = stored.split("$")
        expected = bytes.fromhex(digest)
        actual = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), bytes.fromhex(salt), int(iterations))
    except ValueError:
        return False
    return hmac.compare_digest(expected, actual)


def valid_hash(stored: str) -> bool:
    """Whether a stored value that claims to be a hash is well formed."""
    parts = stored.split("$")
    if len(parts) != 4 or parts[0] != SCHEME:
        return False
    try:
        return int(parts[1]) > 0 and bool(bytes.fromhex(parts[2])) and len(bytes.fromhex(parts[3])) == 32
    except ValueError:
        return False


def main(argv: Sequence[str]) -> int:
    """``minibroker hash-password``: print a hash for the config file (password from stdin or a prompt)."""
    if argv:
        print("usage: minibroker hash-password  (reads the password from stdin or a prompt)", file=sys.stderr)
        return 2
    password = getpass.getpass("password: ") if sys.stdin.isatty() else sys.stdin.readline().rstrip("\n")
    if not password:
        print("minibroker hash-password: empty password", file=sys.stderr)
        return 2
    print(hash_password(password))
    return 0
