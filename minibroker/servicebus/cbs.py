"""The ``$cbs`` node: claims-based security put-token (issue 17 item 1).

The Python SDK (``_pyamqp/cbs.py`` ``CBSAuthenticator._put_token``, through ``_pyamqp/management_link.py``
``ManagementLink``) attaches a sender link to ``$cbs`` and a receiver link from it, sends a request whose
``message-id`` is a uuid and whose application-properties are ``operation`` = ``put-token``, ``type``, ``name``
(the audience) and ``expiration``, and matches the answer by ``properties.correlation-id`` (field 5), reading
``status-code`` and ``status-description`` (``CBSAuthenticator.__init__`` passes those field names). The JS
SDK sets ``reply-to``: the answer is addressed to it. Any token is accepted.
"""

from __future__ import annotations

from typing import Any

from minibroker.amqp import codec
from minibroker.amqp.definitions import AmqpValue, ApplicationProperties, Properties
from minibroker.amqp.sections import APPLICATION_PROPERTIES, PROPERTIES, walk
from minibroker.amqp.types import DecodeError, Int

ACCEPTED = 202
BAD_REQUEST = 400


class Request:
    """What the broker reads of a request to ``$cbs``."""

    __slots__ = ("application_properties", "message_id", "reply_to")

    def __init__(self, message_id: Any, reply_to: Any, application_properties: dict[Any, Any]) -> None:
        self.message_id = message_id
        self.reply_to = reply_to
        self.application_properties = application_properties

    @property
    def operation(self) -> Any:
        return self.application_properties.get("operation")


def read_request(payload: bytes) -> Request:
    """The properties and application-properties of a request (absent ones: None and empty)."""
    properties: Properties | None = None
    application: dict[Any, Any] = {}
    try:
        for section in walk(payload, last=APPLICATION_PROPERTIES):
            if section.code == PROPERTIES:
                found = codec.decode(payload, section.start)[0]
                properties = found if isinstance(found, Properties) else None
            elif section.code == APPLICATION_PROPERTIES:
                found = codec.decode(payload, section.start)[0]
                if isinstance(found, ApplicationProperties) and isinstance(found.value, dict):
                    application = found.value
    except (DecodeError, IndexError):
        pass
    if properties is None:
        return Request(None, None, application)
    return Request(properties.message_id, properties.reply_to, application)


def response(request: Request, status: int, description: str) -> bytes:
    """The answer to ``request``: correlation-id its message-id, to its reply-to, ``status-code`` and
    ``status-description`` as application-properties, an empty body."""
    properties = Properties(correlation_id=request.message_id, to=request.reply_to)
    application = ApplicationProperties({"status-code": Int(status), "status-description": description})
    return codec.encode(properties) + codec.encode(application) + codec.encode(AmqpValue(None))


def answer(payload: bytes) -> tuple[Request, bytes]:
    """The request in ``payload`` and its answer: 202 for a put-token (any token), 400 for another operation."""
    request = read_request(payload)
    if request.operation == "put-token":
        return request, response(request, ACCEPTED, "Accepted")
    return request, response(request, BAD_REQUEST, f"unknown $cbs operation {request.operation!r}")
