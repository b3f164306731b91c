"""Review of issue 17 item 1 (SAS keys in ``$cbs``), frame by frame: a token signed with a configured key is only
good for the resource it names (its ``sr``: the namespace, or an entity and what lies under it), as on Service Bus
(a shared access signature "grants access to the resource URI it was created for", MicrosoftDocs
service-bus-sas.md); and odd tokens get a 401, never a crash."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from azure.servicebus._pyamqp.utils import generate_sas_token

from minibroker.amqp import codec
from minibroker.amqp.definitions import Accepted, AmqpValue, ApplicationProperties, Properties
from minibroker.servicebus.cbs import check_token
from tests.servicebus.test_frames import _answers, _cbs_world

pytestmark = pytest.mark.timeout(30)
KEYS = {"RootManageSharedAccessKey": "k3y"}
AUDIENCE = "sb://127.0.0.1:5672/orders"


def _status(token: Any, audience: Any = AUDIENCE) -> tuple[int, str]:
    """The status-code and -description of ``$cbs``'s answer to a put-token of ``token`` for ``audience``."""
    w, p = _cbs_world("servicebus", sas_keys=KEYS)
    message_id = uuid.uuid4()
    application = {"operation": "put-token", "type": "servicebus.windows.net:sastoken", "expiration": 1_900_000_000}
    if audience is not None:
        application["name"] = audience
    request = (
        codec.encode(Properties(message_id=message_id))
        + codec.encode(ApplicationProperties(application))
        + codec.encode(AmqpValue(token))
    )
    delivery_id = p.transfer("cbs-req", request)
    w.settle()
    assert p.observed.answers[delivery_id][0] == Accepted()
    ((correlation, answer),) = _answers(p)
    assert correlation == message_id
    assert not p.observed.violations
    return answer["status-code"], str(answer["status-description"])


def _signed(resource: str, expiry: int = 1_900_000_000) -> str:
    return generate_sas_token(resource, "RootManageSharedAccessKey", "k3y", expiry)


@pytest.mark.parametrize(
    "resource",
    [
        AUDIENCE,
        "sb://127.0.0.1:5672/",
        "sb://127.0.0.1:5672",
        "sb://127.0.0.1:5672/ORDERS",
        "http://127.0.0.1:5672/orders",
    ],
)
def test_a_token_for_the_namespace_or_the_entity_is_accepted(resource: str) -> None:
    assert _status(_signed(resource))[0] == 202


@pytest.mark.parametrize(
    "resource", ["sb://127.0.0.1:5672/other", "sb://127.0.0.1:5672/ord", "sb://elsewhere:5672/orders"]
)
def test_a_token_for_another_resource_is_refused(resource: str) -> None:
    status, description = _status(_signed(resource))
    assert status == 401
    assert "audience" in description


def test_a_put_token_without_an_audience_is_refused() -> None:
    assert _status(_signed(AUDIENCE), audience=None)[0] == 401


@pytest.mark.parametrize(
    "token",
    [
        "SharedAccessSignature sr=x&se=1900000000&skn=RootManageSharedAccessKey",
        "SharedAccessSignature sr=x&sig=%%%%garbage==&se=1900000000&skn=RootManageSharedAccessKey",
        "SharedAccessSignature " + "sr=x&" * 2_000,
        "SharedAccessSignature sr=x&sig=y&se=99999999999999999999&skn=RootManageSharedAccessKey",
        "SharedAccessSignature sr=x&sig=y&se=-5&skn=RootManageSharedAccessKey",
        "",
        12345,
        None,
        ["SharedAccessSignature"],
        b"\xff\xfe",
    ],
    ids=["no-sig", "garbage-sig", "huge", "long-se", "negative-se", "empty", "int", "null", "list", "not-utf8"],
)
def test_malformed_tokens_are_401(token: Any) -> None:
    """Without sig, a signature not base64, many fields, an expiry too long or negative, no string: 401."""
    assert _status(token)[0] == 401


def test_a_far_future_token_is_accepted_and_a_past_one_refused() -> None:
    """(The expiry against the wall clock, in ``check_token``: the frame-level world's clock starts at 0.)"""
    now = 1_800_000_000.0
    assert check_token(_signed(AUDIENCE, 99_999_999_999), KEYS, now, AUDIENCE) is None
    assert check_token(_signed(AUDIENCE, 1_799_999_999), KEYS, now, AUDIENCE) == "the token has expired"
