"""Where a sweep's jobs run: this machine (a process per job), or a Ray cluster (a task per job).

Both leave the same job folders under OUT/jobs and the same records, so the comparison that
follows cannot tell them apart. Failure handling is the same too:

- a job whose process (or Ray worker, or node) dies is run again, up to `retries` more times;
- a job that runs past `timeout` seconds is killed and failed, not retried (a hang would hang again);
- a job that needs what no node has fails at once, naming what is missing;
- a backend that fails or is unavailable fails its job (a record says why); nothing is retried.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xbackend.errors import UsageError
from xbackend.execution.isolation import kill_group, signal_name
from xbackend.files.owned import LEDGER, claim, drop_parts, forced, new_part, replace_tree
from xbackend.files.runfolders import remove_dead_runs, run_temp_folder
from xbackend.files.untrusted import contained
from xbackend.model.extdata import external_files
from xbackend.model.load import load_proto
from xbackend.sweep.node import job_from_json, job_to_json, node_identity, read_record, record_status, run_job
from xbackend.sweep.outcomes import FleetJob, FleetProgress, node_label
from xbackend.sweep.spec import JobSpec, Requirements

# A process per job; not `-m xbackend.sweep.node`, which runpy warns about once the sweep
# package (which imports node) is loaded first.
_JOB_MAIN = "import sys; from xbackend.sweep.node import main; sys.exit(main(sys.argv[1:]))"

__all__ = ["RAY_PIN", "LocalExecutor", "RayExecutor", "label_matches", "node_feasible", "placement"]

RAY_PIN = "ray==2.60.0"


def _finished(job: JobSpec, folder: Path, attempts: int, fallback_node: Mapping[str, Any]) -> FleetJob:
    rec = read_record(folder)
    if rec is None:
        return FleetJob(job, "failed", "the job left no record", fallback_node, attempts)
    return FleetJob(job, record_status(rec), str(rec.get("reason", "")), rec.get("node", {}), attempts, rec)


@dataclass
class LocalExecutor:
    """Each job in its own process on this machine, one after another."""

    name: str = "local"

    def run(
        self, jobs: Sequence[JobSpec], jobs_dir: Path, progress: FleetProgress, timeout: float, retries: int
    ) -> list[FleetJob]:
        """Run the jobs here, one after another; how each ended."""
        host = {"hostname": socket.gethostname()}
        out = []
        for job in jobs:
            progress.started(job.id, node_label(host))
            fj = self._one(job, jobs_dir / job.folder, host, timeout, retries)
            progress.finished(job.id, fj.node_name, fj.status)
            out.append(fj)
        return out

    def _one(
        self, job: JobSpec, folder: Path, host: Mapping[str, Any], timeout: float, retries: int
    ) -> FleetJob:
        died: list[str] = []
        for attempt in range(1, retries + 2):
            with run_temp_folder("xbackend-job-") as tmp:
                spec = Path(tmp) / "job.json"
                spec.write_text(json.dumps(job_to_json(job)))
                err = Path(tmp) / "stderr"
                with open(err, "wb") as ef:
                    proc = subprocess.Popen(
                        [
                            sys.executable,
                            "-c",
                            _JOB_MAIN,
                            str(spec),
                            str(folder),
                            *(["--force"] if forced(folder) else []),
                        ],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=ef,
                        start_new_session=True,  # a timeout kills the job's workers with it
                    )
                    try:
                        code = proc.wait(timeout)
                    except subprocess.TimeoutExpired:
                        _stop_job(proc, folder)
                        return FleetJob(
                            job, "failed", f"timed out after {timeout:g} s (job_timeout)", host, attempt
                        )
                    except BaseException:  # interrupted: the job goes with the sweep
                        _stop_job(proc, folder)
                        raise
                if code == 0:
                    return _finished(job, folder, attempt, host)
                why = f"job process died ({signal_name(code)})" if code < 0 else f"job process exited {code}"
                tail = _tail(err)
                died.append(f"attempt {attempt}: {why}{': ' + tail if tail else ''}")
            if code > 0:  # an error, not a death: running it again gives the same
                break
        return FleetJob(job, "failed", "; ".join(died), host, len(died))


def _stop_job(proc: subprocess.Popen[bytes], folder: Path) -> None:
    """Kill a job's process group and remove what it left: its half-built job folder and the
    temp folders of its (now dead) processes."""
    kill_group(proc)
    drop_parts(folder)
    remove_dead_runs()


def _tail(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


# --- Ray ----------------------------------------------------------------------------------------


def _import_ray() -> Any:
    try:
        import ray  # optional: the ray extra, only for --executor ray
    except ImportError as error:
        raise UsageError(
            f"--executor ray needs Ray: pip install 'xbackend[ray]' (installs {RAY_PIN}), "
            "or run the sweep with --executor local"
        ) from error
    return ray


def placement(req: Requirements) -> dict[str, Any]:
    """Ray task options for a backend's requirements."""
    opts: dict[str, Any] = {"num_cpus": req.num_cpus, "num_gpus": req.num_gpus}
    if req.accelerator_type:
        opts["accelerator_type"] = req.accelerator_type
    if req.resources:
        opts["resources"] = dict(req.resources)
    if req.labels:
        opts["label_selector"] = dict(req.labels)
    return opts


