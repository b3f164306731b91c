"""What a selector costs, whatever a peer sends (issue 12, items 2 and 6).

- ``LIKE`` never backtracks: the Python-level work of a match depends on the pattern only, and a 30 kB pattern
  against a 1 MB string takes well under a second (a backtracking regex took 16 s and more);
- a selector longer than ``max_length`` is refused before it is parsed;
- a header, properties or application-properties section larger than the limit is never decoded, and a selector
  that reads a field of it does not select the message; the annotations and the body are never decoded;
- a consumer with a selector looks at each ready message once, not at every dispatch: with a deep queue of
  messages it does not select, each arrival costs one look (``Scan.examined``), however deep the queue.

Cost is measured as operation counts (Python line events, messages examined); the only clock readings are
generous upper bounds that the old code missed by far.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.amqp import codec
from minibroker.amqp.definitions import (
    AmqpValue,
    ApplicationProperties,
    Header,
    Properties,
    Released,
)
from minibroker.amqp.types import Described, Symbol, UByte
from minibroker.broker import selector as selector_module
from minibroker.broker.core import Broker, BrokerSettings
from minibroker.broker.message import Message
from minibroker.broker.queue import Queue
from minibroker.broker.selector import (
    APPLICATION_PROPERTIES,
    PROPERTIES,
    SELECTOR_DESCRIPTORS,
    MessageFields,
    Selector,
    SelectorError,
    _Alphabet,
    _LikePattern,
    _Positions,
    selector_from_filter,
)
from minibroker.testing import frames
from tests.broker.test_transactions_adversarial import _count_lines
from tests.broker.txn_driver import World

SELECTOR_DESCRIPTOR = next(d for d in SELECTOR_DESCRIPTORS if isinstance(d, str))


# -- LIKE: a reference, and agreement with it ------------------------------------------------------------------
def reference_like(pattern: str, escape: str | None, value: str) -> bool:
    """LIKE as a regex (what the old code did, and what fnmatch does for * and ?), for small inputs only."""
    parts = []
    chars = iter(pattern)
    for char in chars:
        if char == escape:
            parts.append(re.escape(next(chars)))
        elif char == "%":
            if not parts or parts[-1] != ".*":  # ``%%`` is ``%``; ``.*.*…`` would backtrack for ever in ``re``
                parts.append(".*")
        elif char == "_":
            parts.append(".")
        else:
            parts.append(re.escape(char))
    return re.fullmatch("".join(parts), value, re.DOTALL) is not None


def _valid(pattern: str, escape: str | None) -> bool:
    """A pattern does not end with an unpaired escape character."""
    trailing = len(pattern) - len(pattern.rstrip(escape)) if escape is not None else 0
    return trailing % 2 == 0


_pattern_chars = st.sampled_from(["a", "b", "é", "%", "_", "!", "!%", "!_", "!!", "%%", "__"])
_patterns = st.lists(_pattern_chars, max_size=10).map("".join)
_values = st.text(alphabet="ab!%_é\n", max_size=40)


@settings(deadline=None, max_examples=600)
@given(_patterns, st.sampled_from([None, "!"]), _values, st.sampled_from([-(10**9), 64, 10**9]))
def test_like_agrees_with_a_regex(pattern: str, escape: str | None, value: str, slack: int) -> None:
    """The matcher agrees with a regex, escape character included, whether it narrows the possible starts of a
    _-segment bit by bit to the end (slack very negative), or tries them one by one early (slack very large)."""
    if not _valid(pattern, escape):
        with pytest.raises(ValueError, match="ends with its escape character"):
            _LikePattern(pattern, escape)
        return
    with mock.patch.object(selector_module, "_SPARSE_SLACK", slack):
        assert _LikePattern(pattern, escape).matches(value) is reference_like(pattern, escape, value)


@settings(deadline=None, max_examples=200)
@given(_patterns, _values)
def test_like_in_a_selector_agrees_with_a_regex(pattern: str, value: str) -> None:
    if not _valid(pattern, "!"):
        return
    quoted = pattern.replace("'", "''")
    message = MessageFields({"s": value})
    assert Selector(f"s LIKE '{quoted}' ESCAPE '!'").matches(message) is reference_like(pattern, "!", value)
    assert Selector(f"s NOT LIKE '{quoted}' ESCAPE '!'").matches(message) is not reference_like(pattern, "!", value)


@settings(deadline=None, max_examples=100)
@given(st.lists(st.sampled_from("ab_"), min_size=1, max_size=6).map("".join), st.text(alphabet="ab", max_size=300))
def test_like_on_longer_values_agrees_with_a_regex(segment: str, value: str) -> None:
    for pattern in (f"%{segment}%", f"%{segment}%{segment}%", f"a%{segment}%b", f"%{segment}_%"):
        assert _LikePattern(pattern, None).matches(value) is reference_like(pattern, None, value), pattern


@pytest.mark.parametrize("distinct", [3, 300, 40_000, 60_000])
def test_positions_of_any_alphabet(distinct: int) -> None:
    """Character bitsets are right however many characters the pattern names: one byte per code (up to 255),
    two (up to 32767), or four (beyond, where codes pass the surrogates)."""
    alphabet = "".join(chr(0x100 + i) for i in range(distinct))
    value = "".join(alphabet[(i * 7919) % distinct] for i in range(500)) + "xyz"
    positions = _Positions(value, _Alphabet(alphabet))
    for char in {alphabet[0], alphabet[-1], value[17], value[400]}:
        assert positions.of(char) == sum(1 << i for i, c in enumerate(value) if c == char)
    assert positions.repeated(value[17], 1, 3, 5) == sum(
        1 << i for i in range(len(value)) if all(value[i + k * 5 : i + k * 5 + 1] == value[17] for k in range(3))
    )


# -- LIKE: cost ---------------------------------------------------------------------------------------------
_SHAPES: list[tuple[str, Callable[[int], str]]] = [
    ("%_" + "a" * 300 + "b%", lambda n: "a" * n),  # no match: the segment fails at its last character
    ("%" + "a_" * 150 + "b%", lambda n: "ab" * (n // 2)),
    ("%a_c%", lambda n: "x" * n + "abc"),  # a match at the very end
    ("%abc%xyz%", lambda n: "ab" * n + "abc" + "xyz"),  # literal segments: str.find
    ("a%" + "b_" * 40 + "%c", lambda n: "a" + "b?" * (n // 2) + "c"),
]


@pytest.mark.parametrize(("pattern", "value"), _SHAPES)
def test_like_python_work_does_not_grow_with_the_value(pattern: str, value: Callable[[int], str]) -> None:
    """The Python lines a match runs depend on the pattern, not on the value's length (the rest is C-level
    work linear in the value)."""
    like = _LikePattern(pattern, None)
    short, long = value(1_000), value(100_000)
    assert like.matches(short) is like.matches(long) is reference_like(pattern, None, short)
    few, many = _count_lines(lambda: like.matches(short)), _count_lines(lambda: like.matches(long))
    assert many <= few + 20, f"{pattern[:20]}...: {few} lines against 1 kB, {many} against 100 kB"


@pytest.mark.parametrize(
    ("pattern", "refused", "matching"),
    [
        ("%_" + "a" * 30_000 + "b%", "a" * 1_000_000, "c" + "a" * 30_000 + "b"),
        ("%" + "a_" * 15_000 + "b%", "a" * 1_000_000, "a-" * 15_000 + "b"),
        ("%" + "a" * 15_000 + "_" + "a" * 14_999 + "b%", "a" * 1_000_000, "a" * 15_000 + "-" + "a" * 14_999 + "b"),
        ("%" + "a" * 30_000 + "%", ("a" * 29_999 + "b") * 34, "a" * 30_000),
    ],
    ids=["_aaa..ab", "a_a_..b", "aaa_aaab", "aaa..a"],
)
def test_a_30_kb_pattern_against_a_1_mb_property(pattern: str, refused: str, matching: str) -> None:
    """The issue's attack: a 30 kB LIKE pattern against a 1 MB property blocked the loop for 16 s or more
    (the first three patterns here: 20 to 50 s each). Now a message takes well under a second, matched or not."""
    selector = Selector(f"p LIKE '{pattern}'", max_length=None, max_properties_size=None)
    started = time.perf_counter()
    assert not selector.matches(MessageFields({"p": refused}))
    assert selector.matches(MessageFields({"p": "z" * 500_000 + matching + "z" * 400_000}))
    assert time.perf_counter() - started < 4.0  # two evaluations of up to 1 MB: 2 s each at most


def test_like_within_the_default_limits_is_cheap() -> None:
    """The worst the default limits allow: a 4096-character pattern against a 64 kB value."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    pattern = "%" + "".join(letters[(i * 7) % 26] if i % 3 else "_" for i in range(4090)) + "%"
    values = ["a" * 65_536, (pattern[1:-1].replace("_", "q") * 17)[:65_536], (letters * 2600)[:65_536]]
    selector = Selector(f"p LIKE '{pattern}'")
    started = time.perf_counter()
    for value in values:
        selector.matches(MessageFields({"p": value}))
    assert time.perf_counter() - started < 1.0  # a few milliseconds each, in fact


