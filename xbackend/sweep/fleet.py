"""A sweep: every model x backend job on an executor, then one comparison per model, centrally.

    SWEEP.toml ─► jobs (model x backend) ─► executor (local processes, or Ray tasks on a cluster)
               ─► OUT/jobs/MODEL/BACKEND/{capture/, report.md, report.json, job.json}
               ─► per model: compare the captures (as `compare --load` does) ─► OUT/models/MODEL.md|json
               ─► OUT/fleet.md + OUT/fleet.json

A job whose folder already holds a valid capture made under the same key (model bytes, options,
xbackend version) is not run again, so an interrupted sweep resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

from xbackend.errors import EXIT_ALL_FAILED, EXIT_DIFFERENCES, EXIT_OK, InputError, XbackendError, first_line
from xbackend.results import CompareOptions, Result
from xbackend.sweep.spec import JobSpec, ModelEntry, SweepSpec, check_backends, safe_name

__all__ = [
    "FleetJob",
    "FleetProgress",
    "FleetResult",
    "ModelOutcome",
    "NullFleetProgress",
    "environment_sha256",
    "run_sweep",
]

JOBS = "jobs"
MODELS = "models"


def environment_sha256(env: Mapping[str, str]) -> str:
    return hashlib.sha256("".join(f"{k}={v}\n" for k, v in sorted(env.items())).encode()).hexdigest()


class FleetProgress(Protocol):
    def start(self, total: int, resumed: int) -> None: ...
    def started(self, job: str, node: str) -> None: ...
    def finished(self, job: str, node: str, status: str) -> None: ...
    def describe(self, text: str) -> None: ...
    def stop(self) -> None: ...


class NullFleetProgress:
    def start(self, total: int, resumed: int) -> None:
        pass

    def started(self, job: str, node: str) -> None:
        pass

    def finished(self, job: str, node: str, status: str) -> None:
        pass

    def describe(self, text: str) -> None:
        pass

    def stop(self) -> None:
        pass


@dataclass(frozen=True)
class FleetJob:
    """How one job ended, wherever it ran."""

    job: JobSpec
    status: str  # "ok" | "failed" | "unavailable"
    reason: str = ""
    node: Mapping[str, Any] = field(default_factory=dict)
    attempts: int = 1
    record: Mapping[str, Any] | None = None  # the job's job.json, when it wrote one
    resumed: bool = False  # an earlier sweep's valid capture, not run again

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def node_name(self) -> str:
        return node_label(self.node)

    @property
    def warnings(self) -> list[str]:
        """The job's own WARN and FAIL lines (its probes: threads, batch, ...)."""
        if not self.record:
            return []
        return [v for v in self.record.get("verdict", []) if v.startswith(("WARN", "FAIL"))]


def node_label(node: Mapping[str, Any]) -> str:
    host = str(node.get("hostname", "?"))
    addr = node.get("address")
    return f"{host} ({addr})" if addr else host


class SweepExecutor(Protocol):
    name: str

    def run(
        self, jobs: Sequence[JobSpec], jobs_dir: Path, progress: FleetProgress, timeout: float, retries: int
    ) -> list[FleetJob]: ...


@dataclass(frozen=True)
class ModelOutcome:
    entry: ModelEntry
    sha256: str = ""
    error: str = ""  # the model could not be loaded: none of its jobs ran
    result: Result | None = None  # the comparison of its captures
    reference: str = ""
    note: str = ""

    @property
    def report(self) -> str:
        return f"{MODELS}/{safe_name(self.entry.name)}.md"

    @cached_property
    def verdict(self) -> tuple[str, ...]:
        """The comparison's verdict lines (computed once: the fleet report reads them per job)."""
        return tuple(self.result.verdict()) if self.result is not None else ()


@dataclass(frozen=True)
class FleetResult:
    spec: SweepSpec
    executor: str
    jobs: tuple[FleetJob, ...]
    models: tuple[ModelOutcome, ...]

    def job(self, model: str, backend: str) -> FleetJob:
        for j in self.jobs:
            if j.job.model == model and j.job.backend == backend:
                return j
        raise KeyError((model, backend))

    def model(self, name: str) -> ModelOutcome:
        for m in self.models:
            if m.entry.name == name:
                return m
        raise KeyError(name)

    @property
    def failed(self) -> list[FleetJob]:
        return [j for j in self.jobs if not j.ok]

    @property
    def exit_code(self) -> int:
        """0 every job ran and every comparison passed; 16 a promise broke; 1 any other finding or
        a failed job; 3 no job ran at all."""
        if not any(j.ok for j in self.jobs):
            return EXIT_ALL_FAILED
        codes = {m.result.exit_code for m in self.models if m.result is not None}
        from xbackend.promises import EXIT_PROMISE

        if EXIT_PROMISE in codes:
            return EXIT_PROMISE
        if self.failed or any(m.error for m in self.models) or codes - {EXIT_OK}:
            return EXIT_DIFFERENCES
        return EXIT_OK


def _sweep_hint(message: str, model: str) -> str:
    """An input error's CLI advice, said in the sweep file's terms."""
    shape = re.search(r"pass --shape (\S+?)=([\d,]+)", message)
    if shape:
        dims = ", ".join(shape.group(2).split(","))
        fix = f"add shapes = {{ {shape.group(1)} = [{dims}] }} to model {model} in the sweep file"
        return message[: shape.start()] + fix + message[shape.end() :]
    for flag, key in (("--shape", "shapes"), ("--range", "ranges"), ("--inputs", "inputs")):
        message = message.replace(flag, f"{key} (in model {model}'s entry)")
    return message


