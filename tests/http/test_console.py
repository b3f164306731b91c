"""The web console at ``GET /``: the page as package data, and a real headless browser using it.

The browser is Debian's chromium, driven through its own chromedriver by selenium (the two packages come from
one source package, so their versions always match). When /usr/bin/chromium is missing, the session fixture
installs it with apt-get (about 20 s on a fresh machine of this kind, update included); the test is skipped,
with the reason, only when that cannot be done (not root, no apt-get, no network).

Set ``MINIBROKER_CONSOLE_SCREENSHOT=docs/console.png`` to save the screenshot the README shows.
"""

from __future__ import annotations

import base64
import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from proton import Message
from proton.utils import BlockingConnection
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from minibroker.amqp.definitions import AmqpValue, Coordinator, Declare, Disposition, Flow, Source, TransactionalState
from minibroker.amqp.types import Symbol
from minibroker.http import console
from minibroker.testing import frames
from minibroker.testing.peer import ScriptedPeer
from minibroker.testing.thread import ThreadedBroker, run_in_thread
from tests.http.client import call, http_broker

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
APT_TIMEOUT = 600.0  # each of apt-get update and apt-get install
WAIT_FOR_APT_LOCK = ["-o", "DPkg::Lock::Timeout=120"]  # rather than fail while another apt runs
WAIT = 10.0  # for anything the page should show

# whichever test comes first on a fresh machine waits for the browser's installation
pytestmark = pytest.mark.timeout(2 * APT_TIMEOUT + 60)


def test_page_is_self_contained_html() -> None:
    page = console.page().decode()
    assert page.startswith("<!doctype html>")
    assert console.CONTENT_TYPE == "text/html; charset=utf-8"
    # no CDN, no absolute URL: it works offline and under any path prefix
    assert not re.search(r"""(src|href)\s*=\s*["'](https?:)?//""", page)
    assert "fetch(API + path" in page
    assert console.page() is console.page()  # read once


@pytest.mark.parametrize("path", ["/", "/api/namespaces/default/"])
def test_the_api_serves_the_console(path: str) -> None:
    with http_broker() as broker:
        answer = call(broker, "GET", path)
        assert answer.status == 200
        assert answer.headers["content-type"] == console.CONTENT_TYPE
        assert answer.body == console.page()


def test_the_console_needs_the_api_credentials_and_no_namespace_has_none() -> None:
    with http_broker(auth={"failure_delay": 0.0, "users": {"viewer": "v1ew"}}) as broker:
        assert call(broker, "GET", "/").status == 401
        assert call(broker, "GET", "/", auth=("viewer", "v1ew")).status == 200
        unknown = call(broker, "GET", "/api/namespaces/nope/", auth=("viewer", "v1ew"))
        assert (unknown.status, unknown.json) == (404, {"error": "no namespace 'nope'"})


