"""Promises of deterministic hardware, determinism certificates and their verification."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from roots import ROOT

from tests.cli_helpers import one_line_error, run
from xbackend import compare
from xbackend.certificates.certify import SCHEMA

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
    stmt = json.loads((tmp_path / "cert.json").read_text("utf-8"))
    assert stmt["_type"] == "https://in-toto.io/Statement/v1"  # unsigned: the bare Statement
    assert [x["name"] for x in stmt["subject"]] == ["mlp_batch.onnx"]
    cert = stmt["predicate"]
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
    assert (
        "**GRANTED**" in md
        and cert["outputs"]["sha256"] in md
        and "`xbackend verify cert.json\n--allow-unsigned`" in md
    )
    assert "Latency of the certified configuration on this machine: median " in md
    assert "Battery: 3 runs (and 2 timed runs) in each of 2 fresh builds" in md
    # verify re-runs it here: the same bits, the same environment
    code, _, err = run(capsys, "verify", str(tmp_path / "cert.json"), "--no-progress")
    assert code == 2
    one_line_error(err, "is not signed; pass --allow-unsigned to verify it anyway")
    # the model lies outside the certificate's folder: verify is told where it is
    model = ("--model", str(models["mlp_batch"]))
    code, out, _ = run(
        capsys, "verify", str(tmp_path / "cert.json"), *model, "--allow-unsigned", "--no-progress"
    )
    assert code == 0, out
    assert out.splitlines()[0].startswith("UNSIGNED: anyone could have written or edited this certificate")
    assert out.splitlines()[1].startswith("VERIFIED: ort-cpu on mlp_batch.onnx: the outputs match")
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
    cert = json.loads((tmp_path / "race.json").read_text("utf-8"))["predicate"]
    run_to_run = next(p for p in cert["properties"] if p["name"] == "run-to-run")
    assert run_to_run["status"] == "broken" and run_to_run["first_layer"] == "pooled"
    assert "- BROKEN: run-to-run:" in (tmp_path / "race.md").read_text("utf-8")


def _statement(path: Path) -> dict:
    data = json.loads(path.read_text("utf-8"))
    return json.loads(base64.b64decode(data["dsseEnvelope"]["payload"])) if "dsseEnvelope" in data else data


def _resign(stmt: dict, key: Path) -> dict:
    from xbackend.files import attest

    return attest.sign_statement(stmt, attest.load_private_key(key))


def test_signed_certificate_forgeries_are_refused_and_nothing_runs(
    models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A signed certificate: verify checks the signature first. Edited, resealed, or signed by
    another key, it is refused before anything runs; a certificate that names code (an
    interpreter, a module) is refused even when signed, and the code never runs."""
    code, _, _ = run(capsys, "keygen", "-o", str(tmp_path / "rel"))
    assert code == 0 and oct((tmp_path / "rel.key").stat().st_mode & 0o777) == "0o600"
    code, _, err = run(capsys, "keygen", "-o", str(tmp_path / "rel"))
    assert code == 2
    one_line_error(err, "already exists; choose another -o NAME")
    run(capsys, "keygen", "-o", str(tmp_path / "mallory"))
    stem = tmp_path / "cert"
    code, out, _ = run(
        capsys, "certify", str(models["mlp_layernorm"]), "--backend", "ort-cpu", "--set", "ort-cpu.threads=1",
        "--runs", "2", "--builds", "2", "-o", str(stem), "--key", str(tmp_path / "rel.key"), "--no-progress",
    )  # fmt: skip
    assert code == 0 and "(signed)" in out and f"--key {tmp_path / 'rel.pub'}" in out
    path = tmp_path / "cert.json"
    bundle = json.loads(path.read_text("utf-8"))
    assert bundle["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    assert bundle["dsseEnvelope"]["payloadType"] == "application/vnd.in-toto+json"
    stmt = _statement(path)
    assert stmt["predicateType"].startswith("https://xbackend.dev/attestation/certificate/")
    assert "Signed (in cert.json, a DSSE envelope) with the key" in (tmp_path / "cert.md").read_text("utf-8")
    # Ed25519 is deterministic: the same battery signs to the same bytes
    assert _resign(stmt, tmp_path / "rel.key") == bundle
    model = ("--model", str(models["mlp_layernorm"]))
    code, out, _ = run(
        capsys, "verify", str(path), *model, "--key", str(tmp_path / "rel.pub"), "--no-progress"
    )
    assert code == 0, out
    assert out.splitlines()[0] == (
        f"SIGNED: the signature checks with key {bundle['verificationMaterial']['publicKey']['hint'][:16]}; "
        "the model's 1 file(s) match their digests"
    )
    # another key's public half: refused
    code, _, err = run(capsys, "verify", str(path), "--key", str(tmp_path / "mallory.pub"))
    assert code == 2
    one_line_error(err, "does not carry a valid signature by the key .*it names another signer")

    evil = tmp_path / "evil.sh"
    evil.write_text(f"#!/bin/sh\ntouch {tmp_path / 'PWNED'}\n")
    evil.chmod(0o755)
    forged = json.loads(json.dumps(stmt))
    forged["predicate"]["battery"]["runner_options"] = [["ort-cpu", "python", str(evil)]]
    zeroed = json.loads(json.dumps(stmt))
    zeroed["predicate"]["outputs"]["tensors"] = {n: "0" * 64 for n in stmt["predicate"]["outputs"]["tensors"]}
    tampered = {**bundle, "dsseEnvelope": {**bundle["dsseEnvelope"]}}
    tampered["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(zeroed).encode()).decode()
    cases = [
        (tampered, "rel", "does not carry a valid signature by the key .*it was edited after it was signed"),
        (_resign(forged, tmp_path / "mallory.key"), "rel", "it names another signer"),
        # signed by the verifier's own key, it still never runs what it names
        (_resign(forged, tmp_path / "rel.key"), "rel", "sets ort-cpu.python=.*evil.sh: verify"),
        (_resign(zeroed, tmp_path / "rel.key"), "rel", "its outputs.sha256 is not the digest of its own"),
    ]  # fmt: skip
    for data, key, message in cases:
        path.write_text(json.dumps(data))
        code, _, err = run(capsys, "verify", str(path), *model, "--key", str(tmp_path / f"{key}.pub"))
        assert code == 2, message
        one_line_error(err, message)
    assert not (tmp_path / "PWNED").exists()
    # a module the certificate names, or the grant to import one, is refused the same way
    for key, value in (("module", f"{tmp_path}/evil.py:build"), ("trust_model_code", "true")):
        forged["predicate"]["backend"]["name"] = "torch"
        forged["predicate"]["battery"]["runner_options"] = [["torch", key, value]]
        path.write_text(json.dumps(forged))
        code, _, err = run(capsys, "verify", str(path), *model, "--allow-unsigned")
        assert code == 2
        one_line_error(err, f"the certificate sets torch.{key}={value}: verify never runs")
    # zeroed per-tensor digests with their combination recomputed: the re-run shows the mismatch
    from xbackend.certificates.certify import _combined

    zeroed["predicate"]["outputs"]["sha256"] = _combined(zeroed["predicate"]["outputs"]["tensors"])
    path.write_text(json.dumps(_resign(zeroed, tmp_path / "rel.key")))
    code, out, _ = run(
        capsys, "verify", str(path), *model, "--key", str(tmp_path / "rel.pub"), "--no-progress"
    )
    assert code == 1
    assert out.splitlines()[1].startswith("MISMATCH: ort-cpu on mlp_layernorm.onnx: outputs differ from")
    # another model under the certified path's name
    path.write_text(json.dumps(bundle))
    code, _, err = run(
        capsys, "verify", str(path), "--key", str(tmp_path / "rel.pub"), "--model", str(models["convnet"])
    )
    assert code == 2
    one_line_error(err, "convnet.onnx is not the certified mlp_layernorm.onnx (its sha256 differs")
    # an old self-sealed certificate is refused with what to do
    path.write_text(json.dumps({**stmt["predicate"], "certificate_sha256": "0" * 64}))
    code, _, err = run(capsys, "verify", str(path), "--allow-unsigned")
    assert code == 2
    one_line_error(err, "unsigned certificate from an older xbackend")


def test_verify_from_another_directory_and_only_inside_the_certificates_folder(
    models: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The certificate records the model relative to itself: verify works from any directory. It
    reads the model only inside the certificate's folder (no `..`, no absolute path, no symlink
    out), and a refusal names the entry and --model, never a file outside."""
    import shutil

    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    shutil.copy(models["mlp_layernorm"], work / "m.onnx")
    monkeypatch.chdir(work)
    for stem in ("c", "certs/c"):
        code, _, _ = run(
            capsys, "certify", "m.onnx", "--backend", "ort-cpu", "--runs", "2", "--builds", "2",
            "--batch", "0", "-o", stem, "--no-progress",
        )  # fmt: skip
        assert code == 0
    assert _statement(work / "c.json")["predicate"]["model"]["path"] == "m.onnx"
    assert _statement(work / "certs" / "c.json")["predicate"]["model"]["path"] == "../m.onnx"
    monkeypatch.chdir(elsewhere)
    verify = ("verify", "--allow-unsigned", "--no-progress")
    code, out, _ = run(capsys, *verify, str(work / "c.json"))
    assert code == 0 and out.splitlines()[1].startswith("VERIFIED: ort-cpu on m.onnx")
    code, _, err = run(capsys, *verify, str(work / "certs" / "c.json"))
    assert code == 2
    one_line_error(err, r"model.path names '../m.onnx', which leads out of its own folder; pass --model PATH")
    code, out, _ = run(capsys, *verify, str(work / "certs" / "c.json"), "--model", str(work / "m.onnx"))
    assert code == 0 and out.splitlines()[1].startswith("VERIFIED")
    # an absolute path and a symlink that leads out are refused the same way
    stmt = _statement(work / "c.json")
    for entry in ("/etc/passwd", "link.onnx"):
        stmt["predicate"]["model"]["path"] = entry
        (work / "bad.json").write_text(json.dumps(stmt))
        if entry == "link.onnx":
            (work / "link.onnx").symlink_to(elsewhere / "x.onnx")
        code, _, err = run(capsys, *verify, str(work / "bad.json"))
        assert code == 2
        one_line_error(
            err, f"model.path names '{entry}', which (is not a path inside|leads out of) its own folder"
        )
        assert "passwd" not in err.replace("'/etc/passwd'", "") and "bytes" not in err
    (work / "m.onnx").rename(work / "moved.onnx")
    code, _, err = run(capsys, *verify, str(work / "c.json"))
    assert code == 2
    one_line_error(err, "the certified model 'm.onnx' is not at 'm.onnx'")
    assert "pass --model PATH" in err
    code, out, _ = run(capsys, *verify, str(work / "c.json"), "--model", str(work / "moved.onnx"))
    assert code == 0 and out.splitlines()[1].startswith("VERIFIED")


def test_verify_takes_the_module_from_its_own_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A torch certificate records the module that built the model; verify never imports it
    from there, and runs with the one --torch-module names."""
    import shutil

    root = ROOT / "models"
    for name in ("torch_mlp.onnx", "torch_mlp.py"):
        shutil.copy(root / name, tmp_path / name)
    module = f"{tmp_path / 'torch_mlp.py'}:build"
    code, out, err = run(
        capsys, "certify", str(tmp_path / "torch_mlp.onnx"), "--backend", "torch", "--torch-module", module,
        "--runs", "2", "--builds", "2", "--batch", "0", "-o", str(tmp_path / "c"), "--no-progress",
    )  # fmt: skip
    assert code == 0, out + err
    cert = str(tmp_path / "c.json")
    code, _, err = run(capsys, "verify", cert, "--allow-unsigned", "--no-progress")
    assert code == 2
    one_line_error(err, f"the certificate sets torch.module={module}: verify never runs")
    code, out, _ = run(capsys, "verify", cert, "--allow-unsigned", "--torch-module", module, "--no-progress")
    assert code == 0 and out.splitlines()[1].startswith("VERIFIED: torch on torch_mlp.onnx"), out
    code, _, err = run(
        capsys, "verify", cert, "--allow-unsigned", "--torch-module", module, "--set", "torch.threads=x"
    )
    assert code == 2
    one_line_error(err, "torch option threads expects int")
