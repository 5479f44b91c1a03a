"""`xbackend.compare()`: a model compared across backends, its options typed keywords."""

from __future__ import annotations

import os
from typing import Unpack

from xbackend.api.keywords import CompareKeywords
from xbackend.candidates.session import compare_with_options
from xbackend.execution.progress import ProgressSink
from xbackend.results import CompareOptions, Result

__all__ = ["compare", "compare_with_options"]


def compare(
    model: str | os.PathLike[str],
    progress: ProgressSink | None = None,
    **options: Unpack[CompareKeywords],
) -> Result:
    """Compare `model` (an ONNX file) across backends, each option a keyword of CompareKeywords
    (an unknown one is a UsageError naming the valid ones); `progress`: a bar, e.g.
    xbackend.execution.progress.RichProgress(). Returns the Result: its `findings`, `exit_code`,
    `backends` and comparisons.

    Example: ``xbackend.compare("model.onnx", backends=["ort-cpu", "reference"], runs=5)``.
    """
    return compare_with_options(model, CompareOptions.create(**options), progress)
