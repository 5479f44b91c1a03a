"""Wording shared by the Markdown and JSON reports."""

from __future__ import annotations

__all__ = ["METRIC_DEFINITIONS"]

METRIC_DEFINITIONS: tuple[tuple[str, str], ...] = (
    ("bitwise_equal", "every byte of the tensor is identical"),
    ("mismatch_fraction", "fraction of elements whose bits differ (count variability V_c)"),
    (
        "max_ulp",
        "largest distance in units in the last place of the tensor's own dtype, over "
        "elements finite on both sides; +0 and -0 are 0 apart; near zero this explodes "
        "(a sign flip is ~1e9 for fp32), so do not judge by it alone",
    ),
    (
        "scaled_ulp",
        "largest absolute error divided by one ULP at the reference tensor's largest "
        "finite magnitude: the scale-aware figure that --max-ulp bounds",
    ),
    ("max_abs", "largest |a - b| over comparable elements"),
    ("max_rel", "largest |a - b| / |b| over comparable elements with b != 0"),
    ("p99_abs", "99th percentile of |a - b| over comparable elements"),
    (
        "v_ermv",
        "mean of |a - b| / |b| over comparable elements with b != 0 (elementwise relative mean variability)",
    ),
    (
        "nan_mismatch / inf_mismatch / ftz_mismatch / fill_mismatch",
        "elements where exactly one side is NaN, where "
        "an infinity differs, where one side is subnormal and the other zero (flush-to-zero), or "
        "where the reference holds saturated fill (±finfo.max, e.g. an additive attention mask) and "
        "the candidate another value; counted apart and never turned into ULP figures. Fill is "
        "left out of the scale of scaled ULP",
    ),
    ("first_divergence", "first tensor in topological order whose bits differ"),
    (
        "first_violation",
        "first tensor in topological order past --max-ulp (scaled), or with a "
        "NaN/Inf mismatch, or not comparable (dtype or shape mismatch)",
    ),
)
