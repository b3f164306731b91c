"""Generate ``minibroker/amqp091/definitions.py`` from RabbitMQ's extended AMQP 0-9-1 XML.

Usage: python tools/gen_amqp091.py [SPEC_XML] > minibroker/amqp091/definitions.py

SPEC_XML defaults to ``spec-0-9-1/amqp0-9-1.stripped.extended.xml`` in the project (a verbatim copy of
../shared/specs/amqp-0-9-1). ``tests/amqp091/test_definitions.py`` re-runs this generator and fails if the
committed file differs, so class ids, method ids, field orders and types in the code are the specification's.
"""

from __future__ import annotations

import keyword
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

DEFAULTS = {
    "bit": ("bool", "False"),
    "octet": ("int", "0"),
    "short": ("int", "0"),
    "long": ("int", "0"),
    "longlong": ("int", "0"),
    "timestamp": ("int", "0"),
    "shortstr": ("str", '""'),
    "longstr": ("bytes", 'b""'),
    "table": ("dict[str, Any]", "field(default_factory=dict)"),
}
PROPERTY_TYPES = {name: f"{py} | None" for name, (py, _) in DEFAULTS.items()}


def camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("-"))


def snake(name: str) -> str:
    name = name.replace("-", "_")
    return f"{name}_" if keyword.iskeyword(name) else name


def generate(spec_xml: Path) -> str:
    root = ET.parse(spec_xml).getroot()
    domains = {d.get("name", ""): d.get("type", "") for d in root.iter("domain")}

    def wire_type(f: ET.Element) -> str:
        name = f.get("domain") or f.get("type") or ""
        while domains.get(name, name) != name:
            name = domains[name]
        if name not in DEFAULTS:
            raise SystemExit(f"unknown type {name} of field {f.get('name')}")
        return name

    version = f"{root.get('major')}-{root.get('minor')}-{root.get('revision')}"
    out = [
        f'"""AMQP {version} classes, methods, content properties and constants, generated from RabbitMQ\'s',
        "extended specification XML (``spec-0-9-1/amqp0-9-1.stripped.extended.xml``).",
        "",
        "Do not edit: run ``python tools/gen_amqp091.py > minibroker/amqp091/definitions.py``.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from dataclasses import dataclass, field",
        "from enum import IntEnum",
        "from typing import Any, ClassVar",
        "",
        "from minibroker.amqp091.base import Method, Properties",
        "",
        f"PORT = {root.get('port')}",
    ]
    codes = []
    for c in root.iter("constant"):
        if c.get("class") is None and c.get("name") != "reply-success":
            out.append(f"{snake(c.get('name', '')).upper()} = {c.get('value')}")
        else:
            codes.append(c)
    out += [
        "",
        "",
        "class ReplyCode(IntEnum):",
        '    """Reply codes (``<constant>`` with a class, and reply-success)."""',
        "",
    ]
    for c in codes:
        kind = c.get("class") or "success"
        out.append(f"    {snake(c.get('name', '')).upper()} = {c.get('value')}  # {kind}")
    out += ["", "", "HARD_ERRORS = frozenset({"]
    out += [f"    ReplyCode.{snake(c.get('name', '')).upper()}," for c in codes if c.get("class") == "hard-error"]
    out += ["})", '"""Codes that close the connection; the other error codes close only the channel."""', ""]

    methods, properties = [], []
    for cls in root.iter("class"):
        cname, cid = cls.get("name", ""), int(cls.get("index", ""))
        props = cls.findall("field")
        if len(props) > 15 or any(wire_type(p) == "bit" for p in props):
            # the codec writes one flag word and no bit properties (none in 0-9-1): refuse what it cannot write
            raise SystemExit(f"class {cname}: more than 15 properties, or a bit property")
        if props:
            pyname = f"{camel(cname)}Properties"
            properties.append(pyname)
            out += ["", "@dataclass(frozen=True, slots=True)", f"class {pyname}(Properties):"]
            out += [f'    """Content properties of class {cname} ({cid}), in property-flag order."""', ""]
            out += [f"    CLASS_ID: ClassVar[int] = {cid}", "    PROPERTIES: ClassVar[tuple[tuple[str, str], ...]] = ("]
            out += [f"        ({snake(p.get('name', ''))!r}, {wire_type(p)!r})," for p in props]
            out += ["    )", ""]
            out += [f"    {snake(p.get('name', ''))}: {PROPERTY_TYPES[wire_type(p)]} = None" for p in props]
            out.append("")
        for m in cls.iter("method"):
            mname, mid = m.get("name", ""), int(m.get("index", ""))
            pyname = f"{camel(cname)}{camel(mname)}"
            methods.append(pyname)
            fields = m.findall("field")
            responses = tuple(f"{cname}.{r.get('name')}" for r in m.findall("response"))
            notes = [n for n, v in (("synchronous", m.get("synchronous")), ("content", m.get("content"))) if v == "1"]
            if m.get("deprecated") == "1":
                notes.append("deprecated")
            doc = f"{cname}.{mname} ({cid}, {mid})" + (f": {', '.join(notes)}" if notes else "")
            out += ["", "@dataclass(frozen=True, slots=True)", f"class {pyname}(Method):", f'    """{doc}."""', ""]
            out += [
                f"    CLASS_ID: ClassVar[int] = {cid}",
                f"    METHOD_ID: ClassVar[int] = {mid}",
                f'    NAME: ClassVar[str] = "{cname}.{mname}"',
                f"    SYNCHRONOUS: ClassVar[bool] = {m.get('synchronous') == '1'}",
                f"    CONTENT: ClassVar[bool] = {m.get('content') == '1'}",
                f"    RESPONSES: ClassVar[tuple[str, ...]] = {responses!r}",
            ]
            if fields:
                out.append("    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = (")
                out += [f"        ({snake(f.get('name', ''))!r}, {wire_type(f)!r})," for f in fields]
                out += ["    )", ""]
                for f in fields:
                    py, default = DEFAULTS[wire_type(f)]
                    out.append(f"    {snake(f.get('name', ''))}: {py} = {default}")
            else:
                out.append("    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = ()")
            out.append("")
    out += ["", "METHODS: dict[tuple[int, int], type[Method]] = {"]
    out += [f"    ({n}.CLASS_ID, {n}.METHOD_ID): {n}," for n in methods]
    out += ["}", '"""Every method by (class-id, method-id)."""', "", "PROPERTIES: dict[int, type[Properties]] = {"]
    out += [f"    {n}.CLASS_ID: {n}," for n in properties]
    out += ["}", '"""The content properties of each class that carries content, by class-id."""', ""]
    return "\n".join(out)


if __name__ == "__main__":
    root = Path(__file__).resolve().parent.parent
    spec = Path(sys.argv[1]) if len(sys.argv) > 1 else root / "spec-0-9-1" / "amqp0-9-1.stripped.extended.xml"
    sys.stdout.write(generate(spec))
