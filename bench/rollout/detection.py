"""How fast the rollout controller catches a candidate failing 30% of requests (numbers, not
pass/fail): the candidate requests it takes the default plan's error_rate guardrail to roll
back, by simulation, against 0% and 1% baselines, at the 1%, 5% and 10% stage shares.

The default plan tests error_rate with the score test on the rate difference (margin +0.01
absolute) at alpha 0.05 / (4 guardrails × 5 evaluated stages) = 0.0025, tuned at 10,000
planned units, and needs 30 units per variant before any verdict. New users: one request
per unit. A look after every candidate request (continuous monitoring); the controller
looks every ``interval_s`` (30 s by default), which adds at most that much.

    .venv/bin/python -m bench.rollout.detection --sims 2000
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from analytics.stats import SampleStats, sequential_rate_noninferiority

ALPHA = 0.05 / (4 * 5)
MARGIN = 0.01
MIN_TEST_UNITS = 30


def _arm(requests: int, errors: int) -> SampleStats:
    return SampleStats(requests, errors, errors, requests, requests, errors)


def first_rejection(rng: np.random.Generator, baseline: float, share: float, limit: int) -> int | None:
    """Candidate requests until the rollback (None: not within ``limit``)."""
    cand = rng.random(limit) < 0.30
    ratio = (1.0 - share) / share
    ctrl_n = int(limit * ratio) + 1
    ctrl = rng.random(ctrl_n) < baseline
    cand_cum, ctrl_cum = np.cumsum(cand), np.cumsum(ctrl)
    for k in range(MIN_TEST_UNITS, limit + 1):
        c = max(MIN_TEST_UNITS, int(k * ratio))
        r = sequential_rate_noninferiority(
            _arm(c, int(ctrl_cum[c - 1])),
            _arm(k, int(cand_cum[k - 1])),
            MARGIN,
            "decrease",
            ALPHA,
            10_000,
            with_bounds=False,
        )
        if r.reject_harm:
            return k
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sims", type=int, default=2000)
    ap.add_argument("--limit", type=int, default=400, help="candidate requests simulated per run")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    started = time.monotonic()
    print(
        "| baseline | stage | candidate requests to roll back: median / 95% | seconds at 10 / 100 / 1,000 req/s (95%) |"
    )
    print("|---|---|---|---|")
    for baseline in (0.0, 0.01):
        for share in (0.01, 0.05, 0.10):
            found = [first_rejection(rng, baseline, share, args.limit) for _ in range(args.sims)]
            n = np.array([args.limit + 1 if f is None else f for f in found])
            med, p95 = int(np.median(n)), int(np.percentile(n, 95))
            secs = " / ".join(f"{p95 / (share * rate):,.0f}" for rate in (10, 100, 1000))
            missed = sum(f is None for f in found)
            note = f" ({missed} runs beyond {args.limit})" if missed else ""
            print(f"| {baseline:.0%} | {share:.0%} | {med} / {p95}{note} | {secs} |")
    print(f"\n{args.sims} runs per row, {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
