"""Which messages a Service Bus receiver may take, by their session (issue 17 item 8): the ``SessionGate`` a
receiver carries as its selector (``links.Consumer.selector``). Who holds which session is ``sessions.py``'s; this
module sits below ``links.py`` so that both may name the gate."""

from __future__ import annotations

from minibroker.broker.message import Message


def group_id(message: Message) -> str | None:
    """The session id of ``message``: its ``properties.group-id`` when that is a string."""
    properties = message.properties()
    found = properties.group_id if properties is not None else None
    return found if isinstance(found, str) else None


class SessionGate:
    """The selector of a Service Bus receiver: the messages of one session (``session_id``), or, with None, the
    messages of no session."""

    __slots__ = ("session_id",)

    def __init__(self, session_id: str | None) -> None:
        self.session_id = session_id

    def admits(self, message: Message) -> bool:
        return group_id(message) == self.session_id

    def __repr__(self) -> str:
        return f"SessionGate({self.session_id!r})"
