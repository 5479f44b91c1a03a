"""Sweeps on the local executor: the sweep file, the fleet report, resuming, and failing jobs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from roots import ROOT, TESTS

from tests.cli_helpers import one_line_error, run
from xbackend.errors import UsageError
from xbackend.sweep import load_sweep, run_sweep
from xbackend.sweep.executors import label_matches, node_feasible, placement
from xbackend.sweep.report import cell_for
from xbackend.sweep.spec import Requirements

pytestmark = pytest.mark.slow


def orphaned_workers() -> list[str]:
    """xbackend workers whose parent died (re-parented to init): what a killed job must not leave."""
    pids = subprocess.run(
        ["pgrep", "-f", "xbackend.execution.worker"], capture_output=True, text=True
    ).stdout.split()
    out = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text("utf-8", errors="replace")
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[1] == "1":
            out.append(pid)
    return out


def write_sweep(folder: Path, text: str, name: str = "zoo.toml") -> Path:
    """The sweep file in `folder`, each absolute model path in it copied beside it first: a
    sweep file reads only inside its own folder."""
    folder.mkdir(parents=True, exist_ok=True)
    for quoted in sorted(set(re.findall(r"[\"'](/[^\"']+\.onnx)[\"']", text))):
        src = Path(quoted)
        dest = folder / src.name
        if src.is_file() and not dest.exists():
            shutil.copyfile(src, dest)
        text = text.replace(quoted, src.name)
    path = folder / name
    path.write_text(text, "utf-8")
    return path


def zoo(
    models: dict[str, Path],
    second: str = "scatter_add",
    name: str = "scatter",
    sweep: str = "runs = 3",
    racy: bool = False,
) -> str:
    """mlp_batch and a second sample model, on ort-cpu at 1 and 2 threads and the reference
    evaluator (and test-racy at 2 threads, a certain race on the scatter, with `racy`)."""
    extra = '\n[[backends]]\nname = "test-racy@2t"\nset = { threads = 2 }\n' if racy else ""
    return (
        f"""
[sweep]
name = "zoo"
probes = "none"
{sweep}

[[models]]
path = "{models["mlp_batch"]}"
name = "mlp"
shapes = {{ x = [4, 128] }}

[[models]]
path = "{models[second]}"
name = "{name}"

[[backends]]
name = "reference"

[[backends]]
name = "ort-cpu@1t"
set = {{ threads = 1 }}

