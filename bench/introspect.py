"""minibroker as a process that answers questions about itself, so leaks can be read from the broker.

    python -m bench.introspect [the arguments of python -m minibroker]

``minibroker.serve`` with the configuration ``python -m minibroker`` would build from the same arguments,
plus a line protocol on stdin: ``stats`` answers one JSON line with the connection count, trio task count,
queue depths and allocated memory blocks (``broker_stats``); ``stats gc`` does the same after a garbage
collection; ``trim`` collects garbage, runs ``malloc_trim`` (what RSS remains after it is in use, or held
by Python's allocator, not free heap) and answers the RSS. SIGTERM, SIGINT or the end of stdin stops it.
``bench.broker_process.BrokerProcess(introspect=True)`` starts it and asks the questions.
"""

from __future__ import annotations

import ctypes
import gc
import json
import logging
import os
import signal
import sys
from typing import Any

import trio

from bench.measures import rss_kib


def count_tasks(task: Any) -> int:
    """``task`` and every task below it in trio's task tree."""
    return 1 + sum(count_tasks(child) for nursery in task.child_nurseries for child in nursery.child_tasks)


def task_names(task: Any) -> list[str]:
    """Names of ``task`` and every task below it."""
    names = [str(task.name)]
    for nursery in task.child_nurseries:
        for child in nursery.child_tasks:
            names += task_names(child)
    return names


def broker_stats(running: Any, *, collect: bool = False) -> dict[str, Any]:
    """Connections, trio tasks, queues and allocated blocks of a running broker (call it in its trio thread).

    ``running`` is the ``RunningBroker``; with ``collect`` a garbage collection runs first, so that
    ``allocated_blocks`` counts what is really held.
    """
    if collect:
        gc.collect()
    broker = running.broker
    server = getattr(running, "_server", None)
    root = trio.lowlevel.current_root_task()
    return {
        "connections": len(broker.connections),
        "connection_tasks": len(server.tasks) if server is not None else -1,
        "trio_tasks": count_tasks(root),
        "trio_task_names": sorted(task_names(root)) if collect else [],
        "queues": {name: {"ready": q.depth, "acquired": q.acquired} for name, q in broker.queues.items()},
        "allocated_blocks": sys.getallocatedblocks(),
    }


def answer(running: Any, words: list[bytes]) -> dict[str, Any] | None:
    """The answer to one command line, or None for an unknown command."""
    if words[:1] == [b"stats"]:
        return broker_stats(running, collect=words[1:] == [b"gc"])
    if words[:1] == [b"trim"]:
        # give the heap's free memory back to the system: what RSS is left is really in use
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        return {"rss_kib": rss_kib(os.getpid())}
    return None


async def _answer_stdin(running: Any) -> None:
    """Answer the commands on stdin until it ends."""
    commands = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    pending = b""
    while data := await commands.receive_some():
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            reply = answer(running, line.split())
            if reply is not None:
                print(json.dumps(reply), flush=True)


async def _serve(config: Any) -> None:
    from minibroker import serve
    from minibroker.cli import tune_collector

    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with serve(config) as running, trio.open_nursery() as nursery:
            print(f"minibroker listening on {running.url}", flush=True)
            tune_collector()  # as python -m minibroker does

            async def until_signal() -> None:
                async for _ in signals:
                    break
                nursery.cancel_scope.cancel()

            nursery.start_soon(until_signal)
            await _answer_stdin(running)
            nursery.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> int:
    """Parse ``python -m minibroker``'s arguments, then serve (see the module docstring); the exit code."""
    from minibroker.cli import build_parser, resolve_config
    from minibroker.config import ConfigError

    args = build_parser().parse_args(argv)
    try:
        config = resolve_config(args, dict(os.environ))
    except ConfigError as exc:
        print(f"bench.introspect: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=getattr(logging, config.log_level.upper()), stream=sys.stderr)
    trio.run(_serve, config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
