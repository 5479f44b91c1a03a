"""Runner instances (NAME@LABEL) and workers in another Python environment (python=PATH)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from roots import ROOT

from tests.cli_helpers import one_line_error, run
from tests.foreign_env import OLD_ORT, old_ort_python, venv
from xbackend import compare
from xbackend.errors import UsageError
from xbackend.host.environment import collect_environment

ISA = collect_environment()["cpu.isa"]
# Which layer first differs between two onnxruntime releases depends on the MLAS kernels the CPU
# selects; it was measured on this instruction set.
MEASURED_ISA = "sse4_1 sse4_2 avx avx2 fma f16c"
# The worker's import chain: what another interpreter (down to Python 3.8) must be able to run.
WORKER_MODULES = [
    "errors",
    "execution/__init__",
    "execution/worker",
    "execution/protocol",
    "execution/decoding",
    "execution/foreign_probe",
    "files/__init__",
    "files/run_values",
    "files/modelref",
    "files/storage",
    "files/untrusted",
    "files/userfile",
    "numerics/__init__",
    "numerics/metrics",
    "numerics/streamdiff",
    "numerics/spread",
    "numerics/values",
    "numerics/exactsum",
    "runners/__init__",
    "runners/base",
    "runners/buildinfo",
    "runners/registry",
    "runners/ort_cpu",
    "runners/ort_values",
    "runners/groq",
]


def test_instances_run_one_runner_under_two_settings(models: dict[str, Path], plugins: None) -> None:
    r = compare(
        models["scatter_add"],
        backends=["test-racy@1t", "test-racy@2t"],
        runner_options={"test-racy@1t": {"threads": "1"}, "test-racy@2t": {"threads": "2"}},
        runs=4,
        probes=["none"],
        outputs_only=True,
    )
    by = {b.name: b for b in r.backends}
    assert dict(by["test-racy@1t"].options)["threads"] == "1"
    assert dict(by["test-racy@2t"].options)["threads"] == "2"
    # the injected race runs at 2 threads: only the 1-thread instance is stable
    assert by["test-racy@1t"].deterministic is True
    assert by["test-racy@2t"].deterministic is False and by["test-racy@2t"].distinct_outputs == 4


def test_instance_errors_are_one_line(capsys: pytest.CaptureFixture[str], models: dict[str, Path]) -> None:
    code, _, err = run(capsys, "compare", str(models["mlp_layernorm"]), "--backends", "ort-cpu,ort-cpu")
    assert code == 2
    one_line_error(err, "list it again under a label, e.g. ort-cpu@other")
    code, _, err = run(capsys, "compare", str(models["mlp_layernorm"]), "--backends", "ort-cpu@a b")
    assert code == 2
    one_line_error(err, "a label after @ is letters, digits")
    code, _, err = run(
        capsys,
        "compare",
        str(models["mlp_layernorm"]),
        "--backends",
        "ort-cpu@x",
        "--set",
        "ort-cpu@y.threads=1",
    )
    assert code == 2
    one_line_error(err, "--set names backend(s) ort-cpu@y that are not in --backends")
    with pytest.raises(UsageError, match="ort-cpu has no option nope"):
        compare(models["mlp_layernorm"], backends=["ort-cpu@x"], runner_options={"ort-cpu@x": {"nope": "1"}})


def _module_level_imports(module: str) -> set[str]:
    """xbackend modules that `module` imports at module level (what a foreign worker loads)."""
    tree = ast.parse((ROOT / "xbackend" / f"{module}.py").read_text("utf-8"))
    out = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("xbackend"):
            base = node.module.removeprefix("xbackend").lstrip(".").replace(".", "/")
            for a in node.names:
                sub = f"{base}/{a.name}" if base else a.name
                out.add(sub if (ROOT / "xbackend" / f"{sub}.py").is_file() else base or "__init__")
    mods = {m if (ROOT / "xbackend" / f"{m}.py").is_file() else f"{m}/__init__" for m in out}
    # importing a module runs its packages' __init__ first
    return mods | {f"{m.rsplit('/', 1)[0]}/__init__" for m in mods if "/" in m and not m.endswith("__init__")}


def test_the_worker_module_list_is_whole() -> None:
    """Every module the worker's modules import at module level is on the list vermin checks."""
    todo, seen = ["execution/worker", "runners/ort_cpu", "runners/groq"], set()
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += sorted(_module_level_imports(m))
    assert sorted(seen - set(WORKER_MODULES)) == []


def test_worker_modules_run_under_python_3_8() -> None:
    """The modules another interpreter imports use nothing newer than Python 3.8."""
    files = [str(ROOT / "xbackend" / f"{m}.py") for m in WORKER_MODULES]
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "vermin"), "-t=3.8-", "--no-tips", "--violations", *files],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Minimum required versions: 3.8" in proc.stdout, proc.stdout


# Runner modules an interpreter without onnx cannot import: each reads the ONNX graph itself
# (docs/backends.md lists them). Every other runner needs only numpy and its engine.
NEED_ONNX = {
    "reference", "oracle", "torch_eager", "torch_compile", "torch_cuda", "executorch_rt",
    "executorch_dump",  # executorch_rt's per-operator reader
}  # fmt: skip


