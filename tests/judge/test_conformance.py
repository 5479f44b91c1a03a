"""A fast subset of the conformance sweep (benchmarks/conformance.py) over ONNX's node tests.

Each case is chosen for a value kind or failure mode xbackend once mishandled; none may be
lost: what an engine runs directly, it runs under xbackend too.
"""

from __future__ import annotations

import sys

import pytest
from roots import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import conformance

pytestmark = pytest.mark.slow

CASES = {  # (ort-cpu, reference)
    "test_abs": ("ran", "ran"),
    "test_relu": ("ran", "ran"),
    "test_size": ("ran", "ran"),  # a 0-d output
    "test_reduce_sum_empty_axes_input_noop": ("ran", "ran"),
    "test_string_concat": ("ran", "ran"),  # strings in and out
    "test_identity_sequence": ("ran", "ran"),  # a sequence input and output
    "test_sequence_insert_at_back": ("ran", "ran"),
    # ORT's run() cannot return bfloat16; xbackend reads it through an OrtValue.
    "test_castlike_FLOAT_to_BFLOAT16": ("xbackend only", "ran"),
    # Stamped with opset 28, which ONNX Runtime 1.31 lacks: ORT is unavailable for the model,
    # the reference evaluator still runs (an empty optional input, a bfloat16 output).
    "test_optional_has_element_empty_optional_input": ("both refuse", "ran"),
    "test_cast_FLOAT_to_BFLOAT16": ("both refuse", "ran"),
}


@pytest.fixture(scope="module")
def outcomes() -> dict[str, conformance.CaseOutcome]:
    cases = [c for c in conformance.load_cases() if c.name in CASES]
    assert {c.name for c in cases} == set(CASES)
    return {c.name: conformance.run_case(c) for c in cases}


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_is_run_and_compared(name: str, outcomes: dict[str, conformance.CaseOutcome]) -> None:
    o = outcomes[name]
    got = (o.category(0), o.category(1))
    assert got == CASES[name], (o.status, o.reasons)
    assert o.compared is (got[0] != "both refuse")


def test_summary_counts(outcomes: dict[str, conformance.CaseOutcome]) -> None:
    text = conformance.summarize(list(outcomes.values()))
    assert "| ort-cpu | 7 | 0 | 2 | 1 |" in text and "| reference | 10 | 0 | 0 | 0 |" in text
    assert "lost by xbackend (ran directly, not under xbackend): 0" in text
