"""The ``$cbs`` node: claims-based security put-token (issue 17 item 1).

The Python SDK (``_pyamqp/cbs.py`` ``CBSAuthenticator._put_token``, through ``_pyamqp/management_link.py``
``ManagementLink``) attaches a sender link to ``$cbs`` and a receiver link from it, sends a request whose
``message-id`` is a uuid and whose application-properties are ``operation`` = ``put-token``, ``type``, ``name``
(the audience) and ``expiration``, and matches the answer by ``properties.correlation-id`` (field 5), reading
``status-code`` and ``status-description`` (``CBSAuthenticator.__init__`` passes those field names). The JS
SDK sets ``reply-to``: the answer is addressed to it. Any token is accepted, unless SAS keys are configured
(``[servicebus] sas_keys``): then the token must be a shared access signature one of them signed, not expired
(``check_token``), else the answer is 401, which azure-servicebus turns into ``ServiceBusAuthenticationError``
(``_pyamqp/management_link.py``: a status outside 200-299 is ``FAILED_BAD_STATUS``; ``_pyamqp/cbs.py``
``CBSAuthenticator._on_execute_operation_complete`` and ``handle_token`` raise ``TokenAuthFailure``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote_plus

from minibroker.amqp import codec
from minibroker.amqp.definitions import AmqpValue, ApplicationProperties, Properties
from minibroker.amqp.sections import AMQP_VALUE, APPLICATION_PROPERTIES, PROPERTIES, walk
from minibroker.amqp.types import DecodeError, Int

ACCEPTED = 202
BAD_REQUEST = 400
UNAUTHORIZED = 401
SAS_PREFIX = "SharedAccessSignature "


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


def token_of(payload: bytes) -> Any:
    """The token a put-token carries: its amqp-value body (None when it has none or it does not decode)."""
    try:
        for section in walk(payload):
            if section.code == AMQP_VALUE:
                found = codec.decode(payload, section.start)[0]
                return found.value if isinstance(found, AmqpValue) else None
    except (DecodeError, IndexError):
        pass
    return None


def check_token(token: Any, keys: Mapping[str, str], now: float, audience: Any) -> str | None:
    """None when ``token`` is a shared access signature signed with one of ``keys`` (by key name) that has not
    expired at ``now`` (wall-clock seconds) and is for ``audience`` (the put-token's ``name``); else why not.

    The token as azure-servicebus builds it (``_pyamqp/utils.py`` ``generate_sas_token``, called by
    ``_base_handler.py`` ``_generate_sas_token``): ``SharedAccessSignature sr=URI&sig=SIG&se=EXPIRY&skn=NAME``,
    URL-encoded, where ``SIG`` is the base64 HMAC-SHA256, under the key, of ``URI + "\\n" + EXPIRY`` with URI as it
    stands (encoded) in the token; the JS SDK signs the same string. The fields may come in any order.
    """
    if isinstance(token, bytes):
        try:
            token = token.decode("utf-8")
        except UnicodeDecodeError:
            return "the token is not UTF-8"
    if not isinstance(token, str) or not token.startswith(SAS_PREFIX):
        return "not a shared access signature token"
    raw: dict[str, str] = {}
    for part in token[len(SAS_PREFIX) :].split("&"):
        name, sep, value = part.partition("=")
        if not sep or name in raw:
            return "a malformed shared access signature token"
        raw[name] = value
    if not {"sr", "sig", "se", "skn"} <= raw.keys():
        return "the token lacks one of sr, sig, se, skn"
    key_name = unquote_plus(raw["skn"])
    key = keys.get(key_name)
    if key is None:
        return f"no shared access key named {key_name!r}"
    expiry = raw["se"]
    if not expiry.isascii() or not expiry.isdigit() or len(expiry) > 12:
        return "the token's expiry (se) is not a number of seconds"
    signed = hmac.new(key.encode("utf-8"), f"{raw['sr']}\n{expiry}".encode(), hashlib.sha256).digest()
    if not hmac.compare_digest(base64.b64encode(signed), unquote_plus(raw["sig"]).encode("utf-8", "replace")):
        return "the token's signature does not match the key"
    if int(expiry) <= now:
        return "the token has expired"
    if not isinstance(audience, str) or not _covers(unquote_plus(raw["sr"]), audience):
        return f"the token's resource (sr) is not the audience (name) {audience!r} or above it"
    return None


def _covers(resource: str, audience: str) -> bool:
    """Whether a token for ``resource`` grants ``audience``: the same URI or one under it (a namespace's token
    grants its entities; MicrosoftDocs service-bus-sas.md "the resource URI ... to which access is claimed"),
    without regard to the scheme (``sb://``, ``http://``) or case, as Service Bus names are."""

    def bare(uri: str) -> str:
        return uri.partition("://")[2].lower().rstrip("/")

    granted, wanted = bare(resource), bare(audience)
    return bool(granted) and (wanted == granted or wanted.startswith(granted + "/"))


def answer(payload: bytes, keys: Mapping[str, str] | None = None, now: float = 0.0) -> tuple[Request, bytes]:
    """The request in ``payload`` and its answer: for a put-token 202, or 401 when ``keys`` are given and its token
    fails ``check_token`` at ``now`` (wall-clock seconds); 400 for another operation."""
    request = read_request(payload)
    if request.operation == "put-token":
        audience = request.application_properties.get("name")
        refused = check_token(token_of(payload), keys, now, audience) if keys else None
        if refused is not None:
            return request, response(request, UNAUTHORIZED, f"Unauthorized: {refused}")
        return request, response(request, ACCEPTED, "Accepted")
    return request, response(request, BAD_REQUEST, f"unknown $cbs operation {request.operation!r}")
