"""minibroker in a process of its own, as every benchmark and the crash tests start it.

``BrokerProcess`` runs ``python -m minibroker --host 127.0.0.1 --port 0 --log-level warning`` (or, with
``introspect``, ``python -m bench.introspect`` with the same arguments: the same broker answering questions
about itself on stdin), reads its "listening" line for the port the system picked, and stops it with
SIGTERM, or kills it with SIGKILL. Both programs run from the checkout (or ``tree``, another checkout), so that
checkout's minibroker is the one started. Nothing here imports minibroker: tests/crash/workload.py, which starts
quickly, uses it.
"""

from __future__ import annotations

import compileall
import json
import os
import re
import select
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, Self

from bench import ROOT
from bench.measures import cpu_seconds_or_none

HOST = "127.0.0.1"
LISTENING = re.compile(r"minibroker listening on amqp://([\d.]+):(\d+)")
CLEARED_ENVIRONMENT = ("MINIBROKER_CRASH_AT", "MINIBROKER_CONFIG")  # set only through ``env``


def readline(stream: IO[str], timeout: float) -> str:
    """One line from a pipe, or "" after ``timeout`` seconds."""
    ready, _, _ = select.select([stream], [], [], timeout)
    return str(stream.readline()) if ready else ""


def toml_text(config: Mapping[str, Any]) -> str:
    """``config`` (a dict shaped like the TOML file: tables, strings, numbers, booleans, lists) as TOML."""

    def value(item: Any) -> str:
        if isinstance(item, Mapping):
            return "{" + ", ".join(f"{json.dumps(str(k))} = {value(v)}" for k, v in item.items()) + "}"
        if isinstance(item, list | tuple):
            return "[" + ", ".join(value(v) for v in item) + "]"
        return json.dumps(item, ensure_ascii=False)  # a JSON string, number or boolean is one in TOML too

    return "".join(f"{json.dumps(str(key))} = {value(item)}\n" for key, item in config.items())


class BrokerProcess:
    """A broker process on 127.0.0.1 and a free port; ``url`` (HOST:PORT), ``port`` and ``pid`` once it
    listens.

    ``data_dir``: durable storage (default: memory). ``config``: a TOML file, or a dict shaped like one
    (written to a temporary file for the broker to read). ``env``: extra environment variables; the
    caller's ``MINIBROKER_CRASH_AT`` and ``MINIBROKER_CONFIG`` are not passed on. ``stderr_path``: the
    broker's stderr is appended there (default: this process's stderr). ``introspect``: run
    ``bench.introspect``, whose ``stats()`` and ``trim()`` answer from inside the broker.
    """

    def __init__(
        self,
        data_dir: str | Path | None = None,
        *,
        config: str | Path | Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        stderr_path: str | Path | None = None,
        introspect: bool = False,
        timeout: float = 15.0,
        tree: Path = ROOT,
    ) -> None:
        program = "bench.introspect" if introspect else "minibroker"
        command = [sys.executable, "-m", program, "--host", HOST, "--port", "0", "--log-level", "warning"]
        if data_dir is not None:
            command += ["--data-dir", os.path.abspath(data_dir)]
        written = None
        if isinstance(config, Mapping):
            with tempfile.NamedTemporaryFile("w", prefix="minibroker-", suffix=".toml", delete=False) as file:
                file.write(toml_text(config))
            config = written = file.name
        if config is not None:
            command += ["--config", os.path.abspath(config)]
        environ = {k: v for k, v in os.environ.items() if k not in CLEARED_ENVIRONMENT}
        environ.update(env or {})
        if tree != ROOT:  # another checkout's minibroker (its directory first on sys.path, before any install)
            environ["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [environ.get("PYTHONPATH")])])
        self._stderr = open(stderr_path, "ab") if stderr_path is not None else None  # noqa: SIM115 (closed in wait())
        self._lock = threading.Lock()
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE if introspect else None, stdout=subprocess.PIPE, stderr=self._stderr,
            text=True, env=environ, cwd=tree,
        )  # fmt: skip
        self.pid = self.proc.pid
        try:
            assert self.proc.stdout is not None
            line = readline(self.proc.stdout, timeout)
        finally:
            if written is not None:
                os.unlink(written)
        match = LISTENING.search(line)
        if match is None:
            self.kill()
            raise RuntimeError(f"the broker did not start: {line!r}" + (f" (see {stderr_path})" if stderr_path else ""))
        self.host, self.port = match.group(1), int(match.group(2))
        self.url = f"{self.host}:{self.port}"
        if introspect:
            # serve() returns once the listener is bound; its accept task starts a moment later
            counts = [self.stats()["trio_tasks"]]
            while len(counts) < 3 or len(set(counts[-3:])) > 1:
                time.sleep(0.02)
                counts.append(self.stats()["trio_tasks"])

    # -- questions to an introspecting broker -----------------------------------------------------------
    def _ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None, "only an introspecting broker answers questions"
        assert self.proc.stdout is not None
        with self._lock:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the broker process ended (exit code {self.proc.poll()})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def stats(self, *, collect: bool = False) -> dict[str, Any]:
        """The broker's own figures (``bench.introspect.broker_stats``), after a garbage collection with
        ``collect``."""
        return self._ask("stats gc" if collect else "stats")

    def trim(self) -> int:
        """Collect garbage and ``malloc_trim`` in the broker; its RSS after that, in KiB."""
        kib: int = self._ask("trim")["rss_kib"]
        return kib

    # -- the end -------------------------------------------------------------------------------------------
    def wait(self, timeout: float) -> int:
        """Wait for the process to end (TimeoutExpired after ``timeout`` seconds); its exit status. Its pipes
        are closed either way."""
        try:
            status = self.proc.wait(timeout)
        finally:
            for stream in (self.proc.stdin, self.proc.stdout, self._stderr):
                if stream is not None:
                    stream.close()
        return status

    def kill(self) -> int:
        """SIGKILL (if still running) and reap; the exit status."""
        if self.proc.poll() is None:
            self.proc.kill()
        return self.wait(10)

    def stop(self) -> int:
        """SIGTERM (a clean stop) and reap, SIGKILL after 10 s; the exit status."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.wait(10)
        except subprocess.TimeoutExpired:
            return self.kill()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class TimedBroker(BrokerProcess):
    """``python -m minibroker`` started and timed: ``listening_s`` from spawning it to its listening line,
    ``startup_s`` to its answer to an AMQP open (``minibroker.health.check``), ``startup_cpu_s`` the CPU
    time it used by then.

    The checkout's bytecode is written first, as ``pip install`` writes an installed package's: where
    ``PYTHONDONTWRITEBYTECODE`` is set (as on this project's machines) every start would otherwise compile
    minibroker's sources again, 0.09 s of a 0.2 s start here, which no installed broker pays.
    """

    def __init__(self, tree: Path = ROOT) -> None:
        from minibroker.health import check  # here, not at the top: the crash workload imports this module

        compileall.compile_dir(tree / "minibroker", quiet=1)
        started = time.perf_counter()
        super().__init__(tree=tree)
        self.listening_s = time.perf_counter() - started
        check(f"amqp://{self.url}", timeout=5)
        self.startup_s = time.perf_counter() - started
        self.startup_cpu_s = cpu_seconds_or_none(self.pid)