@pytest.mark.slow
def test_runners_under_another_interpreter_need_onnx_only_where_the_docs_say() -> None:
    """Under an interpreter holding numpy and onnxruntime alone (no onnx), each runner module
    from the staged worker package imports, or fails on its own engine; only the ones that read
    the ONNX graph themselves fail on onnx."""
    from xbackend.execution.foreign import worker_path

    old = old_ort_python()
    modules = sorted(p.stem for p in (ROOT / "xbackend" / "runners").glob("*.py") if p.stem != "__init__")
    code = (
        "import importlib, sys\n"
        "try:\n"
        "    importlib.import_module('xbackend.runners.' + sys.argv[1])\n"
        "except ImportError as e:\n"
        "    print(getattr(e, 'name', None) or str(e))\n"
    )
    env = {"PYTHONPATH": worker_path(), "PATH": "/usr/bin:/bin"}
    missing = {}
    for m in modules:  # each in a fresh process: what one module needs, not an import order
        proc = subprocess.run([str(old), "-c", code, m], capture_output=True, text=True, env=env, cwd="/")
        assert proc.returncode == 0, proc.stderr
        missing[m] = proc.stdout.strip()
    # ml_dtypes comes with onnx: which of the two a module asks for first is only import order
    assert {
        m for m, name in missing.items() if name in ("onnx", "ml_dtypes") and m != "tensorrt"
    } == NEED_ONNX
    assert missing["ort_cpu"] == "" and missing["ort_cuda"] == "" and missing["groq"] == ""
    assert missing["tensorrt"] == "ml_dtypes"  # its bfloat16 and float8 buffers; docs/backends.md says so
    page = " ".join((ROOT / "docs" / "backends.md").read_text("utf-8").split())
    assert (
        "need onnx as well: `reference`, `oracle`, `torch`, `torch-compile`, `torch-cuda`, `executorch`, "
        "`executorch-xnnpack`" in page
    )
    assert "`trt-autotune` and `trt-pinned` also need ml_dtypes" in page


@pytest.mark.slow
def test_two_onnxruntime_releases_layer_by_layer(models: dict[str, Path]) -> None:
    old = old_ort_python()
    model = ROOT / "models" / "torch_mlp.onnx"
    r = compare(
        model,
        backends=["ort-cpu", "ort-cpu@old"],
        runner_options={"ort-cpu@old": {"python": str(old)}},
        runs=2,
        probes=["none"],
    )
    by = {b.name: b for b in r.backends}
    new_info, old_info = dict(by["ort-cpu"].info), dict(by["ort-cpu@old"].info)
    assert by["ort-cpu@old"].ok, by["ort-cpu@old"].reason
    # the worker really ran there: the engine reports its own version
    assert old_info["onnxruntime"] == OLD_ORT
    assert new_info["onnxruntime"] == "1.31.1"
    assert old_info["interpreter.package.onnxruntime"] == OLD_ORT
    assert old_info["interpreter"] == str(old)
    assert old_info["interpreter.python"].startswith("3.")
    assert "interpreter" not in new_info
    x = r.cross("ort-cpu@old")
    assert x.status == "ok"
    # every layer compared (49 ONNX tensors of the 4-block MLP), not only the outputs
    assert len(x.tensors) == len(by["ort-cpu"].layer_digests) > 40
    if ISA == MEASURED_ISA:
        assert not x.bitwise_equal
        assert x.first_divergence == "layer_norm"
        assert x.scaled_ulp == 4.0
    # each release is deterministic with itself
    assert by["ort-cpu"].deterministic and by["ort-cpu@old"].deterministic


@pytest.mark.slow
def test_foreign_engine_gets_a_model_it_can_read(models: dict[str, Path], tmp_path: Path) -> None:
    """IR 13 (onnxruntime 1.31's limit) is lowered in this process to 1.20's IR 10; the worker there
    has no onnx package to do it."""
    import onnx

    proto = onnx.load(models["mlp_layernorm"])
    proto.ir_version = 13
    path = tmp_path / "ir13.onnx"
    onnx.save(proto, path)
    r = compare(
        path,
        backends=["ort-cpu", "ort-cpu@old"],
        runner_options={"ort-cpu@old": {"python": str(old_ort_python())}},
        runs=1,
        probes=["none"],
    )
    by = {b.name: b for b in r.backends}
    assert by["ort-cpu@old"].ok, by["ort-cpu@old"].reason
    assert any("ort-cpu@old: model IR version 13 was downgraded to 10" in n for n in r.notes)
    assert "ort-cpu: model IR version" not in " ".join(r.notes)


@pytest.mark.slow
def test_unusable_interpreters_are_reported_and_the_rest_runs(
    models: dict[str, Path], tmp_path: Path
) -> None:
    bare = venv("bare")  # pip, and no numpy (made once, cached between runs)
    r = compare(
        models["mlp_layernorm"],
        backends=["ort-cpu", "ort-cpu@gone", "ort-cpu@bare"],
        runner_options={
            "ort-cpu@gone": {"python": str(tmp_path / "nope" / "python")},
            "ort-cpu@bare": {"python": str(bare)},
        },
        runs=1,
        probes=["none"],
    )
    by = {b.name: b for b in r.backends}
    assert by["ort-cpu"].ok
    assert by["ort-cpu@gone"].status == "unavailable"
    assert "no such interpreter; give the path of a Python" in by["ort-cpu@gone"].reason
    assert by["ort-cpu@bare"].status == "unavailable"
    assert f"numpy is not installed there ({bare} -m pip install numpy)" in by["ort-cpu@bare"].reason
    # the suggestion works: a bare environment that ran it (made once, cached between runs)
    fixed = venv("bare-then-numpy", "numpy")
    from xbackend.execution.foreign import probe_interpreter

    probe_interpreter.cache_clear()
    it = probe_interpreter(str(fixed), "xbackend.runners.ort_cpu:OrtCpuRunner")
    assert it.numpy and not it.available
    assert f"onnxruntime not installed ({fixed} -m pip install onnxruntime)" in it.reason
