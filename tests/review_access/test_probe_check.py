"""Probes: ``minibroker check`` with credentials (issue 12 item 20: "never print credentials"; README: "the URL is
shown with them masked").
"""

from __future__ import annotations

import socket
import threading

import pytest

from minibroker import health
from minibroker.amqp.definitions import SaslMechanisms
from minibroker.amqp.framing import SASL_FRAME, SASL_HEADER, encode_frame
from minibroker.amqp.types import Symbol


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# each piece of a password is distinctive (three characters or more): a one- or two-letter piece ("p", "ss") would
# be found in any message ("amqp", "password") whether or not the password is shown
@pytest.mark.parametrize("password", ["pa9/ss7", "p4q/a?s#s", "s3cr\\t/x9z"])
def test_check_never_prints_a_password_written_into_the_url_unencoded(
    password: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A password with a ``/`` typed into the URL as it is (not percent-encoded): the check fails (the URL does not
    parse), and what it prints must not hold the password."""
    url = f"amqp://alice:{password}@127.0.0.1:{unused_port()}"
    code = health.main(["--url", url, "--timeout", "0.2"], environ={})
    printed = capsys.readouterr()
    assert code != 0
    for secret in (password, password.split("/")[0], password.split("/")[-1]):
        assert secret not in printed.out + printed.err, f"{secret!r} printed: {printed.err.strip()}"


def test_check_does_not_send_credentials_in_clear_text_to_an_amqps_url() -> None:
    """``amqps://`` asks for TLS; the check speaks plain AMQP to it (and would send PLAIN credentials in clear text
    to whatever answers). It must do TLS, or refuse the scheme before connecting."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        server.settimeout(2)
        received = bytearray()

        def serve() -> None:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(1)
                try:
                    while chunk := conn.recv(4096):
                        received.extend(chunk)
                        if chunk.startswith(b"AMQP\x03"):
                            # answer as a plain AMQP broker offering PLAIN, to see what the check sends next
                            mechanisms = SaslMechanisms(sasl_server_mechanisms=[Symbol("PLAIN")])
                            conn.sendall(SASL_HEADER + encode_frame(0, mechanisms, frame_type=SASL_FRAME))
                except OSError:
                    pass

        thread = threading.Thread(target=serve)
        thread.start()
        health.main(["--url", f"amqps://alice:hunter2@127.0.0.1:{port}", "--timeout", "1"], environ={})
        thread.join()
    assert b"hunter2" not in received, "the password went out in clear text to an amqps:// URL"