def label_matches(selector: str, value: str | None) -> bool:
    """Ray's label selector values: 'v', '!v', 'in(a,b)', '!in(a,b)'."""
    neg = selector.startswith("!")
    sel = selector[1:] if neg else selector
    if sel.startswith("in(") and sel.endswith(")"):
        hit = value is not None and value in [x.strip() for x in sel[3:-1].split(",")]
    else:
        hit = value == sel
    return hit != neg


def node_feasible(req: Requirements, node: Mapping[str, Any]) -> str:
    """'' when `node` (an entry of ray.nodes()) could ever run a job needing `req`, else what it lacks."""
    res = node.get("Resources", {})
    labels = node.get("Labels", {})
    want = {"CPU": req.num_cpus, "GPU": req.num_gpus, **dict(req.resources)}
    if req.accelerator_type:
        want[f"accelerator_type:{req.accelerator_type}"] = 0.001
    for k, value in want.items():
        if value and res.get(k, 0.0) < value:
            return f"{k} {res.get(k, 0.0):g} < {value:g}"
    for k, sel in req.labels:
        if not label_matches(sel, labels.get(k)):
            return f"label {k}={labels.get(k)!r} does not match {sel!r}"
    return ""


def _materialize(bundle: Mapping[str, Any] | None) -> dict[str, str]:
    """Write a job's shipped files (model, external data, inputs) on this node, at a path that
    depends only on their content, so every sweep on this node reads the same paths."""
    if not bundle:
        return {}
    paths = {}
    for role, files in bundle.items():
        digest = hashlib.sha256()
        for rel, data in sorted(files["files"].items()):
            digest.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
        root = Path(tempfile.gettempdir()) / "xbackend-sweep" / digest.hexdigest()[:24]
        for rel, data in files["files"].items():
            dest = root / rel
            if dest.is_file() and dest.stat().st_size == len(data):
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, dest)
        paths[role] = str(root / files["main"])
    return paths


def _bundle(job: JobSpec) -> dict[str, Any]:
    """The files a job needs on a node without shared storage: the model with its external data,
    and its inputs when they are files."""
    model = Path(job.model_path)
    files = {model.name: model.read_bytes()}
    for rel in external_files(load_proto(model, load_external=False)):
        if (model.parent / rel).is_file():
            files[rel] = (model.parent / rel).read_bytes()
    out: dict[str, Any] = {"model": {"main": model.name, "files": files}}
    inputs = job.compare.get("inputs")
    if inputs:
        path = Path(inputs)
        if path.is_dir():
            out["inputs"] = {
                "main": path.name,
                "files": {
                    f"{path.name}/{f.relative_to(path)}": f.read_bytes()
                    for f in sorted(path.rglob("*"))
                    if f.is_file()
                },
            }
        elif path.is_file():
            out["inputs"] = {"main": path.name, "files": {path.name: path.read_bytes()}}
    return out


def _ray_job(
    job_json: Mapping[str, Any],
    bundle: Mapping[str, Any] | None,
    dest: str | None,
    tracker: Any,
    job_id: str,
    force: bool = False,
) -> tuple[dict[str, Any], dict[str, bytes] | None]:
    """The Ray task: run one job on this node; its files come back through the object store
    unless `dest` is on storage the driver shares."""
    # waited on: a job that dies at once must still have said where it ran
    _import_ray().get(tracker.started.remote(job_id, node_identity()))
    _undo_ray_thread_cap()
    job = job_from_json(job_json)
    paths = _materialize(bundle)
    if dest is not None:
        return run_job(job, dest, paths.get("model"), paths.get("inputs"), force), None
    with run_temp_folder("xbackend-job-") as tmp:
        folder = Path(tmp) / "job"
        rec = run_job(job, folder, paths.get("model"), paths.get("inputs"))
        files = {
            str(path.relative_to(folder)): path.read_bytes()
            for path in sorted(folder.rglob("*"))
            if path.is_file()
        }
    return rec, files


