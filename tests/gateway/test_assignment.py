"""Assignment is a pure function: sticky, shares match weights, monotone under ramp."""

from __future__ import annotations

import random

from scipy.stats import chisquare

from gateway.assignment import BUCKETS, bucket, choose, covered, layout_from_weights, matches
from gateway.routing import ASSIGNED_MAX, RequestFacts, decide
from gateway.snapshot import RouteConfig, VariantConfig, build_route
from tests.gateway.conftest import experiment

UNITS = [f"user-{i}" for i in range(100_000)]


def test_bucket_is_the_documented_blake2b_hash() -> None:
    from hashlib import blake2b

    expected = int.from_bytes(blake2b(b"salt:cand:u1", digest_size=8).digest(), "big") % 10_000
    assert bucket("salt:cand:u1") == expected
    assert 0 <= bucket("x") < BUCKETS


def test_assignment_is_sticky() -> None:
    lay = layout_from_weights([("control", 50, True), ("a", 25, False), ("b", 25, False)])
    first = [choose("salt", u, lay) for u in UNITS[:5000]]
    again = [choose("salt", u, lay) for u in UNITS[:5000]]
    assert first == again


def test_shares_match_weights_within_chi_square_tolerance_over_100k_units() -> None:
    weights = [("control", 50.0, True), ("a", 30.0, False), ("b", 15.0, False), ("c", 5.0, False)]
    lay = layout_from_weights(weights)
    counts = {name: 0 for name, _, _ in weights}
    for u in UNITS:
        counts[choose("exp-salt", u, lay)] += 1
    total = sum(w for _, w, _ in weights)
    expected = [len(UNITS) * w / total for _, w, _ in weights]
    stat = chisquare([counts[n] for n, _, _ in weights], expected)
    assert stat.pvalue > 0.001, counts


def test_different_salts_give_independent_assignments() -> None:
    lay = layout_from_weights([("control", 50, True), ("a", 50, False)])
    same = sum(choose("s1", u, lay) == choose("s2", u, lay) for u in UNITS[:20_000])
    assert 9_500 < same < 10_500  # ~50% agreement, not 100%


def test_single_candidate_ramp_only_ever_adds_units() -> None:
    members: set[str] = set()
    units = UNITS[:20_000]
    for pct in (1, 5, 10, 25, 50, 100):
        lay = layout_from_weights([("control", 100 - pct, True), ("cand", pct, False)])
        now = {u for u in units if choose("ramp", u, lay) == "cand"}
        assert members <= now
        assert abs(len(now) / len(units) - pct / 100) < 0.015
        members = now


def test_raising_any_candidate_keeps_its_units_and_lowering_only_removes_them() -> None:
    rng = random.Random(7)
    units = UNITS[:5_000]
    for _ in range(40):
        n = rng.randint(1, 4)
        weights = [rng.uniform(0, 50) for _ in range(n)]
        control = rng.uniform(0, 50)
        target = rng.randrange(n)
        names = [f"v{i}" for i in range(n)]

        def members(ws: list[float], ctrl: float, names: list[str] = names, target: int = target) -> set[str]:
            lay = layout_from_weights(
                [("control", ctrl, True), *((names[i], ws[i], False) for i in range(len(names)))]
            )
            return {u for u in units if choose("prop", u, lay) == names[target]}

        before = members(weights, control)
        raised = list(weights)
        raised[target] += rng.uniform(0, 30)
        # both conventions: raw weight raised, or taken from the control (total constant)
        assert before <= members(raised, control)
        delta = raised[target] - weights[target]
        assert before <= members(raised, max(control - delta, 0.0))
        lowered = list(weights)
        lowered[target] *= rng.uniform(0, 1)
        assert members(lowered, control) <= before


def test_zero_weights_send_everyone_to_the_control() -> None:
    lay = layout_from_weights([("control", 0, True), ("a", 0, False)])
    assert {choose("z", u, lay) for u in UNITS[:1000]} == {"control"}


