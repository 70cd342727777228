"""The phrase part on hashed n-grams (content logging ``hashed``) against real PostgreSQL: the
stored digests are never read as text, the key id selects the rows, the operator's phrase
list resolves hashes (also in the stuffing alarm), a key mismatch is named."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from analytics.ingest.write import ingest
from analytics.report.assembly import ReportOptions, build_report, ngram_options
from analytics.report.risks import RiskOptions, rl_risks
from contracts.ngrams import NgramKey, hash_label, phrase_lookup
from tests.analytics.report_data import create_experiment
from tests.analytics.risks_data import hashed_events, scenario_events
from tests.known_secrets import secret

KEY = NgramKey(secret("ngram"))
STUFFED = hash_label(KEY.hash("great question"))


@pytest.fixture(scope="module")
def hashed(engine: Engine) -> int:
    with engine.begin() as conn:
        eid, _ = create_experiment(conn, [("control", 1), ("candidate", 1)], status="stopped")
        conn.execute(text("UPDATE experiments SET content_logging = 'hashed' WHERE id = :e"), {"e": eid})
    ingest(engine, hashed_events(scenario_events(eid, "reward-hacking", 300, seed=41), KEY))
    return eid


def test_a_hashed_experiment_flags_the_stuffed_hash_and_never_reads_the_digests_as_text(
    engine: Engine, hashed: int
) -> None:
    with engine.connect() as conn:
        r = rl_risks(conn, hashed, "control", ["candidate"], RiskOptions(ngram_key_id=KEY.key_id))[0]
    part = r.phrases
    assert part.state == "ok" and part.source == "hashed" and part.tested > 20
    row = next(p for p in part.phrases if p.hash == STUFFED)
    assert row.flagged and not row.resolved and row.phrase == STUFFED and row.rate_candidate > 0.9
    assert all(p.hash is not None and len(p.hash) == 16 for p in part.phrases)
    assert row.outcome_with is not None and row.judge_with is not None
    stuffing = r.alarm("stuffing")
    assert stuffing is not None and stuffing.firing and STUFFED in (stuffing.detail or "")


def test_the_operators_phrase_list_resolves_hashes_in_the_table_and_the_alarm(
    engine: Engine, hashed: int
) -> None:
    opts = RiskOptions(ngram_key_id=KEY.key_id, phrase_lookup=phrase_lookup(KEY, ["Great question!"]))
    with engine.connect() as conn:
        r = rl_risks(conn, hashed, "control", ["candidate"], opts)[0]
    row = next(p for p in r.phrases.phrases if p.hash == STUFFED)
    assert row.phrase == "great question" and row.resolved and "great question" in r.phrases.flagged
    stuffing = r.alarm("stuffing")
    assert stuffing is not None and "great question" in (stuffing.detail or "")


def test_without_a_key_the_newest_keys_rows_are_read_and_another_key_is_named(
    engine: Engine, hashed: int
) -> None:
    other = NgramKey(secret("ngram"))
    with engine.connect() as conn:
        newest = rl_risks(conn, hashed, "control", ["candidate"], RiskOptions())[0].phrases
        wrong = rl_risks(conn, hashed, "control", ["candidate"], RiskOptions(ngram_key_id=other.key_id))[0]
    assert newest.state == "ok" and STUFFED in newest.flagged
    assert wrong.phrases.state == "unavailable" and wrong.phrases.responses_candidate == 0
    assert KEY.key_id in (wrong.phrases.reason or "") and "LIFTGATE_NGRAM_KEY" in (wrong.phrases.reason or "")
    assert wrong.alarm("stuffing") is not None and not wrong.alarm("stuffing").firing  # type: ignore[union-attr]


def test_the_report_options_build_the_key_and_the_phrase_list(
    engine: Engine, hashed: int, tmp_path: Path
) -> None:
    phrases = tmp_path / "phrases.txt"
    phrases.write_text("Great question!\n\n  \nstep by step\n", encoding="utf-8")
    built = ngram_options(KEY._key.decode(), str(phrases))
    assert built["ngram_key"].key_id == KEY.key_id
    assert built["phrase_lookup"][KEY.hash("great question")] == "great question"
    assert built["phrase_lookup"][KEY.hash("step by step")] == "step by step"
    with pytest.raises(ValueError, match="LIFTGATE_NGRAM_KEY"):
        ngram_options(None, str(phrases))
    assert ngram_options(None, None) == {}
    with engine.connect() as conn:
        report = build_report(conn, hashed, options=ReportOptions(**built))
    part = report.rl_risks[0].phrases
    assert part.source == "hashed" and "great question" in part.flagged


def test_a_hashed_experiment_without_n_grams_says_how_to_turn_them_on(engine: Engine) -> None:
    with engine.begin() as conn:
        eid, _ = create_experiment(conn, [("control", 1), ("candidate", 1)], status="stopped")
        conn.execute(text("UPDATE experiments SET content_logging = 'hashed' WHERE id = :e"), {"e": eid})
    ingest(engine, scenario_events(eid, "reward-hacking", 40, seed=42))  # texts stored, no n-grams
    with engine.connect() as conn:
        part = rl_risks(conn, eid, "control", ["candidate"], RiskOptions())[0].phrases
    assert part.state == "unavailable" and part.source == "hashed"
    assert "LIFTGATE_NGRAM_KEY" in (part.reason or "")
