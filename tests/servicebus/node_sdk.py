"""The JavaScript Service Bus SDK (``@azure/service-bus`` 7.9, from npm) run with node against the broker.

``js/harness.js`` plays scenarios (``js/scenarios.js``, one function each) and prints JSON lines; a line with a
``step`` asks this side to act (advance the broker's virtual clock, say) and waits for one line on the node
process's standard input before it goes on, so scenarios that depend on time stay fast and deterministic.

A new scenario (sessions, the rule manager, ...) is one ``scenario(name, async (ctx) => ...)`` in
``js/scenarios.js`` (``ctx``: ``client``, ``entity()``, ``receive()``, ``describe()``, ``emit()``, ``step()``; see
``js/harness.js``), its name in a test module's list for ``NodeSdk.play``, and a test on its lines.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections import defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "js" / "scenarios.js"
CACHE = HERE / ".node"
"""npm ``--prefix`` of the install (git-ignored): the SDK lands in ``CACHE / "node_modules"``."""
PACKAGE = "@azure/service-bus"
SPEC = f"{PACKAGE}@~7.9"
VERSION_PREFIX = "7.9."
RUN_TIMEOUT = 30.0
"""Upper bound of one node run, steps included."""

Line = dict[str, Any]
StepHandler = Callable[[Line], None]


class NodeSdkError(AssertionError):
    """The node process failed: it exited non-zero, timed out, printed something not JSON, or asked an unknown
    step."""


class NodeSdk:
    """Runs ``js/scenarios.js`` with ``node`` and the installed SDK."""

    def __init__(self, node: str, node_path: Path) -> None:
        self.node = node
        self.node_path = node_path

    def play(
        self, connection: str, scenarios: list[str], steps: Mapping[str, StepHandler], **spec: Any
    ) -> dict[str, list[Line]]:
        """Play ``scenarios`` in one node process on ``connection``; return each scenario's lines (steps left out).
        ``steps[label]`` answers a ``step`` line with that label; ``spec`` goes to the scenarios as ``ctx.spec``."""
        env = {**os.environ, "NODE_PATH": str(self.node_path)}
        env.pop("DEBUG", None)  # the SDK logs through the debug module: keep stderr to real errors
        text = json.dumps({"connection": connection, "scenarios": scenarios, **spec})
        proc = subprocess.Popen(
            [self.node, str(SCRIPT), text],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        timed_out = threading.Event()

        def expire() -> None:
            timed_out.set()
            proc.kill()

        watchdog = threading.Timer(RUN_TIMEOUT, expire)
        watchdog.start()
        lines: list[Line] = []
        try:
            assert proc.stdout is not None
            assert proc.stdin is not None
            for raw in proc.stdout:
                try:
                    line = json.loads(raw)
                except json.JSONDecodeError as exc:
                    raise NodeSdkError(f"node printed something else than a JSON line: {raw!r}") from exc
                if "step" in line:
                    handler = steps.get(line["step"])
                    if handler is None:
                        raise NodeSdkError(f"no handler for step {line!r}")
                    handler(line)
                    proc.stdin.write("done\n")
                    proc.stdin.flush()
                    continue
                lines.append(line)
            proc.wait()
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            stderr = proc.stderr.read() if proc.stderr is not None else ""
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        if timed_out.is_set() or proc.returncode != 0 or not lines or lines[-1] != {"done": True}:
            ending = f"still running after {RUN_TIMEOUT} s" if timed_out.is_set() else f"exited {proc.returncode}"
            raise NodeSdkError(f"node {ending} for {scenarios}\nstderr: {stderr[-2000:]}\nlast lines: {lines[-5:]}")
        found: dict[str, list[Line]] = defaultdict(list)
        for line in lines[:-1]:
            found[line.pop("scenario")].append(line)
        return dict(found)
