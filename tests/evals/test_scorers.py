"""Verifiable scorers: right answers pass; outputs that try to game them fail."""

from __future__ import annotations

from typing import Any

import pytest

from evals.items import AnswerSpec, Constraint, ConstraintsSpec, JsonSchemaSpec, RegexSpec
from evals.scorers.answer import score_answer
from evals.scorers.base import MAX_OUTPUT_CHARS
from evals.scorers.constraints import check_constraint, score_constraints
from evals.scorers.json_output import score_json
from evals.scorers.language import is_language
from evals.scorers.pattern import score_regex


def answer(value: str, **kw: Any) -> AnswerSpec:
    return AnswerSpec(type="answer", answer=value, **kw)


@pytest.mark.parametrize(
    ("expected", "output"),
    [
        ("1000", "So the total is 1,000.\nThe answer is 1,000."),
        ("1000", "#### 1000"),
        ("0.5", "The answer is .50"),
        ("0.75", "Answer: 3/4"),
        ("-3", "The final answer is −3."),
        ("42", "42"),
        ("42", "\\boxed{42}"),
        ("1500", "The answer is $1,500.00"),
        ("42", "The answer is 4\u200b2."),  # a zero-width space cannot split or hide digits
    ],
)
def test_numeric_answers_are_normalised(expected: str, output: str) -> None:
    assert score_answer(answer(expected), output).passed


@pytest.mark.parametrize(
    "output",
    [
        "The answer is 18 or 19.",
        "The answer is 18-19.",
        "The answer is between 18 and 19.",
        "18 or 19",
        "It is 19, maybe 18.",
        "The answer is 19.\nThe answer is 18.",
        "#### 19\n#### 18",
        "The answer is 1,9",
        "The answer is nineteen or so",
        "",
        "x" * (MAX_OUTPUT_CHARS + 1) + " The answer is 19",
    ],
)
def test_hedged_or_several_answers_fail(output: str) -> None:
    assert not score_answer(answer("19"), output).passed


def test_the_marker_wins_over_numbers_in_the_working() -> None:
    assert score_answer(answer("12"), "3 × 4 = 12 and 5 is unrelated.\nThe answer is 12.").passed
    assert not score_answer(answer("12"), "3 × 4 = 12\nThe answer is 13.").passed


def test_exact_answers_compare_normalised_text_and_refuse_alternatives() -> None:
    spec = answer("Paris", mode="exact")
    assert score_answer(spec, "The answer is paris.").passed
    assert not score_answer(spec, "The answer is Paris or Lyon").passed
    assert not score_answer(spec, "Answer: Paris\nAnswer: Lyon").passed


def test_tolerance_is_relative() -> None:
    spec = answer("3.14159", tolerance=0.001)
    assert score_answer(spec, "The answer is 3.1416").passed
    assert not score_answer(spec, "The answer is 3.2").passed


def test_regex_fullmatch_refuses_listing_every_option() -> None:
    spec = RegexSpec(type="regex", pattern="[A-D]")
    assert score_regex(spec, "The answer is B.").passed
    assert not score_regex(spec, "The answer is A, B, C or D").passed
    assert not score_regex(spec, "ABCD").passed


def test_regex_search_needs_one_distinct_match_and_respects_forbidden_patterns() -> None:
    spec = RegexSpec(
        type="regex", pattern=r"\b[A-D]\b", mode="search", target="output", forbid=(r"(?i)\bor\b",)
    )
    assert score_regex(spec, "I pick B because it is right.").passed
    assert not score_regex(spec, "B. Also possibly C.").passed
    assert not score_regex(spec, "B or B").passed


PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array"}},
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


def json_spec(expected: Any = None) -> JsonSchemaSpec:
    return JsonSchemaSpec.model_validate({"type": "json_schema", "schema": PERSON, "expected": expected})


def test_valid_json_passes_bare_or_in_one_fence() -> None:
    value = '{"name": "Ann", "age": 42, "tags": []}'
    assert score_json(json_spec(), value).passed
    assert score_json(json_spec({"name": "Ann", "age": 42, "tags": []}), f"```json\n{value}\n```").passed


@pytest.mark.parametrize(
    "output",
    [
        '{"name": "Ann", "age": "42", "tags": []}',  # right keys, wrong type
        '{"name": "Ann", "age": 42.5, "tags": []}',
        '{"name": "Ann", "age": true, "tags": []}',  # a bool is not an integer
        '{"name": "Ann", "age": 42, "tags": {}}',
        '{"name": "Ann", "age": 42}',  # missing key
        '{"name": "Ann", "age": 42, "tags": [], "extra": 1}',
        '{"name": "Ann", "age": 1, "tags": [], "age": 42}',  # duplicate key: the parser would keep the last
        '{"name": "Ann", "age": NaN, "tags": []}',
        '```json\n{"name": "Ann", "age": 42, "tags": []}\n```\n```json\n{"name": "Bo", "age": 1, "tags": []}\n```',
        '{"name": "Ann", "age": 42, "tags": []} {"name": "Bo", "age": 1, "tags": []}',
        "[" * 10_000 + "]" * 10_000,
        "",
    ],
)
def test_json_that_games_the_schema_fails(output: str) -> None:
    assert not score_json(json_spec(), output).passed


