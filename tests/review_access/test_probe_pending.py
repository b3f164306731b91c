"""Probes: pending handshakes (issue 12 item 18; README: "past it, a new socket closes the oldest pending one ...
so sockets that connect and say nothing cannot lock real clients out: a real client finishes its handshake long
before hundreds of newer sockets push it out").

With a hashed password a real client's handshake lasts as long as its check (0.2-0.3 s of PBKDF2, longer when the
hash threads are busy): a socket flood of ~1000 connects/s (one client machine) pushes it out before its verdict.
The probe makes the window visible with a small ``max_pending_handshakes`` and a costlier hash.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from minibroker.amqp.definitions import SaslMechanisms, SaslOutcome
from minibroker.amqp.framing import SASL_FRAME
from minibroker.auth import hash_password
from minibroker.testing import frames
from minibroker.testing.thread import run_in_thread
from tests.server.test_access import HOST, NO_LIMITS, connect, count_checks  # noqa: F401 (a fixture)


def test_silent_sockets_do_not_push_out_a_login_whose_password_is_being_checked(
    count_checks: Callable[[], int],  # noqa: F811
) -> None:
    users = {"alice": hash_password("right", iterations=3_000_000)}  # ~1 s of PBKDF2
    config = {"server": {"port": 0, "max_pending_handshakes": 4}, "auth": {**NO_LIMITS, "users": users}}
    # a generous time for the verdict: on a loaded machine the ~1 s hash can take several (5 s timed out once)
    with run_in_thread(config) as running, connect(running, timeout=30.0) as peer:
        peer.send_header(b"AMQP\x03\x01\x00\x00")
        peer.expect_header()
        peer.expect_sasl(SaslMechanisms)
        peer.send(frames.sasl_plain("alice", "right"), frame_type=SASL_FRAME)
        deadline = time.monotonic() + 20.0
        while not count_checks():  # wait until the check is under way
            assert time.monotonic() < deadline, "the password check never started"
            time.sleep(0.01)
        silent = [socket.create_connection((HOST, running.port)) for _ in range(4)]
        try:
            outcome = peer.expect_sasl(SaslOutcome)
            assert outcome.code == 0
        finally:
            for sock in silent:
                sock.close()
