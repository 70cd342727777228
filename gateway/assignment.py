"""Variant assignment: a pure, documented function of (salt, unit id, weights).

Hash
    ``bucket(key) = int.from_bytes(blake2b(key.encode(), digest_size=8).digest(), "big") % 10_000``
    — 10,000 buckets, so shares are exact to 0.01 %.

Layout (monotone under ramp, for A/B/n)
    Variants are listed in a fixed order: the control, then the candidates in the order they
    were created. Weights are normalised to shares ``w_k = weight_k / Σ weights``. Each
    candidate ``k`` draws its *own* bucket ``b_k = bucket(f"{salt}:{name_k}:{unit}")`` and has a
    threshold ``t_k = round(10_000 · w_k / (1 − Σ_{j<k} w_j))`` (the conditional share left by the
    candidates before it). A unit goes to the first candidate with ``b_k < t_k``; a unit that no
    candidate claims goes to the control. Hence ``P(k) = w_k`` exactly (up to rounding), and:

    * **raising** candidate X's weight raises ``t_X`` and leaves every ``t_j`` (j before X) and
      every ``b_j`` unchanged, so every unit already in X stays in X;
    * **lowering** X only lowers ``t_X``, so units can only leave X.

    With a single candidate (the rollout case) this is a plain threshold: the candidate holds
    buckets ``[0, 10_000·w)``, and a ramp 1 % → 5 % → 25 % → 100 % only ever adds units.
    (With three or more variants no layout can keep *every other* candidate's units fixed when
    one weight changes while shares stay exact; here a later candidate may trade some units
    with an earlier one that was ramped, but never the ramped candidate itself.)

Coverage
    ``bucket(f"coverage:{salt}:{unit}") < 10_000 · coverage`` — an independent hash, so
    changing coverage does not reshuffle variants. Units outside coverage, or not matching the
    targeting rules, get the control and are not attributed to the experiment.

Targeting
    A list of rules, all of which must hold: ``{"attribute": "header:x-tier", "op": "in",
    "values": ["pro"]}``. Attributes: ``header:<name>`` (request header), ``tag:<name>``
    (``X-Liftgate-Tags``), ``metadata:<key>`` (the request's OpenAI ``metadata`` object),
    ``model``, ``unit``. Ops: ``in``, ``not_in``, ``eq``, ``neq``,
    ``exists``, ``prefix``.

Forced variants
    ``forced = {unit_id: variant_name}`` pins allow-listed units (QA, demos). Forced units are
    served the named variant but not attributed to the experiment, so they never bias it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any

BUCKETS = 10_000


def bucket(key: str) -> int:
    """The documented hash: first 8 bytes of BLAKE2b of ``key`` (UTF-8), modulo 10,000."""
    return int.from_bytes(blake2b(key.encode(), digest_size=8).digest(), "big") % BUCKETS


@dataclass(frozen=True, slots=True)
class Layout:
    """Precomputed thresholds for one experiment's weights (built once per config snapshot)."""

    control: str
    candidates: tuple[str, ...]
    thresholds: tuple[int, ...]
    shares: Mapping[str, float]


def layout_from_weights(weights: Sequence[tuple[str, float, bool]]) -> Layout:
    """Build the layout from ``[(variant name, weight, is_control)]`` in creation order."""
    control = next(name for name, _, is_control in weights if is_control)
    total = sum(max(w, 0.0) for _, w, _ in weights)
    shares = {name: (max(w, 0.0) / total if total > 0 else (1.0 if c else 0.0)) for name, w, c in weights}
    names: list[str] = []
    thresholds: list[int] = []
    taken = 0.0
    for name, _, is_control in weights:
        if is_control:
            continue
        share = shares[name]
        left = 1.0 - taken
        t = BUCKETS if left <= 1e-12 else round(BUCKETS * min(1.0, share / left))
        names.append(name)
        thresholds.append(t if share > 0 else 0)
        taken += share
    return Layout(control=control, candidates=tuple(names), thresholds=tuple(thresholds), shares=shares)


def choose(salt: str, unit: str, lay: Layout) -> str:
    """The variant for ``unit``: first candidate whose own bucket is under its threshold, else control."""
    for name, threshold in zip(lay.candidates, lay.thresholds, strict=True):
        if threshold and bucket(f"{salt}:{name}:{unit}") < threshold:
            return name
    return lay.control


def covered(salt: str, unit: str, coverage: float) -> bool:
    if coverage >= 1.0:
        return True
    return bucket(f"coverage:{salt}:{unit}") < round(BUCKETS * coverage)


def matches(rules: Sequence[Mapping[str, Any]], attributes: Mapping[str, str]) -> bool:
    """True when every rule holds for ``attributes`` (keys like ``header:x-tier``, ``tag:task``)."""
    for rule in rules:
        value = attributes.get(str(rule["attribute"]).lower())
        op = rule["op"]
        values = rule.get("values", [])
        if op == "exists":
            ok = value is not None
        elif value is None:
            ok = op in ("not_in", "neq")
        elif op == "in":
            ok = value in values
        elif op == "not_in":
            ok = value not in values
        elif op == "eq":
            ok = bool(values) and value == values[0]
        elif op == "neq":
            ok = not values or value != values[0]
        else:  # prefix
            ok = any(value.startswith(v) for v in values)
        if not ok:
            return False
    return True
