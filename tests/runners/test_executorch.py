"""ExecuTorch as a backend: the module an ONNX model was exported from, exported to a .pte
program and run by ExecuTorch's runtime on its portable kernels and with XNNPACK, against PyTorch
eager and ONNX Runtime at the graph outputs."""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path
from typing import Any

import pytest
from roots import ROOT

import xbackend

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("executorch") is None or importlib.util.find_spec("torch") is None,
    reason="executorch or torch not installed (pip install 'xbackend[executorch]')",
)
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
    # per operator: ETDump's logged kernel calls, 30 of the 31 the model's tensors (the last is y)
    assert dict(by["executorch"].info)["per operator"] == (
        "ETDump: 31 logged kernel call(s), 30 of them the model's tensors"
    )
    assert dict(by["executorch-xnnpack"].info)["per operator"] == (
        "ETDump: 13 logged kernel call(s), 12 of them the model's tensors"
    )
    hidden = dict(by["executorch-xnnpack"].not_exposed)
    assert hidden["linear_2"] == (
        "inside ExecuTorch's XNNPACK delegate call for blocks.1 (linear_2 .. add_1): it logs the call's "
        "output only (add_1)"
    )


def test_outputs_against_pytorch_eager(mlp: xbackend.Result) -> None:
    """Float32 kernels of their own: close to eager (a few ULP at the outputs), not its bits."""
    cross = {c.backend: c for c in mlp.cross_backend if c.reference == "torch"}
    for name in ("executorch", "executorch-xnnpack"):
        c = cross[name]
        assert c.status == "ok"
        assert c.scaled_ulp is not None and c.scaled_ulp < 64, (name, c.scaled_ulp)


def test_per_operator_values_against_eager(mlp: xbackend.Result) -> None:
    """Each logged kernel call is compared at the ONNX tensor torch.onnx wrote for its operator:
    portable kernels at every linear, SiLU, LayerNorm and residual Add; XNNPACK at its calls'
    outputs (each block's residual Add) and the LayerNorms between them. Each is close to
    eager (float32 kernels of their own), none bitwise by luck of a wrong match."""
    cross = {c.backend: c for c in mlp.cross_backend if c.reference == "torch"}
    portable = {t.name: t for t in cross["executorch"].tensors if t.status == "ok"}
    want = {f"{op}{k}" for k in ("", *(f"_{i}" for i in range(1, 6))) for op in ("layer_norm", "silu", "add")}
    want |= {f"linear{k}" for k in ("", *(f"_{i}" for i in range(1, 12)))}
    assert want <= set(portable), sorted(want - set(portable))
    assert all(t.scaled_ulp is not None and t.scaled_ulp < 64 for t in portable.values())
    assert not all(t.bitwise_equal for t in portable.values())  # its own kernels: not eager's bits
    xnn = {t.name for t in cross["executorch-xnnpack"].tensors if t.status == "ok"}
    assert {"add", "add_5", "layer_norm", "layer_norm_5", "y"} <= xnn and "linear" not in xnn


def test_per_operator_gap_agrees_with_inspector() -> None:
    """The values xbackend reads from ETDump, against torch at op grain, give per operator the
    MSE ExecuTorch's own Inspector.calculate_numeric_gap gives on the same program and input
    (its pipeline run here independently: ETRecord with the input, ETDump, Inspector)."""
    import sys
    import warnings

    import numpy as np
    import torch
    from executorch.devtools import Inspector
    from executorch.exir import to_edge_transform_and_lower
    from executorch.extension.pybindings import portable_lib

    from xbackend.model.load import load_model
    from xbackend.runners.registry import get_runner

    spec, _ = load_model(MLP)
    feed = np.random.default_rng(3).standard_normal((1, 16, 64)).astype(np.float32)
    values = {}
    for name in ("torch", "executorch"):
        runner = get_runner(name)({"module": MODULE, "threads": "1"})
        runner.prepare(spec.ref(), tuple(t.name for t in spec.tensors))
        values[name] = runner.run({"x": feed})
        runner.close()
    ours = {
        t: float(np.mean((values["executorch"][t].astype(np.float64) - v.astype(np.float64)) ** 2))
        for t, v in values["torch"].items()
        if t in values["executorch"]
    }
    sys.path.insert(0, str(ROOT / "models"))
    try:
        from torch_mlp import build
    finally:
        sys.path.remove(str(ROOT / "models"))
    x = torch.from_numpy(feed)
    edge = to_edge_transform_and_lower(torch.export.export(build(), (x,)), generate_etrecord=True)
    program = edge.to_executorch()
    record = program.get_etrecord()
    record.update_representative_inputs([(x,)])
    with tempfile.TemporaryDirectory() as d:
        record.save(f"{d}/etrecord.bin")
        loaded = portable_lib._load_for_executorch_from_buffer(
            program.buffer, enable_etdump=True, debug_buffer_size=1 << 24
        )
        loaded.run_method("forward", (x,))
        loaded.write_etdump_result_to_file(f"{d}/etdump.etdp", f"{d}/debug.bin")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            inspector = Inspector(
                f"{d}/etdump.etdp", etrecord=f"{d}/etrecord.bin", debug_buffer_path=f"{d}/debug.bin"
            )
            gaps = inspector.calculate_numeric_gap("MSE")
    theirs = {ops[-1]: float(gap[0]) for ops, gap in zip(gaps["aot_ops"], gaps["gap"], strict=True)}
    theirs["y"] = theirs.pop("layer_norm_6")  # the graph output: torch.onnx names it y
    assert len(theirs) == 31 and set(theirs) == set(ours), sorted(set(theirs) ^ set(ours))
    for t, gap in theirs.items():
        assert gap > 0 and abs(ours[t] - gap) <= 1e-6 * gap, (t, ours[t], gap)


