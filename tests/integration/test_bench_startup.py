"""``bench.startup --callgrind PYTHON``: the instructions an interpreter spends to minibroker's listening line, of
the minibroker that interpreter has installed. Run here under a stand-in for valgrind that only runs the command
(``exec``), so the tests check what is started, where and how, not valgrind's figures."""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path

import pytest

from bench import startup


@pytest.fixture
def no_valgrind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``valgrind`` first on PATH that drops its two options and becomes the command it was given."""
    fake = tmp_path / "bin" / "valgrind"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\nshift 2\nexec "$@"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.usefixtures("no_valgrind")
def test_the_interpreter_runs_without_the_callers_pythonpath(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run as this repository says (``PYTHONPATH=$PWD``), the measured interpreter must not import the checkout's
    minibroker but its own: PYTHONPATH is not passed on."""
    monkeypatch.setenv("PYTHONPATH", str(Path.cwd()))
    program = "import os, sys; sys.stderr.write('Collected : %d' % (1 + ('PYTHONPATH' in os.environ)))"
    assert startup._callgrind([sys.executable, "-c", program], until_line=False) == 1


def test_a_launcher_script_is_measured_as_the_interpreter_it_starts(tmp_path: Path) -> None:
    """pyenv's ``python`` is a shell script that execs the interpreter; valgrind, not following the exec, would
    count the shell (or nothing): the interpreter behind it is what is measured."""
    shim = tmp_path / "python"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    assert startup.interpreter(str(shim)) == os.path.realpath(sys.executable)


@pytest.mark.timeout(30)
@pytest.mark.usefixtures("no_valgrind")
def test_a_broker_that_never_listens_fails_the_count_instead_of_hanging() -> None:
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="no listening line"):
        startup._callgrind([sys.executable, "-c", "import time; time.sleep(600)"], until_line=True, timeout=2)
    assert time.monotonic() - started < 20


@pytest.mark.usefixtures("no_valgrind")
def test_a_broker_that_fails_to_start_says_why() -> None:
    program = "import sys; sys.exit('No module named minibroker')"
    with pytest.raises(RuntimeError, match="No module named minibroker"):
        startup._callgrind([sys.executable, "-c", program], until_line=True)