[[backends]]
name = "ort-cpu@2t"
set = {{ threads = 2 }}
"""
        + extra
    )


# --- the sweep file ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("[[models]]\npath = 'MODEL'\n", "backends: list at least one backend"),
        ("[[backends]]\nname = 'ort-cpu'\n", "models: list at least one model"),
        ("[swep]\n[[backends]]\nname = 'ort-cpu'\n", "unknown key(s) swep"),
        (
            "[[backends]]\nname = 'ort-cpu'\n[[backends]]\nname = 'ort-cpu'\n[[models]]\npath = 'MODEL'\n",
            "ort-cpu is listed twice; list it again under a label, e.g. ort-cpu@other",
        ),
        ("[[backends]]\nname = 'ort-cpu'\n[[models]]\npath = 'nope.onnx'\n", "model nope.onnx not found"),
        (
            "[[backends]]\nname = 'ort-cpu'\n[[models]]\npath = 'MODEL'\nbackends = ['tensorrt']\n",
            "backends tensorrt are not in [[backends]] (ort-cpu)",
        ),
        (
            "[[backends]]\nname = 'ort-cpu'\n[[models]]\npath = 'MODEL'\n"
            "set = { 'openvino-cpu.threads' = 1 }\n",
            "expected BACKEND.OPTION with a backend this model runs (ort-cpu)",
        ),
        (
            "[sweep]\nprobes = ['thread']\n[[backends]]\nname = 'ort-cpu'\n[[models]]\npath = 'MODEL'\n",
            "model mlp_batch on ort-cpu: unknown probe",
        ),
        (
            "[[backends]]\nname = 'ort-cpu'\nrequires = { gpus = 1 }\n[[models]]\npath = 'MODEL'\n",
            "backends[0].requires: unknown key(s) gpus; valid: accelerator_type, labels, num_cpus",
        ),
        (
            "[sweep]\nruns = 'three'\n[[backends]]\nname = 'ort-cpu'\n[[models]]\npath = 'MODEL'\n",
            "sweep: runs must be int",
        ),
        ("[sweep\n", "is not valid TOML"),
        (
            "[[backends]]\nname = 'ort-gpu'\n[[models]]\npath = 'MODEL'\nshapes = { x = [1, 128] }\n",
            "backend ort-gpu (model mlp_batch): unknown backend 'ort-gpu'; known backends: ",
        ),
        (
            "[[backends]]\nname = 'ort-cpu'\nset = { thread = 1 }\n[[models]]\npath = 'MODEL'\n",
            "backend ort-cpu (model mlp_batch): ort-cpu has no option thread; its options are: ",
        ),
    ],
)
def test_a_bad_sweep_file_is_one_line_naming_file_and_key(
    models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, message: str
) -> None:
    path = write_sweep(tmp_path, body.replace("MODEL", str(models["mlp_batch"])))
    code, _, err = run(capsys, "sweep", str(path), "--no-progress")
    assert code == 2
    one_line_error(err, message)
    assert f"{path}:" in err or "not valid TOML" in err


def test_sweep_options_reach_each_job(models: dict[str, Path], tmp_path: Path) -> None:
    text = zoo(models, sweep="runs = 3\nbuilds = 2").replace(
        'name = "scatter"',
        'name = "scatter"\nruns = 4\nbackends = ["reference", "ort-cpu@2t"]\n'
        'set = { "ort-cpu@2t.threads" = 1 }',
    )
    spec = load_sweep(write_sweep(tmp_path, text))
    jobs = {j.id: j for j in spec.jobs({"mlp": "a" * 64, "scatter": "b" * 64})}
    assert sorted(jobs) == [
        "mlp/ort-cpu@1t",
        "mlp/ort-cpu@2t",
        "mlp/reference",
        "scatter/ort-cpu@2t",
        "scatter/reference",
    ]
    assert jobs["mlp/ort-cpu@2t"].options().options_for("ort-cpu@2t") == {"threads": "2"}
    assert jobs["scatter/ort-cpu@2t"].options().options_for("ort-cpu@2t") == {"threads": "1"}
    assert jobs["scatter/reference"].options().runs == 4 and jobs["mlp/reference"].options().runs == 3
    assert jobs["mlp/reference"].options().builds == 2
    assert spec.output == tmp_path / "zoo-fleet"
    # the key follows what decides the figures: model bytes and options, not placement
    assert jobs["mlp/ort-cpu@1t"].key != jobs["mlp/ort-cpu@2t"].key
    again = load_sweep(write_sweep(tmp_path, text)).jobs({"mlp": "a" * 64, "scatter": "b" * 64})
    assert {j.id: j.key for j in again} == {k: j.key for k, j in jobs.items()}
    moved = load_sweep(write_sweep(tmp_path, text)).jobs({"mlp": "c" * 64, "scatter": "b" * 64})
    assert next(j for j in moved if j.id == "mlp/reference").key != jobs["mlp/reference"].key


def test_requirements_become_ray_placement_and_feasibility() -> None:
    req = Requirements(
        num_cpus=2,
        num_gpus=1,
        accelerator_type="H100",
        resources=(("groq", 1.0),),
        labels=(("pool", "in(gpu,gpu-spot)"),),
    )
    assert placement(req) == {
        "num_cpus": 2,
        "num_gpus": 1,
        "accelerator_type": "H100",
        "resources": {"groq": 1.0},
        "label_selector": {"pool": "in(gpu,gpu-spot)"},
    }
    node = {
        "Resources": {"CPU": 16.0, "GPU": 1.0, "accelerator_type:H100": 1.0, "groq": 1.0},
        "Labels": {"pool": "gpu-spot"},
    }
    assert node_feasible(req, node) == ""
    assert (
        node_feasible(req, {**node, "Labels": {"pool": "cpu"}})
        == "label pool='cpu' does not match 'in(gpu,gpu-spot)'"
    )
    assert node_feasible(req, {**node, "Resources": {"CPU": 16.0, "GPU": 1.0}}) == "groq 0 < 1"
    assert label_matches("!cpu", "gpu") and not label_matches("!cpu", "cpu")
    assert label_matches("!in(a,b)", None) and not label_matches("a", None)


def test_cells_say_the_verdict_in_a_few_words() -> None:
    ok = {"verdict": "fail", "deterministic": False, "distinct_outputs": 3, "reference": "reference"}
    ok.update(scaled_ulp=2.0, within_tolerance=True, promises_broken=[], job_warnings=[])
    assert cell_for(ok) == "FAIL · NONDET (3 outputs) · 2 ULP"
    err = {"verdict": "error", "kind": "timed out"}
    assert cell_for(err) == "**error** (timed out)"


# --- running a sweep ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def zoo_run(
    models: dict[str, Path], plugin_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, object]:
    folder = tmp_path_factory.mktemp("zoo")
    with pytest.MonkeyPatch.context() as mp:  # the test runners, here and in the sweep's workers
        paths = (str(plugin_path), str(TESTS))
        for p in paths:
            mp.syspath_prepend(p)
        mp.setenv("PYTHONPATH", os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")]))
        spec = load_sweep(write_sweep(folder, zoo(models, racy=True)))
        return folder, run_sweep(spec)


def test_local_sweep_reports_every_model_and_backend(zoo_run: tuple[Path, object]) -> None:
    folder, _ = zoo_run
    out = folder / "zoo-fleet"
    fleet = json.loads((out / "fleet.json").read_text("utf-8"))
    assert fleet["schema"] == "xbackend.fleet/1" and fleet["executor"] == "local"
    assert fleet["summary"] == {"backends": 4, "failed": 0, "jobs": 8, "models": 2, "ok": 8}
    m = fleet["matrix"]
    # the injected race at 2 threads lands on the scatter; on 1 thread ORT's ScatterND is stable
    assert m["scatter"]["test-racy@2t"]["deterministic"] is False
    assert m["scatter"]["test-racy@2t"]["verdict"] == "fail"
    assert m["mlp"]["test-racy@2t"]["deterministic"] is True
    assert m["scatter"]["ort-cpu@1t"]["deterministic"] is True
    assert m["mlp"]["ort-cpu@1t"]["deterministic"] is True and m["mlp"]["ort-cpu@2t"]["deterministic"] is True
    assert m["mlp"]["reference"]["reference"] == "reference" and "scaled_ulp" not in m["mlp"]["reference"]
    assert m["mlp"]["ort-cpu@1t"]["scaled_ulp"] is not None
    assert fleet["exit_code"] == 1
    assert any(
        v.startswith("FAIL: scatter: test-racy@2t: nondeterministic run to run: 3 distinct outputs in 3 runs")
        for v in fleet["verdict"]
    ), fleet["verdict"]
    md = (out / "fleet.md").read_text("utf-8")
    assert "| [scatter](models/scatter.md) |" in md and "NONDET" in md
    assert (out / "models" / "mlp.md").is_file() and (out / "models" / "scatter.json").is_file()
    assert (out / "jobs" / "mlp" / "ort-cpu@1t" / "capture" / "SHA256SUMS").is_file()
    assert (out / "jobs" / "mlp" / "ort-cpu@1t" / "report.md").is_file()
    per_model = json.loads((out / "models" / "scatter.json").read_text("utf-8"))
    assert per_model["options"]["reference"] == "reference"
    assert [b["name"] for b in per_model["backends"]] == [
        "reference",
        "ort-cpu@1t",
        "ort-cpu@2t",
        "test-racy@2t",
    ]
    # each backend judged node by node by its own job, where its engine ran; the comparison of
    # captures keeps that judgment (never "no explanation ... stands at 64")
    mlp = json.loads((out / "models" / "mlp.json").read_text("utf-8"))
    assert mlp["explanation"]["status"] == "ok"
    judged = {x["backend"]: x for x in mlp["explanation"]["local_errors"]}
    for b in ("reference", "ort-cpu@1t", "ort-cpu@2t"):
        assert judged[b]["status"] == "ok" and judged[b]["explained"] is True, judged[b]
        assert judged[b]["nodes_compared"] > 10, judged[b]
    text = (out / "models" / "mlp.md").read_text("utf-8")
    assert "stands at 64" not in text and "EXPLAINED: ort-cpu@1t: " in text
    jobs = {j["id"]: j for j in fleet["jobs"]}
    assert jobs["scatter/ort-cpu@2t"]["node"] == os.uname().nodename
    assert fleet["nodes"][0]["environment"]["package.xbackend"]


def test_a_rerun_resumes_and_writes_the_same_bytes(
    zoo_run: tuple[Path, object], plugins: None, capsys: pytest.CaptureFixture[str]
) -> None:
    folder, _ = zoo_run
    out = folder / "zoo-fleet"
    before = {p: p.read_bytes() for p in [out / "fleet.md", out / "fleet.json", out / "models" / "mlp.md"]}
    stamp = (out / "jobs" / "mlp" / "reference" / "job.json").stat().st_mtime_ns
    # damage one capture: a file changed since xbackend wrote it is refused, named; with --force
    # that job alone runs again
    damaged = out / "jobs" / "scatter" / "ort-cpu@1t" / "capture" / "outputs.xbv"
    damaged.write_bytes(b"damaged")
    code, stdout, err = run(capsys, "sweep", str(folder / "zoo.toml"))
    assert code == 2 and damaged.read_bytes() == b"damaged"
    one_line_error(err, f"holds {damaged}, which xbackend did not write (or which changed since)")
    code, stdout, err = run(capsys, "sweep", str(folder / "zoo.toml"), "--force")
    assert code == 1
    assert "7 resumed from earlier captures" in stdout
    # stderr is no terminal here: a line per job instead of a bar
    assert err.splitlines() == [
        "xbackend: sweep: 7 of 8 jobs already done, resuming",
        f"xbackend: [8/8] scatter/ort-cpu@1t: ok on {os.uname().nodename}",
    ]
    assert (out / "jobs" / "mlp" / "reference" / "job.json").stat().st_mtime_ns == stamp
    assert {p: p.read_bytes() for p in before} == before


def test_fresh_sweeps_give_the_same_bytes(models: dict[str, Path], tmp_path: Path) -> None:
    text = zoo(models).replace('name = "scatter"', 'name = "scatter"\nbackends = ["reference"]')
    text = text.replace('name = "mlp"', 'name = "mlp"\nbackends = ["reference", "ort-cpu@1t"]')
    a = run_sweep(load_sweep(write_sweep(tmp_path / "a", text)))
    b = run_sweep(load_sweep(write_sweep(tmp_path / "b", text)))
    for f in ("fleet.md", "fleet.json"):
        assert (a.spec.output / f).read_bytes() == (b.spec.output / f).read_bytes()
    assert a.exit_code == 0


def test_failing_jobs_do_not_stop_the_sweep(
    models: dict[str, Path], tmp_path: Path, plugins: None, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"not a model")
    text = f"""
