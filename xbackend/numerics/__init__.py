"""Numerics: values as engines hand them over, and the per-tensor metrics (ULP, exact sums)."""
