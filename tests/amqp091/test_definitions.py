"""The generated 0-9-1 definitions are the specification's.

Proves: (a) ``minibroker/amqp091/definitions.py`` is exactly what ``tools/gen_amqp091.py`` makes of
``spec-0-9-1/``; (b) ``spec-0-9-1/`` is, byte for byte, RabbitMQ's extended specification XML (its SHA-256
pinned here); (c) an independent reading of the XML finds one class per method with the same ids, names and
fields in order, RabbitMQ's extensions included, and the reply codes are the spec's constants.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from minibroker.amqp091 import definitions as d
from minibroker.amqp091.base import Method

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "spec-0-9-1" / "amqp0-9-1.stripped.extended.xml"
SPEC_SHA256 = "1eeea0eb7e4eacb9716b160fc1d09aff2a33021f6f64541cc9215b8fef0b32fa"
XML = ET.parse(SPEC).getroot()
XML_METHODS = [(c, m) for c in XML.iter("class") for m in c.iter("method")]


def test_definitions_are_generated_from_the_spec() -> None:
    loader = importlib.util.spec_from_file_location("gen_amqp091", ROOT / "tools/gen_amqp091.py")
    assert loader is not None
    assert loader.loader is not None
    generator = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(generator)
    committed = (ROOT / "minibroker/amqp091/definitions.py").read_text()
    assert generator.generate(SPEC) == committed, "python tools/gen_amqp091.py > minibroker/amqp091/definitions.py"


def test_spec_is_the_specification_verbatim() -> None:
    assert sorted(p.name for p in SPEC.parent.iterdir()) == [SPEC.name]
    assert hashlib.sha256(SPEC.read_bytes()).hexdigest() == SPEC_SHA256


def test_xml_reading_finds_every_method() -> None:
    # guards the reading below: 7 classes, 60 methods with RabbitMQ's
    # extensions, one class (basic) with 14 content properties
    assert len(XML_METHODS) == len(d.METHODS) == 60
    assert {c.get("name") for c, _ in XML_METHODS} == {
        "connection",
        "channel",
        "exchange",
        "queue",
        "basic",
        "tx",
        "confirm",
    }


def python_name(name: str) -> str:
    return "global_" if name == "global" else name.replace("-", "_")


@pytest.mark.parametrize(
    ("cls_xml", "method_xml"), XML_METHODS, ids=[f"{c.get('name')}.{m.get('name')}" for c, m in XML_METHODS]
)
def test_class_matches_the_xml(cls_xml: ET.Element, method_xml: ET.Element) -> None:
    cls = d.METHODS[int(cls_xml.get("index", "")), int(method_xml.get("index", ""))]
    assert f"{cls_xml.get('name')}.{method_xml.get('name')}" == cls.NAME
    assert (method_xml.get("content") == "1") == cls.CONTENT
    assert (method_xml.get("synchronous") == "1") == cls.SYNCHRONOUS
    assert [name for name, _ in cls.FIELDS] == [python_name(f.get("name", "")) for f in method_xml.findall("field")]
    assert [f.name for f in dataclasses.fields(cls)] == [name for name, _ in cls.FIELDS]
    assert dataclasses.is_dataclass(cls)
    assert cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
    assert "__slots__" in cls.__dict__
    for name, _ in cls.FIELDS:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(cls(), name, None)


@pytest.mark.parametrize(
    ("cls", "ids", "fields"),
    [
        (d.ConfirmSelect, (85, 10), (("nowait", "bit"),)),
        (d.BasicNack, (60, 120), (("delivery_tag", "longlong"), ("multiple", "bit"), ("requeue", "bit"))),
        (d.ExchangeBind, (40, 30), None),
        (d.ExchangeUnbindOk, (40, 51), ()),
        (d.BasicQos, (60, 10), (("prefetch_size", "long"), ("prefetch_count", "short"), ("global_", "bit"))),
        (
            d.ConnectionStartOk,
            (10, 11),
            (
                ("client_properties", "table"),
                ("mechanism", "shortstr"),
                ("response", "longstr"),
                ("locale", "shortstr"),
            ),
        ),
    ],
)
def test_rabbitmq_extensions_and_domains(
    cls: type[Method], ids: tuple[int, int], fields: tuple[tuple[str, str], ...] | None
) -> None:
    assert ids == (cls.CLASS_ID, cls.METHOD_ID)
    if fields is not None:
        assert fields == cls.FIELDS


def test_basic_properties_in_flag_order() -> None:
    assert [name for name, _ in d.BasicProperties.PROPERTIES] == [
        "content_type", "content_encoding", "headers", "delivery_mode", "priority", "correlation_id", "reply_to",
        "expiration", "message_id", "timestamp", "type", "user_id", "app_id", "reserved",
    ]  # fmt: skip
    assert dict(d.BasicProperties.PROPERTIES)["timestamp"] == "timestamp"
    assert {60: d.BasicProperties} == d.PROPERTIES


def test_reply_codes_are_the_spec_constants() -> None:
    constants = {c.get("name", "").replace("-", "_").upper(): int(c.get("value", "")) for c in XML.iter("constant")}
    for code in d.ReplyCode:
        assert constants[code.name] == code.value
    assert (d.ReplyCode.FRAME_ERROR, d.ReplyCode.SYNTAX_ERROR, d.ReplyCode.COMMAND_INVALID) == (501, 502, 503)
    assert d.ReplyCode.UNEXPECTED_FRAME == 505
    assert (d.FRAME_END, d.FRAME_MIN_SIZE, d.FRAME_HEARTBEAT) == (0xCE, 4096, 8)
    assert d.ReplyCode.NOT_FOUND not in d.HARD_ERRORS
    assert d.ReplyCode.FRAME_ERROR in d.HARD_ERRORS
