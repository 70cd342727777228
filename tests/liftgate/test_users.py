"""Simulated users: heterogeneity and feedback rates follow the configured quality (pure logic)."""

from __future__ import annotations

import random
import statistics

from liftgate import users as u

MODEL = u.FeedbackModel()


def test_population_ids_are_stable_for_a_seed_and_differ_between_seeds() -> None:
    a = u.build_population(50, seed=7)
    b = u.build_population(50, seed=7)
    c = u.build_population(50, seed=8)
    assert [x.user_id for x in a] == [x.user_id for x in b]
    assert a == b
    assert {x.user_id for x in a}.isdisjoint({x.user_id for x in c})
    assert len({x.user_id for x in a}) == 50


def test_a_few_heavy_users_send_a_large_share_of_requests() -> None:
    users = u.build_population(1000, seed=1)
    picker = u.UserPicker(users, random.Random(3))
    counts: dict[str, int] = {}
    for _ in range(50_000):
        user = picker.pick()
        counts[user.user_id] = counts.get(user.user_id, 0) + 1
    ordered = sorted(counts.values(), reverse=True)
    top_decile = sum(ordered[:100]) / sum(ordered)
    # Lognormal(σ=1.3) activity: the top 10% of users send roughly 40-50% of the traffic,
    # far above the 10% a homogeneous population would.
    assert 0.30 < top_decile < 0.65
    assert ordered[0] > 20 * statistics.median(ordered)


def test_task_mix_covers_code_math_and_chat() -> None:
    rng = random.Random(0)
    users = u.build_population(20, seed=2)
    tasks = {u.pick_task(user, rng) for user in users for _ in range(20)}
    assert tasks == set(u.TASKS)
    prompt = u.first_prompt("code", rng)
    assert prompt and "{" not in prompt


def _rates(quality: float, n: int = 40_000, seed: int = 0) -> dict[str, float]:
    rng = random.Random(seed)
    users = u.build_population(500, seed=seed)
    counts: dict[str, float] = {}
    ratings: list[float] = []
    for i in range(n):
        user = users[i % len(users)]
        for s in u.react(quality, "chat", user, rng, MODEL):
            counts[s.kind] = counts.get(s.kind, 0) + 1
            if s.kind == "rating":
                ratings.append(s.value)
    out = {k: v / n for k, v in counts.items()}
    out["rating_mean"] = statistics.fmean(ratings)
    return out


def test_feedback_rates_follow_the_configured_quality() -> None:
    for quality in (0.3, 0.6, 0.9):
        observed = _rates(quality)
        expected = u.expected_rates(quality, MODEL)
        for kind in ("thumbs_up", "thumbs_down", "regenerate"):
            # 40,000 answers: binomial standard error below 0.0025; allow ~4 SE.
            assert abs(observed.get(kind, 0.0) - expected[kind]) < 0.012, (quality, kind, observed, expected)
        assert abs(observed["rating_mean"] - expected["rating_mean"]) < 0.15


def test_a_better_model_earns_more_thumbs_up_and_fewer_regenerations() -> None:
    low, high = _rates(0.60, seed=1), _rates(0.66, seed=2)
    assert high["thumbs_up"] > low["thumbs_up"]
    assert high["regenerate"] < low["regenerate"]
    assert u.continue_probability(0.66, MODEL) > u.continue_probability(0.60, MODEL)


def test_quality_is_clipped_and_ratings_stay_within_one_to_five() -> None:
    rng = random.Random(5)
    user = u.build_population(1, seed=0)[0]
    for q in (-1.0, 0.0, 1.0, 2.0):
        for _ in range(200):
            for s in u.react(q, "code", user, rng, MODEL):
                if s.kind == "rating":
                    assert 1.0 <= s.value <= 5.0
                if q >= 1.0:
                    assert s.kind not in ("thumbs_down", "regenerate")


def test_pacer_spaces_requests_at_the_configured_rate() -> None:
    import asyncio
    import time

    from liftgate.traffic import Pacer

    async def go() -> float:
        pacer = Pacer(200.0)
        t0 = time.monotonic()
        for _ in range(41):
            await pacer.wait()
        return time.monotonic() - t0

    elapsed = asyncio.run(go())
    assert 0.18 < elapsed < 0.6
