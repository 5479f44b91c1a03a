"""Sweeps on a real local Ray cluster: placement, lost workers, timeouts, and the same figures as local.

Ray 2.60 has no local mode: these start a real instance (GCS, raylet, workers) on this machine,
with fake resources and labels standing in for a fleet's GPU types and accelerator boxes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from roots import TESTS

from tests.sweep.test_sweep import orphaned_workers, write_sweep
from tests.sweep.test_sweep import zoo as sweep_zoo
from xbackend.sweep import load_sweep, run_sweep
from xbackend.sweep.executors import LocalExecutor, RayExecutor

ray = pytest.importorskip("ray", reason="Ray is the optional extra xbackend[ray]; `make test` installs it")

pytestmark = pytest.mark.slow
POOL = "xbackend-test/pool"


def _raylets() -> str:
    return subprocess.run(["pgrep", "-f", "raylet"], capture_output=True, text=True).stdout.strip()


def zoo(models: dict[str, Path]) -> str:
    """Two models whose backends are deterministic here, so two sweeps must agree bit for bit."""
    return sweep_zoo(models, "mlp_layernorm", "ln", "runs = 2\nbuilds = 2")


def test_cli_starts_and_stops_its_own_ray_instance(models: dict[str, Path], tmp_path: Path) -> None:
    assert _raylets() == "", "another Ray instance is running on this machine"
    path = write_sweep(tmp_path, zoo(models).replace('name = "ln"', 'name = "ln"\nbackends = ["reference"]'))
    done = subprocess.run(
        [sys.executable, "-m", "xbackend", "sweep", str(path), "--executor", "ray", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith("PASS: 4 job(s) on 2 model(s) ran")
    fleet = json.loads((tmp_path / "zoo-fleet" / "fleet.json").read_text("utf-8"))
    assert fleet["executor"] == "ray" and fleet["summary"]["ok"] == 4
    assert all(j["assigned"] == {"CPU": 1.0} for j in fleet["jobs"])
    assert _raylets() == "", "the sweep left its Ray instance running"


@pytest.fixture(scope="module")
def cluster(plugin_path: Path) -> Iterator[None]:
    """One local node with 2 CPUs, a fake Groq card, a fake A100 and a pool label; the test runners
    importable in its workers."""
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(plugin_path), str(TESTS), old) if p)
    sys.path[:0] = [str(plugin_path), str(TESTS)]
    ray.init(
        num_cpus=2,
        resources={"groq": 1, "accelerator_type:A100": 1},
        labels={POOL: "cpu"},
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=300 * 1024 * 1024,
    )
    try:
        yield
    finally:
        ray.shutdown()
        del sys.path[:2]
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def _figures(fleet: dict[str, Any]) -> dict[str, Any]:
    return {
        "matrix": fleet["matrix"],
        "worst_pairs": fleet["worst_pairs"],
        "verdicts": {m["name"]: m["verdict"] for m in fleet["models"]},
        "exit": fleet["exit_code"],
    }


def test_ray_gives_the_same_figures_and_bits_as_local(
    cluster: None, models: dict[str, Path], tmp_path: Path
) -> None:
    local = run_sweep(load_sweep(write_sweep(tmp_path / "local", zoo(models))), LocalExecutor())
    remote = run_sweep(load_sweep(write_sweep(tmp_path / "ray", zoo(models))), RayExecutor())
    a = json.loads((local.spec.output / "fleet.json").read_text("utf-8"))
    b = json.loads((remote.spec.output / "fleet.json").read_text("utf-8"))
    assert a["summary"]["ok"] == b["summary"]["ok"] == 6
    assert _figures(a) == _figures(b)
    assert a["matrix"]["mlp"]["ort-cpu@1t"]["scaled_ulp"] is not None
    for job in a["jobs"]:  # every capture's values (inputs, outputs, layers), bit for bit
        left = sorted(p.name for p in (local.spec.output / job["capture"]).glob("*.xbv"))
        right = sorted(p.name for p in (remote.spec.output / job["capture"]).glob("*.xbv"))
        assert left == right and "inputs.xbv" in left and len(left) >= 2
        for f in left:
            data = (local.spec.output / job["capture"] / f).read_bytes()
            assert data == (remote.spec.output / job["capture"] / f).read_bytes(), (job["id"], f)
    assert {j["node"] for j in b["jobs"]} == {f"{os.uname().nodename} ({ray.util.get_node_ip_address()})"}
    assert b["nodes"][0]["labels"] == {POOL: "cpu"}
    # Ray's OMP_NUM_THREADS for a 1-CPU task is not passed on to the engines
    assert "env.OMP_NUM_THREADS" not in b["nodes"][0]["environment"]
    assert a["nodes"][0]["environment_sha256"] == b["nodes"][0]["environment_sha256"]


def test_placement_lost_workers_and_timeouts(cluster: None, models: dict[str, Path], tmp_path: Path) -> None:
    text = f"""
