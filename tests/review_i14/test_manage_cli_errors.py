"""The management CLI answers bad input with a message and an exit code, never a traceback, and never prints
the password of its URL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from minibroker.manage_cli import main
from minibroker.testing.thread import ThreadedBroker
from tests.http.client import http_broker


@pytest.fixture
def broker() -> Iterator[ThreadedBroker]:
    with http_broker() as running:
        yield running


def test_a_namespace_that_does_not_exist(broker: ThreadedBroker, capsys: pytest.CaptureFixture[str]) -> None:
    assert broker.http_url is not None
    code = main("queues", ["--http", broker.http_url, "--namespace", "nope"], {})
    assert code == 1
    assert "nope" in capsys.readouterr().err


@pytest.mark.parametrize("timeout", ["nan", "-1", "inf"])
def test_a_bad_timeout(broker: ThreadedBroker, capsys: pytest.CaptureFixture[str], timeout: str) -> None:
    assert broker.http_url is not None
    with pytest.raises(SystemExit) as exited:
        main("queues", ["--http", broker.http_url, "--timeout", timeout], {})
    assert exited.value.code == 2
    assert "timeout" in capsys.readouterr().err


def test_the_password_of_the_url_is_never_printed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main("queues", ["--http", "http://ops:hunter2@127.0.0.1:1"], {}) == 1
    assert main("queues", ["--http", "ftp://ops:hunter2@127.0.0.1:1"], {}) == 2
    assert main("queues", ["--http", "http://ops:hunter2@127.0.0.1:notaport"], {}) == 2
    captured = capsys.readouterr()
    assert "hunter2" not in captured.err + captured.out
