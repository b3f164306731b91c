"""Generate ``minibroker/amqp/definitions.py`` from the AMQP 1.0 XML type definitions.

Usage: python tools/gen_definitions.py [SPEC_DIR] > minibroker/amqp/definitions.py

SPEC_DIR defaults to ``spec/`` in the project (a verbatim copy of ../shared/specs/amqp-1.0). The test
``tests/amqp/test_definitions.py`` re-runs this generator and fails if the committed file differs, so the
descriptors and field orders in the code are the specification's.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

NS = "{http://www.amqp.org/schema/amqp.xsd}"
ORDER = ("types", "transport", "messaging", "security", "transactions")
SYMBOL_KEYED_MAPS = {"fields", "filter-set", "annotations", "node-properties"}
PY_TYPES = {
    "boolean": "bool", "ubyte": "int", "ushort": "int", "uint": "int", "ulong": "int", "byte": "int",
    "short": "int", "int": "int", "long": "int", "timestamp": "int", "float": "float", "double": "float",
    "char": "str", "string": "str", "symbol": "str", "binary": "bytes", "uuid": "UUID",
    "map": "dict[Any, Any]", "fields": "dict[Any, Any]", "list": "list[Any]", "*": "Any",
}  # fmt: skip


def camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("-"))


def snake(name: str) -> str:
    return name.replace("-", "_")


def load(spec_dir: Path) -> list[tuple[str, ET.Element]]:
    types = []
    for part in ORDER:
        root = ET.parse(spec_dir / f"{part}.bare.xml").getroot()
        types.extend((part, t) for t in root.iter(f"{NS}type"))
    return types


def resolver(types: list[tuple[str, ET.Element]]):  # type: ignore[no-untyped-def]
    by_name = {t.get("name"): t for _, t in types}

    def resolve(name: str) -> str:
        """Resolve a field type to a primitive name, "fields", or "*" (anything / a composite)."""
        seen = name
        while True:
            if name == "*":
                return "*"
            if name in SYMBOL_KEYED_MAPS:
                return "fields"
            t = by_name.get(name)
            if t is None:
                raise SystemExit(f"unknown type {name} (from {seen})")
            if t.get("class") == "primitive":
                return name
            if t.get("class") == "composite":
                return "*"
            name = t.get("source") or "*"

    return resolve


def python_type(resolve, field: ET.Element) -> str:  # type: ignore[no-untyped-def]
    """The annotation of a field's constructor parameter: its wire type's Python type, a list if multiple, or None."""
    py = PY_TYPES[resolve(field.get("type", "*"))]
    if field.get("multiple") == "true":
        py = f"list[{py}]"
    return py if py == "Any" else f"{py} | None"


def slots_and_init(names: list[str], params: list[str]) -> tuple[list[str], list[str]]:
    """``__slots__`` and ``__match_args__``, and ``__init__``, as ``@dataclass(slots=True)`` makes them, written out:
    building 40 dataclasses at import was the largest part of importing minibroker (issue 19, start-up).
    ``__eq__`` and ``__repr__`` are the bases' (``composite.py``), driven by the field table."""
    fields = f"({', '.join(map(repr, names))}{',' if len(names) == 1 else ''})"
    head = [f"    __slots__ = {fields}", f"    __match_args__ = {fields}", ""]
    if not params:
        return head, ["    def __init__(self) -> None:", "        pass"]
    init = ["    def __init__(", "        self,", *(f"        {p}," for p in params), "    ) -> None:"]
    return head, init + [f"        self.{n} = {n}" for n in names]


def generate(spec_dir: Path) -> str:
    types = load(spec_dir)
    resolve = resolver(types)
    out = [
        '"""AMQP 1.0 composite and described types, generated from the specification\'s XML.',
        "",
        "Do not edit: run ``python tools/gen_definitions.py > minibroker/amqp/definitions.py``.",
        "",
        "Plain slotted classes with the constructor ``@dataclass(slots=True)`` would make, written out, so that",
        "importing this module builds no dataclass (issue 19: that was 19 ms of the broker's start-up).",
        '"""',
        "",
        "# ruff: noqa: E501, RUF023 (slots in wire order, as the dataclasses had them)",
        "from __future__ import annotations",
        "",
        "from typing import Any, ClassVar",
        "from uuid import UUID",
        "",
        "from minibroker.amqp.composite import Composite, DescribedSection, FieldSpec",
        "",
        '__all__ = ["UUID"]',
    ]
    names = []
    for part, t in types:
        descriptor = t.find(f"{NS}descriptor")
        if descriptor is None:
            continue
        name = t.get("name")
        assert name is not None
        cls = camel(name)
        names.append(cls)
        dname = descriptor.get("name")
        code = int(descriptor.get("code", "").split(":")[1], 16)
        doc = f"{name} ({part}): ``{dname}``, descriptor 0x{code:08x}."
        out += ["", ""]
        if t.get("class") == "composite":
            fields = t.findall(f"{NS}field")
            field_names = [snake(f.get("name", "")) for f in fields]
            params = [f"{n}: {python_type(resolve, f)} = None" for n, f in zip(field_names, fields, strict=True)]
            head, init = slots_and_init(field_names, params)
            out += [f"class {cls}(Composite):", f'    """{doc}"""', "", *head]
            out += [
                f"    DESCRIPTOR_CODE: ClassVar[int] = 0x{code:08x}",
                f'    DESCRIPTOR_NAME: ClassVar[str] = "{dname}"',
                "    FIELDS: ClassVar[tuple[FieldSpec, ...]] = (",
            ]
            for f in fields:
                fname = f.get("name", "")
                args = [repr(snake(fname)), repr(fname), repr(resolve(f.get("type", "*")))]
                if f.get("mandatory") == "true":
                    args.append("mandatory=True")
                if f.get("multiple") == "true":
                    args.append("multiple=True")
                if f.get("default") is not None:
                    args.append(f"default={f.get('default')!r}")
                out.append(f"        FieldSpec({', '.join(args)}),")
            out += ["    )", "", *init]
        else:
            source = resolve(t.get("source", "*"))
            head, init = slots_and_init(["value"], [f"value: {PY_TYPES[source]}"])
            out += [f"class {cls}(DescribedSection):", f'    """{doc}"""', "", *head]
            out += [
                f"    DESCRIPTOR_CODE: ClassVar[int] = 0x{code:08x}",
                f'    DESCRIPTOR_NAME: ClassVar[str] = "{dname}"',
                f'    SOURCE: ClassVar[str] = "{source}"',
                "",
                *init,
            ]
    out += ["", "", "ALL_TYPES: tuple[type, ...] = ("]
    out += [f"    {n}," for n in names]
    out += [")", ""]
    return "\n".join(out)


if __name__ == "__main__":
    root = Path(__file__).resolve().parent.parent
    spec = Path(sys.argv[1]) if len(sys.argv) > 1 else root / "spec"
    sys.stdout.write(generate(spec))
