"""``--trace-frames``: one readable line per frame, in and out, in the style of proton's PN_TRACE_FRM.

    [3]:0 <- @attach(18) [name="sender-1", handle=0, role=false, target=@target(41) [address="orders"]]
    [3]:0 -> @transfer(20) [handle=0, delivery-id=0, delivery-tag=b"\\x00..", settled=true] (256 bytes)

Credentials never appear: a SASL initial response is shown as its length only.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from minibroker.amqp.composite import Composite, DescribedSection
from minibroker.amqp.definitions import SaslInit, SaslResponse
from minibroker.amqp.types import Array, Described, Symbol


def format_value(value: Any) -> str:
    """A compact, readable rendering of an AMQP value."""
    if isinstance(value, Composite):
        name = value.DESCRIPTOR_NAME.split(":")[1]
        fields = []
        for spec in value.FIELDS:
            item = getattr(value, spec.name)
            if item is None:
                continue
            if isinstance(value, SaslInit | SaslResponse) and spec.type == "binary":
                fields.append(f"{spec.amqp_name}=<{len(item)} bytes hidden>")
                continue
            fields.append(f"{spec.amqp_name}={format_value(item)}")
        return f"@{name}({value.DESCRIPTOR_CODE}) [{', '.join(fields)}]"
    if isinstance(value, DescribedSection):
        name = value.DESCRIPTOR_NAME.split(":")[1]
        return f"@{name}({value.DESCRIPTOR_CODE}) {format_value(value.value)}"
    if isinstance(value, Described):
        return f"@{format_value(value.descriptor)} {format_value(value.value)}"
    if isinstance(value, Symbol):
        return f":{value}" if value.replace("-", "").replace(":", "").isalnum() else f':"{value}"'
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bytes):
        return "b" + repr(value)[1:] if len(value) <= 32 else f"<{len(value)} bytes>"
    if isinstance(value, Array):
        return "@<" + value.type + ">[" + ", ".join(format_value(v) for v in value.items) + "]"
    if isinstance(value, list):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{format_value(k)}={format_value(v)}" for k, v in value.items()) + "}"
    return str(value)


class FrameTracer:
    """Writes trace lines to a stream (stderr by default)."""

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out

    def bind(self, conn_id: int) -> Any:
        """The engine's ``trace`` callback for connection ``conn_id``."""

        def trace(direction: str, channel: int, performative: Any, payload: int) -> None:
            if performative is None:
                text = "(empty frame)"
            elif isinstance(performative, bytes):
                text = f"AMQP header {performative!r}"
            else:
                text = format_value(performative)
            if payload:
                text += f" ({payload} bytes)"
            out = self.out or sys.stderr
            print(f"[{conn_id}]:{channel} {direction} {text}", file=out, flush=True)

        return trace
