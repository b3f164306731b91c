"""The ``minibroker`` command (DESIGN §2).

Precedence of settings: command line, then environment (``MINIBROKER_HOST``, ``MINIBROKER_PORT``,
``MINIBROKER_HTTP_PORT``, ``MINIBROKER_HTTP_HOST``, ``MINIBROKER_CONFIG``, ``MINIBROKER_RECOVER``,
``MINIBROKER_PERSONALITY``, ``MINIBROKER_CLOCK``, ``MINIBROKER_SERVICEBUS_CONFIG``), then the config file, then
defaults. ``--servicebus-config Config.json`` reads the Service Bus emulator's entity file (``[servicebus] config``)
and, unless a personality is named, makes the broker a ``servicebus`` one.
``minibroker personalities`` prints every personality ``--personality`` can name, with its quirks.
``minibroker replay CAPTURE --url URL`` replays a captured connection (``minibroker.replay``).
Exit codes: 0 after SIGINT/SIGTERM, 2 for bad arguments or a bad config file (the message names the file, the key
and the problem) and for a data dir that cannot be used (not a directory, not writable, held by another broker, a
corrupt journal: the message says which), 1 when the listener cannot be bound.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import trio

from minibroker.broker import personality as personalities
from minibroker.config import CLOCK_MODES, Config, ConfigError
from minibroker.server.app import serve
from minibroker.store import RECOVER_MODES

# Not imported here, to keep the broker's start-up short (issue 19): each subcommand's module (``health``, ``auth``,
# ``manage_cli``, ``replay``) is imported by its branch of ``main``, the journal (``JournalError``) with a data dir.

CONTAINER_CONFIG = Path("/etc/minibroker/minibroker.toml")
LOG_LEVELS = ("debug", "info", "warning", "error")


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (0-65535; 0 picks a free one)")
    return port


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minibroker",
        description="An embeddable AMQP 1.0 broker for testing, with complete transactions.",
        epilog="minibroker check [--url amqp[s]://[USER:PASSWORD@]HOST:PORT] [--user USER] [--password PASSWORD] "
        "[--ca-file PATH] [--insecure]: exit 0 if a broker answers AMQP open within a second, else 1 (credentials "
        "are never printed; MINIBROKER_CHECK_USER and MINIBROKER_CHECK_PASSWORD work too; amqps is checked over "
        "TLS). "
        "minibroker hash-password: print a password hash for [auth.users]. "
        "minibroker personalities: print every personality --personality can name, with its quirks. "
        "minibroker replay CAPTURE --url amqp://HOST:PORT: replay a captured connection (--capture) against a "
        "broker and compare its answers (exit 0 the same, 1 different, 2 bad input). "
        "minibroker queues | peek QUEUE | purge QUEUE | send QUEUE BODY | txns | reset [--http URL] [--user USER] "
        "[--password PASSWORD] [--json]: manage a running broker through its HTTP API (MINIBROKER_HTTP_URL, "
        "default http://127.0.0.1:8672; MINIBROKER_HTTP_USER and MINIBROKER_HTTP_PASSWORD work too).",
    )
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=_port, help="TCP port (default 5672; 0 picks a free port)")
    parser.add_argument(
        "--http-port",
        type=_port,
        help="port of the HTTP management API on [http] host (default 127.0.0.1); 0 picks a free port "
        "(default: no HTTP listener)",
    )
    parser.add_argument("--config", metavar="PATH", help="TOML configuration file")
    parser.add_argument("--data-dir", metavar="PATH", help="directory for durable storage (default: memory)")
    parser.add_argument(
        "--recover",
        choices=RECOVER_MODES,
        help="on a corrupt journal: strict (default) refuses to start, skip-corrupt skips the corrupt records "
        "(a copy is kept in DATA_DIR/quarantine)",
    )
    parser.add_argument(
        "--personality",
        choices=personalities.names(),
        metavar="NAME",
        help="whose behaviour on the wire the broker has: "
        f"{', '.join(personalities.names())} (default minibroker; `minibroker personalities` lists their quirks)",
    )
    parser.add_argument(
        "--clock",
        choices=CLOCK_MODES,
        help="what the broker's timers run on: real (default), or virtual time that moves only when advanced "
        "(POST /api/clock/advance); handshake, idle time-out and heartbeats stay on real time",
    )
    parser.add_argument(
        "--servicebus-config",
        metavar="PATH",
        help="the Service Bus emulator's Config.json: its queues, topics and subscriptions are created at start "
        "([servicebus] config); the personality becomes servicebus unless one is named",
    )
    parser.add_argument("--log-level", choices=LOG_LEVELS, help="logging threshold (default info)")
    parser.add_argument(
        "--trace-frames", action="store_true", default=None, help="print every frame, decoded, to stderr"
    )
    parser.add_argument(
        "--capture",
        action="store_true",
        default=None,
        help="record every frame ([broker] capture): GET /api/connections/ID/frames, /api/capture.pcap",
    )
    return parser


def resolve_config(args: argparse.Namespace, environ: dict[str, str]) -> Config:
    """Merge command line, environment, config file and defaults, in that order of precedence."""
    path = args.config or environ.get("MINIBROKER_CONFIG")
    if path is None and CONTAINER_CONFIG.exists():
        path = str(CONTAINER_CONFIG)
    servicebus = args.servicebus_config or environ.get("MINIBROKER_SERVICEBUS_CONFIG") or None
    if path:
        config = Config.load(path, servicebus_config=servicebus)
    elif servicebus is not None:
        config = Config.from_dict({"servicebus": {"config": servicebus}}, source="--servicebus-config")
    else:
        config = Config()
    host = args.host or environ.get("MINIBROKER_HOST")
    port_text = environ.get("MINIBROKER_PORT")
    port = args.port
    if port is None and port_text is not None:
        try:
            port = _port(port_text)
        except argparse.ArgumentTypeError as exc:
            raise ConfigError(f"environment: MINIBROKER_PORT: {exc}") from None
    http_port = args.http_port
    http_text = environ.get("MINIBROKER_HTTP_PORT")
    if http_port is None and http_text is not None:
        try:
            http_port = _port(http_text)
        except argparse.ArgumentTypeError as exc:
            raise ConfigError(f"environment: MINIBROKER_HTTP_PORT: {exc}") from None
    changes: dict[str, object] = {}
    if http_port is not None:
        changes["http__port"] = http_port
    http_host = environ.get("MINIBROKER_HTTP_HOST")  # the container image's: the API reachable from outside it
    if http_host:
        changes["http__host"] = http_host
    if host:
        changes["server__host"] = host
    if port is not None:
        changes["server__port"] = port
    if args.log_level:
        changes["log_level"] = args.log_level
    if args.trace_frames:
        changes["trace_frames"] = True
    if args.capture:
        changes["broker__capture"] = True
    if args.data_dir:
        changes["data_dir"] = args.data_dir
    recover = args.recover or environ.get("MINIBROKER_RECOVER")
    if recover is not None:
        if recover not in RECOVER_MODES:
            raise ConfigError(f"environment: MINIBROKER_RECOVER: {recover!r} is not one of {', '.join(RECOVER_MODES)}")
        changes["data_recover"] = recover
    personality = args.personality or environ.get("MINIBROKER_PERSONALITY")
    if personality is not None:
        if personality not in personalities.names():  # the command line's is checked by argparse
            known = ", ".join(personalities.names())
            raise ConfigError(
                f"environment: MINIBROKER_PERSONALITY: unknown personality {personality!r} (known: {known})"
            )
        changes["broker__personality"] = personality
    clock = args.clock or environ.get("MINIBROKER_CLOCK")
    if clock is not None:
        if clock not in CLOCK_MODES:  # the command line's is checked by argparse
            raise ConfigError(f"environment: MINIBROKER_CLOCK: {clock!r} is not one of {', '.join(CLOCK_MODES)}")
        changes["broker__clock"] = clock
    return config.replace(**changes) if changes else config


def print_personalities(argv: Sequence[str]) -> int:
    """``minibroker personalities``: every personality with its quirks, separated by blank lines; exit 0."""
    parser = argparse.ArgumentParser(
        prog="minibroker personalities",
        description="Print every personality (--personality, [broker] personality) with its quirks and their sources.",
    )
    parser.add_argument("--markdown", action="store_true", help="print them as the README's Markdown table")
    args = parser.parse_args(argv)
    if args.markdown:
        print(personalities.markdown_table())
    else:
        print("\n\n".join(personalities.get(name).describe() for name in personalities.names()))
    return 0


YOUNG_COLLECTION_EVERY = 10_000
"""Allocations between two collections of the youngest generation in a broker process (CPython's default: 700)."""


def tune_collector() -> None:
    """Tune CPython's cyclic garbage collector for a broker process, once it is serving.

    A broker holds many long-lived objects (queued messages, their contents, links) and makes few reference cycles.
    With CPython's defaults, a growing queue sets off full collections of the whole heap again and again, every
    queued message scanned each time: 8-10 % of the CPU of filling queues, and a third of each transactional
    message's on a broker holding 40,000 messages (bench/README.md, "The garbage collector"). So what the start-up
    made (modules, classes, the configured nodes) leaves every future collection (``gc.freeze``), and the youngest
    generation is collected every ``YOUNG_COLLECTION_EVERY`` allocations: young collections, and the checks that
    start a full one, come a fourteenth as often; unreachable cycles are still collected, later. Only
    ``python -m minibroker`` does this: embedded, the broker leaves the collector as the application set it.
    """
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_EVERY, *gc.get_threshold()[1:])