# -- selector length ----------------------------------------------------------------------------------------
def test_a_selector_longer_than_the_limit_is_refused_before_it_is_parsed() -> None:
    text = "a = 1" + " OR a = 1" * 454  # 4091 characters
    assert len(text) <= 4096
    Selector(text, max_length=4096)
    longer = text + " OR b = 2"
    with pytest.raises(SelectorError, match=f"selector of {len(longer)} characters is longer than the limit of 4096"):
        Selector(longer, max_length=4096)
    with (
        mock.patch.object(selector_module, "_Parser", side_effect=AssertionError("parsed")),
        pytest.raises(SelectorError, match="longer than the limit"),
    ):
        Selector("x" * 10_000_000, max_length=4096)  # refused in constant time, before tokenizing
    assert Selector(longer).source == longer  # no limit unless asked


def test_selector_from_filter_applies_the_limits() -> None:
    filters = {Symbol("selector"): Described(SELECTOR_DESCRIPTOR, "a = 'x'")}
    with pytest.raises(SelectorError, match="longer than the limit of 3"):
        selector_from_filter(filters, max_length=3)
    found = selector_from_filter(filters, max_length=7, max_properties_size=100)
    assert found is not None
    assert found[1].max_properties_size == 100


# -- sections a selector reads --------------------------------------------------------------------------------
def _encoded(*sections: Any) -> bytes:
    return b"".join(codec.encode(section) for section in sections)


