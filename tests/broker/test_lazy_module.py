"""``minibroker.broker.lazy.lazy_module``: bound at once, executed on the first attribute read, then ordinary."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from minibroker.broker.lazy import lazy_module


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A package ``lazy_probe`` whose module ``counted`` counts its executions in ``lazy_probe.runs``."""
    root = tmp_path / "lazy_probe"
    root.mkdir()
    (root / "__init__.py").write_text("runs = 0\n")
    (root / "counted.py").write_text("import lazy_probe\nlazy_probe.runs += 1\nVALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "lazy_probe"
    for name in [n for n in sys.modules if n == "lazy_probe" or n.startswith("lazy_probe.")]:
        del sys.modules[name]


def test_the_module_runs_on_its_first_read_only(package: str) -> None:
    module = lazy_module(f"{package}.counted")
    parent = sys.modules[package]
    assert parent.runs == 0  # type: ignore[attr-defined]
    assert module.VALUE == 42
    assert module.VALUE == 42
    assert parent.runs == 1  # type: ignore[attr-defined]
    assert type(module) is ModuleType  # an ordinary module after the first read


def test_an_import_after_binding_gets_the_same_module(package: str) -> None:
    module = lazy_module(f"{package}.counted")
    from lazy_probe import counted

    assert counted is module
    assert counted.VALUE == 42
    assert sys.modules[package].runs == 1  # type: ignore[attr-defined]


def test_a_loaded_module_is_returned_as_it_is(package: str) -> None:
    import lazy_probe.counted

    assert lazy_module(f"{package}.counted") is lazy_probe.counted
    assert sys.modules[package].runs == 1  # type: ignore[attr-defined]


def test_an_unknown_module_is_refused_at_once(package: str) -> None:
    with pytest.raises(ModuleNotFoundError, match=r"lazy_probe\.nothing"):
        lazy_module(f"{package}.nothing")