def _undo_ray_thread_cap() -> None:
    """Ray sets OMP_NUM_THREADS to a task's num_cpus when the node's environment does not set it;
    engines would then run other thread counts than outside Ray. The variable is dropped when the
    worker was not started with it (its initial environment, /proc/self/environ on Linux)."""
    try:
        initial = Path("/proc/self/environ").read_bytes().split(b"\0")
    except OSError:
        return
    if not any(e.startswith(b"OMP_NUM_THREADS=") for e in initial):
        os.environ.pop("OMP_NUM_THREADS", None)


class _Tracker:
    """A Ray actor the tasks tell when and where they start (for timeouts and progress)."""

    def __init__(self) -> None:
        self.starts: dict[str, tuple[float, dict[str, Any]]] = {}

    def started(self, job_id: str, node: dict[str, Any]) -> None:
        self.starts[job_id] = (time.time(), node)

    def snapshot(self) -> dict[str, tuple[float, dict[str, Any]]]:
        return dict(self.starts)


def _write_files(folder: Path, files: Mapping[str, bytes]) -> None:
    """A job folder from the object store, replaced whole (a reader never sees half of one)."""
    part = new_part(folder)
    try:
        for rel, data in files.items():
            dest = contained(
                part,
                rel,
                f"a job's file from a node ({folder.name})",
                "the node sent a path out of its folder",
            )
            if dest.name == LEDGER:  # recorded here, from the bytes that arrived
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
            claim(dest, hashlib.sha256(data).hexdigest())
        replace_tree(part, folder, "the job folder")
    finally:
        shutil.rmtree(part, ignore_errors=True)


@dataclass
class _Pending:
    job: JobSpec
    attempt: int
    ref: Any
    died: list[str] = field(default_factory=list)
    cancelled: str = ""

    @property
    def key(self) -> str:
        return f"{self.job.id}#{self.attempt}"


