"""The public API, pinned: a name added to or dropped from it fails here until this list says so.

What users may import is what ``__all__`` says: the package (``serve``, ``run_in_thread`` ...), the test kit
``minibroker.testing`` and its modules, and the fixtures of the pytest plugin. Every exported class and
function carries a docstring; every fixture shows one in ``pytest --fixtures``.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import minibroker
import minibroker.pytest_plugin
import minibroker.testing

EXPORTS: dict[str, set[str]] = {
    "minibroker": {"Config", "ConfigError", "RunningBroker", "ThreadedBroker", "connect", "run_in_thread", "serve"},
    "minibroker.remote": {
        "BrokerUnreachable",
        "RemoteBroker",
        "RemoteError",
        "RemoteQueue",
        "RemoteTopic",
        "connect",
        "message_view",
    },
    "minibroker.testing.frames": {
        "AMQP_FRAME",
        "AMQP_HEADER",
        "RECEIVER",
        "SASL_FRAME",
        "SASL_HEADER",
        "SENDER",
        "TLS_HEADER",
        "attach_receiver",
        "attach_sender",
        "begin",
        "disposition",
        "flow",
        "frame",
        "heartbeat",
        "message",
        "open_",
        "raw_frame",
        "sasl_anonymous",
        "sasl_frame",
        "sasl_plain",
        "transfer",
        "undecodable_frame",
    },
    "minibroker.testing.client": {
        "RECEIVER",
        "SENDER",
        "ClientConnection",
        "Delivery",
        "Ended",
        "Event",
        "Expect",
        "Frame",
        "FrameReader",
        "Link",
        "ProtocolError",
        "ProtocolHeader",
        "Sasl",
        "Script",
        "ScriptRun",
        "Send",
        "Session",
        "attach_link",
        "authenticate",
        "begin_session",
        "check",
        "close_connection",
        "open_connection",
        "parse_frames",
        "recent",
        "split_header",
    },
    "minibroker.testing.peer": {"Sasl", "ScriptedPeer", "read_event"},
    "minibroker.testing.memory": {"MemoryBroker", "MemoryPeer", "memory_broker"},
    "minibroker.testing.thread": {"ThreadedBroker", "run_in_thread"},
    "minibroker.pytest_plugin": {"factories"},
    "minibroker.pytest_plugin.factories": {
        "ExternalBroker",
        "minibroker",
        "minibroker_noproc",
        "minibroker_proc",
        "minibroker_trio",
    },
}
TESTING_MODULES = {"client", "frames", "memory", "peer", "thread"}
FIXTURES = {"amqp091_url", "minibroker", "minibroker_noproc", "minibroker_proc", "minibroker_trio"}


def _module(name: str) -> ModuleType:
    return importlib.import_module(name)


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_all_is_exactly_the_pinned_names(name: str) -> None:
    module = _module(name)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{name} has no __all__"
    assert len(exported) == len(set(exported)), f"{name}.__all__ names something twice"
    assert set(exported) == EXPORTS[name]


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_every_exported_name_exists_and_classes_and_functions_have_docstrings(name: str) -> None:
    module = _module(name)
    for export in EXPORTS[name]:
        assert hasattr(module, export), f"{name}.{export} is exported but does not exist"
        value = getattr(module, export)
        if inspect.isclass(value):
            # its own docstring: not inherited, not the signature a dataclass writes when there is none
            doc = vars(value).get("__doc__") or ""
            assert doc.strip(), f"{name}.{export} has no docstring"
            assert not doc.startswith(f"{export}("), f"{name}.{export} has only the docstring dataclass wrote"
        elif inspect.isfunction(value) or inspect.ismodule(value):
            assert inspect.getdoc(value), f"{name}.{export} has no docstring"
        # constants and type aliases (AMQP_HEADER, Sasl) cannot carry one


def test_the_testing_package_is_its_modules() -> None:
    found = {info.name for info in pkgutil.iter_modules(minibroker.testing.__path__) if not info.name.startswith("_")}
    assert found == TESTING_MODULES
    assert not hasattr(minibroker.testing, "__all__")
    attributes = {
        attr
        for attr, value in vars(minibroker.testing).items()
        if not attr.startswith("_") and not inspect.ismodule(value)
    }
    assert attributes == set()


def test_the_plugin_registered_by_the_entry_point_is_ours(pytestconfig: pytest.Config) -> None:
    assert pytestconfig.pluginmanager.get_plugin("minibroker") is minibroker.pytest_plugin


def test_the_plugin_provides_exactly_the_pinned_fixtures_each_documented(tmp_path: Path) -> None:
    """As ``pytest --fixtures`` shows them to a user whose suite has the package installed."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--fixtures", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode in (0, 5), result.stdout + result.stderr  # 5: no tests collected
    lines = result.stdout.splitlines()
    entry = re.compile(r"^(\w+)(?: \[\w+ scope\])? -- .*minibroker[/\\]pytest_plugin[/\\]")
    documented: dict[str, str] = {}
    for i, line in enumerate(lines):
        found = entry.match(line)
        if found:
            documented[found.group(1)] = lines[i + 1].strip() if i + 1 < len(lines) else ""
    assert set(documented) == FIXTURES, result.stdout
    for fixture, doc in documented.items():
        assert doc, f"fixture {fixture} has no docstring"
        assert doc != "no docstring available", f"fixture {fixture} has no docstring"
    for fixture in FIXTURES:
        assert hasattr(minibroker.pytest_plugin, fixture)
