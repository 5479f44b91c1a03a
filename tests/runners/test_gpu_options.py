"""What the GPU backends decide without a GPU: option translation, TensorRT's builder-config
calls, inspector JSON, timing-cache keys, the pin decision, availability reasons, and the
probes' choice of backends. The same runners on a GPU are in test_gpu.py."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from roots import ROOT

from xbackend.errors import BackendUnavailableError, RunnerFailedError
from xbackend.host import gpu
from xbackend.planning.context import PlannedBackend
from xbackend.probes.tf32 import on_gpu_with_tf32
from xbackend.runners import get_runner
from xbackend.runners.ort_cuda import OrtCudaRunner, cuda_provider_options
from xbackend.runners.ort_trt import trt_provider_options
from xbackend.runners.tensorrt import (
    ConfigCall,
    apply_calls,
    capture_method,
    config_calls,
    default_cache_path,
    format_timing_key,
    parse_engine_json,
    parse_layer,
    parse_timing_key,
    parse_version,
    pin_mode,
)
from xbackend.runners.tensorrt_plan import layer_nodes, runtime_layers

TRT = {"tf32": False, "opt_level": 3, "workspace_mb": 0}


# --- ONNX Runtime CUDA and TensorRT providers ------------------------------------------------


@pytest.mark.parametrize(
    ("autotune", "search"), [("on", "EXHAUSTIVE"), ("off", "HEURISTIC"), ("pinned", "DEFAULT")]
)
def test_cuda_provider_options_map_autotune_to_cudnn_search(autotune: str, search: str) -> None:
    opts = OrtCudaRunner.resolve_options({"autotune": autotune})
    assert cuda_provider_options(opts) == {
        "device_id": "0",
        "cudnn_conv_algo_search": search,
        "use_tf32": "0",
    }


def test_cuda_provider_options_default_is_ort_default_search_with_tf32_off() -> None:
    opts = OrtCudaRunner.resolve_options({})
    assert opts["autotune"] == "on" and opts["tf32"] is False
    tf32 = cuda_provider_options(OrtCudaRunner.resolve_options({"tf32": "true", "device_id": "1"}))
    assert tf32 == {"device_id": "1", "cudnn_conv_algo_search": "EXHAUSTIVE", "use_tf32": "1"}


def test_ort_cuda_refuses_a_session_that_fell_back_to_the_cpu() -> None:
    runner = OrtCudaRunner()
    session = SimpleNamespace(get_providers=lambda: ["CPUExecutionProvider"])
    with pytest.raises(RunnerFailedError, match="could not start CUDAExecutionProvider and fell back to CPU"):
        runner._check_provider(session)
    ok = SimpleNamespace(
        get_providers=lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"],
        get_provider_options=lambda: {
            "CUDAExecutionProvider": {"use_tf32": "0", "cudnn_conv_algo_search": "HEURISTIC"}
        },
    )
    runner._check_provider(ok)
    info = runner.info()
    assert info["in_force.use_tf32"] == "0" and info["in_force.cudnn_conv_algo_search"] == "HEURISTIC"


def test_trt_provider_options_map_autotune_to_caches_and_level() -> None:
    cls = get_runner("ort-trt")
    on = trt_provider_options({**cls.resolve_options({}), "opt_level": 3}, "")
    assert on["trt_timing_cache_enable"] == "False" and on["trt_engine_cache_enable"] == "False"
    assert on["trt_builder_optimization_level"] == "3" and on["trt_fp16_enable"] == "False"
    off = trt_provider_options({**cls.resolve_options({"autotune": "off"}), "opt_level": 3}, "")
    assert off["trt_builder_optimization_level"] == "0"
    pinned = trt_provider_options({**cls.resolve_options({"autotune": "pinned"}), "opt_level": 3}, "/c")
    assert pinned["trt_timing_cache_enable"] == pinned["trt_engine_cache_enable"] == "True"
    assert pinned["trt_timing_cache_path"] == pinned["trt_engine_cache_path"] == "/c"


# --- TensorRT builder config -------------------------------------------------------------------


def test_config_calls_clear_tf32_and_ask_for_detailed_profiling() -> None:
    calls = [str(c) for c in config_calls(TRT, "fresh", (10, 13))]
    assert calls == ["profiling_verbosity=DETAILED", "builder_optimization_level=3", "clear_flag(TF32)"]
    assert "set_flag(TF32)" in [str(c) for c in config_calls({**TRT, "tf32": True}, "fresh", (11, 1))]


def test_config_calls_for_recording_and_replaying_a_pin() -> None:
    record = [str(c) for c in config_calls(TRT, "record", (10, 8))]
    assert record[-1] == "set_flag(EDITABLE_TIMING_CACHE)"
    replay = [str(c) for c in config_calls(TRT, "replay", (11, 0))]
    assert replay[-2:] == ["set_flag(EDITABLE_TIMING_CACHE)", "set_flag(ERROR_ON_TIMING_CACHE_MISS)"]
    # before 10.8 there is no editable timing cache; error-on-miss still applies
    old = [str(c) for c in config_calls(TRT, "replay", (10, 7))]
    assert "set_flag(EDITABLE_TIMING_CACHE)" not in old and old[-1] == "set_flag(ERROR_ON_TIMING_CACHE_MISS)"
    assert [str(c) for c in config_calls({**TRT, "workspace_mb": 2}, "fresh", (10, 0))][-1] == (
        f"workspace_bytes={2 << 20}"
    )
    with pytest.raises(RunnerFailedError, match="0 to 5"):
        config_calls({**TRT, "opt_level": 6}, "fresh", (10, 0))


class _Config:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.profiling_verbosity: Any = None
        self.builder_optimization_level = 3

    def set_flag(self, flag: Any) -> None:
        self.calls.append(("set_flag", flag))

    def clear_flag(self, flag: Any) -> None:
        self.calls.append(("clear_flag", flag))

    def set_memory_pool_limit(self, pool: Any, size: int) -> None:
        self.calls.append(("pool", (pool, size)))


def _fake_trt(flags: list[str]) -> Any:
    # enum values as strings: apply_calls must look them up by name, never by number
    return SimpleNamespace(
        __version__="11.1.0",
        BuilderFlag=SimpleNamespace(**{f: f"BuilderFlag.{f}" for f in flags}),
        ProfilingVerbosity=SimpleNamespace(DETAILED="ProfilingVerbosity.DETAILED"),
        MemoryPoolType=SimpleNamespace(WORKSPACE="MemoryPoolType.WORKSPACE"),
    )


def test_apply_calls_sets_flags_by_name_on_the_builder_config() -> None:
    config = _Config()
    trt = _fake_trt(["TF32", "EDITABLE_TIMING_CACHE", "ERROR_ON_TIMING_CACHE_MISS"])
    apply_calls(config, trt, config_calls({**TRT, "opt_level": 0, "workspace_mb": 1}, "replay", (11, 1)))
    assert config.profiling_verbosity == "ProfilingVerbosity.DETAILED"
    assert config.builder_optimization_level == 0
    assert config.calls == [
        ("clear_flag", "BuilderFlag.TF32"),
        ("pool", ("MemoryPoolType.WORKSPACE", 1 << 20)),
        ("set_flag", "BuilderFlag.EDITABLE_TIMING_CACHE"),
        ("set_flag", "BuilderFlag.ERROR_ON_TIMING_CACHE_MISS"),
    ]


def test_apply_calls_names_a_flag_this_tensorrt_lacks() -> None:
    with pytest.raises(
        BackendUnavailableError, match=r"TensorRT 11.1.0 has no BuilderFlag.EDITABLE_TIMING_CACHE"
    ):
        apply_calls(_Config(), _fake_trt(["TF32"]), [ConfigCall("set_flag", "EDITABLE_TIMING_CACHE")])


# --- engine inspector and timing cache ----------------------------------------------------------

# Written to the documented format of IEngineInspector.get_engine_information(JSON) with
# ProfilingVerbosity.DETAILED: TensorRT 10 lists I/O under "Bindings", 11 under "I/O Tensors".
TRT10_JSON = json.dumps(
    {
        "Layers": [
            {
                "Name": "/conv1/Conv + /relu1/Relu",
                "LayerType": "CaskConvolution",
                "Inputs": [
                    {
                        "Name": "image",
                        "Dimensions": [8, 3, 32, 32],
                        "Format/Datatype": "Row major linear FP32",
                    }
                ],
                "Outputs": [{"Name": "relu1", "Dimensions": [8, 16, 32, 32]}],
                "TacticName": "sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nchw",
                "TacticValue": "0x4d7f1e8f2c0a0b11",
            },
            {
                "Name": "/pool/GlobalAveragePool",
                "LayerType": "CaskPooling",
                "TacticValue": "0x0000000000000001",
            },
            {"Name": "reformat", "LayerType": "Reformat"},
        ],
        "Bindings": ["image", "logits"],
    }
)
TRT11_JSON = json.dumps(
    {"Layers": ["/conv1/Conv", "/fc/Gemm"], "I/O Tensors": [{"Name": "image"}, {"Name": "logits"}]}
)


def test_parse_engine_json_reads_layer_tactics_and_io_in_both_layouts() -> None:
    layers, io = parse_engine_json(TRT10_JSON)
    assert io == ["image", "logits"]
    assert [(x.name, x.type, x.tactic) for x in layers] == [
        ("/conv1/Conv + /relu1/Relu", "CaskConvolution",
         "sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nchw"),
        ("/pool/GlobalAveragePool", "CaskPooling", "0x0000000000000001"),
        ("reformat", "Reformat", ""),
    ]  # fmt: skip
    layers, io = parse_engine_json(TRT11_JSON)
    assert io == ["image", "logits"] and [x.name for x in layers] == ["/conv1/Conv", "/fc/Gemm"]
    assert layers[0].tactic == ""  # names only: the engine was not built with detailed profiling


def test_parse_engine_json_rejects_what_is_not_inspector_output() -> None:
    with pytest.raises(ValueError, match="does not parse"):
        parse_engine_json("{Layers:")
    with pytest.raises(ValueError, match="not an engine-inspector layer"):
        parse_layer({"LayerType": "Reformat"})


def test_engine_layer_names_give_the_onnx_nodes_each_layer_computes() -> None:
    """TensorRT's layer names as its inspector writes them (NVIDIA/TensorRT#2525: "+" vertical,
    "||" horizontal fusion, PWN a pointwise kernel; Myelin regions as ForeignNode ranges)."""
    assert layer_nodes("/conv1/Conv + /relu1/Relu") == (("/conv1/Conv", "/relu1/Relu"), False)
    assert layer_nodes("Conv_68 || Conv_72") == (("Conv_68", "Conv_72"), False)
    assert layer_nodes("Conv_531 + PWN(LeakyRelu_532)") == (("Conv_531", "LeakyRelu_532"), False)
    assert layer_nodes("PWN(PWN(/act/Sigmoid, /act/Mul), /mul)") == (
        ("/act/Sigmoid", "/act/Mul", "/mul"),
        False,
    )
    assert layer_nodes("{ForeignNode[/attn/MatMul.../attn/MatMul_1]}") == (
        ("/attn/MatMul", "/attn/MatMul_1"),
        True,
    )
    assert layer_nodes("Reformatting CopyNode for Input Tensor 0 to /fc/Gemm") == ((), False)
    layers, _ = parse_engine_json(TRT10_JSON)
    assert runtime_layers(layers) == [
        {
            "name": "/conv1/Conv + /relu1/Relu",
            "type": "CaskConvolution",
            "original": ["/conv1/Conv", "/relu1/Relu"],
            "range": False,
        },
        {
            "name": "/pool/GlobalAveragePool",
            "type": "CaskPooling",
            "original": ["/pool/GlobalAveragePool"],
            "range": False,
        },
    ]  # fmt: skip  (the Reformat layer computes no node)


def test_timing_cache_keys_round_trip_in_their_string_form() -> None:
    text = "0x00112233445566778899aabbccddeeff"
    key = parse_timing_key(text)
    assert key == bytes(range(0, 256, 17)) and format_timing_key(key) == text
    assert parse_timing_key("  0xFFEEDDCCBBAA99887766554433221100\n") == bytes.fromhex(
        "ffeeddccbbaa99887766554433221100"
    )
    for bad in ("00112233445566778899aabbccddeeff", "0x0011", "0xzz112233445566778899aabbccddeeff"):
        with pytest.raises(ValueError, match="32 hex digits"):
            parse_timing_key(bad)
    with pytest.raises(ValueError, match="16 bytes"):
        format_timing_key(b"\x00" * 15)


def test_pin_mode_records_once_then_replays() -> None:
    assert pin_mode(False, "", False) == "fresh"
    assert pin_mode(False, "/x", True) == "fresh"  # trt-autotune never reads a cache
    assert pin_mode(True, "/x", False) == "record"
    assert pin_mode(True, "/x", True) == "replay"
    with pytest.raises(BackendUnavailableError, match=r"--set trt-pinned\.cache=FILE"):
        pin_mode(True, "", False)


def test_capture_method_prefers_unfused_debug_tensors_where_supported() -> None:
    assert capture_method("auto", (10, 12), True) == "debug"
    assert capture_method("auto", (11, 1), True) == "debug"
    assert capture_method("auto", (10, 9), True) == "outputs"  # 10.9: the listener is never called
    assert capture_method("auto", (10, 13), False) == "outputs"
    assert capture_method("outputs", (11, 1), True) == "outputs"
    with pytest.raises(BackendUnavailableError, match=r"10\.12"):
        capture_method("debug", (10, 9), False)


def test_default_cache_path_is_per_model_version_and_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", "/cache")
    path = default_cache_path("ab" * 32, "10.13.3.9", "NVIDIA H100 80GB HBM3 (sm_90)")
    assert (
        path
        == "/cache/xbackend/tensorrt/abababababababab-trt10.13.3.9-NVIDIA-H100-80GB-HBM3-sm-90.timing-cache"
    )
    assert parse_version("10.13.3.9") == (10, 13) and parse_version("11.1.0") == (11, 1)


# --- torch on CUDA -----------------------------------------------------------------------------


def test_torch_cuda_switches_and_their_read_back() -> None:
    pytest.importorskip("torch")
    import torch

    from xbackend.runners.torch_cuda import TorchCudaRunner, apply_switches, cuda_switches, read_switches

    opts = TorchCudaRunner.resolve_options({})
    assert cuda_switches(opts) == [
        ("cuda.matmul.allow_tf32", False),
        ("cudnn.allow_tf32", False),  # PyTorch's own default is True
        ("cudnn.benchmark", False),
        ("cudnn.deterministic", False),
    ]
    pinned = cuda_switches(TorchCudaRunner.resolve_options({"autotune": "pinned", "tf32": "true"}))
    assert dict(pinned) == {
        "cuda.matmul.allow_tf32": True,
        "cudnn.allow_tf32": True,
        "cudnn.benchmark": False,
        "cudnn.deterministic": True,
    }
    saved = read_switches(pinned)
    try:
        apply_switches(pinned)
        assert read_switches(pinned) == {f"torch.backends.{k}": str(v) for k, v in pinned}
        assert torch.backends.cudnn.deterministic is True
    finally:
        apply_switches([(k.removeprefix("torch.backends."), v == "True") for k, v in saved.items()])
    assert TorchCudaRunner.process_env(TorchCudaRunner.resolve_options({"deterministic": "true"})) == {
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8"
    }


# --- availability, environment, probes -----------------------------------------------------------


def test_no_driver_is_named_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    real = ctypes.CDLL

    def cdll(name: str, *a: Any, **k: Any) -> Any:
        if "nvidia-ml" in str(name):
            raise OSError(f"{name}: cannot open shared object file")
        return real(name, *a, **k)

    gpu.driver_info.cache_clear()
    monkeypatch.setattr(ctypes, "CDLL", cdll)
    try:
        info = gpu.driver_info()
        assert info.devices == () and info.problem.startswith(
            "no NVIDIA driver here (libnvidia-ml.so.1 not found)"
        )
        assert gpu.gpu_environment() == {}
        for name in ("ort-cuda", "ort-trt", "torch-cuda", "trt-autotune", "trt-pinned"):
            avail = get_runner(name).availability()
            assert not avail.available and "no NVIDIA driver here" in avail.reason, name
    finally:
        gpu.driver_info.cache_clear()


def test_cpu_onnxruntime_is_named_with_a_working_install_command() -> None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider")
    reason = gpu.ort_gpu_problem("CUDAExecutionProvider")
    assert reason == (
        f"the installed onnxruntime {ort.__version__} is a CPU build without CUDAExecutionProvider "
        "(pip uninstall -y onnxruntime onnxruntime-gpu && pip install 'onnxruntime-gpu[cuda,cudnn]==1.31.1')"
    )


def test_backends_lists_gpu_backends_as_unavailable_with_reasons() -> None:
    if not gpu.cuda_problem():
        pytest.skip("a GPU is here")
    out = subprocess.run(
        [sys.executable, "-m", "xbackend", "backends"], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    for name in ("ort-cuda", "ort-trt", "torch-cuda", "trt-autotune", "trt-pinned"):
        line = next(x for x in out.splitlines() if x.startswith(name + " "))
        assert "unavailable:" in line and "no NVIDIA driver here" in line, line


def test_compare_goes_on_without_the_gpu_backends(models: dict[str, Path], tmp_path: Path) -> None:
    if not gpu.cuda_problem():
        pytest.skip("a GPU is here")
    report = tmp_path / "r.md"
    proc = subprocess.run(
        [sys.executable, "-m", "xbackend", "compare", str(models["mlp_layernorm"]), "--backends",
         "ort-cpu,ort-cuda,trt-pinned", "--runs", "2", "--no-progress", "--report", str(report)],
        capture_output=True, text=True, encoding="utf-8", cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    text = report.read_text(encoding="utf-8")
    assert "| ort-cpu | ok | yes |" in text
    assert (
        "| ort-cuda | **unavailable**: " in text
        and "| trt-pinned (promises build-to-build) | **unavailable**: TensorRT is not installed" in text
    )


def _planned(name: str, **raw: str) -> PlannedBackend:
    cls = get_runner(name)
    return PlannedBackend(name, cls, cls.resolve_options(raw), raw)


def test_tf32_probe_takes_gpu_backends_only() -> None:
    assert on_gpu_with_tf32(_planned("ort-cuda"))
    assert on_gpu_with_tf32(_planned("trt-autotune"))
    assert on_gpu_with_tf32(_planned("torch-cuda"))
    assert on_gpu_with_tf32(_planned("torch-compile", device="cuda"))
    assert not on_gpu_with_tf32(_planned("torch-compile"))  # device=cpu: TF32 does not exist there
    assert not on_gpu_with_tf32(_planned("ort-cpu"))


def test_autotune_families_of_the_gpu_backends() -> None:
    assert get_runner("ort-cuda").autotune_family("/w/p.json") == {
        "off": ("ort-cuda", {"autotune": "off"}),
        "on": ("ort-cuda", {"autotune": "on"}),
        "pinned": ("ort-cuda", {"autotune": "pinned"}),
    }
    assert get_runner("trt-autotune").autotune_family("/w/p.json") == {
        "off": ("trt-autotune", {"opt_level": "0"}),
        "on": ("trt-autotune", {}),
        "pinned": ("trt-pinned", {"cache": "/w/p.timing-cache"}),
    }
    assert get_runner("ort-trt").autotune_family("/w/p.json")["pinned"] == (
        "ort-trt",
        {"autotune": "pinned", "cache": "/w/p-ort-trt"},
    )
    assert set(get_runner("torch-cuda").autotune_family("")) == {"off", "on", "pinned"}


def test_inductor_switches_are_feature_detected() -> None:
    """torch 2.11 (the GPU hosts' image) has no torch._inductor.config.batch_invariant: setting it
    unasked made every torch-compile build fail there (measured on an H100). Unasked, a missing
    switch is left alone; asked, the build is unavailable and says why."""
    import types

    from xbackend.errors import BackendUnavailableError
    from xbackend.runners.torch_compile import set_switches

    old = types.SimpleNamespace(deterministic=False)
    set_switches(old, {"deterministic": True, "batch_invariant": False}, "2.11.0")
    assert old.deterministic is True and not hasattr(old, "batch_invariant")
    with pytest.raises(
        BackendUnavailableError,
        match=r"unavailable in torch 2.11.0: it has no torch._inductor.config.batch_invariant",
    ):
        set_switches(old, {"batch_invariant": True}, "2.11.0")
    new = types.SimpleNamespace(deterministic=False, batch_invariant=True)
    set_switches(new, {"deterministic": False, "batch_invariant": False}, "2.13.0")
    assert new.batch_invariant is False
