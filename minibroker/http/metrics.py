"""The broker's counts in the Prometheus text exposition format (version 0.0.4), for ``GET /metrics``.

``exposition(broker, journal)`` reads the core as it stands (the caller runs it where the broker's state
lives: in the broker's trio task, or through the thread runner's ``call``) and returns the whole page. It
changes nothing and keeps nothing between scrapes: every figure is a count the core already keeps, so a
scrape costs O(namespaces + nodes + subscriptions + open transactions) and the hot path pays nothing for it.

Names follow the Prometheus conventions: ``minibroker_`` first, counters end in ``_total``, a unit-less
gauge is a plain noun. Every node-level sample carries ``namespace``; a subscription is named by its topic
and the ``(container, subscription)`` key it has in the topic (unique there). The transaction counters are
kept broker-wide by the core, so they carry no ``namespace``; their ``outcome`` values are disjoint (each
ended transaction is counted once): ``rolled_back`` counts the rollbacks that were neither a time-out nor a
failed commit.
"""

from __future__ import annotations

from collections.abc import Iterable

from minibroker.broker.core import Broker
from minibroker.store.journal import Journal

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The ``Content-Type`` of what ``exposition`` returns."""

Labels = tuple[tuple[str, str], ...]
Sample = tuple[Labels, int]


def escape_label_value(value: str) -> str:
    """A label value as the text format quotes it: backslash, double quote and line feed escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


