"""The command line and its data dir (real broker processes): one broker per data dir, a data dir that cannot
be used said so (exit 2), a corrupt journal refused (exit 2 naming the segment and the byte offset) unless
``--recover=skip-corrupt``, and a torn tail cut with a log line.

Issue 12: items 8, 10, 13.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from proton import Message
from proton.utils import BlockingConnection

from minibroker.store.journal import record_offsets
from tests.test_cli import broker_process


def _start(data_dir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A broker that is expected not to start: its exit status and output."""
    return subprocess.run(
        [sys.executable, "-m", "minibroker", "--port", "0", "--data-dir", str(data_dir), *args],
        capture_output=True, text=True, timeout=30, env={**os.environ, **(env or {})}, check=False,
    )  # fmt: skip


def _send(port: int, bodies: list[str]) -> None:
    conn = BlockingConnection(f"127.0.0.1:{port}", timeout=5)
    try:
        sender = conn.create_sender("orders")
        for body in bodies:
            sender.send(Message(body=body, durable=True))
    finally:
        conn.close()


def _drain(port: int, expected: int) -> list[str]:
    conn = BlockingConnection(f"127.0.0.1:{port}", timeout=5)
    try:
        receiver = conn.create_receiver("orders")
        bodies = []
        for _ in range(expected):
            bodies.append(receiver.receive(timeout=5).body)
            receiver.accept()
        with pytest.raises(Exception):  # noqa: B017, PT011 - proton's Timeout: nothing more
            receiver.receive(timeout=0.3)
        return bodies
    finally:
        conn.close()


# -- item 8: one broker per data dir --------------------------------------------------------------------------
def test_a_second_broker_on_the_same_data_dir_exits_2_naming_the_holder(tmp_path: Path) -> None:
    with broker_process("--port", "0", "--data-dir", str(tmp_path)) as (first, port):
        second = _start(tmp_path)
        assert second.returncode == 2, second.stderr
        assert f"in use by another minibroker (pid {first.pid})" in second.stderr
        assert str(tmp_path) in second.stderr
        assert second.stdout == ""
        _send(port, ["still served"])  # the first one is untouched
        first.terminate()
        assert first.wait(10) == 0
    with broker_process("--port", "0", "--data-dir", str(tmp_path)) as (again, port):  # the lock went with it
        assert _drain(port, 1) == ["still served"]
        again.terminate()


# -- item 13: a data dir that cannot be used ----------------------------------------------------------------------
def test_a_data_dir_that_is_a_file_exits_2_saying_so(tmp_path: Path) -> None:
    path = tmp_path / "data"
    path.write_text("not a directory")
    for data_dir in (path, path / "below"):
        result = _start(data_dir)
        assert result.returncode == 2, result.stderr
        assert f"data dir {data_dir} is not a directory" in result.stderr
        assert "cannot listen" not in result.stderr


@contextlib.contextmanager
def _read_only(path: Path) -> Iterator[str]:
    """Make ``path`` read-only for the broker: a read-only bind mount or an immutable directory (as root, who
    ignores permissions), else permissions. Yields how."""
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield "permissions"
        finally:
            path.chmod(0o755)
        return
    if shutil.which("mount") and _run("mount", "--bind", str(path), str(path)):
        try:
            if _run("mount", "-o", "remount,bind,ro", str(path)):
                yield "read-only mount"
                return
        finally:
            _run("umount", str(path))
    if shutil.which("chattr") and _run("chattr", "+i", str(path)):
        try:
            yield "immutable"
        finally:
            _run("chattr", "-i", str(path))
        return
    pytest.skip("cannot make a directory read-only for root here")


def _run(*command: str) -> bool:
    return subprocess.run(command, capture_output=True, check=False).returncode == 0


def test_a_read_only_data_dir_exits_2_saying_so(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    with _read_only(data_dir) as how:
        result = _start(data_dir)
    assert result.returncode == 2, (how, result.stderr)
    assert f"data dir {data_dir} is not writable" in result.stderr, how
    assert "cannot listen" not in result.stderr


# -- item 10: torn tail or corruption -------------------------------------------------------------------------
def _journal_of_ten(data_dir: Path) -> Path:
    with broker_process("--port", "0", "--data-dir", str(data_dir)) as (proc, port):
        _send(port, [f"m{i}" for i in range(10)])
        proc.terminate()
        assert proc.wait(10) == 0
    (segment,) = sorted(data_dir.glob("journal-*.log"))
    return segment


def _flip_fifth(segment: Path) -> tuple[int, int]:
    offset, end, _ = record_offsets(segment)[4]
    data = bytearray(segment.read_bytes())
    data[(offset + end) // 2] ^= 0x01
    segment.write_bytes(bytes(data))
    return offset, end


@pytest.mark.parametrize("how", ["option", "environment", "config"])
def test_a_flipped_byte_mid_journal_refuses_to_start_unless_skip_corrupt(tmp_path: Path, how: str) -> None:
    data_dir = tmp_path / "data"
    segment = _journal_of_ten(data_dir)
    offset, end = _flip_fifth(segment)
    damaged = segment.read_bytes()

    refused = _start(data_dir)
    assert refused.returncode == 2, refused.stderr
    assert f"journal {segment} is corrupt at byte {offset}" in refused.stderr
    assert "--recover=skip-corrupt" in refused.stderr
    assert segment.read_bytes() == damaged  # nothing changed
    assert not (data_dir / "quarantine").exists()

    args: list[str] = []
    env: dict[str, str] = {}
    if how == "option":
        args = ["--recover=skip-corrupt"]
    elif how == "environment":
        env = {"MINIBROKER_RECOVER": "skip-corrupt"}
    else:
        config = tmp_path / "c.toml"
        config.write_text('data_recover = "skip-corrupt"\n')
        args = ["--config", str(config)]
    with broker_process("--port", "0", "--data-dir", str(data_dir), *args, env=env) as (proc, port):
        assert _drain(port, 9) == [f"m{i}" for i in range(10) if i != 4]
        proc.terminate()
        assert proc.wait(10) == 0
        assert proc.stderr is not None
        log = proc.stderr.read()
    assert f"skipped {end - offset} corrupt bytes at byte {offset}" in log
    (kept,) = (data_dir / "quarantine").iterdir()
    assert kept.read_bytes() == damaged  # the evidence is kept


def test_a_torn_tail_is_cut_with_a_log_line(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    segment = _journal_of_ten(data_dir)
    offset, end, _ = record_offsets(segment)[-1]
    data = segment.read_bytes()
    segment.write_bytes(data[: end - 5])  # the last record torn, as a crash leaves it
    with broker_process("--port", "0", "--data-dir", str(data_dir)) as (proc, port):
        assert _drain(port, 9) == [f"m{i}" for i in range(9)]
        proc.terminate()
        assert proc.wait(10) == 0
        assert proc.stderr is not None
        log = proc.stderr.read()
    assert f"cut a torn tail of {end - 5 - offset} bytes at byte {offset}" in log
    (kept,) = (data_dir / "quarantine").iterdir()
    assert kept.read_bytes() == data[offset : end - 5]