def _big_application_properties(entries: int) -> bytes:
    """An application-properties section of ``entries`` small entries (about 10 bytes each), encoded directly."""
    body = b"".join(b"\xa1\x06" + b"%06x" % i + b"\x54\x01" for i in range(entries))
    return b"\x00\x53\x74\xd1" + (len(body) + 4).to_bytes(4, "big") + (2 * entries).to_bytes(4, "big") + body


def test_huge_application_properties_are_not_decoded() -> None:
    """11 MB of application-properties (1M entries) took 4 s and 147 MiB to decode; now they are skipped."""
    payload = _encoded(Header(priority=UByte(7))) + _big_application_properties(1_000_000) + _encoded(AmqpValue("x"))
    assert len(payload) > 10_000_000
    with mock.patch.object(codec, "decode", wraps=codec.decode) as decode:
        started = time.perf_counter()
        fields = MessageFields.from_message(payload, 65536)
        elapsed = time.perf_counter() - started
    assert fields.oversized == APPLICATION_PROPERTIES
    assert fields.application_properties == {}
    assert fields.priority == 7
    assert all(call.args[1] < 100 for call in decode.call_args_list)  # the header and descriptors, nothing further
    assert elapsed < 0.5


def test_sections_up_to_the_limit_are_read() -> None:
    properties = _encoded(ApplicationProperties({"k": "v" * 100}))
    payload = properties + _encoded(AmqpValue("body"))
    assert MessageFields.from_message(payload, len(properties)).application_properties == {"k": "v" * 100}
    assert MessageFields.from_message(payload, len(properties) - 1).oversized == APPLICATION_PROPERTIES
    assert MessageFields.from_message(payload, None).application_properties == {"k": "v" * 100}