async def _run(config: Config) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with serve(config) as running:
            for url in running.urls:
                print(f"minibroker listening on {url}", flush=True)
            if running.http_url is not None:
                print(f"minibroker http on {running.http_url}", flush=True)
            tune_collector()
            async for _ in signals:
                break
    logging.getLogger("minibroker").info("stopped")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["check"]:
        from minibroker import health  # the probe and its client core: for this subcommand only

        return health.main(argv[1:])
    if argv[:1] == ["hash-password"]:
        from minibroker import auth  # for this subcommand only

        return auth.main(argv[1:])
    if argv[:1] == ["personalities"]:
        return print_personalities(argv[1:])
    if argv[:1] == ["replay"]:
        from minibroker import replay  # imported only for the subcommand

        return replay.main(argv[1:])
    if argv[:1] and not argv[0].startswith("-"):  # a word, not an option: perhaps a management command
        from minibroker import manage_cli  # with its HTTP client: not for the broker itself

        if argv[0] in manage_cli.COMMANDS:
            return manage_cli.main(argv[0], argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = resolve_config(args, dict(os.environ))
    except ConfigError as exc:
        print(f"minibroker: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=getattr(logging, config.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        trio.run(_run, config)
    except BaseException as raised:
        error = _alone(raised)  # a listener that cannot be bound fails inside serve's nursery: in a group
        journal = sys.modules.get("minibroker.store.journal")  # loaded only with a data dir
        if journal is not None and isinstance(error, journal.JournalError):  # not a dir, not writable, locked, corrupt
            print(f"minibroker: {error}", file=sys.stderr)
            return 2
        http_server = sys.modules.get("minibroker.http.server")  # loaded only with the HTTP listener on
        if http_server is not None and isinstance(error, http_server.HttpListenError):
            print(f"minibroker: {error}", file=sys.stderr)
            return 1
        if isinstance(error, OSError):
            print(f"minibroker: cannot listen on {config.server.host}:{config.server.port}: {error}", file=sys.stderr)
            return 1
        if not isinstance(error, KeyboardInterrupt):
            raise
    return 0


def _alone(exc: BaseException) -> BaseException:
    """The one exception inside (nested) exception groups of one member each, else ``exc`` itself."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
