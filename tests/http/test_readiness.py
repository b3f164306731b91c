"""``/readyz`` is 503 until the broker is ready: the HTTP listener is bound first, the journal is recovered in a
worker thread meanwhile, and only the probes answer until then (issue 14).

Recovery is held deterministically at the ``recovery`` hold point (``MINIBROKER_HOLD_AT=recovery:FIFO``, see
``minibroker/store/crash.py``): opening the named pipe for writing returns once the broker waits there, and
closing it lets recovery go on. No sleeps, no polling.
"""

from __future__ import annotations

import http.client
import logging
import os
import re
import select
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pytest
import trio

from minibroker import serve
from minibroker.store.journal import JournalCorrupt, JournalError
from tests.http.client import Answer, call, http_broker
from tests.test_cli_data_dir import _flip_fifth

LISTENING = re.compile(r"^minibroker listening on amqp://127\.0\.0\.1:(\d+)$")
HTTP_ON = re.compile(r"^minibroker http on http://127\.0\.0\.1:(\d+)$")
HTTP_LOGGED = re.compile(r"management API on http://127\.0\.0\.1:(\d+) ")
USERS = {"failure_delay": 0.0, "users": {"admin": "s3cret"}}


def _journal_of(data_dir: Path, bodies: list[str]) -> Path:
    """A data dir whose journal holds ``bodies`` as durable messages of queue ``jobs``; its segment."""
    with http_broker(data_dir=str(data_dir)) as broker:
        for body in bodies:
            durable = {"body": body, "header": {"durable": True}}
            assert call(broker, "POST", "/api/queues/jobs/messages", durable).status == 201
    (segment,) = sorted(data_dir.glob("journal-*.log"))
    return segment


def _get(port: int, path: str, auth: tuple[str, str] | None = None) -> Answer:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        return call(conn, "GET", path, auth=auth)
    finally:
        conn.close()


async def aget(port: int, path: str, auth: tuple[str, str] | None = None) -> tuple[int, Any]:
    """Status and JSON body of ``GET path`` (from a worker thread: the broker answers on this trio loop)."""
    answer = await trio.to_thread.run_sync(_get, port, path, auth)
    return answer.status, answer.json


async def held(fifo: Path) -> IO[bytes]:
    """Open the hold point's pipe for writing: returns once the broker waits at it; closing it lets it go on."""
    with trio.fail_after(10):
        return await trio.to_thread.run_sync(open, fifo, "wb", abandon_on_cancel=True)


