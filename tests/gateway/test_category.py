"""Task category before treatment: the client's task tag, else rules on the first user message."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from contracts.events import decode, encode
from gateway.category import (
    OTHER,
    SCAN_CHARS,
    SEEN_MAX,
    CategoryRules,
    RulesError,
    default_rules,
    first_user_text,
)
from gateway.snapshot import UpstreamConfig, VariantConfig
from tests.gateway.conftest import MemorySink, experiment, post, start_gateway, static_source

RULES = CategoryRules.compile(
    [
        {"name": "code", "keywords": ["python", "stack trace"]},
        {"name": "math", "regex": r"\d\s*[+*/^-]\s*\d"},
        {"name": "writing", "keywords": ["write"]},
    ]
)


def chat(text: str) -> dict[str, object]:
    return {"messages": [{"role": "system", "content": "write python"}, {"role": "user", "content": text}]}


def test_the_first_matching_rule_wins_in_the_configured_order() -> None:
    assert RULES.categorize(chat("Write a Python function"), "chat", {}) == "code"
    assert RULES.categorize(chat("what is 2 + 3"), "chat", {}) == "math"
    assert RULES.categorize(chat("write me a poem"), "chat", {}) == "writing"
    assert RULES.categorize(chat("hello there"), "chat", {}) == OTHER


def test_keywords_match_whole_words_case_insensitively() -> None:
    assert RULES.categorize(chat("I love PYTHON"), "chat", {}) == "code"
    assert RULES.categorize(chat("pythonic ideas"), "chat", {}) == OTHER
    assert RULES.categorize(chat("here is a Stack Trace"), "chat", {}) == "code"


def test_only_the_first_user_message_is_read_not_the_system_prompt_or_later_turns() -> None:
    req = {
        "messages": [
            {"role": "system", "content": "You write Python."},
            {"role": "user", "content": "hello"},
            {"role": "user", "content": "python please"},
        ]
    }
    assert RULES.categorize(req, "chat", {}) == OTHER


def test_a_client_task_tag_naming_a_category_wins_and_unknown_ones_fall_back_to_rules() -> None:
    assert RULES.categorize(chat("python"), "chat", {"task": "math"}) == "math"
    assert RULES.categorize(chat("python"), "chat", {"task": "MATH"}) == "math"
    assert RULES.categorize(chat("python"), "chat", {"task": "other"}) == OTHER
    assert RULES.categorize(chat("python"), "chat", {"task": "poetry' OR 1=1"}) == "code"


def test_text_parts_and_completions_prompts_are_read_and_odd_shapes_are_other() -> None:
    parts = {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "python"}, {"type": "image_url"}]}]
    }
    assert RULES.categorize(parts, "chat", {}) == "code"
    assert RULES.categorize({"prompt": "1+1"}, "completions", {}) == "math"
    for odd in ({"messages": None}, {"messages": [1, None]}, {"messages": [{"role": "user", "content": 3}]}):
        assert RULES.categorize(odd, "chat", {}) == OTHER
    assert RULES.categorize({"prompt": ["python"]}, "completions", {}) == OTHER


def test_a_remembered_text_keeps_its_category_the_memory_stays_bounded_and_holds_no_text() -> None:
    rules = CategoryRules.compile([{"name": "code", "keywords": ["python"]}])
    for _ in range(3):  # the answer from memory is the rules' answer
        assert rules.categorize(chat("python please"), "chat", {}) == "code"
        assert rules.categorize(chat("hello"), "chat", {}) == OTHER
    # A task tag still wins over a remembered text, and does not change what is remembered.
    assert rules.categorize(chat("python please"), "chat", {"task": "other"}) == OTHER
    assert rules.categorize(chat("python please"), "chat", {}) == "code"
    for i in range(SEEN_MAX + 10):
        assert rules.categorize(chat(f"python {i}" if i % 2 else f"hello {i}"), "chat", {}) == (
            "code" if i % 2 else OTHER
        )
    assert 0 < len(rules._seen) <= SEEN_MAX
    assert not any(isinstance(k, str) for k in rules._seen), "no user text is kept past its request"


def test_rules_scan_a_bounded_prefix_so_a_huge_prompt_costs_what_a_short_one_does() -> None:
    huge = "a" * SCAN_CHARS + " python" + "b" * 5_000_000
    assert len(first_user_text(chat(huge), "chat")) == SCAN_CHARS
    assert RULES.categorize(chat(huge), "chat", {}) == OTHER
    t0 = time.perf_counter()
    for _ in range(100):
        RULES.categorize(chat(huge), "chat", {})
    assert time.perf_counter() - t0 < 0.5  # a scan of 5 MB per call would take seconds


@pytest.mark.parametrize(
    ("entries", "reason"),
    [
        ([{"name": "Code", "keywords": ["x"]}], "name must match"),
        ([{"name": "other", "keywords": ["x"]}], "name must match"),
        ([{"name": "code"}], "needs keywords or a regex"),
        ([{"name": "code", "regex": "("}], "invalid regex"),
        ([{"name": "code", "keywords": "python"}], "keywords must be a list"),
        ([{"name": "code", "keywords": ["a"]}, {"name": "code", "keywords": ["b"]}], "duplicate"),
        ([{"name": "code", "keywords": ["a"], "weight": 2}], "unknown field"),
        (["code"], "expected a mapping"),
    ],
)
def test_bad_rules_are_refused_with_a_reason(entries: list[object], reason: str) -> None:
    with pytest.raises(RulesError, match=reason):
        CategoryRules.compile(entries)  # type: ignore[arg-type]


def test_rules_load_from_yaml_and_the_built_in_rules_know_the_usual_tasks(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text("categories:\n  - name: legal\n    keywords: [contract, clause]\n")
    assert CategoryRules.load(path).categorize(chat("review this clause"), "chat", {}) == "legal"
    rules = default_rules()
    assert rules.categorize(chat("Write a Python function that sorts a list"), "chat", {}) == "code"
    assert rules.categorize(chat("What is the derivative of x^2 times log x?"), "chat", {}) == "math"
    assert rules.categorize(chat("Help me write a polite e-mail"), "chat", {}) == "writing"
    assert rules.categorize(chat("hi"), "chat", {}) == OTHER


def test_a_category_travels_in_the_event_contract_and_stays_optional() -> None:
    from tests.gateway.kafka_helpers import event

    ev = event(1)
    ev.category = "code"
    assert decode(encode(ev)).category == "code"  # type: ignore[union-attr]
    ev.category = None
    assert decode(encode(ev)).category is None  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def gw(simulator: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, MemorySink]]:
    rules = tmp_path_factory.mktemp("rules") / "rules.json"
    rules.write_text('[{"name": "code", "keywords": ["python"]}, {"name": "math", "keywords": ["sum"]}]')
    sink = MemorySink()
    control = VariantConfig("control", "sim", "base", 50, True)
    exp = experiment("assistant", [control, VariantConfig("cand", "sim", "cand", 50)])
    source = static_source([exp], [UpstreamConfig("sim", simulator, timeout_s=5.0)])
    with start_gateway(sink, source, category_rules=str(rules)) as g:
        yield g.url, sink


def test_the_gateway_tags_each_primary_call_with_its_category_whatever_the_variant(
    gw: tuple[str, MemorySink],
) -> None:
    url, sink = gw
    asks = {"python loops": "code", "the sum of odd numbers": "math", "a joke please": OTHER}
    for i in range(20):
        for text, _ in asks.items():
            r = post(
                url + "/v1/chat/completions",
                {"model": "assistant", "messages": [{"role": "user", "content": text}], "user": f"u{i}"},
            )
            assert r.status_code == 200, r.text
    seen: dict[str, set[str]] = {}
    for e in sink.interactions():
        assert e.category is not None
        seen.setdefault(e.category, set()).add(e.variant or "")
    assert set(seen) == {"code", "math", OTHER}
    assert all(v == {"control", "cand"} for v in seen.values())  # both arms get every category


def test_the_task_header_tag_overrides_the_rules(gw: tuple[str, MemorySink]) -> None:
    url, sink = gw
    r = post(
        url + "/v1/chat/completions",
        {"model": "assistant", "messages": [{"role": "user", "content": "python"}]},
        headers={"X-Liftgate-Tags": "task=math"},
    )
    assert r.status_code == 200
    rid = r.headers["x-request-id"]  # the event is recorded just after the response is sent
    assert [e.category for e in sink.wait_for(lambda e: e.request_id == rid)] == ["math"]


def test_embeddings_carry_no_category(gw: tuple[str, MemorySink]) -> None:
    url, sink = gw
    r = post(url + "/v1/embeddings", {"model": "assistant", "input": "python"})
    assert r.status_code == 200, r.text
    rid = r.headers["x-request-id"]
    assert [e.category for e in sink.wait_for(lambda e: e.request_id == rid)] == [None]


def test_a_bad_rules_file_stops_the_gateway_at_start(tmp_path: Path) -> None:
    from gateway.app import create_app
    from gateway.telemetry import GatewayMetrics
    from tests.gateway.conftest import settings

    bad = tmp_path / "rules.json"
    bad.write_text('[{"name": "code", "regex": "("}]')
    with pytest.raises(RulesError, match="invalid regex"):
        create_app(
            settings(category_rules=str(bad)),
            MemorySink(),
            config_source=static_source([], []),
            metrics=GatewayMetrics(),
        )


def test_rules_run_in_linear_time_so_no_regex_can_stall_a_request() -> None:
    """``(a+)+$`` backtracks exponentially in Python's re; RE2 has no backtracking."""
    rules = CategoryRules.compile([{"name": "evil", "regex": r"(a+)+$"}])
    text = "a" * 400 + "!"
    t0 = time.perf_counter()
    for _ in range(100):
        assert rules.categorize(chat(text), "chat", {}) == OTHER
    assert time.perf_counter() - t0 < 0.5


def test_look_around_is_refused_because_rules_use_re2_syntax() -> None:
    with pytest.raises(RulesError, match="RE2"):
        CategoryRules.compile([{"name": "code", "regex": r"(?<=def )\w+"}])