@dataclass
class RayExecutor:
    """Each job a Ray task, placed by its backend's requirements. `address`: an existing cluster
    ('auto', 'ray://HOST:10001', ...); None: the one this process is connected to, else a local
    instance started for the sweep and stopped after it. `shared_storage`: the sweep's output folder
    is mounted at the same path on every node, so jobs write there instead of returning their files
    through the object store."""

    address: str | None = None
    shared_storage: bool = False
    poll_s: float = 0.5
    name: str = "ray"
    init_options: Mapping[str, Any] = field(default_factory=dict)

    def run(
        self, jobs: Sequence[JobSpec], jobs_dir: Path, progress: FleetProgress, timeout: float, retries: int
    ) -> list[FleetJob]:
        """Run the jobs on a Ray cluster (one started here where none runs, stopped after), each where its
        requirements place it; how each ended."""
        ray = _import_ray()
        started_here = False
        if not ray.is_initialized():
            try:
                ray.init(
                    address=self.address,
                    include_dashboard=False,
                    log_to_driver=False,
                    logging_level="ERROR",
                    **self.init_options,
                )
            except (ConnectionError, RuntimeError, ValueError) as error:
                where = self.address or "a local instance"
                raise UsageError(
                    f"cannot start or reach Ray at {where} ({str(error).splitlines()[0][:200]}); check "
                    "--address "
                    "(e.g. auto, or ray://HEAD:10001), or run with --executor local"
                ) from error
            started_here = True
        try:
            return self._run(ray, jobs, jobs_dir.resolve(), progress, timeout, retries)
        finally:
            if started_here:
                ray.shutdown()

    def _run(
        self,
        ray: Any,
        jobs: Sequence[JobSpec],
        jobs_dir: Path,
        progress: FleetProgress,
        timeout: float,
        retries: int,
    ) -> list[FleetJob]:
        nodes = [node for node in ray.nodes() if node.get("Alive")]
        task = ray.remote(_ray_job)
        tracker = ray.remote(_Tracker).options(num_cpus=0).remote()
        bundles: dict[str, Any] = {}
        out: list[FleetJob] = []
        pending: list[_Pending] = []

        def submit(job: JobSpec, attempt: int, died: list[str]) -> None:
            bundle = None
            if not self.shared_storage:
                if job.model not in bundles:
                    bundles[job.model] = ray.put(_bundle(job))
                bundle = bundles[job.model]
            dest = None if not self.shared_storage else str(jobs_dir / job.folder)
            opts = {**placement(job.requires), "max_retries": 0, "retry_exceptions": False}
            ref = task.options(**opts).remote(
                job_to_json(job), bundle, dest, tracker, f"{job.id}#{attempt}", forced(jobs_dir / job.folder)
            )
            pending.append(_Pending(job, attempt, ref, died))

        for job in jobs:
            why = _infeasible(job.requires, nodes)
            if why:
                fj = FleetJob(job, "failed", why, {}, 0)
                progress.finished(job.id, "-", fj.status)
                out.append(fj)
            else:
                submit(job, 1, [])
        seen: set[str] = set()
        try:
            while pending:
                ready, _ = ray.wait([p.ref for p in pending], num_returns=1, timeout=self.poll_s)
                starts = ray.get(tracker.snapshot.remote())
                now = time.time()
                for p in pending:
                    t0, node = starts.get(p.key, (None, {}))
                    if t0 is None:
                        continue
                    if p.key not in seen:
                        seen.add(p.key)
                        progress.started(p.job.id, node_label(node))
                    if not p.cancelled and now - t0 > timeout:
                        p.cancelled = f"timed out after {timeout:g} s (job_timeout)"
                        ray.cancel(p.ref, force=True)
                for p in [p for p in pending if p.ref in ready]:
                    pending.remove(p)
                    node = starts.get(p.key, (0.0, {}))[1]
                    got = self._collect(ray, p, node, jobs_dir, retries)
                    if got is None:  # the process or node died: again, while retries last
                        submit(p.job, p.attempt + 1, p.died)
                        continue
                    progress.finished(p.job.id, got.node_name or "-", got.status)
                    out.append(got)
        except BaseException:  # interrupted: a cluster's tasks go with the sweep
            for p in pending:
                ray.cancel(p.ref, force=True)
            raise
        return out

    def _collect(
        self, ray: Any, pending: _Pending, node: Mapping[str, Any], jobs_dir: Path, retries: int
    ) -> FleetJob | None:
        from ray.exceptions import RayError, RayTaskError, TaskCancelledError  # optional: the ray extra

        try:
            rec, files = ray.get(pending.ref)
        except TaskCancelledError:
            return FleetJob(pending.job, "failed", pending.cancelled or "cancelled", node, pending.attempt)
        except RayTaskError as error:  # xbackend raised on the node: the same again on a retry
            return FleetJob(
                pending.job, "failed", f"the job raised on its node: {_first(error)}", node, pending.attempt
            )
        except RayError as error:
            if pending.cancelled:
                return FleetJob(pending.job, "failed", pending.cancelled, node, pending.attempt)
            where = f" on {node_label(node)}" if node else ""
            pending.died.append(f"attempt {pending.attempt}: {type(error).__name__}{where}: {_first(error)}")
            if len(pending.died) <= retries:
                return None
            return FleetJob(pending.job, "failed", "; ".join(pending.died), node, pending.attempt)
        if files is not None:
            _write_files(jobs_dir / pending.job.folder, files)
        return FleetJob(
            pending.job,
            record_status(rec),
            str(rec.get("reason", "")),
            rec.get("node", {}),
            pending.attempt,
            rec,
        )


def _first(base_exception: BaseException) -> str:
    text = str(base_exception).strip().splitlines()
    lines = [ln.strip() for ln in text if ln.strip()]
    return (lines[-1] if lines else type(base_exception).__name__)[:300]


def _infeasible(req: Requirements, nodes: Sequence[Mapping[str, Any]]) -> str:
    if not nodes:
        return "the Ray cluster has no live node"
    lacks = [node_feasible(req, node) for node in nodes]
    if all(lacks):
        per = "; ".join(
            f"{node.get('NodeManagerHostname', '?')} ({node.get('NodeManagerAddress', '?')}): {why}"
            for node, why in zip(nodes, lacks, strict=True)
        )
        return f"no node in the Ray cluster has {req.describe()} ({per})"
    return ""
