"""The keywords `xbackend.compare()` takes, typed: an IDE completes them and mypy rejects a
misspelt one. Each takes what its command-line flag takes, or the plain Python value; None is
the option's default. CompareOptions (xbackend.results.options) declares each option's default,
its flag and its check; a test holds the two lists equal."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TypedDict

__all__ = ["CompareKeywords"]

Path = str | os.PathLike[str]
Names = str | Sequence[str]  # "a,b" or ["a", "b"]


class CompareKeywords(TypedDict, total=False):
    """Every keyword of `xbackend.compare()`; see docs/python-api.md and `xbackend compare --help`."""

    backends: Names  # runner names (`xbackend backends` lists them)
    reference: str | None  # the backend every other is compared against
    runs: int  # runs per session
    builds: int  # fresh sessions, each in a fresh process
    max_ulp: float | str | None  # a number of scaled ULP at the outputs, or "auto"/None
    timeout: float  # seconds per backend build
    inputs: Path | None  # FILE.npz or a DIR of input_N.pb
    seed: int  # seed for generated inputs
    shapes: Mapping[str, int | Sequence[int]] | Sequence[str | tuple[str, Sequence[int]]]  # x=1,3
    runner_options: Mapping[str, Mapping[str, object]] | Sequence[str | tuple[str, str, str]]
    outputs_only: bool  # compare graph outputs only
    tensors: str  # "all", "modules", "outputs" or globs
    probes: Names | None  # probes to run, "all" or "none"
    batch_invariance: int  # a batch size >= 2: each sample alone vs in the batch
    probe_threads: int  # the thread count the threads probe holds against 1
    ranges: Mapping[str, tuple[float, float]] | Sequence[str | tuple[str, float, float]]
    timings: bool  # time each backend's runs
    loads: Mapping[str, Path] | Sequence[str | tuple[str, Path]]  # captures: NAME=DIR
    baseline: Path | None  # a JSON report or a capture to measure drift against
    fail_on: Names  # gates, e.g. "ulp>8"
    save_captures: Path | None  # a folder for every backend's capture
    noise_samples: int | None  # the floor's samples (0: no explanation)
    timed_runs: int  # timed runs per backend
    max_memory: int | str | None  # bytes, or a size such as "3GiB"
    decode: int  # greedy decoding steps
    decisions: Names  # "auto" or output names
    candidates: str | Mapping[str, Names] | Sequence[str | tuple[str, Names]]  # FILE@BACKENDS
    advise: bool  # the nodes to keep in float32 so each candidate's answers match
    advise_budget: int  # the advice's re-conversions
    modes: Names | None  # runners run under each determinism mode they declare
    threads: int | None  # thread count for every backend with a threads option
    torch_module: str | None  # path/to/file.py:factory or pkg.mod:factory
    trust_model_code: bool  # let the torch backends import the file the model names
