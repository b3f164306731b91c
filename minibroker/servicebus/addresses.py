"""Service Bus entity addresses (issue 17 item 2).

The Python SDK attaches to ``amqps://HOST:PORT/ENTITY`` even without TLS (azure-servicebus
``_servicebus_sender.py`` ``ServiceBusSender.__init__``: ``self._entity_uri = "amqps://{}/{}"``, and
``_servicebus_receiver.py`` likewise, with ``/$DeadLetterQueue`` appended for ``ServiceBusSubQueue.DEAD_LETTER``).
A subscription is ``TOPIC/Subscriptions/NAME`` (``_common/constants.py`` ``SUBSCRIPTION_ENTITY_PATH``... as
``ServiceBusReceiver`` builds it: ``"{}/Subscriptions/{}"``).
"""

from __future__ import annotations

CBS = "$cbs"
"""The claims-based-security node (``_pyamqp/cbs.py`` ``CBSAuthenticator``: ``management_link`` on ``"$cbs"``)."""
MANAGEMENT = "$management"
"""An entity's management node (``_servicebus_receiver.py`` / ``_servicebus_sender.py``: ``entity + "/$management"``;
its operations are ``minibroker.broker.management``)."""
DEAD_LETTER_QUEUE = "$DeadLetterQueue"
"""The dead-letter sub-queue of an entity (``_common/constants.py`` ``DEAD_LETTER_QUEUE_SUFFIX``)."""
_SUBSCRIPTIONS = "/subscriptions/"


def entity_path(address: str) -> str:
    """``address`` without scheme and authority: ``amqps://host:5672/orders`` is ``orders``; a bare name as it is."""
    scheme, sep, rest = address.partition("://")
    if not sep or "/" in scheme:
        return address
    _authority, _slash, path = rest.partition("/")
    return path


def subscription(path: str) -> tuple[str, str, str] | None:
    """``(topic, subscription, sub-queue)`` when ``path`` names a subscription (``TOPIC/Subscriptions/NAME``,
    case-insensitive as Service Bus is, optionally followed by ``/$DeadLetterQueue``); None otherwise."""
    at = path.lower().find(_SUBSCRIPTIONS)
    if at <= 0:
        return None
    topic, rest = path[:at], path[at + len(_SUBSCRIPTIONS) :]
    name, _sep, sub_queue = rest.partition("/")
    if not name:
        return None
    return topic, name, sub_queue


def sub_queue_node(topic: str, name: str, sub_queue: str) -> str:
    """The node of a subscription's sub-queue (``orders/Subscriptions/audit/$DeadLetterQueue``): a queue of its own."""
    return f"{topic}/Subscriptions/{name}/{sub_queue}"


def is_management(path: str) -> bool:
    """Whether ``path`` names a management node (``$management`` or ``ENTITY/$management``)."""
    return path == MANAGEMENT or path.endswith("/" + MANAGEMENT)


def dead_letter_queue(entity: str) -> str:
    """The node of ``entity``'s dead-letter sub-queue (``orders/$DeadLetterQueue``)."""
    return f"{entity}/{DEAD_LETTER_QUEUE}"
