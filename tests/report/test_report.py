"""Reports: reproducible bytes, the JSON schema, atomic writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import xbackend
from xbackend.errors import ReportError
from xbackend.report import to_json, to_markdown, write_atomic

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_runs(models: dict[str, Path]) -> tuple[xbackend.Result, xbackend.Result]:
    return (
        xbackend.compare(models["attention"], runs=2, builds=2),
        xbackend.compare(models["attention"], runs=2, builds=2),
    )


def test_same_inputs_give_byte_identical_reports(two_runs: tuple[xbackend.Result, xbackend.Result]) -> None:
    a, b = two_runs
    assert to_markdown(a) == to_markdown(b)
    assert to_json(a) == to_json(b)


def test_json_schema(two_runs: tuple[xbackend.Result, xbackend.Result]) -> None:
    r = two_runs[0]
    data = json.loads(to_json(r))
    assert data["schema"] == "xbackend.report/2"
    assert data["model"]["sha256"] == r.model.sha256 and data["model"]["path"].endswith("attention.onnx")
    assert data["inputs"]["seed"] == 0 and len(data["inputs"]["sha256"]) == 64
    names = [b["name"] for b in data["backends"]]
    assert names == ["ort-cpu", "reference"]
    ort = data["backends"][0]
    assert {k: ort[k] for k in ("status", "reason", "deterministic", "runs", "distinct_outputs")} == {
        "status": "ok",
        "reason": "",
        "deterministic": True,
        "runs": 2,
        "distinct_outputs": 1,
    }
    cross = data["cross_backend"][0]
    assert cross["backend"] == "ort-cpu" and cross["reference"] == "reference"
    assert cross["bitwise_equal"] is False and cross["first_divergence"] == "ln.out"
    assert isinstance(cross["max_ulp"], int)
    first = cross["tensors"][0]
    assert set(first) >= {
        "name",
        "op_type",
        "dtype",
        "bitwise_equal",
        "max_ulp",
        "mismatch_fraction",
        "max_abs",
        "max_rel",
    }
    assert first["name"] == "ln.out" and first["op_type"] == "LayerNormalization"
    assert "cpu.model" in data["environment"] and "package.onnxruntime" in data["environment"]


def test_markdown_sections_in_order(two_runs: tuple[xbackend.Result, xbackend.Result]) -> None:
    md = to_markdown(two_runs[0])
    heads = [ln for ln in md.splitlines() if ln.startswith("## ")]
    assert heads == [
        "## Answer",
        "## Verdict",
        "## Backends",
        "## What the differences are",
        "## All pairs at the outputs",
        "## Allowances per element",
        "## Cross-backend, per layer",
        "## Observer effect",
        "## Run to run and build to build",
        "## What moves the bits (probes)",
        "## Model",
        "## Inputs",
        "## Options in force",
        "## Environment",
        "## Metrics",
        "## Glossary",
        "## Reproduce",
    ]
    assert "| **ln.out** ⟵ first divergence | LayerNormalization |" in md
    assert "xbackend compare " in md.split("## Reproduce")[1]


def test_atomic_write_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "r.md"
    write_atomic(target, "old")
    write_atomic(target, "new\n")  # its own file, recorded: replaced
    assert target.read_text("utf-8") == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".xbackend-files.json", "r.md"]


def test_unwritable_report_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ReportError, match="cannot write report"):
        write_atomic(blocker / "r.md", "x")


def test_build_times_only_on_request(models: dict[str, Path]) -> None:
    r = xbackend.compare(models["mlp_layernorm"], backends=["ort-cpu"], runs=1, builds=2, probes="none")
    assert "## Build times" not in to_markdown(r) and "build_seconds" not in json.loads(to_json(r))
    timed = xbackend.compare(
        models["mlp_layernorm"], backends=["ort-cpu"], runs=1, builds=2, probes="none", timings=True
    )
    seconds = json.loads(to_json(timed))["build_seconds"]["ort-cpu"]
    assert len(seconds) == 2 and all(0 < s < 600 for s in seconds)
    md = to_markdown(timed)
    assert "## Build times" in md and f"| ort-cpu | 1 | {timed.backend('ort-cpu').build_s[1]:.1f} |" in md
    assert timed.command.endswith(" --timings")