def _load_models(spec: SweepSpec) -> dict[str, ModelOutcome]:
    """Each model read, and its inputs made, once here: a model that cannot be read or fed fails its
    own jobs at once (not on every node), and the sweep goes on."""
    from xbackend.compare import _feeds
    from xbackend.model import load_model

    out = {}
    for m in spec.models:
        opts = CompareOptions.create(**{**m.compare, "backends": ["reference"]})
        try:
            ms, _ = load_model(m.path)
            _feeds(ms, opts)  # the inputs compare will make on each node
        except XbackendError as e:
            out[m.name] = ModelOutcome(m, error=_sweep_hint(first_line(e), m.name))
            continue
        out[m.name] = ModelOutcome(m, sha256=ms.sha256)
    return out


def _resumable(job: JobSpec, folder: Path) -> dict[str, Any] | None:
    """The record of an earlier run of this very job whose capture is whole, else None."""
    from xbackend.portable import load_capture
    from xbackend.sweep.node import read_record

    rec = read_record(folder)
    if rec is None or rec.get("key") != job.key or rec.get("status") != "ok":
        return None
    try:
        load_capture(folder / "capture", job.backend)
    except InputError:
        return None
    return rec


def run_sweep(
    spec: SweepSpec,
    executor: SweepExecutor | None = None,
    progress: FleetProgress | None = None,
    resume: bool = True,
) -> FleetResult:
    """Run every job not already done, compare each model's captures, write the fleet report."""
    from xbackend.sweep.executors import LocalExecutor

    ex = executor or LocalExecutor()
    if ex.name == "local":  # unknown runners and options fail here, before any job
        check_backends(spec)
    bar = progress or NullFleetProgress()
    jobs_dir = spec.output / JOBS
    models = _load_models(spec)
    jobs = spec.jobs({k: m.sha256 for k, m in models.items()})
    done: dict[str, FleetJob] = {}
    todo: list[JobSpec] = []
    for job in jobs:
        m = models[job.model]
        if m.error:
            done[job.id] = FleetJob(job, "failed", f"model not run: {m.error}", attempts=0)
            continue
        rec = _resumable(job, jobs_dir / job.folder) if resume else None
        if rec is not None:
            done[job.id] = FleetJob(job, "ok", "", rec.get("node", {}), 1, rec, resumed=True)
        else:
            todo.append(job)
    bar.start(len(jobs), sum(1 for j in done.values() if j.resumed))
    try:
        for fj in ex.run(todo, jobs_dir, bar, spec.job_timeout, spec.retries):
            done[fj.job.id] = fj
        bar.describe("comparing captures")
        outcomes = tuple(_compare_model(models[m.name], done, jobs_dir) for m in spec.models)
    finally:
        bar.stop()
    result = FleetResult(spec, ex.name, tuple(done[j.id] for j in jobs), outcomes)
    write_fleet(result)
    return result


def _reference(m: ModelEntry, ok: Sequence[str]) -> tuple[str, str]:
    """The model's reference among the backends whose jobs succeeded, and a note when it had to change."""
    wanted = m.reference or ("reference" if "reference" in m.backends else m.backends[0])
    if wanted in ok:
        return wanted, ""
    return ok[0], f"reference {wanted} has no capture (its job failed); compared against {ok[0]}"


def _compare_model(m: ModelOutcome, done: Mapping[str, FleetJob], jobs_dir: Path) -> ModelOutcome:
    from xbackend.compare import compare_with_options

    if m.error:
        return m
    entry = m.entry
    ok = [b for b in entry.backends if done[f"{entry.name}/{b}"].ok]
    if not ok:
        return m
    ref, note = _reference(entry, ok)
    kw: dict[str, Any] = {
        "backends": (),
        "loads": [(b, str(jobs_dir / done[f"{entry.name}/{b}"].job.folder / "capture")) for b in ok],
        "reference": ref,
        "max_ulp": entry.max_ulp,
        "probes": "none",
    }
    for k in ("runs", "builds", "outputs_only"):
        if k in entry.compare:
            kw[k] = entry.compare[k]
    if "inputs" in entry.compare:  # golden outputs beside them join as 'expected'
        kw["inputs"] = entry.compare["inputs"]
    try:
        result = compare_with_options(entry.path, CompareOptions.create(**kw))
    except XbackendError as e:
        return ModelOutcome(entry, m.sha256, f"comparison failed: {first_line(e)}", None, ref, note)
    return ModelOutcome(entry, m.sha256, "", result, ref, note)


def write_fleet(r: FleetResult) -> None:
    """Per-model reports, then fleet.json and fleet.md last (each written atomically)."""
    from xbackend.report import to_json, write_atomic, write_markdown_bundle
    from xbackend.report.fleet import fleet_json, fleet_markdown, to_dict

    out = r.spec.output
    for m in r.models:
        if m.result is not None:
            md = out / m.report
            write_markdown_bundle(m.result, md)
            write_atomic(md.with_suffix(".json"), to_json(m.result))
    d = to_dict(r)
    write_atomic(out / "fleet.json", fleet_json(r, d), "fleet report")
    write_atomic(out / "fleet.md", fleet_markdown(r, d), "fleet report")


def relpath(path: str | os.PathLike[str], start: Path) -> str:
    try:
        return os.path.relpath(path, start)
    except ValueError:  # another drive
        return str(path)