def test_expected_values_compare_types_not_just_equality() -> None:
    spec = json_spec({"name": "Ann", "age": 42, "tags": []})
    assert not score_json(spec, '{"name": "Ann", "age": 42.0, "tags": []}').passed
    assert not score_json(spec, '{"name": "Ann", "age": 41, "tags": []}').passed


def constraint(kind: str, **kw: Any) -> Constraint:
    return Constraint.model_validate({"kind": kind, **kw})


def check(kind: str, text: str, **kw: Any) -> bool:
    return check_constraint(constraint(kind, **kw), text)[0]


def test_constrained_response_refuses_every_option_at_once() -> None:
    kind = "detectable_format:constrained_response"
    assert check(kind, "I think so. My answer is yes.")
    assert not check(kind, "My answer is yes. My answer is no. My answer is maybe.")


def test_no_comma_refuses_unicode_commas() -> None:
    assert check("punctuation:no_comma", "no commas here")
    for comma in (",", "，", "、", "‚"):
        assert not check("punctuation:no_comma", f"one{comma} two")


def test_placeholders_highlights_titles_and_bullets_must_hold_text() -> None:
    assert check("detectable_content:number_placeholders", "at [address] on [date]", num_placeholders=2)
    assert not check("detectable_content:number_placeholders", "[] [ ] [address]", num_placeholders=2)
    assert check("detectable_format:number_highlighted_sections", "*one* and *two*", num_highlights=2)
    assert not check(
        "detectable_format:number_highlighted_sections", "** and * * and *one*", num_highlights=2
    )
    assert check("detectable_format:title", "<<A title>>\ntext")
    assert not check("detectable_format:title", "<<>>\n<< >>\ntext")
    assert check("detectable_format:number_bullet_lists", "* a\n* b", num_bullets=2)
    assert not check("detectable_format:number_bullet_lists", "* a\n* \n*", num_bullets=2)


def test_case_checks_see_through_zero_width_and_fullwidth_tricks() -> None:
    assert check("change_case:english_lowercase", "all lower case")
    assert not check("change_case:english_lowercase", "all lower Éase")
    assert not check("change_case:english_lowercase", "all lower ＣＡＳＥ")  # full-width capitals
    assert not check("change_case:english_lowercase", "12345")  # no letters: not a lowercase reply


def test_word_counts_are_not_inflated_by_zero_width_characters() -> None:
    spec = ConstraintsSpec(type="constraints", constraints=(constraint(
        "length_constraints:number_words", num_words=5, relation="at least"),))  # fmt: skip
    assert score_constraints(spec, "one two three four five").passed
    assert not score_constraints(spec, "one\u200btwo\u200bthree\u200bfour\u200bfive").passed


def test_two_responses_must_be_two_different_non_empty_replies() -> None:
    kind = "combination:two_responses"
    assert check(kind, "First answer.\n******\nSecond answer.")
    assert not check(kind, "Same.\n******\nSame.")
    assert not check(kind, "Only one\n******\n")
    assert not check(kind, "a\n******\nb\n******\nc")


def test_keywords_match_whole_words_and_forbidden_words_too() -> None:
    assert check("keywords:existence", "a Lantern and a compass", keywords=["lantern", "compass"])
    assert not check("keywords:existence", "lanterns", keywords=["lantern"])
    assert not check("keywords:forbidden_words", "it is Awesome.", forbidden_words=["awesome"])
    assert check("keywords:forbidden_words", "it is awesomeness", forbidden_words=["awesome"])


def test_unknown_constraints_and_bad_arguments_fail_closed() -> None:
    assert not check("detectable_format:unknown_thing", "anything")
    assert not check("length_constraints:number_words", "a b c")  # num_words missing
    assert not check("length_constraints:number_words", "a b c", num_words=1, relation="about")


def test_sentences_and_paragraphs_are_counted() -> None:
    assert check("length_constraints:number_sentences", "One. Two! Dr. Who is three?", num_sentences=4,
                 relation="less than")  # fmt: skip
    assert not check("length_constraints:number_sentences", "One. Two. Three. Four.", num_sentences=4,
                     relation="less than")  # fmt: skip
    assert check("length_constraints:number_paragraphs", "a\n***\nb\n***\nc", num_paragraphs=3)
    assert not check("length_constraints:number_paragraphs", "a\n***\n\n***\nc", num_paragraphs=3)


def test_language_is_checked_offline_or_the_check_fails() -> None:
    assert is_language("Le chat est sur la table et il dort dans le soleil.", "fr")[0]
    assert not is_language("The cat is on the table and it sleeps in the sun.", "fr")[0]
    assert is_language("Кошка спит на столе весь день.", "ru")[0]
    assert not is_language("これは日本語です。漢字とかなを使います。", "zh")[0]
    assert is_language("これは日本語です。漢字とかなを使います。", "ja")[0]
    ok, why = is_language("Dit is Nederlands, maar wie weet?", "sw")
    assert not ok and "cannot be checked offline" in why