class _Page:
    """The families of one exposition, in the order they are added (each family's samples together)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str, samples: Iterable[Sample]) -> None:
        lines = self.lines
        lines.append(f"# HELP {name} {_escape_help(help_text)}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            if labels:
                pairs = ",".join(f'{key}="{escape_label_value(val)}"' for key, val in labels)
                lines.append(f"{name}{{{pairs}}} {value}")
            else:
                lines.append(f"{name} {value}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


# (metric suffix, type, help, ``NodeCounts`` field) of the figures every queue and subscription has
_NODE_FAMILIES: tuple[tuple[str, str, str, str], ...] = (
    ("depth", "gauge", "Messages ready for delivery.", "ready"),
    ("acquired", "gauge", "Messages delivered to a consumer and not yet settled.", "acquired"),
    ("staged", "gauge", "Messages posted in open transactions, invisible until commit.", "staged"),
    ("scheduled", "gauge", "Messages not yet visible: a delivery time or a redelivery delay.", "scheduled"),
    ("consumers", "gauge", "Links consuming from it.", "consumers"),
    (
        "messages_in_total",
        "counter",
        "Messages that became ready on it (a message back from a delay counts again).",
        "enqueued_total",
    ),
    (
        "messages_out_total",
        "counter",
        "Messages that left it for good: consumed, dead-lettered, expired, dropped or purged.",
        "dequeued_total",
    ),
)


def exposition(broker: Broker, journal: Journal | None = None) -> str:
    """The Prometheus text exposition (format 0.0.4, served as ``CONTENT_TYPE``) of ``broker``'s state now;
    with ``journal`` (the broker's, when it has a data dir) its bytes written and fsyncs too."""
    page = _Page()
    namespaces = sorted(broker.namespaces.values(), key=lambda ns: ns.name)

    queues: list[tuple[Labels, dict[str, int]]] = []
    subscriptions: list[tuple[Labels, dict[str, int]]] = []
    topics: list[tuple[Labels, tuple[int, int, int]]] = []  # staged, published, subscriptions
    for ns in namespaces:
        queues.extend(
            ((("namespace", ns.name), ("queue", name)), broker.node_counts(ns.queues[name]))
            for name in sorted(ns.queues)
        )
        for name in sorted(ns.topics):
            topic = ns.topics[name]
            topic_labels = (("namespace", ns.name), ("topic", name))
            topics.append((topic_labels, (topic.staged, topic.published_total, len(topic.subscriptions))))
            for key in sorted(topic.subscriptions):
                labels = (*topic_labels, ("container", key[0]), ("subscription", key[1]))
                subscriptions.append((labels, broker.node_counts(topic.subscriptions[key])))

    for suffix, kind, help_text, count in _NODE_FAMILIES:
        page.family(f"minibroker_queue_{suffix}", kind, help_text, ((lbl, v[count]) for lbl, v in queues))
    for suffix, kind, help_text, count in _NODE_FAMILIES:
        page.family(
            f"minibroker_subscription_{suffix}",
            kind,
            f"Topic subscriptions: {help_text[0].lower()}{help_text[1:]}",
            ((lbl, v[count]) for lbl, v in subscriptions),
        )
    page.family(
        "minibroker_topic_staged",
        "gauge",
        "Messages posted to the topic in open transactions, invisible until commit.",
        ((labels, figures[0]) for labels, figures in topics),
    )
    page.family(
        "minibroker_topic_messages_in_total",
        "counter",
        "Messages published to the topic (each is copied to the subscriptions it matches).",
        ((labels, figures[1]) for labels, figures in topics),
    )
    page.family(
        "minibroker_topic_subscriptions",
        "gauge",
        "Subscriptions of the topic.",
        ((labels, figures[2]) for labels, figures in topics),
    )

    page.family(
        "minibroker_connections",
        "gauge",
        "Open connections working in the namespace.",
        (((("namespace", ns.name),), len(ns.connections)) for ns in namespaces),
    )
    now = broker.clock.now
    page.family(
        "minibroker_transactions_open",
        "gauge",
        "Transactions declared by the namespace's connections and not yet discharged.",
        (((("namespace", ns.name),), len(broker.transactions_at(now, ns.connections, ns))) for ns in namespaces),
    )
    stats = broker.txn_stats
    page.family(
        "minibroker_transactions_declared_total",
        "counter",
        "Transactions declared (broker-wide).",
        [((), stats.declared)],
    )
    page.family(
        "minibroker_transactions_in_doubt_total",
        "counter",
        "Transactions held in doubt when their connection was lost (check-back, broker-wide).",
        [((), stats.in_doubt)],
    )
    # the core counts time-outs, failed commits and abandoned ones among the rollbacks too: here each ending is
    # counted once
    rolled_back = max(0, stats.rolled_back - stats.timed_out - stats.failed_commits - stats.abandoned)
    page.family(
        "minibroker_transactions_total",
        "counter",
        "Transactions ended (broker-wide), by how: committed; rolled_back (a discharge with fail=true, a "
        "connection that closed, an error on the link); timed_out (transaction_timeout); failed (a commit "
        "that rolled back instead); abandoned (in doubt, no answer after check_max checks).",
        [
            ((("outcome", "committed"),), stats.committed),
            ((("outcome", "rolled_back"),), rolled_back),
            ((("outcome", "timed_out"),), stats.timed_out),
            ((("outcome", "failed"),), stats.failed_commits),
            ((("outcome", "abandoned"),), stats.abandoned),
        ],
    )
    page.family(
        "minibroker_internal_errors_total",
        "counter",
        "Internal errors the broker contained and logged (0 unless it has a bug).",
        [((), broker.internal_errors)],
    )
    page.family(
        "minibroker_fault_firings_total",
        "counter",
        "Times each fault injection rule fired (issue 16; rules that exist now, by id, point and action).",
        [
            ((("rule", str(rule.id)), ("point", rule.point), ("action", rule.action)), rule.hits)
            for rule in broker.faults.list()
        ],
    )

    if journal is not None:
        page.family(
            "minibroker_journal_bytes_total",
            "counter",
            "Bytes written to the journal (records, segment headers, snapshots).",
            [((), journal.io.bytes_written)],
        )
        page.family(
            "minibroker_journal_fsyncs_total",
            "counter",
            "fsyncs of the journal's files and directory.",
            [((), journal.io.fsyncs)],
        )
    return page.text()


__all__ = ["CONTENT_TYPE", "escape_label_value", "exposition"]
