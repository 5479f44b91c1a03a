"""Releases: portable captures, baselines and drift, --fail-on gates, the report folder, `report`,
`diff`."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from cli_helpers import one_line_error, run
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator
from PIL import Image
from roots import ROOT

import xbackend
from xbackend.cli import main
from xbackend.files.storage import ValueFile
from xbackend.model.inputs import generate_feeds, load_feeds
from xbackend.model.load import load_model
from xbackend.report import bundle_files, from_json, to_json
from xbackend.report.figures import COLORS
from xbackend.results.capture_record import open_capture

pytestmark = pytest.mark.slow

TORCH_MLP = ROOT / "models" / "torch_mlp.onnx"


def _bits(v: object) -> object:
    a = np.asarray(v)
    if a.dtype.kind in "OU":  # strings: the reference evaluator returns str_, captures object arrays
        return [str(x) for x in a.reshape(-1)]
    return (str(a.dtype), a.shape, a.tobytes())


@pytest.mark.parametrize("sample", ["bf16_chain", "strings"])
def test_a_capture_round_trips_bit_exactly(
    sample: str, models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cap = tmp_path / "cap"
    extra: list[str] = []
    spec, proto = load_model(models[sample])
    if sample == "strings":  # strings cannot be generated: real data, with non-ASCII text
        np.savez(tmp_path / "words.npz", words=np.array(["The", "Größe", "THE", "naïve", "Ω"]))
        extra = ["--inputs", str(tmp_path / "words.npz")]
        feeds = load_feeds(tmp_path / "words.npz", spec).arrays
    else:
        feeds = generate_feeds(spec, 0, {}, {}).arrays
    code, out, err = run(
        capsys,
        "capture",
        str(models[sample]),
        "--backend",
        "reference",
        "-o",
        str(cap),
        "--runs",
        "2",
        *extra,
    )
    assert code == 0, err
    assert out.startswith(f"wrote {cap}: reference, deterministic over 2 run(s) x 1 build(s)")
    # the checksum list is sha256sum's format
    for line in (cap / "SHA256SUMS").read_text("utf-8").splitlines():
        digest, name = line.split("  ")
        assert hashlib.sha256((cap / name).read_bytes()).hexdigest() == digest
    expected = dict(zip(spec.output_names, ReferenceEvaluator(proto).run(None, dict(feeds)), strict=True))
    loaded = open_capture(cap)
    assert loaded.name == "reference@cap" and loaded.model_sha256 == spec.sha256
    with ValueFile(cap / "inputs.xbv") as f:
        assert {k: _bits(f[k]) for k in f.names} == {k: _bits(v) for k, v in feeds.items()}
    with ValueFile(cap / "layers.xbv") as f:
        for name, want in expected.items():
            assert _bits(f[name]) == _bits(want)
        dtypes = {str(np.asarray(f[n]).dtype) for n in f.names}
    assert ("bfloat16" in dtypes) if sample == "bf16_chain" else ("object" in dtypes)


@pytest.fixture(scope="module")
def mlp_capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cap = tmp_path_factory.mktemp("caps") / "cpu-host"
    assert main(["capture", str(TORCH_MLP), "--backend", "ort-cpu", "-o", str(cap), "--runs", "2"]) == 0
    return cap


def test_a_capture_equals_a_live_run_of_the_same_backend(mlp_capture: Path) -> None:
    r = xbackend.compare(
        TORCH_MLP, backends=["ort-cpu"], runs=2, loads=[str(mlp_capture)], reference="ort-cpu", probes="none"
    )
    loaded = r.backend("ort-cpu@cpu-host")
    assert loaded.loaded_from == str(mlp_capture) and loaded.deterministic is True
    c = r.cross("ort-cpu@cpu-host")
    assert c.bitwise_equal and c.first_divergence is None
    assert len(c.tensors) == 49 and all(d.bitwise_equal for d in c.tensors)
    assert r.feeds.source == f"capture {mlp_capture}"


def test_a_loaded_capture_brings_the_floor_back_and_says_what_decided_each_tolerance(
    mlp_capture: Path,
) -> None:
    """The K-order floors leave the default path: they run only for a backend the float64 judge
    cannot judge (a loaded capture), and each comparison names what decided its tolerances."""
    live = xbackend.compare(TORCH_MLP, backends=["ort-cpu", "reference"], runs=1, probes="none")
    assert live.explanation.ok and live.explanation.floors == ()
    assert live.explanation.floor_note.startswith("not measured: every backend was judged against float64")
    assert live.cross("ort-cpu").tolerance_by == "its nodes' allowances against float64"
    r = xbackend.compare(
        TORCH_MLP, backends=["ort-cpu", "reference"], runs=1, loads=[str(mlp_capture)], probes="none"
    )
    ex = r.explanation
    assert ex.ok and ex.samples == 8 and ex.engine == "ort-cpu" and len(ex.floors) == 49
    assert r.cross("ort-cpu").tolerance_by == "its nodes' allowances against float64"
    loaded = r.cross("ort-cpu@cpu-host")
    assert loaded.explained is None and loaded.tolerance_by == "4x its noise floor (8 orders on ort-cpu)"
    # the floors decide the loaded capture's tolerances: 4 x max(floor, op bound, 1) per tensor
    assert dict(loaded.tolerances) == ex.tolerances(r.model.op_types())
    # asked for, the per-node check of the allowances runs; by default it says how to ask
    assert live.explanation.reorder_check.reason.endswith("with --noise-samples K")
    assert ex.reorder_check.status == "unavailable"


def test_a_damaged_capture_is_refused_in_one_line(
    mlp_capture: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    def broken(name: str) -> Path:
        d = tmp_path / name
        shutil.copytree(mlp_capture, d)
        return d

    tampered = broken("tampered")
    data = bytearray((tampered / "outputs.xbv").read_bytes())
    data[20] ^= 1
    (tampered / "outputs.xbv").write_bytes(bytes(data))
    truncated = broken("truncated")
    (truncated / "layers.xbv").write_bytes((truncated / "layers.xbv").read_bytes()[:1000])
    future = broken("future")
    m = json.loads((future / "capture.json").read_text("utf-8"))
    m["format"] = "xbackend.capture/9"
    (future / "capture.json").write_text(json.dumps(m))
    interrupted = broken("interrupted")
    (interrupted / "SHA256SUMS").unlink()
    resummed = broken("resummed")  # the value file's JSON index edited, then its sha256 recomputed
    data = bytearray((resummed / "outputs.xbv").read_bytes())
    at = data.rfind(b'"nbytes"')
    data[at : at + 8] = b'"nbyteX"'
    (resummed / "outputs.xbv").write_bytes(bytes(data))
    sums = (resummed / "SHA256SUMS").read_text("utf-8").splitlines()
    fixed = [
        f"{hashlib.sha256((resummed / n).read_bytes()).hexdigest()}  {n}"
        for n in (ln.split("  ")[1] for ln in sums)
    ]
    (resummed / "SHA256SUMS").write_text("\n".join(fixed) + "\n", "utf-8")
    cases = {
        tampered: "outputs.xbv does not match its sha256 in SHA256SUMS",
        truncated: "is truncated: layers.xbv has 1000 bytes",
        future: "has format 'xbackend.capture/9'; this xbackend reads 'xbackend.capture/1'",
        interrupted: "has no SHA256SUMS (its write was interrupted)",
        resummed: "has a damaged value file outputs.xbv",
    }
    for path, why in cases.items():
        code, out, err = run(capsys, "compare", str(TORCH_MLP), "--backends", "ort-cpu", "--load", str(path))
        assert code == 2 and out == ""
        one_line_error(err, why)


def test_a_capture_of_another_model_is_refused(
    mlp_capture: Path, models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "compare", str(models["mlp_layernorm"]), "--load", str(mlp_capture))
    assert code == 2
    one_line_error(err, "was made from another model (torch_mlp.onnx")


def _nudged(tmp_path: Path) -> Path:
    """torch_mlp with the weights of blocks.2.fc1 (its MatMul's constant, val_16) one ULP up. Every
    element moves: whether one element's ULP survives the rounding of every sum after it depends
    on the BLAS kernel (numpy 2.4.6's OpenBLAS rounds it away before y on Zen 4)."""
    m = onnx.load(str(TORCH_MLP))
    for t in m.graph.initializer:
        if t.name == "val_16":
            a = np.nextafter(numpy_helper.to_array(t), np.float32(np.inf))
            t.CopyFrom(numpy_helper.from_array(a, t.name))
    out = tmp_path / "torch_mlp_next.onnx"
    onnx.save(m, str(out))
    return out


def test_a_baseline_reports_drift_from_the_layer_whose_weight_moved_one_ulp(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = tmp_path / "v1"
    code, _, err = run(
        capsys, "compare", str(TORCH_MLP), "--backends", "reference", "--runs", "1", "--probes", "none",
        "--json", str(old / "report.json"), "--save-captures", str(old / "captures"),
    )  # fmt: skip
    assert code == 0, err
    new = _nudged(tmp_path)
    for baseline, measured in ((old / "captures", True), (old / "report.json", True)):
        r = xbackend.compare(new, backends=["reference"], runs=1, probes="none", baseline=str(baseline))
        (d,) = r.baseline
        assert (d.backend, d.status, d.measured) == ("reference", "drifted", measured)
        assert d.first_moved == "val_17"  # the MatMul that reads the moved weight
        assert r.model.modules()["val_17"] == "blocks.2.fc1"
        assert d.moved[-1] == "y" and "val_16" not in d.moved
        assert d.outputs_moved == ("y",) and (d.scaled_ulp or 0) > 0
        assert any(
            line.startswith("DRIFT: reference moved from the baseline: ")
            and line.endswith("first moved tensor val_17 (blocks.2.fc1)")
            for line in r.verdict()
        )
    # a JSON report alone (no captures beside it): digests say whether and where, not how much
    lone = tmp_path / "lone.json"
    lone.write_text((old / "report.json").read_text("utf-8"))
    r = xbackend.compare(new, backends=["reference"], runs=1, probes="none", baseline=str(lone))
    (d,) = r.baseline
    assert (d.status, d.measured, d.first_moved, d.scaled_ulp) == ("drifted", False, "val_17", None)
    # the same model: identical
    r = xbackend.compare(TORCH_MLP, backends=["reference"], runs=1, probes="none", baseline=str(lone))
    assert [(d.status, d.moved) for d in r.baseline] == [("identical", ())]
    # no backend of the run in the baseline: nothing compared, and never "no backend moved"
    r = xbackend.compare(TORCH_MLP, backends=["ort-cpu"], runs=1, probes="none", baseline=str(lone))
    assert [d.status for d in r.baseline] == ["no-baseline"]
    assert "WARN: baseline: no backend of this run is in the baseline, so nothing was compared" in "\n".join(
        r.verdict()
    )
    md = xbackend.to_markdown(r)
    assert "no backend moved" not in md
    assert "- **Against the baseline: not compared.** No backend was compared (it holds none" in md
    code, out, _ = run(
        capsys, "compare", str(new), "--backends", "reference", "--runs", "1", "--probes", "none",
        "--baseline", str(old / "report.json"), "--fail-on", "baseline-drift",
    )  # fmt: skip
    assert code == 13
    assert out.startswith("GATE: baseline-drift fired (exit 13): reference moved from the baseline")


def test_fail_on_policies_have_their_exit_codes(
    models: dict[str, Path], plugins: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["compare", str(models["mlp_layernorm"]), "--runs", "1", "--probes", "none"]
    nudge = [
        "--backends",
        "test-nudge,reference",
        "--set",
        "test-nudge.tensor=y",
        "--set",
        "test-nudge.ulps=5",
    ]
    assert run(capsys, *base, *nudge, "--fail-on", "ulp>4")[0] == 12
    assert run(capsys, *base, *nudge, "--fail-on", "ulp>5")[0] == 0
    assert run(capsys, *base, *nudge, "--fail-on", "nondeterminism,build-variance")[0] == 0
    flaky = [
        "--backends", "test-flaky-build", "--builds", "2", "--set", f"test-flaky-build.state_dir={tmp_path}",
        "--set", "test-flaky-build.tensor=y",
    ]  # fmt: skip
    code, out, _ = run(capsys, *base, *flaky, "--fail-on", "nondeterminism,build-variance")
    assert code == 11
    assert out.startswith(
        "GATE: build-variance fired (exit 11): test-flaky-build: 2 distinct outputs over 2 builds"
    )
    code, out, _ = run(capsys, *base, "--backends", "reference,test-crash", "--fail-on", "failure")
    assert code == 15 and "GATE: failure fired (exit 15): test-crash failed" in out
    drift = [
        "compare", str(models["attention"]), "--runs", "1", "--backends", "test-drift", "--probes", "threads",
        "--probe-threads", "3", "--set", f"test-drift.state_dir={tmp_path}",
        "--set", "test-drift.drift_threads=3",
        "--set", "test-drift.drift_from=scores",
    ]  # fmt: skip
    code, out, _ = run(capsys, *drift, "--fail-on", "probe-warning")
    assert code == 14 and "test-drift changes with threads (3 vs 1): from scores on" in out
    # several fire: the lowest exit code wins; `any` is all of them
    code, out, _ = run(capsys, *base, *nudge, "--max-ulp", "2", "--fail-on", "any")
    assert code == 12 and out.startswith("GATE: ulp>2 fired (exit 12)")
    assert run(capsys, *base, "--backends", "reference,test-crash", "--fail-on", "ulp>0,failure")[0] == 15
    code, _, err = run(capsys, *base, "--fail-on", "ulp>x")
    assert code == 2
    one_line_error(err, "unknown --fail-on policy 'ulp>x'; valid: nondeterminism, build-variance, ulp>N")


def test_nondeterminism_gate_exits_10(
    models: dict[str, Path], plugins: None, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        capsys, "compare", str(models["scatter_add"]), "--backends", "test-racy", "--runs", "6",
        "--set", "test-racy.threads=2", "--probes", "none", "--fail-on", "nondeterminism",
    )  # fmt: skip
    assert code == 10 and out.startswith("GATE: nondeterminism fired (exit 10): test-racy: ")


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A 12-block model on three engines with the batch probe and two builds, twice."""
    from xbackend.model.samples import build

    root = tmp_path_factory.mktemp("release")
    model = root / "mlp_batch.onnx"
    onnx.save(build("mlp_batch"), str(model))
    for name in ("a", "b"):
        argv = [
            "compare", str(model), "--backends", "ort-cpu,reference,oracle", "--shape", "x=4,128",
            "--batch-invariance", "4", "--runs", "1", "--builds", "2",
            "--report", str(root / name / "report.md"), "--json", str(root / name / "report.json"),
        ]  # fmt: skip
        assert main(argv) == 0
    return root / "a", root / "b"


def test_report_folder_is_byte_stable_and_re_rendered_by_xbackend_report(
    release: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = release
    names = sorted(p.name for p in a.iterdir())
    assert names == [
        ".xbackend-files.json",  # the ledger of what xbackend wrote (xbackend.files.owned)
        "report.batch-invariance.png",
        "report.error-depth.png",
        "report.json",
        "report.layers.csv",
        "report.md",
        "report.ulp-distribution.png",
    ]
    for n in names[1:]:  # the ledger's seal names its own folder: every report file is the same bytes
        assert (a / n).read_bytes() == (b / n).read_bytes(), n
    out = tmp_path / "again" / "report.md"
    code, _, err = run(capsys, "report", str(a / "report.json"), "-o", str(out))
    assert code == 0, err
    for n in names:
        if n not in ("report.json", ".xbackend-files.json"):
            assert (out.parent / n).read_bytes() == (a / n).read_bytes(), n


def test_report_reads_verdict_first_and_folds_the_rest(release: tuple[Path, Path]) -> None:
    md = (release[0] / "report.md").read_text("utf-8")
    lines = md.splitlines()
    first_fold = next(i for i, line in enumerate(lines) if line.startswith("<details>"))
    assert (
        first_fold <= 80
    )  # the answers, verdict and backends in 40 (tests/report/test_first_screen.py), then figures
    head = "\n".join(lines[:first_fold])
    assert lines[4] == "## Answer"
    assert lines[6].startswith("- **Run to run: not measured.** One run per build")
    assert "## Verdict" in lines and lines[lines.index("## Verdict") + 2].startswith("- PASS")
    for section in ("## Answer", "## Verdict", "## Backends", "## Figures"):
        assert section in head
    # identical builds are one sentence, not a flat line at 0
    assert (
        "*Build variance is not drawn: fresh builds of ort-cpu, reference, oracle computed the same" in head
    )
    assert "![Batch invariance: a sample alone vs inside a batch](report.batch-invariance.png)" in head
    assert "[report.layers.csv](report.layers.csv)" in head
    csv = (release[0] / "report.layers.csv").read_text("utf-8").splitlines()
    assert csv[0].startswith("comparison,position,tensor,module,op,dtype")
    r = from_json((release[0] / "report.json").read_text("utf-8"))
    per_layer = len(r.cross("ort-cpu").tensors)
    assert sum(1 for row in csv if row.startswith("ort-cpu vs reference,")) == per_layer
    # position is model order for every comparison: a tensor has one position in all of them
    where: dict[str, set[str]] = {}
    for row in csv[1:]:
        fields = row.split(",")
        where.setdefault(fields[2], set()).add(fields[1])
    assert all(len(p) == 1 for p in where.values()), {t: p for t, p in where.items() if len(p) > 1}
    # the folded per-layer table is capped; the CSV has every row
    assert per_layer > 50 and f"({per_layer - 50} more tensors in the layer CSV" in md


def test_figures_are_pngs_with_the_series_they_claim(release: tuple[Path, Path]) -> None:
    r = from_json((release[0] / "report.json").read_text("utf-8"))
    want = {
        "error-depth": ["ort-cpu", "reference"],  # against the oracle
        "ulp-distribution": ["ort-cpu", "oracle"],  # against the reference
        "batch-invariance": ["ort-cpu (batch 4)", "reference (batch 4)", "oracle (batch 4)"],
    }
    for slug, series in want.items():
        path = release[0] / f"report.{slug}.png"
        with Image.open(path) as im:
            im.verify()
        with Image.open(path) as im:
            desc = json.loads(im.text["Description"])
            rgb = np.asarray(im.convert("RGB")).reshape(-1, 3)
            pixels = {"#{:02x}{:02x}{:02x}".format(*p) for p in np.unique(rgb, axis=0)}
        assert [s["name"] for s in desc["series"]] == series, slug
        assert [s["color"] for s in desc["series"]] == list(COLORS[: len(series)])
        for s in desc["series"]:
            assert s["color"] in pixels, (slug, s)  # each claimed series is drawn
    files = bundle_files(r, release[0] / "report.md")
    assert sorted(p.name for p in files) == sorted(
        p.name for p in release[0].iterdir() if p.name not in ("report.json", ".xbackend-files.json")
    )


def test_json_round_trips_the_whole_result(release: tuple[Path, Path]) -> None:
    text = (release[0] / "report.json").read_text("utf-8")
    assert to_json(from_json(text)) == text


def test_diff_names_what_changed(
    release: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = release
    code, out, _ = run(capsys, "diff", str(a / "report.json"), str(b / "report.json"))
    assert code == 0 and "Nothing changed" in out
    other = tmp_path / "other.json"
    assert main(["compare", str(TORCH_MLP), "--backends", "reference", "--runs", "1", "--probes", "none",
                 "--json", str(tmp_path / "v1.json")]) == 0  # fmt: skip
    nudged = str(_nudged(tmp_path))
    assert main(["compare", nudged, "--backends", "reference", "--runs", "1", "--probes", "none",
                 "--json", str(other)]) == 0  # fmt: skip
    capsys.readouterr()
    code, out, _ = run(capsys, "diff", str(tmp_path / "v1.json"), str(other), "-o", str(tmp_path / "d.md"))
    assert code == 1
    assert "- reference: outputs moved; first tensor that moved: val_17 (blocks.2.fc1)" in out
    assert "| model.sha256 |" in out
    assert (tmp_path / "d.md").read_text("utf-8") == out
    # options in a person's words: never a Python repr (None, (), True, tuples)
    v2 = ["compare", str(TORCH_MLP), "--backends", "reference", "--runs", "2", "--probes", "threads",
          "--max-ulp", "8", "--tensors", "outputs", "--json", str(tmp_path / "v2.json")]  # fmt: skip
    assert main(v2) == 0
    capsys.readouterr()
    code, out, _ = run(capsys, "diff", str(tmp_path / "v1.json"), str(tmp_path / "v2.json"))
    assert code == 1
    for row in ("| max_ulp | auto | 8.0 |", "| outputs_only | no | yes |", "| probes | none | threads |"):
        assert row in out, out
    options = out.split("## Options", 1)[1].split("## Backends", 1)[0]
    assert not re.search(r"\| (None|\(\)|True|False|\(.*,\)) \|", options), options
    code, _, err = run(capsys, "diff", str(tmp_path / "nope.json"), str(other))
    assert code == 2
    one_line_error(err, "OLD.json")


def test_report_refuses_a_json_it_cannot_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"schema": "xbackend.report/1"}))
    code, _, err = run(capsys, "report", str(old), "-o", str(tmp_path / "r.md"))
    assert code == 2
    one_line_error(err, "has schema 'xbackend.report/1', this xbackend reads 'xbackend.report/2'")


def test_file_formats_keep_their_names() -> None:
    """Captures and value files written by earlier releases name these formats; moving the
    modules that write them must not rename them (docs/releases.md cites the capture's)."""
    from xbackend.files.capture_folder import FORMAT as CAPTURE
    from xbackend.files.storage import FORMAT as VALUES

    assert (CAPTURE, VALUES) == ("xbackend.capture/1", "xbackend.values/1")
    docs = ROOT / "docs" / "releases.md"
    assert f"format `{CAPTURE}`" in docs.read_text("utf-8")


def test_load_capture_and_capture_export_give_numpy_the_values(
    models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """xbackend.load_capture and `capture export --npz` hand over the capture's inputs, graph
    outputs and layers as plain arrays: an independent onnxruntime run on the inputs gives the
    outputs bit for bit; the same capture exports to the same bytes; a tampered capture is refused."""
    import onnxruntime as ort

    cap = tmp_path / "cap"
    code, _, err = run(
        capsys, "capture", str(models["mlp_layernorm"]), "--backend", "ort-cpu", "-o", str(cap)
    )
    assert code == 0, err
    arrays = xbackend.load_capture(cap)
    spec, _ = load_model(models["mlp_layernorm"])
    inputs = {k.removeprefix("inputs/"): v for k, v in arrays.items() if k.startswith("inputs/")}
    assert sorted(inputs) == sorted(t.name for t in spec.inputs)
    sess = ort.InferenceSession(str(models["mlp_layernorm"]), providers=["CPUExecutionProvider"])
    for name, want in zip(spec.output_names, sess.run(None, inputs), strict=True):
        assert arrays[f"outputs/{name}"].tobytes() == want.tobytes()
        assert f"layers/{name}" in arrays  # the instrumented build's tensors too
    assert sorted(k for k in arrays if k.startswith("outputs/")) == [
        f"outputs/{n}" for n in sorted(spec.output_names)
    ]

    out = tmp_path / "cap.npz"
    assert run(capsys, "capture", "export", str(cap), "--npz", str(out))[0] == 0
    with np.load(out) as npz:
        assert {k: npz[k].tobytes() for k in arrays} == {k: v.tobytes() for k, v in arrays.items()}
        assert str(npz["xbackend.capture-export"]) == "cap"
    first = out.read_bytes()
    assert run(capsys, "capture", "export", str(cap), "--npz", str(out))[0] == 0  # its own file: replaced
    assert out.read_bytes() == first  # same capture, same bytes
    notes = tmp_path / "notes.npz"
    notes.write_bytes(b"mine")
    code, _, err = run(capsys, "capture", "export", str(cap), "--npz", str(notes))
    assert code == 2 and notes.read_bytes() == b"mine"
    one_line_error(err, "exists and xbackend did not write it")
    with open(cap / "outputs.xbv", "r+b") as f:  # one byte changed: the checksum no longer matches
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    code, _, err = run(capsys, "capture", "export", str(cap), "--npz", str(tmp_path / "bad.npz"))
    assert code == 2 and not (tmp_path / "bad.npz").exists()
    one_line_error(err, "outputs.xbv")