def test_coverage_admits_the_configured_share_independently_of_variant() -> None:
    inside = [u for u in UNITS[:20_000] if covered("cov", u, 0.3)]
    assert abs(len(inside) / 20_000 - 0.3) < 0.015
    assert set(inside) <= {u for u in UNITS[:20_000] if covered("cov", u, 0.6)}


def test_targeting_rules() -> None:
    rules = [
        {"attribute": "header:x-tier", "op": "in", "values": ["pro"]},
        {"attribute": "tag:task", "op": "neq", "values": ["math"]},
    ]
    assert matches(rules, {"header:x-tier": "pro", "tag:task": "code"})
    assert not matches(rules, {"header:x-tier": "free"})
    assert not matches(rules, {"header:x-tier": "pro", "tag:task": "math"})
    assert matches([{"attribute": "unit", "op": "prefix", "values": ["qa-"]}], {"unit": "qa-1"})
    assert not matches([{"attribute": "header:x-a", "op": "exists"}], {})


def _facts(unit: str | None, headers: list[tuple[bytes, bytes]] | None = None) -> RequestFacts:
    return RequestFacts(
        unit_header=unit, user=None, authorization=None, headers=headers or [], tags={}, model="r"
    )


def test_forced_targeting_and_coverage_decide_attribution() -> None:
    variants = [VariantConfig("control", "u", "m0", 0, True), VariantConfig("cand", "u", "m1", 100)]
    route = build_route(
        experiment(
            "r",
            variants,
            forced={"qa-1": "control"},
            targeting=({"attribute": "header:x-tier", "op": "in", "values": ["pro"]},),
        )
    )
    pro = [(b"x-tier", b"pro")]
    d = decide(route, _facts("someone", pro))
    assert (d.variant.name, d.attributed, d.unit_source, d.mode) == ("cand", True, "header", "ab")
    d = decide(route, _facts("qa-1", pro))
    assert (d.variant.name, d.attributed) == ("control", False)
    d = decide(route, _facts("someone", [(b"x-tier", b"free")]))
    assert (d.variant.name, d.attributed, d.mode) == ("control", False, "none")
    d = decide(route, _facts(None, pro))
    assert d.unit_source == "random" and d.unit_id.startswith("anon-")


def test_unit_falls_back_from_header_to_user_to_api_key() -> None:
    variants = [VariantConfig("control", "u", "m0", 50, True), VariantConfig("cand", "u", "m1", 50)]
    route = build_route(experiment("r", variants))
    facts = RequestFacts(None, "alice", b"Bearer sk-secret", [], {}, "r")
    assert decide(route, facts).unit_id == "alice"
    facts = RequestFacts(None, None, b"Bearer sk-secret", [], {}, "r")
    d = decide(route, facts)
    assert d.unit_source == "api_key" and "sk-secret" not in d.unit_id
    route_user = build_route(experiment("r", variants, unit_key="user"))
    assert decide(route_user, RequestFacts("hdr", None, None, [], {}, "r")).unit_source == "random"


def test_a_remembered_unit_gets_what_the_layout_gives_and_a_new_snapshot_forgets() -> None:
    def route_with(weight: float) -> RouteConfig:
        variants = [
            VariantConfig("control", "u", "m0", 100 - weight, True),
            VariantConfig("cand", "u", "m1", weight),
        ]
        return build_route(experiment("r", variants))

    half = route_with(50)
    units = [f"unit-{i}" for i in range(ASSIGNED_MAX + 500)]
    for _ in range(2):  # the second pass answers from memory
        for unit in units:
            assert decide(half, _facts(unit)).variant.name == choose(half.experiment.salt, unit, half.layout)
    assert 0 < len(half.assigned) <= ASSIGNED_MAX
    # Weights change only with a new snapshot, whose route remembers nothing yet.
    everyone = route_with(100)
    assert {decide(everyone, _facts(unit)).variant.name for unit in units[:200]} == {"cand"}
    # Units drawn at random are not remembered (they never come back).
    before = len(everyone.assigned)
    d = decide(everyone, _facts(None))
    assert d.unit_source == "random" and len(everyone.assigned) == before
