"""Passwords for SASL PLAIN: stored plain or hashed (PBKDF2-SHA256), checked in constant time.

    minibroker hash-password          # reads a password, prints "pbkdf2_sha256$600000$<salt>$<hash>"

A configured password that starts with ``pbkdf2_sha256$`` is a hash; anything else is compared as is; an
empty one matches nothing (a user who logs in with a client certificate only, SASL EXTERNAL).

``PasswordBook`` checks the configured users so that the time taken does not tell whether a user exists;
``LoginThrottle`` limits failed logins per peer address and per user. Both are clock-free: the server passes
the time in, and runs ``PasswordBook.check`` (up to ~0.3 s of CPU) in a worker thread.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import sys
import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

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


def iterations_of(stored: str) -> int:
    """The PBKDF2 iteration count of a well-formed hash; 0 for a plain password."""
    return int(stored.split("$")[1]) if is_hashed(stored) and valid_hash(stored) else 0


class PasswordBook:
    """The configured users and their passwords (``[auth.users]``).

    ``check`` costs the same whether or not the user exists, whatever each user's hash: every check spends as
    many PBKDF2 iterations as the costliest configured hash. An unknown user, and a user whose password is
    empty (certificate only), is checked against a dummy hash of that cost; a user whose hash has fewer
    iterations (an older ``hash-password``), or whose password is plain, spends the missing ones on a padding
    hash. (With plain passwords only, nothing is hashed and every check is immediate.) Credentials that passed
    are remembered (as a digest, at most 1024 of them), so a client reconnecting with them is not made to wait
    for the hash again. ``check`` is safe to call from several threads at once.
    """

    def __init__(self, users: Mapping[str, str]) -> None:
        self.users = dict(users)
        iterations = max((iterations_of(stored) for stored in self.users.values()), default=0)
        self._dummy = (
            f"{SCHEME}${iterations}${secrets.token_hex(16)}${secrets.token_hex(32)}"
            if iterations
            else secrets.token_hex(16)
        )
        self._padding = {user: iterations - iterations_of(stored) for user, stored in self.users.items()}
        """PBKDF2 iterations each user's check spends on top of its own hash, to cost the costliest one."""
        self._pad_salt = secrets.token_bytes(16)
        self._verified: set[bytes] = set()
        self._lock = threading.Lock()

    def __contains__(self, user: object) -> bool:
        return user in self.users

    @staticmethod
    def _digest(user: str, password: str, stored: str) -> bytes:
        return hashlib.sha256(f"{user}\x00{password}\x00{stored}".encode()).digest()

    def remembered(self, user: str, password: str) -> bool:
        """Whether these credentials passed ``check`` before (cheap: answered without hashing)."""
        stored = self.users.get(user)
        return bool(stored) and self._digest(user, password, stored or "") in self._verified

    def check(self, user: str, password: str) -> bool:
        """Whether ``password`` is ``user``'s (slow for hashed passwords: call it off the event loop)."""
        stored = self.users.get(user)
        if not stored:  # unknown, or certificate only: as much work as for a known user, then no
            check_password(self._dummy, password)
            return False
        padding = self._padding.get(user, 0)
        if padding > 0:  # a cheaper hash, or a plain password: the costliest hash's time all the same
            hashlib.pbkdf2_hmac("sha256", password.encode("utf-8", "surrogatepass"), self._pad_salt, padding)
        if not check_password(stored, password):
            return False  # failures are never remembered
        with self._lock:
            if len(self._verified) < 1024:
                self._verified.add(self._digest(user, password, stored))
        return True


