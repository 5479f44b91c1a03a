"""The command line: exit codes, one-line errors on stderr, reports written."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import one_line_error, run
from roots import ROOT


def test_missing_file_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "compare", "missing.onnx")
    assert code == 2 and out == ""
    one_line_error(err, "model file not found: missing.onnx; check the path")


def test_corrupt_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00\x01garbage" * 10)
    code, _, err = run(capsys, "compare", str(bad))
    assert code == 2
    one_line_error(err, "bad.onnx")


def test_dynamic_dims_without_shape_exit_2(
    models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "compare", str(models["convnet"]))
    assert code == 2
    one_line_error(err, "pass --shape image=1,3,32,32")


def test_bad_set_syntax_exits_2(models: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "compare", str(models["attention"]), "--set", "threads=1")
    assert code == 2 and out == ""
    one_line_error(err, "--set: expected BACKEND.OPTION=VALUE (e.g. ort-cpu.threads=1), got 'threads=1'")


def test_typer_usage_errors_are_one_line_with_a_pointer_to_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "compare", "m.onnx", "--runz", "2")
    assert code == 2 and out == ""
    one_line_error(err, "No such option: --runz")
    assert err.rstrip().endswith("see `xbackend compare --help`")
    code, _, err = run(capsys, "capture", "m.onnx", "-o", "out")
    assert code == 2
    one_line_error(err, "Missing option '--backend'; see `xbackend capture --help`")
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for command in ("compare", "capture", "report", "diff", "backends", "export"):
        assert command in out


def test_help_fits_a_person_version_panels_order_and_no_bool_metavar(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from xbackend.cli.app import ORDER
    from xbackend.cli.params import PANELS
    from xbackend.version import VERSION

    monkeypatch.setenv("COLUMNS", "120")
    code, out, _ = run(capsys, "--version")
    assert (code, out.strip()) == (0, f"xbackend {VERSION}")
    code, out, _ = run(capsys, "--help")
    listed = [m.group(1) for m in re.finditer(r"^│ ([a-z][a-z-]+) ", out, re.MULTILINE)]
    assert code == 0 and listed == list(ORDER), listed  # compare first, as people reach for them
    code, out, _ = run(capsys, "compare", "--help")
    assert code == 0 and "<bool>" not in out
    for name in PANELS:  # the options grouped as a reader looks for them
        assert f"─ {name} ─" in out, name
    threads = out.split("--probe-threads", 1)[1].split("│ --", 1)[0]
    assert "(default:" in threads and "[default" not in threads  # one default, said in words


def test_unknown_backend_exits_2(models: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "compare", str(models["attention"]), "--backends", "ort-gpu")
    assert code == 2
    one_line_error(
        err,
        "unknown backend 'ort-gpu'; known backends: executorch, executorch-xnnpack, expected, groq "
        "(unavailable), llama.cpp, openvino-cpu, openvino-cpu-default, oracle, ort-cpu, ort-cuda",
    )
    assert err.rstrip().endswith("(`xbackend backends` says why one is unavailable)")


@pytest.mark.slow
def test_compare_writes_reports_and_exits_0(
    models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    md, js = tmp_path / "out" / "r.md", tmp_path / "out" / "r.json"
    code, out, err = run(
        capsys,
        "compare",
        str(models["convnet"]),
        "--shape",
        "image=2,3,32,32",
        "--runs",
        "2",
        "--report",
        str(md),
        "--json",
        str(js),
    )
    assert code == 0, err
    assert out.splitlines()[0].startswith("PASS")
    data = json.loads(js.read_text("utf-8"))
    assert data["schema"] == "xbackend.report/2"
    assert data["inputs"]["values"] == [{"name": "image", "dtype": "float32", "shape": "[2,3,32,32]"}]
    assert "--shape image=2,3,32,32" in data["command"]
    text = md.read_text("utf-8")
    assert text.startswith("# xbackend report: convnet.onnx\n\nxbackend ") and "exit code 0 (pass)" in text
    verdict = text.split("## Verdict\n\n", 1)[1]
    assert verdict.startswith("- PASS")
    assert (md.parent / "r.layers.csv").is_file() and (md.parent / "r.error-depth.png").is_file()


@pytest.mark.slow
def test_nondeterministic_backend_exits_1(
    models: dict[str, Path], plugins: None, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        capsys,
        "compare",
        str(models["scatter_add"]),
        "--backends",
        "test-racy",
        "--runs",
        "6",
        "--set",
        "test-racy.threads=2",
    )
    assert code == 1
    assert out.startswith(
        "FAIL: test-racy: nondeterministic run to run: 6 distinct outputs in 6 runs of one build"
    ), out
    assert "first varying tensor pooled" in out.splitlines()[0]


@pytest.mark.slow
def test_all_failed_exits_3(
    models: dict[str, Path], plugins: None, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "compare", str(models["attention"]), "--backends", "test-crash", "--runs", "1")
    assert code == 3
    assert "test-crash: failed (prepare: crashed with SIGABRT" in out or "crashed with SIGABRT" in out


def test_backends_lists_available_and_unavailable(plugins: None, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "backends")
    assert code == 0
    lines = out.splitlines()
    assert any(ln.startswith("ort-cpu") and "available (1.31.1)" in ln for ln in lines)
    assert any(
        ln.startswith("test-missing") and "unavailable: libtest.so not installed" in ln for ln in lines
    )
    assert "--set ort-cpu.opt_level=... [disable|basic|extended|layout|all]" in out


@pytest.mark.slow
def test_console_script_keeps_stdout_clean(models: dict[str, Path], tmp_path: Path) -> None:
    exe = shutil.which("xbackend", path=str(Path(sys.executable).parent))
    assert exe is not None, "the xbackend console script is not installed in this environment"
    p = subprocess.run(
        [exe, "compare", str(models["attention"]), "--runs", "1", "--json", str(tmp_path / "r.json")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    # stderr is no terminal: no bar, a line per finished build, and nothing else
    lines = p.stderr.splitlines()
    assert lines and all(re.fullmatch(r"xbackend: \[\d+/\d+\] .+: done in \d+\.\d s", ln) for ln in lines), (
        lines
    )
    assert any("ort-cpu-build0: done in" in ln for ln in lines)
    assert p.stdout.startswith("PASS")
    p = subprocess.run([exe, "compare", "nope.onnx"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr == "xbackend: error: model file not found: nope.onnx; check the path\n"


def test_unknown_probe_exits_2(models: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "compare", str(models["attention"]), "--probes", "threads,speed")
    assert code == 2
    one_line_error(
        err,
        "unknown probe(s) speed; choose from builds, threads, opt-levels, batch, autotune, tf32, all, none",
    )


def test_batch_of_one_exits_2(models: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "compare", str(models["attention"]), "--batch-invariance", "1")
    assert code == 2
    one_line_error(err, "--batch-invariance needs a batch size >= 2, got 1")


def test_outputs_are_checked_before_anything_runs_and_destroy_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--json onto the model, one path for --report and --json, a folder, someone's file: each a
    one-line error (exit 2) before any backend runs, the file left as it was. A report xbackend
    wrote is overwritten, as a re-run expects."""
    import shutil

    model = tmp_path / "m.onnx"
    shutil.copy(ROOT / "models" / "torch_mlp.onnx", model)
    before = model.read_bytes()
    kw = ["--backends", "reference", "--runs", "1", "--probes", "none", "--no-progress"]
    code, out, err = run(capsys, "compare", str(model), "--json", str(model), *kw)
    assert code == 2 and out == "" and model.read_bytes() == before
    one_line_error(err, f"--json {model} is an input of this command; write the output to another path")
    same = tmp_path / "r.out"
    code, _, err = run(capsys, "compare", str(model), "--report", str(same), "--json", str(same), *kw)
    assert code == 2 and not same.exists()
    one_line_error(err, f"--json {same} is the same file as --report {same}; give each output its own path")
    code, _, err = run(capsys, "compare", str(model), "--report", str(tmp_path), *kw)
    assert code == 2
    one_line_error(err, f"--report {tmp_path} is a folder; give a file path in it")
    notes = tmp_path / "notes.md"
    notes.write_text("my notes\n")
    code, _, err = run(capsys, "compare", str(model), "--report", str(notes), *kw)
    assert code == 2 and notes.read_text("utf-8") == "my notes\n"
    one_line_error(err, "exists and xbackend did not write it")
    report, js = tmp_path / "r.md", tmp_path / "r.json"
    for _ in range(2):  # the second run overwrites the reports the first one wrote
        code, _, err = run(capsys, "compare", str(model), "--report", str(report), "--json", str(js), *kw)
        assert code == 0, err
    assert (
        report.read_text("utf-8").startswith("# xbackend report")
        and json.loads(js.read_text("utf-8"))["schema"]
    )
