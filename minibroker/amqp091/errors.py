"""The package's two errors: who is at fault, and for the peer's faults the 0-9-1 reply code to close with."""

from __future__ import annotations

from minibroker.amqp091.definitions import HARD_ERRORS, ReplyCode


class ProtocolError(Exception):
    """The peer sent bytes that break AMQP 0-9-1; ``reply_code`` is the code of the close to answer with
    (``connection.close`` for the hard errors of §1.3, the spec's constants: 501 frame-error, 502
    syntax-error, 503 command-invalid, 505 unexpected-frame, ...). ``class_id`` and ``method_id`` name the
    method being read when the fault was found, 0 when none (the close's fields of the same names)."""

    def __init__(self, reply_code: ReplyCode, text: str, *, class_id: int = 0, method_id: int = 0) -> None:
        super().__init__(f"{reply_code.value} {reply_code.name}: {text}")
        self.reply_code = reply_code
        self.text = text
        self.class_id = class_id
        self.method_id = method_id

    @property
    def hard(self) -> bool:
        """Whether the answer is a connection close (else a channel close)."""
        return self.reply_code in HARD_ERRORS


class EncodeError(ValueError):
    """Our own code asked to encode a value its 0-9-1 type cannot hold (an octet of 256, a shortstr of more
    than 255 bytes, a table value of no field type): a programming error, never the peer's."""


class LocalProtocolError(RuntimeError):
    """Our own code asked the engine for something the connection's state does not allow (a login verdict
    nobody awaits, open-ok before connection.open): a programming error, never the peer's."""
