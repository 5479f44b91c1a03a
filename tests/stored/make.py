"""Write tests/stored/*.json: JSON reports of real comparisons on this machine's engines, each
chosen for the findings it holds (gates, failures, probes, drift, decoding, decisions, candidates,
a vacuous comparison, nothing that ran). The unit tier reads them back (xbackend.report.from_json)
to test verdicts, ranking, folding, gating and rendering without running an engine.

    .venv/bin/python tests/stored/make.py        # a few minutes on 2 cores

A stored report is what a user's `--json` holds: the tests read it as a user's file."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import xbackend  # noqa: E402
from xbackend.report import to_json  # noqa: E402
from xbackend.results import Result  # noqa: E402


def _bundled(name: str) -> str:
    """A bundled model copied into the case's folder, named as a user would name it."""
    shutil.copy(ROOT / "models" / name, name)
    return name


@contextlib.contextmanager
def _test_runners(folder: Path) -> Iterator[None]:
    """The test suite's runners (tests/plugin_runners.py) registered as its conftest does."""
    from conftest import write_plugin_dist

    paths = [str(write_plugin_dist(folder / "plugins")), str(ROOT / "tests")]
    old = os.environ.get("PYTHONPATH", "")
    sys.path[:0] = paths
    os.environ["PYTHONPATH"] = os.pathsep.join([*paths, old] if old else paths)
    try:
        yield
    finally:
        os.environ["PYTHONPATH"] = old
        del sys.path[:2]


def _relu(folder: Path) -> Path:
    """y = Relu(x): fed negative inputs, every output is zero (a vacuous comparison)."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), "relu.onnx")
    return Path("relu.onnx")


def _classifier(folder: Path) -> Path:
    """logits = x @ W + b, ten classes, weights from a seed: --decisions reads its class axis."""
    rng = np.random.default_rng(0)
    weight = helper.make_tensor(
        "W", TensorProto.FLOAT, [64, 10], rng.standard_normal((64, 10)).astype(np.float32).ravel()
    )
    bias = helper.make_tensor("b", TensorProto.FLOAT, [10], rng.standard_normal(10).astype(np.float32))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["logits"])],
        "classifier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [32, 10])],
        initializer=[weight, bias],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), "classifier.onnx")
    return Path("classifier.onnx")


def gated(folder: Path) -> Result:
    """Gates that fire, a backend that cannot run here, the builds and threads probes."""
    return xbackend.compare(
        _bundled("torch_mlp.onnx"),
        backends=["ort-cpu", "reference", "openvino-cpu", "trt-pinned"],
        runs=2,
        builds=2,
        probes="builds,threads",
        probe_threads=2,
        fail_on="ulp>0,failure,probe-warning",
    )


def drifted(folder: Path) -> Result:
    """Against a baseline whose ort-cpu ran unoptimized: ort-cpu moved, the reference did not."""
    model = _bundled("mlp_layernorm.onnx")
    unoptimized = {"ort-cpu": {"opt_level": "disable"}}
    base = xbackend.compare(
        model, backends=["ort-cpu", "reference"], runs=1, probes="none", runner_options=unoptimized
    )
    Path("baseline.json").write_text(to_json(base), "utf-8")
    return xbackend.compare(
        model, backends=["ort-cpu", "reference"], runs=1, probes="none", baseline="baseline.json"
    )


def decoded(folder: Path) -> Result:
    """A causal LM decoded greedily on three engines: tokens compared step by step."""
    import decoder_lm

    decoder_lm.export("lm.onnx", "llama")
    return xbackend.compare(
        "lm.onnx", backends=["ort-cpu", "reference", "openvino-cpu"], runs=1, probes="none", decode=4
    )


def decided(folder: Path) -> Result:
    """Top-1 choices along a class axis, held against the reference's."""
    return xbackend.compare(
        _classifier(folder),
        backends=["ort-cpu", "reference", "openvino-cpu"],
        runs=1,
        probes="none",
        decisions="auto",
    )


def candidate(folder: Path) -> Result:
    """A float16 release candidate against its original (the quick table)."""
    import candidate_models

    original = _bundled("torch_mlp.onnx")
    candidate_models.fp16(Path(original), Path("torch_mlp-fp16.onnx"))
    return xbackend.compare(original, candidates=["torch_mlp-fp16.onnx"], probes="none", runs=1)


def vacuous(folder: Path) -> Result:
    """Every output zero: agreement proves little."""
    return xbackend.compare(_relu(folder), backends=["ort-cpu", "reference"], runs=1, ranges=["x=-2:-1"])


def nothing_ran(folder: Path) -> Result:
    """The one backend asked for cannot run here."""
    return xbackend.compare(_bundled("torch_mlp.onnx"), backends=["trt-pinned"], runs=1, probes="none")


def planted(folder: Path) -> Result:
    """Errors of known size at known nodes (the test suite's runners): 3 ULP on one Add (an
    origin), a build that alternates between two kernels (nondeterministic), and a threads
    probe on the reference's own evaluator."""
    model = _bundled("mlp_layernorm.onnx")
    with _test_runners(folder):
        return xbackend.compare(
            model,
            backends=["test-nudge", "test-flaky-build", "reference"],
            runs=2,
            builds=2,
            probes="threads",
            runner_options={
                "test-nudge": {"tensor": "block2.fc1.out", "ulps": "3"},
                "test-flaky-build": {"tensor": "y", "state_dir": str(folder)},
            },
        )


CASES: dict[str, Callable[[Path], Result]] = {
    "gated": gated,
    "drifted": drifted,
    "decoded": decoded,
    "decided": decided,
    "candidate": candidate,
    "vacuous": vacuous,
    "nothing-ran": nothing_ran,
    "planted": planted,
}


def main() -> None:
    asked = sys.argv[1:] or list(CASES)
    with tempfile.TemporaryDirectory() as tmp:
        for name in asked:
            folder = Path(tmp) / name
            folder.mkdir()
            os.chdir(folder)  # the models are named as a user in that folder names them
            result = CASES[name](folder)
            (HERE / f"{name}.json").write_text(to_json(result), "utf-8")
            print(f"{name}: exit {result.exit_code}, {len(result.findings())} finding(s)")
        os.chdir(ROOT)


if __name__ == "__main__":
    main()
