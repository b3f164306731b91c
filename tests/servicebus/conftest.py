"""A broker in the ``servicebus`` personality and the azure-servicebus SDK's client for it (issue 17)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from azure.servicebus import ServiceBusClient  # a test dependency (the ``test`` extras): never skipped

from minibroker.testing.thread import ThreadedBroker, run_in_thread
from tests.npm_install import ensure_package, node_and_npm
from tests.servicebus import node_sdk
from tests.servicebus.node_sdk import NodeSdk


def connection_string(port: int) -> str:
    """The Service Bus emulator's connection string, pointed at ``port`` (plain AMQP: UseDevelopmentEmulator)."""
    return (
        f"Endpoint=sb://127.0.0.1:{port};SharedAccessKeyName=RootManageSharedAccessKey;"
        "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true"
    )


@pytest.fixture
def sb_broker() -> Iterator[ThreadedBroker]:
    with run_in_thread({"server": {"port": 0}, "broker": {"personality": "servicebus"}}) as broker:
        yield broker


@pytest.fixture
def client(sb_broker: ThreadedBroker) -> Iterator[ServiceBusClient]:
    with ServiceBusClient.from_connection_string(connection_string(sb_broker.port)) as sb:
        yield sb


@pytest.fixture
def virtual_broker() -> Iterator[ThreadedBroker]:
    """A ``servicebus`` broker on the virtual clock: ``broker.clock.advance(s)`` moves its time (locks, schedules)."""
    config = {"server": {"port": 0}, "broker": {"personality": "servicebus", "clock": "virtual"}}
    with run_in_thread(config) as broker:
        yield broker


@pytest.fixture
def virtual_client(virtual_broker: ThreadedBroker) -> Iterator[ServiceBusClient]:
    with ServiceBusClient.from_connection_string(connection_string(virtual_broker.port)) as sb:
        yield sb


@pytest.fixture(scope="session")
def js_sdk() -> NodeSdk:
    """``@azure/service-bus`` installed once into ``tests/servicebus/.node`` (git-ignored), run with node."""
    node, npm = node_and_npm("the @azure/service-bus tests")
    ensure_package(npm, node_sdk.CACHE, node_sdk.PACKAGE, node_sdk.SPEC, node_sdk.VERSION_PREFIX)
    return NodeSdk(node, node_sdk.CACHE / "node_modules")