class FailureLimiter:
    """A token bucket of failed logins per key: ``limit`` failures at once, refilled at ``limit`` per ``window``
    seconds. ``limit`` 0 disables it.

    A login takes a token before its password is checked (so parallel attempts cannot all start before the
    first one fails) and gives it back when it succeeds, or when its check never ran; one that finds no token
    is refused without a check. At most ``max_keys`` keys are remembered: when a new key would pass that, full
    buckets are forgotten, then the least recently used, down to ``max_keys`` less a tenth. So the scan of all
    keys happens once per ``max_keys // 10`` new keys at most: O(1) per attempt, amortised, even when every
    attempt comes from a new address.
    """

    def __init__(self, limit: int, window: float, *, max_keys: int = 10_000) -> None:
        self.limit = limit
        self.rate = limit / window  # tokens per second (window > 0)
        self.max_keys = max_keys
        self._low_water = max_keys - max(1, max_keys // 10)
        """How many keys a prune leaves at most."""
        self._buckets: OrderedDict[Hashable, list[float]] = OrderedDict()  # key -> [tokens, time, refused]

    def _bucket(self, key: Hashable, now: float) -> list[float]:
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.max_keys:
                self._prune(now)  # before the new bucket goes in: it is full, and would be forgotten at once
            bucket = self._buckets[key] = [float(self.limit), now, 0.0]
        else:
            self._buckets.move_to_end(key)
            bucket[0] = min(float(self.limit), bucket[0] + (now - bucket[1]) * self.rate)
            bucket[1] = now
        return bucket

    def _prune(self, now: float) -> None:
        """Forget full buckets, then the least recently used, until at most ``_low_water`` keys are left (a
        batch, so that the next prune is ``max_keys // 10`` new keys away)."""
        rate, limit = self.rate, self.limit
        for key in [k for k, (tokens, then, _) in self._buckets.items() if tokens + (now - then) * rate >= limit]:
            del self._buckets[key]
        while len(self._buckets) > self._low_water:
            self._buckets.popitem(last=False)

    def take(self, key: Hashable, now: float) -> bool:
        """Take a token for one check; False (and one more refusal counted) when there is none."""
        if not self.limit:
            return True
        bucket = self._bucket(key, now)
        if bucket[0] >= 1:
            bucket[0] -= 1
            bucket[2] = 0
            return True
        bucket[2] += 1
        return False

    def give_back(self, key: Hashable, now: float) -> None:
        """The login succeeded: its token was not a failure."""
        if self.limit:
            bucket = self._bucket(key, now)
            bucket[0] = min(float(self.limit), bucket[0] + 1)

    def refused(self, key: Hashable) -> int:
        """Attempts refused in a row (since the last token was taken)."""
        bucket = self._buckets.get(key)
        return int(bucket[2]) if bucket is not None else 0


MAX_THROTTLE_DELAY = 30.0
"""Seconds at most that a throttled login waits for its answer (the handshake time-out may end it first)."""


@dataclass(frozen=True)
class Throttled:
    """A login refused without a check."""

    delay: float
    """Seconds to wait before answering it as failed."""
    by: str
    """"address" or "user": whose allowance is used up."""
    first: bool
    """The first refusal in a row for that address or user (worth a log line; the later ones are not)."""


class LoginThrottle:
    """Failed logins limited per peer address and per user (``auth.max_failures_per_address``, ``_per_user``,
    ``failure_window``), however many connections they come on.

    ``admit`` is asked before a password is checked. A throttled attempt is answered as failed without a
    check, after ``failure_delay``, doubled for each further attempt refused in a row (at most
    ``MAX_THROTTLE_DELAY``).
    """

    def __init__(self, per_address: int, per_user: int, window: float, failure_delay: float) -> None:
        self.addresses = FailureLimiter(per_address, window)
        self.users = FailureLimiter(per_user, window)
        self.failure_delay = failure_delay

    @staticmethod
    def _user_key(user: str) -> bytes:
        return hashlib.sha256(user.encode("utf-8", "surrogatepass")).digest()  # bounded, whatever its length

    def _throttled(self, limiter: FailureLimiter, key: Hashable, by: str) -> Throttled:
        refused = limiter.refused(key)
        delay = min(MAX_THROTTLE_DELAY, self.failure_delay * 2 ** min(refused - 1, 16))
        return Throttled(delay, by, refused == 1)

    def admit(self, address: str | None, user: str, now: float) -> Throttled | None:
        """None: check the password (a token of each bucket is taken). Else the attempt is to be answered as
        failed without a check."""
        if address is not None and not self.addresses.take(address, now):
            return self._throttled(self.addresses, address, "address")
        key = self._user_key(user)
        if not self.users.take(key, now):
            if address is not None:
                self.addresses.give_back(address, now)  # this address did not get a check
            return self._throttled(self.users, key, "user")
        return None

    def succeeded(self, address: str | None, user: str, now: float) -> None:
        """The checked password was right, or it was never checked (the login gave up while it waited for a hash
        thread): the tokens ``admit`` took are given back. Only wrong passwords count as failures."""
        if address is not None:
            self.addresses.give_back(address, now)
        self.users.give_back(self._user_key(user), now)


def main(argv: Sequence[str]) -> int:
    """``minibroker hash-password``: print a hash for the config file (password from stdin or a prompt)."""
    if argv:
        print("usage: minibroker hash-password  (reads the password from stdin or a prompt)", file=sys.stderr)
        return 2
    import getpass  # the hash-password command only: not at the broker's start (issue 19)

    password = getpass.getpass("password: ") if sys.stdin.isatty() else sys.stdin.readline().rstrip("\n")
    if not password:
        print("minibroker hash-password: empty password", file=sys.stderr)
        return 2
    print(hash_password(password))
    return 0