def test_a_planted_error_is_found_at_its_operator(tmp_path: Path) -> None:
    """The module ExecuTorch runs differs from the model's by 1e-2 in one bias (block 2's fc1):
    the first tensor past tolerance is that Linear's own (linear_4), nothing before it moves
    past rounding, and XNNPACK, which logs only its calls' outputs, first moves at that block's
    residual Add (add_2)."""
    nudged = tmp_path / "nudged_mlp.py"
    nudged.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT / 'models')!r})\n"
        "import torch\nfrom torch_mlp import build as original\n\n"
        "def build():\n"
        "    m = original()\n"
        "    with torch.no_grad():\n"
        "        m.blocks[2].fc1.bias[5] += 1e-2\n"
        "    return m\n",
        encoding="utf-8",
    )
    spec = f"{nudged}:build"
    result = xbackend.compare(
        MLP, backends=["torch", "executorch", "executorch-xnnpack"], reference="torch", torch_module=MODULE,
        runner_options=[(b, k, v) for b in ("executorch", "executorch-xnnpack")
                        for k, v in (("module", spec), ("check_weights", "false"))],
        probes=["none"], runs=1, noise_samples=0,
    )  # fmt: skip
    cross = {c.backend: c for c in result.cross_backend if c.reference == "torch"}

    def first_past(c: Any) -> tuple[str, float]:
        return next((t.name, t.scaled_ulp) for t in c.tensors if (t.scaled_ulp or 0) > c.tolerance(t.name))

    name, ulp = first_past(cross["executorch"])
    assert name == "linear_4" and ulp > 1000, (name, ulp)
    assert first_past(cross["executorch-xnnpack"])[0] == "add_2"
    before = [t for t in cross["executorch"].tensors if t.name in ("linear_3", "add_1", "layer_norm_2")]
    assert len(before) == 3 and all(t.scaled_ulp is not None and t.scaled_ulp < 64 for t in before)


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, xbackend.Result]:
    """A ResNet (basic blocks, ResNet-18's kind) and a BERT from their transformers configs,
    random init, exported by `xbackend export torch`, through both ExecuTorch programs."""
    pytest.importorskip("transformers")
    import shutil

    from xbackend.export.example_inputs import InputDecl
    from xbackend.export.torch_onnx import export_torch

    folder = tmp_path_factory.mktemp("et_families")
    shutil.copy(ROOT / "tests" / "hf_models.py", folder / "hf_models.py")
    decls = {
        "resnet": [InputDecl("pixel_values", (1, 3, 32, 32), "float32")],
        "bert": [InputDecl("input_ids", (1, 16), "int64"), InputDecl("attention_mask", (1, 16), "int64")],
    }
    ranges = {"input_ids": (0, 512), "attention_mask": (1, 2)}
    out = {}
    for name, inputs in decls.items():
        path = folder / f"{name}.onnx"
        mine = {k: v for k, v in ranges.items() if name == "bert"}
        export_torch(f"{folder / 'hf_models.py'}:{name}", inputs, path, ranges=mine)
        out[name] = xbackend.compare(
            path, backends=["torch", "executorch", "executorch-xnnpack", "ort-cpu"], reference="torch",
            torch_module=f"{folder / 'hf_models.py'}:{name}", probes=["none"], runs=2, ranges=mine,
        )  # fmt: skip
    return out


def _logged(calls: int, matched: int) -> str:
    return f"ETDump: {calls} logged kernel call(s), {matched} of them the model's tensors"


# measured here (ExecuTorch 1.5.1, torch 2.13): the calls ETDump logs, and those that are tensors
# of the model (the rest are steps inside one of its operators, views, or calls torch.onnx wrote
# otherwise)
FAMILY_LOGGED = {
    "resnet": {"executorch": _logged(40, 16), "executorch-xnnpack": _logged(1, 1)},
    "bert": {"executorch": _logged(68, 40), "executorch-xnnpack": _logged(38, 15)},
}


@pytest.mark.parametrize("family", ["resnet", "bert"])
def test_real_families_judged_per_kernel_call(families: dict[str, xbackend.Result], family: str) -> None:
    """Beside torch (the reference), both programs are judged against float64 from their own
    values at each kernel call they log (they cannot be fed the reference's): every call within
    the rounding its nodes compose to, no origin; XNNPACK takes each model whole (one delegate
    call: judged at the output alone)."""
    r = families[family]
    assert not [ln for ln in r.verdict() if ln.startswith("FAIL")], r.verdict()
    by = {b.name: b for b in r.backends}
    local = {le.backend: le for le in r.explanation.local}
    for name in ("executorch", "executorch-xnnpack"):
        assert by[name].ok and by[name].deterministic, by[name].reason
        assert local[name].status == "ok" and local[name].explained, (name, local[name].reason)
    logged = {n: dict(by[n].info)["per operator"] for n in ("executorch", "executorch-xnnpack")}
    assert logged == FAMILY_LOGGED[family], logged
    # XNNPACK takes the whole ResNet: one call, judged at the logits alone
    assert (local["executorch-xnnpack"].compared == 1) == (family == "resnet")
