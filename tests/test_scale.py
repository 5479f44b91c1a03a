"""LLM scale: choosing the tensors to expose, memory windows, models past 2 GiB."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import xbackend
from xbackend.errors import UsageError
from xbackend.model import load_model
from xbackend.selection import select

ROOT = Path(__file__).resolve().parent.parent
MLP = ROOT / "models" / "torch_mlp.onnx"  # 6 blocks (ln, fc1, act, fc2, residual), module map recorded


def test_module_boundaries_are_each_modules_output() -> None:
    spec, _ = load_model(MLP)
    got = select(spec, "modules")
    # per block: ln, fc1, act, fc2 and the residual add; the final LayerNorm is the graph output
    assert len(got) == 31 and got[-1] == "y"
    assert got[:5] == ("layer_norm", "linear", "silu", "linear_1", "add")
    assert "val_3" not in got  # fc1's MatMul, inside the module, before its bias


def test_a_glob_takes_a_block_and_its_submodules() -> None:
    spec, _ = load_model(MLP)
    got = select(spec, "blocks.1.*")
    # block 1's ops (its submodules' and its own residual add), and the graph output
    assert got == (
        "layer_norm_1",
        "val_10",
        "linear_2",
        "val_11",
        "silu_1",
        "val_13",
        "linear_3",
        "add_1",
        "y",
    )
    assert select(spec, "outputs") == ("y",)
    assert select(spec, "linear_1,linear_3") == ("linear_1", "linear_3", "y")  # tensor names too


def test_a_glob_that_matches_nothing_says_what_would() -> None:
    spec, _ = load_model(MLP)
    with pytest.raises(
        UsageError, match=r"--tensors 'block.9.\*' matches no module path .* start with blocks"
    ):
        select(spec, "block.9.*")


def test_modules_needs_module_paths() -> None:
    spec, _ = load_model(ROOT / "models" / "mlp_layernorm.onnx")
    with pytest.raises(UsageError, match=r"records none .* --tensors all"):
        select(spec, "modules")


def test_compare_exposes_the_selection(tmp_path: Path) -> None:
    r = xbackend.compare(MLP, backends=["ort-cpu", "reference"], runs=2, tensors="blocks.2.*")
    cross = r.cross_backend[0]
    assert [d.name for d in cross.tensors] == [
        "layer_norm_2", "val_17", "linear_4", "val_18", "silu_2", "val_20", "linear_5", "add_2", "y"
    ]  # fmt: skip
    assert "--tensors 'blocks.2.*'" in r.command  # quoted for the shell
    js = json.loads(xbackend.to_json(r))
    assert js["model"]["exposed"] == 9 and js["model"]["tensors"] == 49
    assert js["options"]["tensors"] == "blocks.2.*"
    md = xbackend.to_markdown(r)
    assert "tensors matching blocks.2.* (--tensors), 9 of 49 tensors" in md
