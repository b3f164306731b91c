"""``minibroker queues | peek | purge | send | txns | reset``: a running broker managed over its HTTP API.

Each command makes one request to the management API (``--http URL``, else ``MINIBROKER_HTTP_URL``, else
``http://127.0.0.1:8672``), with HTTP Basic auth when a user is given (``--user``/``--password``, or
``MINIBROKER_HTTP_USER``/``MINIBROKER_HTTP_PASSWORD``, or in the URL), in the namespace ``--namespace`` (the
default one unless told). It prints a table, or with ``--json`` the API's answer as JSON. Exit codes: 0 when
the broker did it, 1 when it cannot be reached or answers an error (the message says which), 2 for bad
arguments. Credentials are never printed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode

from minibroker.remote import DEFAULT_HTTP_URL, RemoteBroker, RemoteError, connect

COMMANDS = ("queues", "peek", "purge", "send", "txns", "reset")
URL_ENV = "MINIBROKER_HTTP_URL"
USER_ENV = "MINIBROKER_HTTP_USER"
PASSWORD_ENV = "MINIBROKER_HTTP_PASSWORD"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """``rows`` under ``headers`` in columns as wide as their widest cell (None shows as ``-``)."""
    cells = [list(headers), *[["-" if cell is None else str(cell) for cell in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def _queue_path(name: str) -> str:
    return f"/queues/{quote(name, safe='')}"


def _queues(broker: RemoteBroker, args: argparse.Namespace) -> tuple[Any, str]:
    answer = broker.request("GET", "/queues")
    rows = [
        [q["name"], q.get("depth"), q.get("acquired"), q.get("staged"), q.get("consumers"), q.get("kind")]
        for q in answer
    ]
    return answer, table(["QUEUE", "DEPTH", "ACQUIRED", "STAGED", "CONSUMERS", "KIND"], rows)


def _shown_body(message: Mapping[str, Any]) -> str:
    if message.get("body_encoding") == "base64":
        return f"<{message.get('body')} (base64)>"
    body = message.get("body")
    return body if isinstance(body, str) else json.dumps(body)


def _peek(broker: RemoteBroker, args: argparse.Namespace) -> tuple[Any, str]:
    query = "" if args.limit is None else f"?{urlencode({'limit': args.limit})}"
    answer = broker.request("GET", f"{_queue_path(args.queue)}/messages{query}")
    rows = [
        [
            i,
            (m.get("properties") or {}).get("message_id"),
            _shown_body(m),
            json.dumps(m.get("application_properties") or {}, sort_keys=True),
        ]
        for i, m in enumerate(answer)
    ]
    return answer, table(["#", "MESSAGE-ID", "BODY", "APPLICATION-PROPERTIES"], rows)


def _purge(broker: RemoteBroker, args: argparse.Namespace) -> tuple[Any, str]:
    answer = broker.request("DELETE", f"{_queue_path(args.queue)}/messages")
    return answer, f"purged {answer['purged']} message(s) from {args.queue}"


def _property(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= 24 * 3600:  # also false for nan
        raise argparse.ArgumentTypeError(f"{text!r}: expected more than 0 and at most 86400 seconds")
    return value


def _send(broker: RemoteBroker, args: argparse.Namespace) -> tuple[Any, str]:
    message: dict[str, Any] = {"body": args.body}
    if args.property:
        message["application_properties"] = dict(args.property)
    answer = broker.request("POST", f"{_queue_path(args.queue)}/messages", message)
    return answer, f"sent 1 message to {args.queue}"


def _txns(broker: RemoteBroker, args: argparse.Namespace) -> tuple[Any, str]:
    answer = broker.request("GET", "/transactions")
    rows = [
        [
            t["id"],
            t.get("connection"),
            f"{float(t.get('age_s', 0)):.1f}",
            t.get("posts"),
            t.get("retirements"),
            t.get("acquisitions"),
            t.get("state"),
            t.get("failed"),
        ]
        for t in answer
    ]
    headers = ["TXN-ID", "CONNECTION", "AGE-S", "POSTS", "RETIREMENTS", "ACQUISITIONS", "STATE", "FAILED"]
    return answer, table(headers, rows)


def _reset(broker: RemoteBroker, args: argparse.Namespace) -> tuple[Any, str]:
    answer = broker.request("POST", "/reset")
    return answer, f"reset namespace {broker.namespace_name}"


_RUN: dict[str, Callable[[RemoteBroker, argparse.Namespace], tuple[Any, str]]] = {
    "queues": _queues,
    "peek": _peek,
    "purge": _purge,
    "send": _send,
    "txns": _txns,
    "reset": _reset,
}


def build_parser(command: str, environ: Mapping[str, str]) -> argparse.ArgumentParser:
    """The arguments of ``minibroker COMMAND`` (one of ``COMMANDS``)."""
    descriptions = {
        "queues": "list the queues with their counts",
        "peek": "show a queue's ready messages without consuming them",
        "purge": "drop a queue's ready messages",
        "send": "send one message to a queue",
        "txns": "list the open transactions",
        "reset": "drop every node, message and transaction; close the connections",
    }
    parser = argparse.ArgumentParser(prog=f"minibroker {command}", description=descriptions[command])
    parser.add_argument(
        "--http",
        metavar="URL",
        default=environ.get(URL_ENV, DEFAULT_HTTP_URL),
        help=f"the broker's HTTP management API (default ${URL_ENV}, else {DEFAULT_HTTP_URL})",
    )
    parser.add_argument("--user", default=environ.get(USER_ENV), help=f"HTTP Basic auth user (default ${USER_ENV})")
    parser.add_argument(
        "--password", default=environ.get(PASSWORD_ENV), help=f"HTTP Basic auth password (default ${PASSWORD_ENV})"
    )
    parser.add_argument("--namespace", help="the namespace to act in (default: the broker's default one)")
    parser.add_argument("--timeout", type=_seconds, default=10.0, help="seconds to wait for the answer (default 10)")
    parser.add_argument("--json", action="store_true", help="print the API's answer as JSON instead of a table")
    if command in ("peek", "purge", "send"):
        parser.add_argument("queue", metavar="QUEUE")
    if command == "peek":
        parser.add_argument("--limit", type=int, help="show at most this many messages")
    if command == "send":
        parser.add_argument("body", metavar="BODY", help="the message body (a string)")
        parser.add_argument(
            "--property",
            "-p",
            metavar="KEY=VALUE",
            type=_property,
            action="append",
            help="an application property (string value); repeat for more",
        )
    return parser


def main(command: str, argv: Sequence[str], environ: Mapping[str, str] | None = None) -> int:
    """``minibroker COMMAND [options]``: 0 when done, 1 when the broker cannot be reached or answers an error."""
    environ = os.environ if environ is None else environ
    args = build_parser(command, environ).parse_args(argv)
    try:
        broker = connect(args.http, user=args.user, password=args.password, timeout=args.timeout)
    except ValueError as exc:  # not an http(s) URL, a port that is not a number
        print(f"minibroker {command}: {exc}", file=sys.stderr)
        return 2
    if args.namespace:
        broker = broker.namespace(args.namespace)
    try:
        answer, text = _RUN[command](broker, args)
    except (RemoteError, LookupError) as exc:  # LookupError: no such namespace
        print(f"minibroker {command}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(answer, indent=2, sort_keys=True) if args.json else text)
    return 0


__all__ = ["COMMANDS", "build_parser", "main", "table"]
