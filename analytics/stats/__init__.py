"""liftgate's statistics engine: pure functions over sufficient statistics, no I/O.

Typical use by the report, per metric::

    ests = cuped_estimates(stats_by_variant, kind).estimates   # or [estimate(s, kind) ...]
    control, candidate = ests[0], ests[1]
    fixed = welch_lift(control, candidate, alpha)              # fixed-horizon CI, p-value
    seq = sequential_lift(control, candidate, alpha, planned)  # confidence sequence, mSPRT p
    bayes = chance_to_beat(control, candidate, direction)
    guard = sequential_noninferiority(control, candidate, margin, direction, alpha, planned)
    rate = sequential_rate_noninferiority(control_sums, candidate_sums, 0.01, "decrease")  # 0/1 events

Every result is a frozen dataclass of finite floats / ``None`` with ``error`` and
``message`` (see :mod:`analytics.stats.errors`); nothing raises on degenerate data.
Formulas and references: ``docs/statistics.md``.
"""

from analytics.stats.bayes import BayesResult, GaussianPrior, chance_to_beat
from analytics.stats.correction import benjamini_hochberg, holm
from analytics.stats.cuped import CupedEstimates, cuped_estimates
from analytics.stats.errors import Direction, ErrorCode
from analytics.stats.estimate import MetricKind, VariantEstimate, estimate
from analytics.stats.guardrail import NonInferiorityResult, noninferiority
from analytics.stats.lift import Interval, LiftResult, compare, welch_lift
from analytics.stats.paired import McNemarResult, PairedResult, RateInterval, agreement, mcnemar, paired_test
from analytics.stats.power import (
    MdeResult,
    PowerResult,
    SampleSizeResult,
    minimum_detectable_effect,
    power_of,
    required_sample_size,
)
from analytics.stats.quantile import (
    BUCKETS_PER_E,
    QuantileDiff,
    QuantileEstimate,
    bucket_bounds,
    bucket_of,
    design_effect,
    estimated_design_effect,
    quantile_ci,
    quantile_diff,
)
from analytics.stats.rate import RateArm, restricted_rates, sequential_rate_noninferiority
from analytics.stats.sequential import (
    DEFAULT_PLANNED_UNITS,
    SequentialGuardrail,
    SequentialResult,
    msprt_p_value,
    sequential_lift,
    sequential_noninferiority,
)
from analytics.stats.srm import SRM_THRESHOLD, SrmResult, srm_check
from analytics.stats.sufficient import SampleStats

__all__ = [
    "BUCKETS_PER_E",
    "DEFAULT_PLANNED_UNITS",
    "SRM_THRESHOLD",
    "BayesResult",
    "CupedEstimates",
    "Direction",
    "ErrorCode",
    "GaussianPrior",
    "Interval",
    "LiftResult",
    "McNemarResult",
    "MdeResult",
    "MetricKind",
    "NonInferiorityResult",
    "PairedResult",
    "PowerResult",
    "QuantileDiff",
    "QuantileEstimate",
    "RateArm",
    "RateInterval",
    "SampleSizeResult",
    "SampleStats",
    "SequentialGuardrail",
    "SequentialResult",
    "SrmResult",
    "VariantEstimate",
    "agreement",
    "benjamini_hochberg",
    "bucket_bounds",
    "bucket_of",
    "chance_to_beat",
    "compare",
    "cuped_estimates",
    "design_effect",
    "estimate",
    "estimated_design_effect",
    "holm",
    "mcnemar",
    "minimum_detectable_effect",
    "msprt_p_value",
    "noninferiority",
    "paired_test",
    "power_of",
    "quantile_ci",
    "quantile_diff",
    "required_sample_size",
    "restricted_rates",
    "sequential_lift",
    "sequential_noninferiority",
    "sequential_rate_noninferiority",
    "srm_check",
    "welch_lift",
]
