"""Promises of deterministic hardware, determinism certificates and their verification."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_helpers import one_line_error, run
from xbackend import compare
from xbackend.certify import SCHEMA, seal

pytestmark = pytest.mark.slow


def test_broken_promise_fails_with_its_own_code(models: dict[str, Path], plugins: None) -> None:
    # ORT at 2 threads races on ScatterND(reduction=add): the runner promised otherwise
    r = compare(models["scatter_add"], backends=["test-promising"], runs=4, probes=["threads"])
    by = {c.name: c for c in r.promise_checks()}
    assert set(by) == {"run-to-run", "build-to-build", "thread-count"}
    assert by["run-to-run"].broken and by["run-to-run"].first_layer == "pooled"
    assert by["thread-count"].broken and by["thread-count"].first_layer == "pooled"
    assert by["build-to-build"].status == "unchecked"  # one build: nothing to compare
    assert r.exit_code == 16
    assert r.verdict()[0].startswith("FAIL: test-promising broke its promise of run-to-run determinism")
    # with --fail-on the promise still gates, beside the policies asked for
    r2 = compare(
        models["scatter_add"], backends=["test-promising"], runs=4, probes=["none"], fail_on=["failure"]
    )
    assert [g.policy for g in r2.gates()] == ["promise"]
    assert r2.exit_code == 16


def test_kept_promise_passes_and_is_marked(models: dict[str, Path], plugins: None, tmp_path: Path) -> None:
    md = tmp_path / "r.md"
    code = run_cli(
        "compare",
        str(models["mlp_layernorm"]),
        "--backends",
        "test-promising",
        "--set",
        "test-promising.threads=1",
        "--builds",
        "2",
        "--probes",
        "threads",
        "--report",
        str(md),
    )
    assert code == 0
    text = md.read_text("utf-8")
    assert "| test-promising (promises run-to-run, build-to-build, thread-count) | ok |" in text
    assert "| test-promising | build-to-build | held | bit-identical over 2 fresh builds" in text
    assert "| test-promising | thread-count | held | bit-identical at 1 thread and at 4 threads" in text


def run_cli(*argv: str) -> int:
    from xbackend.cli import main

    return main(list(argv))


def test_certify_grants_one_thread_and_verify_matches(
    models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stem = tmp_path / "cert"
    code, out, _ = run(
        capsys,
        "certify",
        str(models["mlp_batch"]),
        "--backend",
        "ort-cpu",
        "--set",
        "ort-cpu.threads=1",
        "--shape",
        "x=1,128",
        "--runs",
        "3",
        "--builds",
        "2",
        "--timed-runs",
        "2",
        "-o",
        str(stem),
        "--no-progress",
    )
    assert code == 0, out
    assert "GRANTED" in out
    assert "  latency: median " in out
    cert = json.loads((tmp_path / "cert.json").read_text("utf-8"))
    assert cert["schema"] == SCHEMA and cert["granted"] is True
    status = {p["name"]: p["status"] for p in cert["properties"]}
    assert status == dict.fromkeys(["run-to-run", "build-to-build", "batch-position", "thread-count"], "held")
    assert cert["backend"]["options"]["threads"] == "1"
    assert cert["model"]["sha256"] and cert["inputs"]["sha256"]
    assert list(cert["outputs"]["tensors"]) == ["y"]
    assert cert["environment"]["package.onnxruntime"] == "1.31.1"
    # the certified runs themselves, timed: (3 + 2 timed - 1 warm-up) x 2 builds
    lat = cert["latency"]
    assert lat["runs"] == 8 and 0 < lat["min_ms"] <= lat["median_ms"] <= lat["max_ms"]
    assert cert["battery"]["timed_runs"] == 2
    md = (tmp_path / "cert.md").read_text("utf-8")
    assert "**GRANTED**" in md and cert["outputs"]["sha256"] in md and "`xbackend verify cert.json`" in md
    assert "Latency of the certified configuration on this machine: median " in md
    assert "Battery: 3 runs (and 2 timed runs) in each of 2 fresh builds" in md
    # verify re-runs it here: the same bits, the same environment
    code, out, _ = run(capsys, "verify", str(tmp_path / "cert.json"), "--no-progress")
    assert code == 0, out
    assert out.splitlines()[0].startswith("VERIFIED: ort-cpu on mlp_batch.onnx: the outputs match")
    assert "ENVIRONMENT: the same as the certificate's" in out
    assert "ms in the certificate (" in next(
        line for line in out.splitlines() if line.startswith("LATENCY: ")
    )


def test_certify_refuses_two_threads_on_the_scatter_race(
    models: dict[str, Path], tmp_path: Path, plugins: None, capsys: pytest.CaptureFixture[str]
) -> None:
    stem = tmp_path / "race"
    code, out, _ = run(
        capsys,
        "certify",
        str(models["scatter_add"]),
        "--backend",
        "test-racy",
        "--set",
        "test-racy.threads=2",
        "--runs",
        "4",
        "--builds",
        "2",
        "-o",
        str(stem),
        "--no-progress",
    )
    assert code == 16
    assert "REFUSED" in out
    assert "run-to-run: broken (" in out and "first broke at pooled" in out
    cert = json.loads((tmp_path / "race.json").read_text("utf-8"))
    run_to_run = next(p for p in cert["properties"] if p["name"] == "run-to-run")
    assert run_to_run["status"] == "broken" and run_to_run["first_layer"] == "pooled"
    assert "- BROKEN: run-to-run:" in (tmp_path / "race.md").read_text("utf-8")


def test_verify_refuses_a_tampered_certificate(
    models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stem = tmp_path / "cert"
    code, _, _ = run(
        capsys,
        "certify",
        str(models["mlp_layernorm"]),
        "--backend",
        "ort-cpu",
        "--set",
        "ort-cpu.threads=1",
        "--runs",
        "2",
        "--builds",
        "2",
        "-o",
        str(stem),
        "--no-progress",
    )
    assert code == 0
    path = tmp_path / "cert.json"
    cert = json.loads(path.read_text("utf-8"))
    # an edited hash, seal left alone: refused before anything runs
    edited = {**cert, "outputs": {**cert["outputs"], "sha256": "0" * 64}}
    path.write_text(json.dumps(edited))
    code, _, err = run(capsys, "verify", str(path))
    assert code == 2
    one_line_error(err, "was modified after it was written")
    # an edited hash, resealed: the re-run shows the outputs do not match
    body = {k: v for k, v in edited.items() if k != "certificate_sha256"}
    path.write_text(json.dumps({**body, "certificate_sha256": seal(body)}))
    code, out, _ = run(capsys, "verify", str(path), "--no-progress")
    assert code == 1
    assert out.startswith(
        "MISMATCH: ort-cpu on mlp_layernorm.onnx: outputs differ from the certificate (all)"
    )
    # another model under the certified path's name
    code, _, err = run(capsys, "verify", str(tmp_path / "cert.json"), "--model", str(models["convnet"]))
    assert code == 2
    one_line_error(err, "is not the certified model")


def test_verify_from_another_directory(
    models: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The certificate records the model relative to itself: verify works from any directory,
    and a moved model is one line naming --model."""
    import shutil

    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    shutil.copy(models["mlp_layernorm"], work / "m.onnx")
    monkeypatch.chdir(work)
    code, _, _ = run(
        capsys, "certify", "m.onnx", "--backend", "ort-cpu", "--runs", "2", "--builds", "2",
        "--batch", "0", "-o", "certs/c", "--no-progress",
    )  # fmt: skip
    assert code == 0
    assert json.loads((work / "certs" / "c.json").read_text("utf-8"))["model"]["path"] == "../m.onnx"
    monkeypatch.chdir(elsewhere)
    code, out, _ = run(capsys, "verify", str(work / "certs" / "c.json"), "--no-progress")
    assert code == 0 and out.startswith("VERIFIED: ort-cpu on m.onnx")
    (work / "m.onnx").rename(work / "moved.onnx")
    code, _, err = run(capsys, "verify", str(work / "certs" / "c.json"), "--no-progress")
    assert code == 2
    one_line_error(err, "the certified model m.onnx is not at")
    assert "pass --model PATH" in err
    code, out, _ = run(
        capsys, "verify", str(work / "certs" / "c.json"), "--model", str(work / "moved.onnx"), "--no-progress"
    )
    assert code == 0 and out.startswith("VERIFIED")