def test_annotations_are_never_decoded() -> None:
    """The annotations are skipped by their size: what they hold does not matter (here, nonsense)."""
    garbage = b"\x00\x53\x72\xc1\x04\x02\xfe\xfe\xfe"  # message-annotations: a map of undecodable bytes
    payload = _encoded(Header(priority=UByte(3))) + garbage + _encoded(ApplicationProperties({"k": 1}))
    fields = MessageFields.from_message(payload)
    assert (fields.priority, fields.application_properties) == (3, {"k": 1})


@pytest.mark.parametrize(
    ("selector", "when_too_large", "when_read"),
    [
        ("color = 'red'", False, True),
        ("NOT (color = 'red')", False, False),  # not TRUE either: unknown
        ("color IS NULL", False, False),  # not NULL: unknown
        ("JMSPriority = 7", True, True),  # the header is small enough to read
        ("JMSType = 'order'", True, True),
        ("TRUE", True, True),
        ("JMSPriority = 7 AND color IS NOT NULL", False, True),
    ],
)
def test_an_oversized_section_selects_nothing_that_reads_it(
    selector: str, when_too_large: bool, when_read: bool
) -> None:
    payload = _encoded(
        Header(priority=UByte(7)),
        Properties(subject="order"),
        ApplicationProperties({"color": "red", "pad": "x" * 70_000}),
        AmqpValue("body"),
    )
    fields = MessageFields.from_message(payload)  # the default limit: 64 KiB
    assert fields.oversized == APPLICATION_PROPERTIES
    assert Selector(selector).matches(fields) is when_too_large
    # with a limit above the section, the same selector reads it
    roomy = Selector(selector, max_properties_size=100_000)
    assert roomy.matches(MessageFields.from_message(payload, 100_000)) is when_read


def test_an_oversized_properties_section() -> None:
    payload = _encoded(Properties(subject="s" * 70_000), ApplicationProperties({"k": 1}), AmqpValue("body"))
    fields = MessageFields.from_message(payload)
    assert fields.oversized == PROPERTIES
    assert fields.subject is None
    assert not Selector("JMSType LIKE 's%'").matches(fields)
    assert Selector("k = 1").matches(fields)  # application-properties are small: read


# -- incremental dispatch to consumers with a selector ------------------------------------------------------
def _colored(name: str, color: str, priority: int | None = None) -> bytes:
    sections: list[Any] = [ApplicationProperties({"color": color})]
    if priority is not None:
        sections.insert(0, Header(priority=UByte(priority)))
    return frames.message(f"<<{name}>>", *sections)


def _selective_world(depth: int) -> tuple[World, Any, Any]:
    """``deep`` holds ``depth`` blue messages; ``reds`` (color = 'red', credit 100) has looked at them all."""
    world = World(Broker(BrokerSettings()))
    peer = world.connect("app")
    peer.attach_producer("p", "deep")
    world.settle()
    for i in range(depth):
        peer.transfer("p", _colored(f"blue{i}", "blue"), settled=True)
    world.settle()
    selector = {Symbol("selector"): Described(SELECTOR_DESCRIPTOR, "color = 'red'")}
    peer.attach_consumer("reds", "deep", presettled=False, default_outcome=None, source_filter=selector)
    peer.flow("reds", 100)
    world.settle()
    return world, peer, world.broker.queues["deep"]


def _scan_of(world: World, queue: Queue) -> Any:
    (consumer,) = world.broker.dispatcher.consumers(queue)
    return consumer.scan