[sweep]
runs = 2
probes = "none"
job_timeout = 30
retries = 1

[[models]]
path = "{models["mlp_batch"]}"
shapes = {{ x = [2, 128] }}

[[backends]]
name = "reference@cpu-pool"
requires = {{ labels = {{ "{POOL}" = "cpu" }} }}

[[backends]]
name = "reference@groq"
requires = {{ resources = {{ groq = 1 }} }}

[[backends]]
name = "reference@a100"
requires = {{ accelerator_type = "A100" }}

[[backends]]
name = "reference@gpu"
requires = {{ num_gpus = 1 }}

[[backends]]
name = "reference@gpu-pool"
requires = {{ labels = {{ "{POOL}" = "in(gpu,gpu-spot)" }} }}

[[backends]]
name = "test-kill-job@once"
set = {{ marker = "{tmp_path / "once"}", times = 1 }}

[[backends]]
name = "test-kill-job@always"
set = {{ marker = "{tmp_path / "always"}", times = 9 }}

[[backends]]
name = "test-hang"
"""
    r = run_sweep(load_sweep(write_sweep(tmp_path, text)), RayExecutor())
    fleet = json.loads((r.spec.output / "fleet.json").read_text("utf-8"))
    jobs = {j["backend"]: j for j in fleet["jobs"]}
    assert jobs["reference@cpu-pool"]["status"] == "ok"
    assert jobs["reference@groq"]["assigned"] == {"CPU": 1.0, "groq": 1.0}
    assert jobs["reference@a100"]["status"] == "ok"
    assert set(jobs["reference@a100"]["assigned"]) == {"CPU", "accelerator_type:A100"}
    host = f"{os.uname().nodename} ({ray.util.get_node_ip_address()})"
    assert (
        jobs["reference@gpu"]["reason"] == f"no node in the Ray cluster has 1 CPU, 1 GPU ({host}: GPU 0 < 1)"
    )
    assert jobs["reference@gpu-pool"]["reason"] == (
        f"no node in the Ray cluster has 1 CPU, label {POOL}=in(gpu,gpu-spot) "
        f"({host}: label {POOL}='cpu' does not match 'in(gpu,gpu-spot)')"
    )
    once = jobs["test-kill-job@once"]
    assert (once["status"], once["attempts"]) == ("ok", 2)
    always = jobs["test-kill-job@always"]
    assert (always["status"], always["attempts"]) == ("failed", 2)
    assert always["reason"].startswith("attempt 1: WorkerCrashedError on ")
    assert "; attempt 2: WorkerCrashedError on " in always["reason"]
    assert jobs["test-hang"]["reason"] == "timed out after 30 s (job_timeout)"
    assert fleet["summary"] == {"backends": 8, "failed": 4, "jobs": 8, "models": 1, "ok": 4}
    assert r.exit_code == 1
    assert orphaned_workers() == [], "a cancelled job left its worker running"


def test_shared_storage_jobs_write_in_place(cluster: None, models: dict[str, Path], tmp_path: Path) -> None:
    text = zoo(models).replace('name = "ln"', 'name = "ln"\nbackends = ["reference"]')
    r = run_sweep(load_sweep(write_sweep(tmp_path, text)), RayExecutor(shared_storage=True))
    assert [j.status for j in r.jobs] == ["ok"] * 4
    assert (r.spec.output / "jobs" / "mlp" / "ort-cpu@2t" / "capture" / "SHA256SUMS").is_file()
    assert not list((r.spec.output / "jobs" / "mlp").glob(".*partial"))
