"""PyTorch export and the eager torch runner (torch is installed by the README's commands)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from roots import ROOT

import xbackend
from xbackend.cli import main
from xbackend.errors import ExportError

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("torch") is None, reason="torch not installed: pip install 'xbackend[torch]'"
    ),
]

SPEC = f"{ROOT / 'models' / 'torch_mlp.py'}:build"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from xbackend.export.torch_onnx import InputDecl, export_torch

    out = tmp_path_factory.mktemp("export") / "mlp.onnx"
    res = export_torch(SPEC, [InputDecl.parse("x=1,16,64")], out, output_names=["y"])
    assert res.outputs == ("y",)
    return out


def test_export_records_its_source(exported: Path) -> None:
    import torch

    meta = {p.key: p.value for p in onnx.load(str(exported)).metadata_props}
    assert meta["xbackend.source"] == "torch"
    assert meta["xbackend.torch.module"] == SPEC  # outside the model's directory: stored absolute
    assert meta["xbackend.torch.version"] == torch.__version__
    assert json.loads(meta["xbackend.torch.inputs"]) == [
        {"name": "x", "shape": [1, 16, 64], "dtype": "float32"}
    ]
    mapped = json.loads(meta["xbackend.torch.module_outputs"])
    # Every LayerNorm, Linear and SiLU of the 6 blocks, and each block's residual sum (less the last,
    # whose output is the final LayerNorm's input and also 'blocks'): verified numerically at export.
    assert mapped["blocks.0.ln"] == "layer_norm" and mapped["blocks.0.fc1"] == "linear"
    assert len(mapped) == 30


def test_export_past_the_proto_limit_keeps_weights_external(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Weights past 2 GiB: torch saves them as external data; the export moves that file beside
    the output by rename and never serializes the weights into one proto. The size at which torch
    switches is lowered here so that a small module takes the same path."""
    import torch.onnx._internal.exporter._onnx_program as program

    from xbackend.export.torch_onnx import InputDecl, export_torch

    monkeypatch.setattr(program, "_LARGE_MODEL_THRESHOLD", 0)
    out = tmp_path / "big" / "mlp.onnx"
    export_torch(SPEC, [InputDecl.parse("x=1,16,64")], out, output_names=["y"])
    assert sorted(p.name for p in out.parent.iterdir()) == [
        ".xbackend-files.json",
        "mlp.onnx",
        "mlp.onnx.data",
    ]
    proto = onnx.load(str(out), load_external_data=False)
    external = [t for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert len(external) == 18  # per block: both (transposed) weights and fc1's bias; the rest stays inline
    assert {e.value for t in external for e in t.external_data if e.key == "location"} == {"mlp.onnx.data"}
    assert out.stat().st_size < 100_000
    meta = {p.key: p.value for p in proto.metadata_props}
    assert len(json.loads(meta["xbackend.torch.module_outputs"])) == 30  # verified as the inline export
    r = xbackend.compare(out, backends=["ort-cpu", "reference"], runs=1)
    assert r.backend("ort-cpu").ok and r.backend("reference").ok


def test_bundled_model_runs_on_every_cpu_engine() -> None:
    r = xbackend.compare(
        ROOT / "models" / "torch_mlp.onnx",
        backends=["ort-cpu", "openvino-cpu", "torch", "reference", "oracle"],
        runs=2,
        runner_options={"torch": {"trust_model_code": "true"}},
    )
    t = r.backend("torch")
    assert t.ok and t.deterministic
    assert dict(t.info)["module"] == "torch_mlp.py:build"  # stored relative to the model
    assert t.exposed == 31 and dict(t.info)["mapped_intermediates"] == "30"
    # at op grain: each aten call the export recorded (the module map has the same 30 here)
    assert dict(t.info)["grain"] == "op (30 aten calls mapped)"
    assert all(why == "no aten call of the module maps to this tensor" for _, why in t.not_exposed)
    cross = r.cross("torch")
    assert cross.first_divergence == "layer_norm"  # the first LayerNorm already differs from numpy's
    assert cross.scaled_ulp is not None and cross.scaled_ulp <= 8
    assert r.oracle("torch").scaled_ulp is not None
    assert r.exit_code == 0


def test_torch_module_option_for_a_model_without_metadata(exported: Path, tmp_path: Path) -> None:
    m = onnx.load(str(exported))
    del m.metadata_props[:]
    bare = tmp_path / "bare.onnx"
    onnx.save(m, str(bare))
    # the map and the reason, not the explanation or the probes
    r = xbackend.compare(
        bare, backends=["torch", "ort-cpu"], runs=1, reference="ort-cpu", noise_samples=0, probes="none"
    )
    assert r.backend("torch").status == "unavailable"
    assert "pass --torch-module" in r.backend("torch").reason
    r = xbackend.compare(
        bare,
        backends=["torch", "ort-cpu"],
        runs=1,
        reference="ort-cpu",
        runner_options={"torch": {"module": SPEC}},
        noise_samples=0,
        probes="none",
    )
    t = r.backend("torch")
    # no recorded map: the exporter's name scopes on the nodes map the module outputs instead
    info = dict(t.info)
    assert t.ok and info["mapped_from"] == "the exporter's name scopes (unverified)"
    assert int(info["mapped_intermediates"]) >= 24 and t.exposed == int(info["mapped_intermediates"]) + 1
    assert [d.name for d in r.cross("torch").output_tensors] == ["y"]
    ln = next(d for d in r.cross("torch").tensors if d.name == "layer_norm")
    assert ln.scaled_ulp is not None and ln.scaled_ulp < 16  # the mapped tensor is the module's output


CONV_BN = """
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.relu = torch.nn.ReLU()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(self.relu(self.bn1(self.conv1(x))).mean((2, 3)))


def make():
    torch.manual_seed(0)
    net = Net().eval()
    net.bn1.running_mean.uniform_(-1, 1)
    net.bn1.running_var.uniform_(0.5, 2)
    return net
"""


def test_plain_dynamo_export_fused_labels_and_torch_map(tmp_path: Path) -> None:
    """A model from a plain torch.onnx.export(dynamo=True): the Conv that absorbed the BatchNorm
    is labelled conv1+bn1, and --torch-module maps the torch intermediates by name scope."""
    import sys

    import torch

    (tmp_path / "convbn.py").write_text(CONV_BN)
    sys.path.insert(0, str(tmp_path))
    try:
        import convbn  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp_path))
    path = tmp_path / "convbn.onnx"
    torch.onnx.export(convbn.make(), (torch.randn(2, 3, 16, 16),), str(path), dynamo=True, input_names=["x"])
    spec, _ = xbackend.load_model(path)
    conv = next(t for t in spec.tensors if t.op_type == "Conv")
    assert conv.module == "conv1+bn1"  # fused by the exporter's optimizer (FuseBatchNormIntoConv)
    relu = next(t for t in spec.tensors if t.op_type == "Relu")
    assert relu.module == "relu"
    r = xbackend.compare(
        path,
        backends=["torch", "reference"],
        runs=1,
        runner_options={"torch": {"module": f"{tmp_path / 'convbn.py'}:make", "grain": "module"}},
    )
    t = r.cross("torch")
    compared = {d.name for d in t.tensors if d.comparable}
    assert {conv.name, relu.name} <= compared  # bn1's and relu's hooks map onto the ONNX tensors
    assert t.explained is True, r.verdict()


