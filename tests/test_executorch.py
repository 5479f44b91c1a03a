"""ExecuTorch as a backend: the module an ONNX model was exported from, exported to a .pte
program and run by ExecuTorch's runtime on its portable kernels and with XNNPACK, against PyTorch
eager and ONNX Runtime at the graph outputs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import xbackend

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("executorch") is None or importlib.util.find_spec("torch") is None,
    reason="executorch or torch not installed (pip install 'xbackend[executorch]')",
)
ROOT = Path(__file__).resolve().parents[1]
MLP = ROOT / "models" / "torch_mlp.onnx"
MODULE = f"{ROOT / 'models' / 'torch_mlp.py'}:build"


@pytest.fixture(scope="module")
def mlp() -> xbackend.Result:
    return xbackend.compare(
        MLP, backends=["torch", "executorch", "executorch-xnnpack", "ort-cpu"], reference="torch",
        torch_module=MODULE, probes=["none"], runs=2, noise_samples=0,
    )  # fmt: skip


def test_both_programs_run_and_repeat_their_bits(mlp: xbackend.Result) -> None:
    by = {b.name: b for b in mlp.backends}
    for name in ("executorch", "executorch-xnnpack"):
        assert by[name].ok, by[name].reason
        assert by[name].deterministic
    info = dict(by["executorch-xnnpack"].info)
    assert "XNNPACK delegate call(s)" in info["program"] and not info["program"].startswith("0 XNNPACK")
    portable = dict(by["executorch"].info)["program"]
    assert portable.endswith(portable.split("; ")[-1]) and "XNNPACK" not in portable
    hidden = dict(by["executorch"].not_exposed)
    assert hidden and all(v.startswith("ExecuTorch's per-operator values") for v in hidden.values())


def test_outputs_against_pytorch_eager(mlp: xbackend.Result) -> None:
    """Float32 kernels of their own: close to eager (a few ULP at the outputs), not its bits."""
    cross = {c.backend: c for c in mlp.cross_backend if c.reference == "torch"}
    for name in ("executorch", "executorch-xnnpack"):
        c = cross[name]
        assert c.status == "ok"
        assert c.scaled_ulp is not None and c.scaled_ulp < 64, (name, c.scaled_ulp)
