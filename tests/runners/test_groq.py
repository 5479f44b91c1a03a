"""The groq runner against a stand-in that honours GroqFlow's documented API (no LPU here)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.cli_helpers import run
from tests.foreign_env import STANDIN, groq_standin_python, old_ort_python
from xbackend import compare
from xbackend.execution.foreign import probe_interpreter
from xbackend.runners.groq import GroqRunner, build_items


@pytest.fixture
def sdk(monkeypatch: pytest.MonkeyPatch) -> Path:
    """GroqFlow's interpreter in XBACKEND_GROQ_PYTHON; the stand-in groq-compiler and lspci (one
    GroqCard) on PATH."""
    python = groq_standin_python()
    monkeypatch.setenv("XBACKEND_GROQ_PYTHON", str(python))
    monkeypatch.setenv("PATH", f"{STANDIN / 'bin'}{os.pathsep}{os.environ['PATH']}")
    probe_interpreter.cache_clear()
    return python


def test_groq_options_and_precision_are_explicit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(STANDIN))  # fp32 builds a sequence from GroqFlow's stages
    opts = GroqRunner.resolve_options({})
    assert opts["precision"] == "fp16"  # GroqFlow's default, said out loud
    r = GroqRunner({"precision": "fp32", "compiler_flags": "--large-program --no-multichip-pipelining"})
    kw = r._groqit_kwargs("b", "/tmp/c")
    stages = [type(s).__name__ for s in kw["sequence"].stages]
    assert stages == ["OnnxLoad", "CheckOnnxCompatibility", "CompileOnnx", "Assemble"]  # no ConvertOnnxToFp16
    assert "sequence" not in GroqRunner({})._groqit_kwargs("b", "/c")  # fp16: GroqFlow's own sequence
    assert kw["compiler_flags"] == ["--large-program", "--no-multichip-pipelining"]
    assert kw["rebuild"] == "always" and kw["cache_dir"] == "/tmp/c" and "num_chips" not in kw
    assert GroqRunner({"num_chips": "2"})._groqit_kwargs("b", "/c")["num_chips"] == 2
    assert GroqRunner.promises == {"run-to-run", "build-to-build"}


def test_build_fingerprint_ignores_state_and_logs(tmp_path: Path) -> None:
    (tmp_path / "compile").mkdir()
    (tmp_path / "compile" / "program.iop").write_bytes(b"\x01\x02")
    (tmp_path / "b_state.yaml").write_text("build_time: 1\n")
    (tmp_path / "log_compile.txt").write_text("ok\n")
    items = build_items(tmp_path)
    assert [k for k, _ in items] == ["compile/program.iop"]
    assert items[0][1] == "a12871fee210fb8619291eaea194581cbd2531e4b23759d225f6806923f63222"


def test_backends_says_what_is_missing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("XBACKEND_GROQ_PYTHON", raising=False)
    for m in [m for m in sys.modules if m.split(".")[0] in ("groqflow", "onnxflow", "groq")]:
        monkeypatch.delitem(sys.modules, m)  # the stand-in, if another test imported it here
    code, out, _ = run(capsys, "backends")
    line = next(ln for ln in out.splitlines() if ln.startswith("groq "))
    assert code == 0
    assert "unavailable: groqflow is not installed in this interpreter" in line
    assert "point python= or XBACKEND_GROQ_PYTHON at its interpreter" in line
    assert "groq-devtools is missing (no groq-compiler" in line
    assert "groq-runtime is missing" in line
    # an interpreter without GroqFlow, named by the environment variable: asked, not guessed
    monkeypatch.setenv("XBACKEND_GROQ_PYTHON", str(old_ort_python()))
    probe_interpreter.cache_clear()
    code, out, _ = run(capsys, "backends")
    line = next(ln for ln in out.splitlines() if ln.startswith("groq "))
    assert f"unavailable: python={old_ort_python()}" in line and "groqflow is not installed" in line


@pytest.mark.slow
def test_groq_through_groqflow_api(
    sdk: Path, capsys: pytest.CaptureFixture[str], models: dict[str, Path]
) -> None:
    _, out, _ = run(capsys, "backends")
    assert f"groq         available in python={sdk} (4.3.1)" in out
    r = compare(
        models["mlp_layernorm"],
        backends=["groq", "groq@fp32", "reference"],
        runner_options={"groq@fp32": {"precision": "fp32"}, "groq": {"compiler_flags": "--large-program"}},
        builds=2,
        probes=["none"],
    )
    by = {b.name: b for b in r.backends}
    for name in ("groq", "groq@fp32"):
        b = by[name]
        assert b.ok, b.reason
        assert b.promises == ("run-to-run", "build-to-build")
        assert b.deterministic and len(set(b.fingerprints)) == 1  # the state file's timestamp is left out
        assert dict(b.info)["interpreter.package.groqflow"] == "4.3.1"
    assert dict(by["groq"].info)["precision"] == "fp16 (GroqFlow's default: ConvertOnnxToFp16)"
    assert dict(by["groq"].info)["compiler_command"] == "groq-compiler --large-program"
    assert dict(by["groq@fp32"].info)["precision"] == "fp32 (no fp16 conversion)"
    assert [c.status for c in r.promise_checks()] == ["held"] * 4
    # fp16 rounding shows against the reference; fp32 stays within a few ULP
    fp16, fp32 = r.cross("groq"), r.cross("groq@fp32")
    assert fp16.scaled_ulp is not None and fp16.scaled_ulp > 1000
    assert fp32.scaled_ulp is not None and fp32.scaled_ulp < 16
    assert r.exit_code == 1  # fp16 is past --max-ulp: a difference, not a broken promise