[sweep]
runs = 2
probes = "none"
job_timeout = 30
retries = 1

[[models]]
path = "{models["mlp_batch"]}"
shapes = {{ x = [2, 128] }}

[[models]]
path = "{models["mlp_batch"]}"
name = "noshape"
backends = ["reference"]

[[models]]
path = "{bad}"
backends = ["reference"]

[[backends]]
name = "reference"

[[backends]]
name = "test-kill-job@once"
set = {{ marker = "{tmp_path / "once"}", times = 1 }}

[[backends]]
name = "test-kill-job@always"
set = {{ marker = "{tmp_path / "always"}", times = 9 }}

[[backends]]
name = "test-hang"

[[backends]]
name = "test-missing"
"""
    code, stdout, _ = run(capsys, "sweep", str(write_sweep(tmp_path, text)), "--no-progress")
    assert code == 1
    fleet = json.loads((tmp_path / "zoo-fleet" / "fleet.json").read_text("utf-8"))
    jobs = {j["id"]: j for j in fleet["jobs"]}
    assert jobs["mlp_batch/reference"]["status"] == "ok"
    once = jobs["mlp_batch/test-kill-job@once"]
    assert (once["status"], once["attempts"]) == ("ok", 2)
    always = jobs["mlp_batch/test-kill-job@always"]
    assert always["status"] == "failed" and always["attempts"] == 2
    assert always["reason"] == "attempt 1: job process died (SIGKILL); attempt 2: job process died (SIGKILL)"
    assert jobs["mlp_batch/test-hang"]["reason"] == "timed out after 30 s (job_timeout)"
    assert jobs["mlp_batch/test-missing"]["status"] == "unavailable"
    assert jobs["broken/reference"]["reason"].startswith("model not run: ")
    assert jobs["noshape/reference"]["reason"] == (
        "model not run: input 'x' has dynamic dimension(s) batch in shape [batch,128]; "
        "add shapes = { x = [1, 128] } to model noshape in the sweep file"
    )
    assert fleet["matrix"]["mlp_batch"]["test-kill-job@once"]["verdict"] == "pass"
    assert fleet["matrix"]["mlp_batch"]["test-hang"]["kind"] == "timed out"
    assert "FAIL: job mlp_batch/test-hang failed: timed out after 30 s (job_timeout)" in stdout
    # the hung worker died with its job: nothing of it is left running
    assert orphaned_workers() == []


def test_the_default_install_needs_no_ray(models: dict[str, Path], tmp_path: Path) -> None:
    path = write_sweep(
        tmp_path,
        f'[sweep]\nruns = 1\nprobes = "none"\n[[models]]\npath = "{models["mlp_batch"]}"\n'
        "shapes = { x = [2, 128] }\n"
        '[[backends]]\nname = "reference"\n',
    )
    code = (
        "import sys; sys.modules['ray'] = None\n"  # import ray fails, as without the extra
        "from xbackend.cli import main\n"
        f"sys.exit(main(['sweep', {str(path)!r}, '--no-progress'] + sys.argv[1:]))\n"
    )
    local = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert local.returncode == 0, local.stderr
    ray = subprocess.run([sys.executable, "-c", code, "--executor", "ray"], capture_output=True, text=True)
    assert ray.returncode == 2
    assert ray.stderr.strip() == (
        "xbackend: error: --executor ray needs Ray: pip install 'xbackend[ray]' (installs ray==2.60.0), "
        "or run the sweep with --executor local"
    )


def test_ray_only_flags_need_the_ray_executor(
    models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_sweep(tmp_path, zoo(models))
    code, _, err = run(capsys, "sweep", str(path), "--address", "auto")
    assert code == 2
    one_line_error(err, "--address and --shared-storage apply to --executor ray")
    code, _, err = run(capsys, "sweep", str(path), "--executor", "slurm")
    assert code == 2
    one_line_error(err, "--executor must be local or ray, got 'slurm'")


def test_usage_error_type() -> None:
    with pytest.raises(UsageError, match="not found"):
        load_sweep("/nonexistent/zoo.toml")


def test_the_documented_sweep_file_and_the_bundled_one_load(tmp_path: Path) -> None:
    page = (ROOT / "docs" / "fleet.md").read_text("utf-8")
    block = page.split("# Fleet sweeps")[1].split("```toml\n")[1].split("```")[0]
    path = write_sweep(tmp_path, block.replace('path = "models/', f'path = "{ROOT}/models/'))
    spec = load_sweep(path)
    jobs = {j.id: j for j in spec.jobs({m.name: "0" * 64 for m in spec.models})}
    assert len(jobs) == 4 + 3
    h100 = jobs["convnet/ort-cuda@h100"]
    assert h100.options().options_for("ort-cuda@h100") == {"tf32": "true"}
    assert h100.options().runs == 5 and h100.options().shapes == (("image", (4, 3, 32, 32)),)
    assert placement(h100.requires) == {"num_cpus": 1.0, "num_gpus": 1.0, "accelerator_type": "H100"}
    assert placement(jobs["torch_mlp/groq"].requires)["resources"] == {"groq": 1.0}
    assert spec.output == tmp_path / "fleet"
    bundled = load_sweep(ROOT / "models" / "zoo.sweep.toml")
    assert len(bundled.jobs({m.name: "0" * 64 for m in bundled.models})) == 15
    assert bundled.output == ROOT / "models" / "zoo-fleet"  # inside its folder; make fleet passes -o


def test_progress_counts_jobs_per_node() -> None:
    from xbackend.sweep.progress import Counts

    c = Counts()
    c.start(5, 1)
    c.started("a/x", "gpu-1 (10.0.0.7)")
    c.started("a/y", "gpu-1 (10.0.0.7)")
    c.started("b/x", "cpu-1 (10.0.0.9)")
    c.finished("a/x", "failed")
    assert (c.done, c.failed) == (2, 1)
    assert c.text() == "1 failed, 1 resumed; running on cpu-1 (10.0.0.9): 1, gpu-1 (10.0.0.7): 1"