def test_cli_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.onnx"
    code = main(["export", "torch", SPEC, "--input", "x=2,16,64", "--dynamic", "x=0:batch", "-o", str(out)])
    assert code == 0, capsys.readouterr().err
    assert "30 module outputs mapped" in capsys.readouterr().out
    dims = onnx.load(str(out)).graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "batch" and dims[1].dim_value == 16


def test_bad_module_specs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from xbackend.export.torch_onnx import InputDecl, export_torch

    x = [InputDecl.parse("x=1,4")]
    with pytest.raises(ExportError, match=r"cannot import no_such_pkg\.mod"):
        export_torch("no_such_pkg.mod:build", x, tmp_path / "a.onnx")
    (tmp_path / "notmod.py").write_text("def build():\n    return 42\n")
    with pytest.raises(ExportError, match=r"returned int, expected a torch.nn.Module"):
        export_torch(f"{tmp_path / 'notmod.py'}:build", x, tmp_path / "a.onnx")
    with pytest.raises(ExportError, match="has no attribute 'nope'"):
        export_torch(f"{tmp_path / 'notmod.py'}:nope", x, tmp_path / "a.onnx")
    with pytest.raises(ExportError, match=r"must be path/to/file\.py:factory"):
        export_torch("just_a_name", x, tmp_path / "a.onnx")
    code = main(
        ["export", "torch", "no_such_pkg.mod:build", "--input", "x=1,4", "-o", str(tmp_path / "b.onnx")]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("xbackend: error: module spec")
    with pytest.raises(ExportError, match="--input expects NAME=D1,D2"):
        InputDecl.parse("1,2,3")


def test_module_map_applies_to_the_recorded_module_however_it_is_named(
    exported: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xbackend.execution.executor import separate_layers
    from xbackend.model.load import load_model
    from xbackend.model.torch_module import module_map
    from xbackend.runners.torch_compile import TorchCompileRunner

    spec, _ = load_model(exported)
    meta = dict(spec.metadata)
    monkeypatch.chdir(ROOT)
    # the recorded file, named relative to the working directory: still the recorded module
    assert len(module_map(meta, "models/torch_mlp.py:build", exported.parent)) == 30
    assert separate_layers(TorchCompileRunner, spec, {"module": "models/torch_mlp.py:build"})
    # a copy of it is another module as far as the map goes: no instrumented compile is planned
    copy = tmp_path / "copy.py"
    copy.write_text((ROOT / "models" / "torch_mlp.py").read_text("utf-8"))
    assert module_map(meta, f"{copy}:build", exported.parent) == {}
    assert not separate_layers(TorchCompileRunner, spec, {"module": f"{copy}:build"})
    options = {"module": f"{copy}:build", "grain": "module"}
    # at module grain torch keeps the recorded map by name (each module checked against the
    # reference's value), and says where it came from
    r = xbackend.compare(exported, backends=["torch"], runs=1, runner_options={"torch": options})
    t = r.backend("torch")
    assert t.ok and t.exposed == 31, t.reason
    assert {w for _, w in t.not_exposed} == {"no torch module output maps to this tensor"}
    assert dict(t.info)["mapped_from"].startswith("the recorded module's map, by name")
    # at op grain its aten calls are the model's, whatever file they come from
    r = xbackend.compare(
        exported, backends=["torch"], runs=1, runner_options={"torch": {"module": f"{copy}:build"}}
    )
    t = r.backend("torch")
    assert t.ok and t.exposed == 31 and dict(t.info)["grain"] == "op (30 aten calls mapped)", t.reason


def test_bfloat16_module_exports_maps_and_runs(tmp_path: Path) -> None:
    spec = f"{ROOT / 'tests' / 'half_chain.py'}:build_bf16"
    out = tmp_path / "bf16.onnx"
    from xbackend.export.torch_onnx import InputDecl, export_torch

    # ONNX Runtime has no bfloat16 Gemm on CPU: the map is verified with ONNX's reference evaluator
    res = export_torch(spec, [InputDecl.parse("x=32,64:bfloat16")], out, output_names=["y"])
    assert sorted(res.module_outputs) == ["act", "act2", "fc"]
    r = xbackend.compare(
        out, backends=["torch", "reference"], runs=1, reference="torch", probes="none",
        runner_options={"torch": {"module": spec, "grain": "module"}},
    )  # fmt: skip
    t = r.backend("torch")
    assert t.ok and t.exposed == 4, t.reason
    # the Linear's weight and bias, found among the model's bfloat16 initializers
    assert dict(t.info)["weights_checked"] == "2 of 2 non-constant float tensors found in the model"
    cross = r.cross("reference")
    assert [d.dtype for d in cross.output_tensors] == ["bfloat16"]
    # the reference evaluator's bfloat16 Gemm rounds differently from torch's: the first layer differs
    assert cross.first_divergence == "linear"


def test_export_ranges_reach_compare(tmp_path: Path) -> None:
    """--range at export is kept in the model (xbackend.input_ranges), and compare's generated
    ids come from it, not from the embedding's 50 rows."""
    from xbackend.export.torch_onnx import InputDecl, export_torch
    from xbackend.model.inputs import META_RANGES, generate_feeds
    from xbackend.model.load import load_model

    src = tmp_path / "emb.py"
    src.write_text(
        "import torch\n\n"
        "class E(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.emb = torch.nn.Embedding(50, 8)\n\n"
        "    def forward(self, ids):\n"
        "        return self.emb(ids).sum(-1)\n\n"
        "def build():\n"
        "    torch.manual_seed(0)\n"
        "    return E()\n"
    )
    out = tmp_path / "emb.onnx"
    export_torch(f"{src}:build", [InputDecl.parse("ids=2,6:int64")], out, ranges={"ids": (3.0, 5.0)})
    spec, _ = load_model(out)
    assert dict(spec.metadata)[META_RANGES] == '{"ids": [3.0, 5.0]}'
    feeds = generate_feeds(spec)
    assert set(np.unique(feeds.arrays["ids"])) == {3, 4}
    assert dict(feeds.made)["ids"] == "integers in [3, 5) (the range given at export, kept in the model)"