# -- the browser --------------------------------------------------------------------------------------
def _install_chromium() -> str | None:
    """Install Debian's chromium and chromium-driver; the reason it could not, or None."""
    if shutil.which("apt-get") is None:
        return "no apt-get to install Debian's chromium with"
    if os.geteuid() != 0:
        return "not root: cannot apt-get install chromium chromium-driver"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    started = time.monotonic()
    for command in (
        ["apt-get", "update", "-q", *WAIT_FOR_APT_LOCK],
        [
            "apt-get",
            "install",
            "-y",
            "-q",
            *WAIT_FOR_APT_LOCK,
            "--no-install-recommends",
            "chromium",
            "chromium-driver",
        ],
    ):
        try:
            subprocess.run(command, env=env, capture_output=True, text=True, timeout=APT_TIMEOUT, check=True)
        except subprocess.TimeoutExpired:
            return f"{' '.join(command[:2])} took over {APT_TIMEOUT:.0f} s"
        except subprocess.CalledProcessError as exc:
            tail = " | ".join(exc.stderr.strip().splitlines()[-3:])
            return f"{' '.join(command[:2])} failed ({exc.returncode}): {tail}"
    print(f"installed chromium and chromium-driver in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return None


@pytest.fixture(scope="session")
def chromium() -> Path:
    """The path of Debian's chromium, installed if need be; a skip, with why, if it cannot be."""
    # one installer at a time (pytest-xdist workers each run this fixture); the others find it installed
    with (Path(tempfile.gettempdir()) / "minibroker-chromium-install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
            reason = _install_chromium()
            if reason is not None:
                pytest.skip(f"Debian's chromium is not installed and cannot be: {reason}")
    return CHROMIUM


@pytest.fixture
def browser(chromium: Path) -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(chromium)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,860"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    try:
        yield driver
    finally:
        driver.quit()


# -- AMQP: real clients putting work in the broker ------------------------------------------------------
def post_orders(broker: ThreadedBroker, count: int, queue: str = "orders") -> None:
    conn = BlockingConnection(broker.url, timeout=WAIT)
    try:
        sender = conn.create_sender(queue)
        for n in range(1, count + 1):
            sender.send(Message(body=f"order {n}", subject="order", properties={"n": n}))
    finally:
        conn.close()


def post_orders_as(broker: ThreadedBroker, user: str, password: str) -> None:
    conn = BlockingConnection(broker.url, timeout=WAIT, user=user, password=password)
    try:
        conn.create_sender("orders").send(Message(body="order"))
    finally:
        conn.close()


def open_transaction(broker: ThreadedBroker) -> ScriptedPeer:
    """A connection left open with a declared transaction that staged one post to ``orders``."""
    peer = ScriptedPeer.connect(broker.host, broker.port, timeout=WAIT)
    peer.open(container_id="console-test")
    peer.begin()
    peer.attach_sender(
        None, 0, "txn", source=Source(), target=Coordinator(capabilities=[Symbol("amqp:local-transactions")])
    )
    peer.expect(Flow)
    peer.transfer(0, 0, frames.message(AmqpValue(Declare())))
    txn_id = peer.expect(Disposition).state.txn_id
    peer.attach_sender("orders", 1, "staged")
    peer.expect(Flow)
    peer.transfer(1, 1, frames.message("staged order"), state=TransactionalState(txn_id=txn_id))
    peer.expect(Disposition)
    return peer


# -- the page, as a person sees it ----------------------------------------------------------------------
def wait_until(driver: WebDriver, what: str, condition: Callable[[WebDriver], Any]) -> Any:
    def check(d: WebDriver) -> Any:
        try:
            return condition(d)
        except StaleElementReferenceException:
            return False

    return WebDriverWait(driver, WAIT, poll_frequency=0.1).until(check, message=f"the console never showed {what}")


def cell(driver: WebDriver, selector: str) -> str:
    found = driver.find_elements(By.CSS_SELECTOR, selector)
    return found[0].text if found else ""


def confirm(driver: WebDriver) -> str:
    alert = WebDriverWait(driver, WAIT).until(expected_conditions.alert_is_present())
    text = alert.text
    alert.accept()
    return text


def test_console_shows_queues_transactions_and_connections_and_purges_and_resets(browser: WebDriver) -> None:
    with run_in_thread({"server": {"port": 0}, "http": {"port": 0}}) as broker:
        post_orders(broker, 3)
        peer = open_transaction(broker)
        try:
            browser.get(f"{broker.http_url}/")
            row = 'tr[data-queue="orders"]'
            wait_until(browser, "orders with depth 3", lambda d: cell(d, f"{row} td.depth") == "3")
            assert cell(browser, f"{row} td.staged") == "1"
            assert cell(browser, f"{row} td.acquired") == "0"
            wait_until(browser, "the open transaction", lambda d: cell(d, "tr.transaction td.posts") == "1")
            assert float(cell(browser, "tr.transaction td.age")) >= 0
            assert cell(browser, "tr.transaction td.addresses") == "orders"
            wait_until(browser, "the open connection", lambda d: "console-test" in cell(d, "#connections tbody"))
            assert cell(browser, "tr.connection td.peer").startswith("127.0.0.1:")

            browser.find_element(By.CSS_SELECTOR, f"{row} td.name").click()  # peek
            wait_until(browser, "3 ready messages", lambda d: len(d.find_elements(By.CSS_SELECTOR, "tr.message")) == 3)
            assert cell(browser, "tr.message td.body") == "order 1"
            assert "n: 1" in cell(browser, "tr.message td.application-properties")
            assert "order" in cell(browser, "tr.message td.properties")
            if screenshot := os.environ.get("MINIBROKER_CONSOLE_SCREENSHOT"):
                browser.save_screenshot(screenshot)

            browser.find_element(By.CSS_SELECTOR, f"{row} button.purge").click()
            assert "orders" in confirm(browser)
            wait_until(browser, "orders with depth 0", lambda d: cell(d, f"{row} td.depth") == "0")
            wait_until(browser, "the peek emptied", lambda d: not d.find_elements(By.CSS_SELECTOR, "tr.message"))
            assert "purged 3 from orders" in cell(browser, "#status")
            assert broker.queue("orders").depth == 0

            browser.find_element(By.ID, "reset").click()
            confirm(browser)
            wait_until(browser, "no transaction left", lambda d: cell(d, "#transactions tbody") == "none")
            assert "broker reset" in cell(browser, "#status")
            assert broker.transactions == []
        finally:
            peer.close_socket()


def test_console_of_a_namespace_shows_that_namespace(browser: WebDriver) -> None:
    with run_in_thread({"server": {"port": 0}, "http": {"port": 0}}) as broker:
        post_orders(broker, 2)
        tenant = broker.create_namespace("tenant")
        post_orders(tenant, 1, "invoices")
        browser.get(f"{broker.http_url}/api/namespaces/tenant/")
        wait_until(browser, "invoices with depth 1", lambda d: cell(d, 'tr[data-queue="invoices"] td.depth') == "1")
        assert not browser.find_elements(By.CSS_SELECTOR, 'tr[data-queue="orders"]')
        browser.find_element(By.CSS_SELECTOR, 'tr[data-queue="invoices"]').send_keys(Keys.ENTER)  # peek
        wait_until(browser, "the invoice peeked", lambda d: cell(d, "tr.message td.body") == "order 1")


def test_console_with_users_shows_what_the_api_refuses(browser: WebDriver) -> None:
    auth = {"failure_delay": 0.0, "users": {"viewer": "v1ew"}, "permissions": {"viewer": {}}}
    with run_in_thread({"server": {"port": 0}, "http": {"port": 0}, "auth": auth}) as broker:
        post_orders_as(broker, "viewer", "v1ew")
        # what the browser sends once its user typed credentials into the Basic prompt
        credentials = base64.b64encode(b"viewer:v1ew").decode()
        browser.execute_cdp_cmd("Network.enable", {})
        browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Basic {credentials}"}})
        browser.get(f"{broker.http_url}/")
        row = 'tr[data-queue="orders"]'
        wait_until(browser, "orders with depth 1", lambda d: cell(d, f"{row} td.depth") == "1")
        browser.find_element(By.CSS_SELECTOR, f"{row} button.purge").click()
        confirm(browser)
        wait_until(browser, "the refusal", lambda d: "purge failed: 403" in cell(d, "#status"))
        assert cell(browser, f"{row} td.depth") == "1"
        assert broker.queue("orders").depth == 1
