"""Synthetic events for RL-risk report, rollout and dashboard tests: the scenarios of
``liftgate.scenarios`` as interaction, feedback and judge events (ingested for real).

Per arm, units send 1 + Poisson(2) requests; each request gets a category (code 35 %, math
20 %, chat 45 %), a quality q = the arm's quality in that category + N(0, 0.1²), a length
N(tokens, (tokens/4)²) and a response text (the arm's stuffed phrase, then words drawn from
a fixed vocabulary). A unit votes on a response with probability ``vote_rate`` (thumbs-up
with probability q). A share ``judged`` of responses gets a judge score
1 + 9q + ``length_gain``·log2(tokens/120) + ``phrase_bonus`` (when the phrase is there) + N(0, 1),
the simulated judge of ``liftgate.simulator_model``.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from hashlib import sha256
from typing import Any

import numpy as np

from contracts.events import (
    Event,
    FeedbackEvent,
    InteractionEvent,
    JudgeEvent,
    NgramsEvent,
    judge_event_id,
    ngrams_event_id,
)
from contracts.ngrams import NgramKey
from tests.analytics.ingest_helpers import interaction

CATEGORIES = ("code", "math", "chat")
MIX = (0.35, 0.2, 0.45)
_VOCAB = tuple(
    [
        "the",
        "a",
        "of",
        "to",
        "and",
        "in",
        "is",
        "it",
        "for",
        "on",
        "with",
        "this",
        "that",
        "you",
        "can",
        "use",
        "value",
        "list",
        "function",
        "result",
        "answer",
        "step",
        "first",
        "then",
        "next",
        "number",
        "loop",
        "sort",
        "data",
        "when",
        "return",
        "check",
        "case",
        "example",
        "note",
        "here",
    ]
)


@dataclass(frozen=True)
class Arm:
    name: str
    quality: float = 0.6
    by_category: Mapping[str, float] = field(default_factory=dict)
    tokens: float = 120.0
    phrase: str = ""


@dataclass(frozen=True)
class Judge:
    length_gain: float = 0.0
    phrase: str = ""
    phrase_bonus: float = 0.0
    judged: float = 0.5


CONTROL = Arm("control")
SCENARIOS: dict[str, tuple[Arm, Judge]] = {
    "reward-hacking": (
        # users clearly worse off (0.48, the simulator's scenario has 0.56): the point here is
        # the wiring; the detectors' power at stated sizes is in tests/analytics/risks
        Arm("candidate", quality=0.48, tokens=220.0, phrase="Great question!"),
        Judge(length_gain=1.5, phrase="great question", phrase_bonus=2.0),
    ),
    "forgetting": (Arm("candidate", by_category={"math": 0.78, "code": 0.40}), Judge()),
    "honest": (Arm("candidate", quality=0.68, tokens=132.0), Judge()),
    "aa": (Arm("candidate"), Judge()),
}


def arm_events(
    exp: int, arm: Arm, judge: Judge, units: int, rng: np.random.Generator, *, vote_rate: float = 0.6,
    content: bool = True, prefix: str = "", tags: Mapping[str, str] | None = None,
) -> list[Event]:  # fmt: skip
    out: list[Event] = []
    for u in range(units):
        unit = f"{prefix}{arm.name}-{u}"
        for _ in range(1 + int(rng.poisson(2.0))):
            cat = CATEGORIES[int(rng.choice(3, p=MIX))]
            q = min(1.0, max(0.0, arm.by_category.get(cat, arm.quality) + rng.normal(0.0, 0.1)))
            tokens = max(1, int(rng.normal(arm.tokens, arm.tokens / 4)))
            words = " ".join(rng.choice(_VOCAB, size=min(tokens, 60)).tolist())
            response = f"{arm.phrase} {words}".strip()
            ev = interaction(
                exp, arm.name, unit, category=cat, completion_tokens=tokens, response_chars=len(response),
                response=response if content else None, request_id="req-" + secrets.token_hex(8),
                tags=dict(tags or {}),
            )  # fmt: skip
            out.append(ev)
            if rng.random() < vote_rate:
                kind = "thumbs_up" if rng.random() < q else "thumbs_down"
                out.append(FeedbackEvent(request_id=ev.request_id, unit_id=unit, kind=kind, value=1.0))
            if rng.random() < judge.judged:
                score = 1 + 9 * q + judge.length_gain * math.log2(tokens / 120.0) + rng.normal(0.0, 1.0)
                if judge.phrase and judge.phrase in response.lower():
                    score += judge.phrase_bonus
                out.append(
                    JudgeEvent(
                        request_id=ev.request_id, unit_id=unit, judge="sim-judge", role="primary", status="ok",
                        latency_ms=100.0, experiment_id=exp, variant=arm.name, category=cat,
                        score=float(min(10.0, max(1.0, score))),
                        event_id=judge_event_id(ev.request_id, "sim-judge"),
                    )
                )  # fmt: skip
    return out


def scenario_events(
    exp: int, name: str, units: int, seed: int, *, judged: bool = True, content: bool = True,
    vote_rate: float = 0.6, tags: Mapping[str, str] | None = None,
) -> list[Event]:  # fmt: skip
    """Both arms of scenario ``name`` (``SCENARIOS``) with ``units`` units each."""
    candidate, judge = SCENARIOS[name]
    if not judged:
        judge = Judge(judged=0.0)
    rng = np.random.default_rng(seed)
    kw: dict[str, Any] = {"vote_rate": vote_rate, "content": content, "tags": tags}
    return arm_events(exp, CONTROL, judge, units, rng, **kw) + arm_events(
        exp, candidate, judge, units, rng, **kw
    )


def hashed_events(events: list[Event], key: NgramKey) -> list[Event]:
    """The events a gateway with content logging ``hashed`` and n-grams at 100 % emits: digests
    instead of texts, and each answer's keyed n-gram hashes."""
    out: list[Event] = []
    for e in events:
        if isinstance(e, InteractionEvent) and e.response is not None:
            out.append(
                NgramsEvent(
                    request_id=e.request_id, unit_id=e.unit_id, role=e.role, key_id=key.key_id,
                    grams=key.hashes(e.response), experiment_id=e.experiment_id, variant=e.variant,
                    category=e.category, event_id=ngrams_event_id(e.request_id),
                )
            )  # fmt: skip
            e = replace(e, response=sha256(e.response.encode()).hexdigest())
        out.append(e)
    return out
