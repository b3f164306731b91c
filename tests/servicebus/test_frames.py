"""The ``servicebus`` personality frame by frame (the in-memory driver, no sockets): the ``$cbs`` node and entity
addresses given as URIs, against ``minibroker``'s own answers."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from azure.servicebus._pyamqp.utils import generate_sas_token

from minibroker.amqp import codec
from minibroker.amqp.definitions import (
    Accepted,
    AmqpValue,
    ApplicationProperties,
    Header,
    MessageAnnotations,
    Properties,
    Target,
    Transfer,
)
from minibroker.testing import frames
from tests.broker.txn_driver import Peer, World
from tests.personalities.harness import payload, peer, ready, world

pytestmark = pytest.mark.timeout(30)


def _put_token(
    message_id: uuid.UUID,
    reply_to: str | None = None,
    token: str = "SharedAccessSignature sr=x&sig=y&se=1&skn=RootManageSharedAccessKey",
) -> bytes:
    """A put-token request as azure-servicebus sends it (``_pyamqp/cbs.py`` ``CBSAuthenticator._put_token``)."""
    return (
        codec.encode(Properties(message_id=message_id, reply_to=reply_to))
        + codec.encode(
            ApplicationProperties(
                {
                    "name": "sb://127.0.0.1/orders",
                    "operation": "put-token",
                    "type": "servicebus.windows.net:sastoken",
                    "expiration": 1_900_000_000,
                }
            )
        )
        + codec.encode(AmqpValue(token))
    )


def _cbs_world(name: str, answer_address: str = "$cbs", **settings: Any) -> tuple[World, Peer]:
    """A peer with a request link to ``$cbs`` and an answer link from ``answer_address``, with credit."""
    w = world(name, **settings)
    p = peer(w)
    p.attach_producer("cbs-req", "$cbs")
    p.attach_consumer("cbs-resp", answer_address, presettled=False, default_outcome=None)
    w.settle()
    p.flow("cbs-resp", 10)
    w.settle()
    return w, p


def _answers(p: Peer) -> list[tuple[object, dict[object, object]]]:
    """(correlation-id, application-properties) of each message the peer received on ``cbs-resp``."""
    found = []
    for completed in p.observed.completed:
        if completed.link != "cbs-resp":
            continue
        properties, pos = codec.decode(completed.payload)
        application, _ = codec.decode(completed.payload, pos)
        assert isinstance(properties, Properties)
        assert isinstance(application, ApplicationProperties)
        found.append((properties.correlation_id, application.value))
    return found


def test_cbs_put_token_is_answered_202() -> None:
    """servicebus: a put-token to ``$cbs`` is accepted and answered on the answer link, correlated by message-id;
    minibroker: ``$cbs`` is an ordinary queue, the request sits on it."""
    message_id = uuid.uuid4()
    w, p = _cbs_world("servicebus")
    delivery_id = p.transfer("cbs-req", _put_token(message_id))
    w.settle()
    assert p.observed.answers[delivery_id][0] == Accepted()
    assert _answers(p) == [(message_id, {"status-code": 202, "status-description": "Accepted"})]
    assert ready(w, "$cbs") == []
    assert not p.observed.violations

    w, p = _cbs_world("minibroker")
    p.transfer("cbs-req", _put_token(message_id))
    w.settle()
    assert [c.link for c in p.observed.completed] == ["cbs-resp"]  # its own request, as a queue gives it back
    assert _answers(p) == [
        (
            None,
            {
                "name": "sb://127.0.0.1/orders",
                "operation": "put-token",
                "type": "servicebus.windows.net:sastoken",
                "expiration": 1_900_000_000,
            },
        )
    ]


def test_cbs_checks_tokens_against_configured_sas_keys() -> None:
    """With ``sas_keys``: a token the key signed, not expired, is answered 202; a wrong signature, an unknown key
    name, an expired token, a token of another kind, 401 (azure-servicebus: ServiceBusAuthenticationError). The
    request itself is accepted either way (the answer carries the verdict)."""
    audience = "sb://127.0.0.1/orders"
    tokens = [
        (generate_sas_token(audience, "RootManageSharedAccessKey", "k3y", 1_900_000_000), 202, "Accepted"),
        (generate_sas_token(audience, "RootManageSharedAccessKey", "nope", 1_900_000_000), 401, "signature"),
        (generate_sas_token(audience, "Other", "k3y", 1_900_000_000), 401, "no shared access key named 'Other'"),
        (generate_sas_token(audience, "RootManageSharedAccessKey", "k3y", -1), 401, "expiry"),
        ("Bearer eyJ0", 401, "not a shared access signature"),
    ]
    for token, status, words in tokens:  # (one request per connection, as azure-servicebus makes them)
        w, p = _cbs_world("servicebus", sas_keys={"RootManageSharedAccessKey": "k3y"})
        message_id = uuid.uuid4()
        delivery_id = p.transfer("cbs-req", _put_token(message_id, token=token))
        w.settle()
        assert p.observed.answers[delivery_id][0] == Accepted()
        ((correlation, application),) = _answers(p)
        assert (correlation, application["status-code"]) == (message_id, status)
        assert words in str(application["status-description"])
        assert not p.observed.violations


def test_cbs_answer_follows_reply_to() -> None:
    """A request naming ``reply-to`` (as the JS SDK sends it) is answered on the link whose target is that address."""
    message_id = uuid.uuid4()
    w = world("servicebus")
    p = peer(w)
    p.attach_producer("cbs-req", "$cbs")
    p.send(frames.attach_receiver("$cbs", p.new_handle("cbs-resp"), "cbs-resp", target=Target(address="cbs-client-1")))
    w.settle()
    p.flow("cbs-resp", 10)
    w.settle()
    p.transfer("cbs-req", _put_token(message_id, reply_to="cbs-client-1"))
    w.settle()
    assert _answers(p) == [(message_id, {"status-code": 202, "status-description": "Accepted"})]


def test_entity_uri_names_the_entity() -> None:
    """servicebus: ``amqps://host:port/orders`` (as the SDKs attach, even without TLS) is queue ``orders``;
    minibroker takes the whole URI as the name."""
    for name, expected in (("servicebus", ["m"]), ("minibroker", [])):
        w = world(name)
        p = peer(w)
        p.attach_producer("p", "amqps://127.0.0.1:5671/orders")
        w.settle()
        p.transfer("p", payload("m"))
        w.settle()
        assert ready(w, "orders") == expected, name


def test_delivery_is_stamped() -> None:
    """servicebus: a message sent without a message-id is delivered with one, a 16-octet delivery-tag, a header
    delivery-count and the Service Bus annotations; minibroker delivers the bytes as they came."""
    for name in ("servicebus", "minibroker"):
        w = world(name)
        p = peer(w)
        p.attach_producer("p", "orders")
        p.attach_consumer("c", "orders", presettled=False, default_outcome=None)
        w.settle()
        sent = payload("m")
        p.transfer("p", sent)
        p.flow("c", 1)
        w.settle()
        (completed,) = [c for c in p.observed.completed if c.link == "c"]
        (transfer,) = [f for f in p.observed.performatives if isinstance(f, Transfer)]
        if name == "minibroker":
            assert completed.payload == sent
            assert len(transfer.delivery_tag) == 8
            continue
        header, pos = codec.decode(completed.payload)
        annotations, pos = codec.decode(completed.payload, pos)
        properties, _ = codec.decode(completed.payload, pos)
        assert isinstance(header, Header)
        assert header.delivery_count == 0
        assert isinstance(annotations, MessageAnnotations)
        assert set(annotations.value) == {
            "x-opt-enqueued-time",
            "x-opt-sequence-number",
            "x-opt-locked-until",
            "x-opt-message-state",
        }
        assert annotations.value["x-opt-sequence-number"] == 1
        assert isinstance(properties, Properties)
        assert isinstance(properties.message_id, str)
        assert len(transfer.delivery_tag) == 16
