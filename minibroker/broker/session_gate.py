"""Which messages a Service Bus receiver may take, by their session (issue 17 item 8): the ``SessionGate`` a
receiver carries as its selector (``links.Consumer.selector``). Who holds which session is ``sessions.py``'s; this
module sits below ``links.py`` so that both may name the gate."""

from __future__ import annotations

from minibroker.broker.message import Message
from minibroker.servicebus.sessions import session_key


def group_id(message: Message) -> str | None:
    """The session id of ``message``: its ``properties.group-id`` when that is a string."""
    properties = message.properties()
    found = properties.group_id if properties is not None else None
    return found if isinstance(found, str) else None


class SessionGate:
    """The selector of a Service Bus receiver: the messages of one session (``session_id``), or, with None, the
    messages of no session. Session ids are compared without regard to case (``session_key``)."""

    __slots__ = ("key", "session_id")

    def __init__(self, session_id: str | None) -> None:
        self.session_id = session_id
        self.key = session_key(session_id) if session_id is not None else None

    def admits(self, message: Message) -> bool:
        found = group_id(message)
        return found is None if self.key is None else found is not None and session_key(found) == self.key

    def __repr__(self) -> str:
        return f"SessionGate({self.session_id!r})"