def _hold_recovery(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    fifo = tmp_path / "hold"
    os.mkfifo(fifo)
    monkeypatch.setenv("MINIBROKER_HOLD_AT", f"recovery:{fifo}")
    return fifo


def _logged_http_port(caplog: pytest.LogCaptureFixture) -> int:
    found = HTTP_LOGGED.search(caplog.text)
    assert found, caplog.text
    return int(found[1])


async def test_readyz_is_503_while_the_journal_is_recovered_then_200_with_the_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    data_dir = tmp_path / "data"
    bodies = [f"m{i}" for i in range(5)]
    await trio.to_thread.run_sync(_journal_of, data_dir, bodies)
    fifo = _hold_recovery(tmp_path, monkeypatch)
    caplog.set_level(logging.INFO, logger="minibroker")
    config = {"server": {"port": 0}, "http": {"port": 0}, "data_dir": str(data_dir), "auth": USERS}
    admin = ("admin", "s3cret")
    ready = trio.Event()
    stop = trio.Event()

    async def run() -> None:
        async with serve(config) as running:
            assert running.ready
            ready.set()
            await stop.wait()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        hold = await held(fifo)
        try:
            port = _logged_http_port(caplog)
            assert await aget(port, "/healthz") == (200, {"status": "ok"})
            assert await aget(port, "/readyz") == (503, {"status": "recovering"})
            assert (await aget(port, "/api/queues"))[0] == 401  # credentials are checked first, as always
            not_ready = (503, {"error": "not ready (recovering): see /readyz"})
            for path in ("/api/queues", "/api/queues/jobs/messages", "/api/namespaces/default/info", "/metrics", "/"):
                assert await aget(port, path, admin) == not_ready, path
            assert not ready.is_set()
            assert "recovered" not in caplog.text
        finally:
            hold.close()
        with trio.fail_after(10):
            await ready.wait()
        assert await aget(port, "/readyz") == (200, {"status": "ready"})
        status, queues = await aget(port, "/api/queues", admin)
        assert (status, [(q["name"], q["depth"]) for q in queues]) == (200, [("jobs", 5)])
        status, messages = await aget(port, "/api/queues/jobs/messages", admin)
        assert [m["body"] for m in messages] == bodies
        stop.set()


async def test_a_corrupt_journal_ends_serve_with_its_error_and_closes_the_http_listener(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    data_dir = tmp_path / "data"
    segment = await trio.to_thread.run_sync(_journal_of, data_dir, [f"m{i}" for i in range(10)])
    offset, _ = _flip_fifth(segment)
    fifo = _hold_recovery(tmp_path, monkeypatch)
    caplog.set_level(logging.INFO, logger="minibroker")
    config = {"server": {"port": 0}, "http": {"port": 0}, "data_dir": str(data_dir)}
    raised: list[BaseException] = []

    async def run() -> None:
        try:
            async with serve(config):
                pytest.fail("a corrupt journal must not start in strict mode")
        except BaseException as exc:
            raised.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        hold = await held(fifo)
        try:
            port = _logged_http_port(caplog)
            assert await aget(port, "/readyz") == (503, {"status": "recovering"})
        finally:
            hold.close()
    (error,) = raised
    assert isinstance(error, JournalCorrupt)  # as it is, not in an exception group
    assert f"corrupt at byte {offset}" in str(error)
    with pytest.raises(ConnectionRefusedError):
        await trio.to_thread.run_sync(_get, port, "/healthz")


async def test_a_failed_recovery_without_http_raises_as_before(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    segment = await trio.to_thread.run_sync(_journal_of, data_dir, [f"m{i}" for i in range(10)])
    _flip_fifth(segment)
    with pytest.raises(JournalError, match="corrupt at byte"):
        async with serve({"server": {"port": 0}, "data_dir": str(data_dir)}):
            pytest.fail("a corrupt journal must not start in strict mode")


@contextmanager
def _process(*args: str, env: dict[str, str]) -> Iterator[subprocess.Popen[str]]:
    command = [sys.executable, "-m", "minibroker", "--port", "0", "--http-port", "0", *args]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env}
    ) as proc:
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


def test_cli_logs_the_http_address_at_once_and_prints_its_lines_once_ready(tmp_path: Path) -> None:
    """The HTTP address is logged (stderr) as soon as it is bound; stdout keeps its lines, AMQP first, for when
    the broker is ready."""
    data_dir = tmp_path / "data"
    _journal_of(data_dir, ["a", "b"])
    fifo = tmp_path / "hold"
    os.mkfifo(fifo)
    with _process("--data-dir", str(data_dir), env={"MINIBROKER_HOLD_AT": f"recovery:{fifo}"}) as proc:
        assert proc.stdout is not None
        assert proc.stderr is not None
        with open(fifo, "wb"):  # returns once the broker is held in its recovery
            logged = None
            while logged is None:
                line = proc.stderr.readline()
                assert line, "the broker ended before logging its HTTP address"
                logged = HTTP_LOGGED.search(line)
            port = int(logged[1])
            assert _get(port, "/readyz").json == {"status": "recovering"}
            assert _get(port, "/api/queues").status == 503
            assert select.select([proc.stdout], [], [], 0)[0] == []  # nothing printed before ready
        assert LISTENING.match(proc.stdout.readline().rstrip("\n"))
        printed = HTTP_ON.match(proc.stdout.readline().rstrip("\n"))
        assert printed
        assert int(printed[1]) == port
        assert _get(port, "/readyz").json == {"status": "ready"}
        assert [(q["name"], q["depth"]) for q in _get(port, "/api/queues").json] == [("jobs", 2)]
        proc.terminate()
        assert proc.wait(10) == 0


def test_cli_a_corrupt_journal_exits_2_with_http_on(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    segment = _journal_of(data_dir, [f"m{i}" for i in range(10)])
    offset, _ = _flip_fifth(segment)
    with _process("--data-dir", str(data_dir), env={}) as proc:
        _, stderr = proc.communicate(timeout=30)
        assert proc.returncode == 2
    assert f"minibroker: journal {segment} is corrupt at byte {offset}" in stderr
    assert "Traceback" not in stderr
