"""liftgate's statistics engine: pure functions over sufficient statistics, no I/O.

Typical use by the report, per metric::

    ests = cuped_estimates(stats_by_variant, kind).estimates   # or [estimate(s, kind) ...]
    control, candidate = ests[0], ests[1]
    fixed = welch_lift(control, candidate, alpha)              # fixed-horizon CI, p-value
    seq = sequential_lift(control, candidate, alpha, planned)  # confidence sequence, mSPRT p
    bayes = chance_to_beat(control, candidate, direction)
    guard = sequential_noninferiority(control, candidate, margin, direction, alpha, planned)
    rate = sequential_rate_noninferiority(control_sums, candidate_sums, 0.01, "decrease")  # 0/1 events

Conventions other engines use, and the methods beside the defaults (``docs/statistics.md``
says which engine each matches): ``cuped_estimates(..., theta="per_arm")``,
``proportion_lift(..., test="pooled_z")``, ``power_of(..., test="relative")``,
``mann_whitney``/``mann_whitney_guardrail`` (request-level samples), ``group_sequential_*``,
``sequential_srm``, ``adjusted_intervals``, ``ratio_cuped_estimates``, ``beta_binomial``,
``quantile_chance_to_beat``.

Every result is a frozen dataclass of finite floats / ``None`` with ``error`` and
``message`` (see :mod:`analytics.stats.errors`); nothing raises on degenerate data.
Formulas and references: ``docs/statistics.md``.
"""

from analytics.stats.bayes import BayesResult, GaussianPrior, chance_to_beat
from analytics.stats.bayes_quantile import quantile_chance_to_beat
from analytics.stats.beta_binomial import BetaBinomialResult, BetaPrior, beta_binomial
from analytics.stats.correction import (
    AdjustedInterval,
    Effect,
    IntervalAdjustment,
    InvalidPValue,
    adjusted_intervals,
    benjamini_hochberg,
    holm,
)
from analytics.stats.cuped import CupedEstimates, CupedTheta, cuped_estimates
from analytics.stats.errors import Direction, ErrorCode
from analytics.stats.estimate import MetricKind, VariantEstimate, estimate
from analytics.stats.group_sequential import (
    GroupSequentialDesign,
    GroupSequentialGuardrail,
    GroupSequentialResult,
    Spending,
    group_sequential_design,
    group_sequential_lift,
    group_sequential_noninferiority,
    group_sequential_rate_noninferiority,
)
from analytics.stats.guardrail import NonInferiorityResult, noninferiority
from analytics.stats.lift import Interval, LiftResult, compare, welch_lift
from analytics.stats.paired import McNemarResult, PairedResult, RateInterval, agreement, mcnemar, paired_test
from analytics.stats.power import (
    LiftTest,
    MdeResult,
    PowerResult,
    SampleSizeResult,
    minimum_detectable_effect,
    power_of,
    required_sample_size,
)
from analytics.stats.proportion import ProportionTest, proportion_lift
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
from analytics.stats.rank import (
    MannWhitneyResult,
    RankGuardrail,
    batch_quantiles,
    mann_whitney,
    mann_whitney_guardrail,
)
from analytics.stats.rate import RateArm, restricted_rates, sequential_rate_noninferiority
from analytics.stats.ratio_cuped import RatioSampleStats, ratio_cuped_estimates
from analytics.stats.sequential import (
    DEFAULT_PLANNED_UNITS,
    SequentialGuardrail,
    SequentialResult,
    msprt_p_value,
    sequential_lift,
    sequential_noninferiority,
)
from analytics.stats.srm import (
    SRM_THRESHOLD,
    SequentialSrmResult,
    SrmReason,
    SrmResult,
    sequential_srm,
    srm_check,
)
from analytics.stats.sufficient import SampleStats

__all__ = [
    "BUCKETS_PER_E",
    "DEFAULT_PLANNED_UNITS",
    "SRM_THRESHOLD",
    "AdjustedInterval",
    "BayesResult",
    "BetaBinomialResult",
    "BetaPrior",
    "CupedEstimates",
    "CupedTheta",
    "Direction",
    "Effect",
    "ErrorCode",
    "GaussianPrior",
    "GroupSequentialDesign",
    "GroupSequentialGuardrail",
    "GroupSequentialResult",
    "Interval",
    "IntervalAdjustment",
    "InvalidPValue",
    "LiftResult",
    "LiftTest",
    "MannWhitneyResult",
    "McNemarResult",
    "MdeResult",
    "MetricKind",
    "NonInferiorityResult",
    "PairedResult",
    "PowerResult",
    "ProportionTest",
    "QuantileDiff",
    "QuantileEstimate",
    "RankGuardrail",
    "RateArm",
    "RateInterval",
    "RatioSampleStats",
    "SampleSizeResult",
    "SampleStats",
    "SequentialGuardrail",
    "SequentialResult",
    "SequentialSrmResult",
    "Spending",
    "SrmReason",
    "SrmResult",
    "VariantEstimate",
    "adjusted_intervals",
    "agreement",
    "batch_quantiles",
    "benjamini_hochberg",
    "beta_binomial",
    "bucket_bounds",
    "bucket_of",
    "chance_to_beat",
    "compare",
    "cuped_estimates",
    "design_effect",
    "estimate",
    "estimated_design_effect",
    "group_sequential_design",
    "group_sequential_lift",
    "group_sequential_noninferiority",
    "group_sequential_rate_noninferiority",
    "holm",
    "mann_whitney",
    "mann_whitney_guardrail",
    "mcnemar",
    "minimum_detectable_effect",
    "msprt_p_value",
    "noninferiority",
    "paired_test",
    "power_of",
    "proportion_lift",
    "quantile_chance_to_beat",
    "quantile_ci",
    "quantile_diff",
    "ratio_cuped_estimates",
    "required_sample_size",
    "restricted_rates",
    "sequential_lift",
    "sequential_noninferiority",
    "sequential_rate_noninferiority",
    "sequential_srm",
    "srm_check",
    "welch_lift",
]
