"""The judge probe: does a phrase move the judge by itself (a grader exploit)?

For a phrase the stuffing detector lists, the probe re-scores a sample with the judge:
candidate responses that contain it, as they were and with the phrase removed, and control
responses without it, as they were and with the phrase inserted at the start. Each pair gives
the phrase's effect on the judge's score, d = score(with) − score(without); pooled over both
kinds of pair (n pairs):

    d̄ = Σ d_i / n,   se = sd(d) / √n,   lower = d̄ − z_{1−α}·se   (one look: fixed horizon)

The users' side is what they did with responses with vs without the phrase: the candidate's
user outcome with − without when the candidate uses it in only some responses, else (it uses
it everywhere) the candidate's whole user lift over the control — an upper bound on what the
phrase could have bought. A phrase is a **grader exploit** when the judge's effect is shown
positive (lower > 0) and the users' is not positive: it moves the judge but not users.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats as sps


@dataclass(frozen=True, slots=True)
class ProbeResult:
    phrase: str
    pairs_removed: int  # candidate responses re-scored without the phrase
    pairs_inserted: int  # control responses re-scored with it
    judge_effect: float | None  # mean score(with) − score(without)
    judge_std_error: float | None
    judge_lower: float | None  # one-sided lower bound at alpha
    users_effect: float | None
    users_basis: str  # "with_vs_without" | "candidate_lift" | "none"
    exploit: bool
    alpha: float
    message: str | None = None


def probe_effect(
    phrase: str,
    removed: Sequence[tuple[float, float]],
    inserted: Sequence[tuple[float, float]],
    users_effect: float | None,
    users_basis: str,
    alpha: float = 0.05,
    min_pairs: int = 10,
) -> ProbeResult:
    """``removed``: (original, without phrase) scores of candidate responses; ``inserted``:
    (original, with phrase) of control responses (module docstring)."""
    d = [orig - mod for orig, mod in removed] + [mod - orig for orig, mod in inserted]
    d = [x for x in d if math.isfinite(x)]
    base = {"phrase": phrase, "pairs_removed": len(removed), "pairs_inserted": len(inserted),
            "users_effect": users_effect, "users_basis": users_basis, "alpha": alpha}  # fmt: skip
    if len(d) < min_pairs:
        return ProbeResult(**base, judge_effect=None, judge_std_error=None, judge_lower=None, exploit=False,  # type: ignore[arg-type]
                           message=f"{len(d)} re-scored pairs; the probe needs at least {min_pairs}")  # fmt: skip
    n = len(d)
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    se = sd / math.sqrt(n)
    lower = mean - float(sps.norm.ppf(1 - alpha)) * se if se > 0 else mean
    users_not_better = users_effect is not None and users_effect <= 0.0
    return ProbeResult(**base, judge_effect=mean, judge_std_error=se, judge_lower=lower,  # type: ignore[arg-type]
                       exploit=lower > 0.0 and users_not_better)  # fmt: skip
