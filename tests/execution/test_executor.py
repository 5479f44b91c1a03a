"""A crashed worker's reason says what its runner knows to try (Runner.crash_hint)."""

from __future__ import annotations

from pathlib import Path

import pytest

from xbackend.execution import executor
from xbackend.execution.executor import Job
from xbackend.execution.isolation import WorkerOutcome
from xbackend.runners import llama_cpp
from xbackend.runners.llama_cpp import LlamaCppRunner
from xbackend.runners.ort_cpu import OrtCpuRunner

pytestmark = pytest.mark.unit  # the unit tier: make check

CRASH = "crashed with SIGSEGV"
SAID = "this CPU has AMX, whose llama.cpp kernels of quantized weights can crash"


def _job(cls: type, backend: str = "", **options: str) -> Job:
    return Job("main", backend or cls.name, cls, tuple(sorted(options.items())), Path("feeds.xbv"))


@pytest.mark.parametrize("amx", [True, False])
def test_a_crash_of_llama_cpp_with_its_extra_buffers_names_the_knob_on_an_amx_cpu(
    monkeypatch: pytest.MonkeyPatch, amx: bool
) -> None:
    flags = {"avx512f", "amx_int8"} if amx else {"avx512f"}
    monkeypatch.setattr(llama_cpp, "cpu_flags", lambda: frozenset(flags))
    crashed = WorkerOutcome("failed", CRASH, signal=11)
    reason = executor._with_hint(_job(LlamaCppRunner), crashed).reason
    said = f"{CRASH}; {SAID}: --set llama.cpp.extra_buffers=false runs its plain CPU kernels"
    assert reason == (said if amx else CRASH)
    # a label of the backend: the --set names the label, whose options are its own
    labelled = executor._with_hint(_job(LlamaCppRunner, "llama.cpp@token"), crashed).reason
    said = f"{CRASH}; {SAID}: --set llama.cpp@token.extra_buffers=false runs its plain CPU kernels"
    assert labelled == (said if amx else CRASH)
    # the knob already off, another backend, or a worker that exited: the reason as it was
    off = _job(LlamaCppRunner, extra_buffers="false")
    assert executor._with_hint(off, crashed).reason == CRASH
    assert executor._with_hint(_job(OrtCpuRunner), crashed).reason == CRASH
    exited = WorkerOutcome("failed", "worker exited with code 1")
    assert executor._with_hint(_job(LlamaCppRunner), exited).reason == "worker exited with code 1"


def test_a_signal_is_recorded_only_for_a_worker_a_signal_ended(tmp_path: Path) -> None:
    from xbackend.execution.isolation import _outcome

    missing = tmp_path / "result.json"
    assert _outcome(-11, missing, tmp_path / "err", 0.1).signal == 11
    assert _outcome(3, missing, tmp_path / "err", 0.1).signal == 0