def test_each_arrival_is_looked_at_once_however_deep_the_queue() -> None:
    """A non-matching consumer on a deep queue rescanned it at every arrival (a bystander went from 2450 to 33
    round trips a second). Now it looks at each message once."""
    world, peer, queue = _selective_world(3000)
    scan = _scan_of(world, queue)
    assert scan.examined == 3000  # its first look, once
    for i in range(50):
        peer.transfer("p", _colored(f"more{i}", "blue"), settled=True)
        world.settle()
    assert scan.examined == 3050  # one look per arrival
    peer.transfer("p", _colored("red", "red"), settled=True)
    seen = world.settle()[peer]
    assert [c.name for c in seen.completed] == ["red"]
    assert scan.examined == 3051
    assert queue.depth == 3050


def test_the_cost_of_an_arrival_does_not_grow_with_the_depth() -> None:
    counts = {}
    for depth in (200, 2000):
        _, peer, _ = _selective_world(depth)
        counts[depth] = _count_lines(partial(peer.transfer, "p", _colored("one more", "blue"), settled=True))
    assert counts[2000] <= counts[200] + 100, counts


def test_messages_coming_in_behind_the_scan_are_seen_in_delivery_order() -> None:
    """A release puts a message back at its place, and a higher priority goes ahead: both land behind a scan's
    cursor, and the consumer still takes them, first things first."""
    world, peer, queue = _selective_world(5)
    scan = _scan_of(world, queue)
    peer.transfer("p", _colored("red1", "red"), settled=True)
    (taken,) = world.settle()[peer].completed
    assert taken.name == "red1"
    peer.dispose(taken.delivery_id, Released(), settled=True)  # back to its place, at the scan's cursor
    (again,) = world.settle()[peer].completed
    assert again.name == "red1"
    # no credit for a while: messages come in, some ahead of the cursor
    peer.flow("reds", 0)
    world.settle()
    peer.transfer("p", _colored("red-late", "red"), settled=True)  # after the cursor
    peer.transfer("p", _colored("red-urgent", "red", priority=9), settled=True)  # ahead of everything
    peer.transfer("p", _colored("blue-urgent", "blue", priority=9), settled=True)
    world.settle()
    looked = scan.examined
    peer.flow("reds", 10)
    seen = world.settle()[peer]
    assert [c.name for c in seen.completed] == ["red-urgent", "red-late"]
    assert scan.examined == looked + 3  # the two urgent ones behind the cursor, then the late one
    assert queue.depth == 6


def test_a_scan_that_does_not_look_is_restarted_rather_than_grown() -> None:
    """Messages coming in behind an idle scan are remembered up to a bound, then it starts over instead."""
    queue = Queue("q")
    messages = [Message(_colored(f"m{i}", "blue"), seq=i + 1) for i in range(10)]
    for message in messages:
        queue.put(message)
    scan = queue.open_scan()
    scan.cursor = (-4, 10)  # it has looked at everything
    for _ in range(100):
        for message in messages:
            queue.acquire(message)
            queue.requeue(message)  # back behind the cursor
            assert len(scan.behind) <= 2 * len(queue.ready) + 64
    assert scan.cursor is None or len(scan.behind) <= 84
    queue.close_scan(scan)
    queue.acquire(messages[0])
    queue.requeue(messages[0])
    assert queue.scans == []


# -- configuration ------------------------------------------------------------------------------------------
def test_the_limits_are_configured_from_the_broker_section() -> None:
    import trio

    from minibroker.config import Config, ConfigError
    from minibroker.server.app import make_broker

    def settings_of(config: Config) -> BrokerSettings:
        async def build() -> BrokerSettings:
            return make_broker(config).settings

        return trio.run(build)

    defaults = settings_of(Config())
    assert (defaults.max_selector_length, defaults.max_selector_properties_size) == (4096, 65536)
    example = Config.load(Path(__file__).resolve().parents[2] / "conf" / "minibroker.toml")
    assert (example.broker.max_selector_length, example.broker.max_selector_properties_size) == (4096, 65536)
    settings = settings_of(Config.from_dict({"broker": {"max_selector_length": 10, "max_selector_properties_size": 0}}))
    assert (settings.max_selector_length, settings.max_selector_properties_size) == (10, 0)
    with pytest.raises(ConfigError, match=r"broker\.max_selector_length: must not be negative"):
        Config.from_dict({"broker": {"max_selector_length": -1}})
