"""The judge probe runner: re-score stored responses with a phrase removed / inserted
(:mod:`analytics.risks.probe` has the statistics).

Reads the most recent ``samples`` stored candidate responses that contain the phrase and as
many control responses that do not (content logging ``full``/``redacted``), asks the judge
(any OpenAI-compatible endpoint, the gateway's prompt: :mod:`contracts.judging`) for each as
it was and as modified, with ``concurrency`` requests in flight. A call that fails or gives
no score drops its pair (counted in ``failed``). The user side is read from stored feedback.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import orjson
from sqlalchemy import Connection, text

from analytics.risks.probe import ProbeResult, probe_effect
from contracts.judging import DEFAULT_RUBRIC, judge_request, parse_score, system_prompt


@dataclass(frozen=True, slots=True)
class JudgeEndpoint:
    base_url: str  # OpenAI-compatible, e.g. http://host:8000/v1
    model: str
    api_key: str | None = None
    rubric: str = DEFAULT_RUBRIC
    score_min: float = 1.0
    score_max: float = 10.0
    timeout_s: float = 30.0
    concurrency: int = 8


@dataclass(frozen=True, slots=True)
class ProbeRun:
    result: ProbeResult
    failed: int  # judge calls without a score


_SAMPLES = text(
    """
    SELECT coalesce(prompt, ''), response FROM interactions
    WHERE experiment_id = :e AND variant = :v AND role = 'primary' AND status = 'ok' AND response IS NOT NULL
      AND (response ILIKE :like) = :has
    ORDER BY ts DESC LIMIT :n
    """
)
_USERS = text(
    """
    WITH f AS (
        SELECT request_id, max((kind = 'thumbs_up')::int) - max((kind = 'thumbs_down')::int) AS y
        FROM feedback WHERE experiment_id = :e AND kind IN ('thumbs_up', 'thumbs_down') GROUP BY request_id
    )
    SELECT i.variant, i.response ILIKE :like AS has, count(*), coalesce(sum(f.y), 0)
    FROM interactions i LEFT JOIN f USING (request_id)
    WHERE i.experiment_id = :e AND i.variant = ANY(:variants) AND i.role = 'primary' AND i.status = 'ok'
      AND i.response IS NOT NULL
    GROUP BY 1, 2
    """
)


def _pattern(phrase: str) -> re.Pattern[str]:
    """The phrase's words in order, case-insensitive, with the punctuation and space after it."""
    words = re.findall(r"[a-z0-9]+(?:'[a-z0-9]+)?", phrase.lower())
    return re.compile(r"\b" + r"\W+".join(re.escape(w) for w in words) + r"\b[^\w\s]*\s*", re.IGNORECASE)


def _like(phrase: str) -> str:
    return "%" + phrase.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _score(judge: JudgeEndpoint, system: str, question: str, answer: str) -> float | None:
    body = orjson.dumps(judge_request(judge.model, system, question, answer))
    headers = {"Content-Type": "application/json"}
    if judge.api_key:
        headers["Authorization"] = f"Bearer {judge.api_key}"
    req = urllib.request.Request(
        judge.base_url.rstrip("/") + "/chat/completions", body, headers, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=judge.timeout_s) as resp:
            return parse_score(resp.read(1 << 20), judge.score_min, judge.score_max)
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _users(conn: Connection, eid: int, control: str, candidate: str, like: str) -> tuple[float | None, str]:
    sums: dict[tuple[str, bool], tuple[int, float]] = {}
    for variant, has, n, y in conn.execute(
        _USERS, {"e": eid, "variants": [control, candidate], "like": like}
    ):
        sums[(variant, bool(has))] = (int(n), float(y))

    def mean(keys: Sequence[tuple[str, bool]]) -> float | None:
        n = sum(sums.get(k, (0, 0.0))[0] for k in keys)
        return sum(sums.get(k, (0, 0.0))[1] for k in keys) / n if n else None

    with_, without = mean([(candidate, True)]), mean([(candidate, False)])
    if with_ is not None and without is not None:
        return with_ - without, "with_vs_without"
    cand, ctrl = mean([(candidate, True), (candidate, False)]), mean([(control, True), (control, False)])
    if cand is not None and ctrl is not None:
        return cand - ctrl, "candidate_lift"
    return None, "none"


def run_probe(
    conn: Connection, eid: int, control: str, candidate: str, phrase: str, judge: JudgeEndpoint,
    samples: int = 40, alpha: float = 0.05,
) -> ProbeRun:  # fmt: skip
    pattern, like = _pattern(phrase), _like(phrase)
    with_phrase = conn.execute(
        _SAMPLES, {"e": eid, "v": candidate, "like": like, "has": True, "n": samples}
    ).all()
    without = conn.execute(_SAMPLES, {"e": eid, "v": control, "like": like, "has": False, "n": samples}).all()
    # Insert the phrase as the candidate writes it (its casing and punctuation), at the start.
    found = next((m.group() for _, r in with_phrase if (m := pattern.search(r))), phrase + " ")
    jobs = [(q, r, pattern.sub("", r, count=1)) for q, r in with_phrase] + [
        (q, r, found + r) for q, r in without
    ]
    system = system_prompt(judge.rubric, judge.score_min, judge.score_max)
    calls = [(q, a) for q, orig, mod in jobs for a in (orig, mod)]
    with ThreadPoolExecutor(max_workers=judge.concurrency) as pool:
        scores = list(pool.map(lambda c: _score(judge, system, c[0], c[1]), calls))
    pairs = [(scores[2 * i], scores[2 * i + 1]) for i in range(len(jobs))]
    removed = [(a, b) for a, b in pairs[: len(with_phrase)] if a is not None and b is not None]
    inserted = [(a, b) for a, b in pairs[len(with_phrase) :] if a is not None and b is not None]
    users, basis = _users(conn, eid, control, candidate, like)
    result = probe_effect(phrase, removed, inserted, users, basis, alpha)
    return ProbeRun(result, sum(s is None for s in scores))
