"""Shared steps of the RabbitMQ model tests: a broker core driven in memory by ``tests/broker/txn_driver.py``'s
frame-level peers (no sockets, time moves only with ``World.advance``)."""

from __future__ import annotations

from typing import Any

import pytest

from minibroker.amqp.definitions import ApplicationProperties, MessageAnnotations, Properties
from minibroker.amqp.types import Symbol
from minibroker.amqp091.definitions import ReplyCode
from minibroker.broker.rabbit import RabbitError
from minibroker.testing import frames
from tests.broker.txn_driver import World, name_in
from tests.personalities.harness import peer, world

__all__ = ["fails", "message", "names_in", "peer", "rabbit_world", "ready"]


def rabbit_world(personality: str = "minibroker", **settings: Any) -> World:
    """A broker core whose queues are never created on demand (as RabbitMQ's), to be sure that a route reaches a
    declared queue and never makes one."""
    return world(personality, auto_create=False, **settings)


def message(
    name: str,
    *,
    subject: str | None = None,
    to: str | None = None,
    headers: dict[str, Any] | None = None,
    annotations: dict[str, Any] | None = None,
) -> bytes:
    """An encoded message named ``name`` with the sections asked for."""
    sections: list[Any] = []
    if annotations is not None:
        sections.append(MessageAnnotations({Symbol(k): v for k, v in annotations.items()}))
    if subject is not None or to is not None:
        sections.append(Properties(to=to, subject=subject))
    if headers is not None:
        sections.append(ApplicationProperties(headers))
    return frames.message(f"<<{name}>>", *sections)


def ready(w: World, queue: str, namespace: str | None = None) -> list[str | None]:
    """The names of the ready messages of ``queue``, in delivery order."""
    space = w.broker.namespaces[namespace] if namespace else w.broker.default
    return [name_in(m.payload) for m in space.queues[queue].ready]


def names_in(payloads: list[bytes]) -> list[str | None]:
    return [name_in(p) for p in payloads]


def fails(code: ReplyCode, text: str | None = None) -> Any:
    """``pytest.raises`` for a ``RabbitError`` with ``code`` (and exactly ``text`` when given)."""

    class _Check:
        def __enter__(self) -> None:
            self.raises = pytest.raises(RabbitError)
            self.info = self.raises.__enter__()

        def __exit__(self, *exc: Any) -> bool:
            handled = self.raises.__exit__(*exc)
            err = self.info.value
            assert err.reply_code == code, err
            if text is not None:
                assert err.text == text
            return bool(handled)

    return _Check()
