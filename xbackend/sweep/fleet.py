"""A sweep: every model x backend job on an executor, then one comparison per model, centrally.

    SWEEP.toml ─► jobs (model x backend) ─► executor (local processes, or Ray tasks on a cluster)
               ─► OUT/jobs/MODEL/BACKEND/{capture/, report.md, report.json, job.json}
               ─► per model: compare the captures (as `compare --load` does) ─► OUT/models/MODEL.md|json
               ─► OUT/fleet.md + OUT/fleet.json

A job whose folder already holds a valid capture made under the same key (model bytes, options,
xbackend version) is not run again, so an interrupted sweep resumes where it stopped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from xbackend.api.compare import compare_with_options
from xbackend.comparison.saved_report import read_result
from xbackend.comparison.tolerances import attach
from xbackend.errors import InputError, UsageError, XbackendError, first_line
from xbackend.files.atomic import check_outputs
from xbackend.files.owned import allow, check_tree, forced, recorded
from xbackend.files.userfile import name_problem
from xbackend.model.load import load_model
from xbackend.planning.plan import make_feeds
from xbackend.report import bundle_outputs, write_atomic, write_markdown_bundle
from xbackend.results import CompareOptions, Result
from xbackend.results.capture_record import open_capture
from xbackend.results.explanation import Explanation, LocalErrors
from xbackend.sweep.executors import LocalExecutor
from xbackend.sweep.node import read_record
from xbackend.sweep.outcomes import (
    JOBS,
    MODELS,
    FleetJob,
    FleetProgress,
    FleetResult,
    ModelOutcome,
    NullFleetProgress,
    SweepExecutor,
)
from xbackend.sweep.report import fleet_json, fleet_markdown, to_dict
from xbackend.sweep.spec import JobSpec, ModelEntry, SweepSpec, check_backends, safe_name

__all__ = ["run_sweep", "write_fleet"]


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
    out = {}
    for model in spec.models:
        opts = CompareOptions.create(**{**model.compare, "backends": ["reference"]})
        try:
            ms, _ = load_model(model.path)
            make_feeds(ms, opts)  # the inputs compare will make on each node
        except XbackendError as error:
            out[model.name] = ModelOutcome(model, error=_sweep_hint(first_line(error), model.name))
            continue
        out[model.name] = ModelOutcome(model, sha256=ms.sha256)
    return out


def _resumable(job: JobSpec, folder: Path) -> dict[str, Any] | None:
    """The record of an earlier run of this very job whose capture is whole, else None."""
    rec = read_record(folder)
    if rec is None or rec.get("key") != job.key or rec.get("status") != "ok":
        return None
    try:
        open_capture(folder / "capture", job.backend)
    except InputError:
        return None
    return rec


def check_output(spec: SweepSpec, force: bool = False) -> None:
    """Before any job: the fleet folder is new, empty, or one a sweep wrote (its ledger lists a
    file), and every file the sweep would write or remove there (fleet.json, fleet.md, each
    model's report, each job folder whole) is xbackend's, unchanged since (xbackend.files.owned):
    a user's file in it is never overwritten or removed. A model named README writes
    models/README.md, refused in a folder where that is someone's. `force` (--force): the folder's
    files may be replaced."""
    out = spec.output
    flag = "the sweep's output"
    bad = name_problem(out)
    if bad:
        raise UsageError(f"{flag} {str(out)!a} {bad}")
    if force:
        allow([out])
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise UsageError(f"{flag} {out} is a file or a link; pass -o DIR with a new or empty folder")
    if not out.exists() or forced(out) or not any(out.iterdir()):
        return
    if not recorded(out):
        raise UsageError(
            f"{flag} {out} is a non-empty folder xbackend did not write; xbackend never writes into it: "
            "pass -o DIR with a new or empty folder (or --force)"
        )
    files: list[tuple[str, Path | None]] = [("-o", out / "fleet.json"), ("-o", out / "fleet.md")]
    for m in spec.models:
        md = out / MODELS / f"{safe_name(m.name)}.md"
        files += [*bundle_outputs("-o", md), ("-o", md.with_suffix(".json"))]
    check_outputs(files)
    for job in spec.jobs({model.name: "" for model in spec.models}):
        check_tree(f"{flag}'s job folder", out / JOBS / job.folder)


def run_sweep(
    spec: SweepSpec,
    executor: SweepExecutor | None = None,
    progress: FleetProgress | None = None,
    resume: bool = True,
    force: bool = False,
) -> FleetResult:
    """Run every job not already done, compare each model's captures, write the fleet report."""
    ex = executor or LocalExecutor()
    check_output(spec, force)
    if ex.name == "local":  # unknown runners and options fail here, before any job
        check_backends(spec)
    bar = progress or NullFleetProgress()
    jobs_dir = spec.output / JOBS
    models = _load_models(spec)
    jobs = spec.jobs({key: model.sha256 for key, model in models.items()})
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
    bar.start(len(jobs), sum(1 for fleet_job in done.values() if fleet_job.resumed))
    try:
        for fj in ex.run(todo, jobs_dir, bar, spec.job_timeout, spec.retries):
            done[fj.job.id] = fj
        bar.describe("comparing captures")
        outcomes = tuple(_compare_model(models[model.name], done, jobs_dir) for model in spec.models)
    finally:
        bar.stop()
    result = FleetResult(spec, ex.name, tuple(done[job.id] for job in jobs), outcomes)
    write_fleet(result)
    return result


def _reference(model_entry: ModelEntry, ok: Sequence[str]) -> tuple[str, str]:
    """The model's reference among the backends whose jobs succeeded, and a note when it had to change."""
    wanted = model_entry.reference or (
        "reference" if "reference" in model_entry.backends else model_entry.backends[0]
    )
    if wanted in ok:
        return wanted, ""
    return ok[0], f"the reference ({wanted}) has no capture (its job failed); compared against {ok[0]}"


def _compare_model(model_outcome: ModelOutcome, done: Mapping[str, FleetJob], jobs_dir: Path) -> ModelOutcome:
    if model_outcome.error:
        return model_outcome
    entry = model_outcome.entry
    ok = [backend for backend in entry.backends if done[f"{entry.name}/{backend}"].ok]
    if not ok:
        return model_outcome
    ref, note = _reference(entry, ok)
    kw: dict[str, Any] = {
        "backends": (),
        "loads": [
            (backend, str(jobs_dir / done[f"{entry.name}/{backend}"].job.folder / "capture"))
            for backend in ok
        ],
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
    except XbackendError as error:
        return ModelOutcome(
            entry, model_outcome.sha256, f"comparison failed: {first_line(error)}", None, ref, note
        )
    folders = {backend: jobs_dir / done[f"{entry.name}/{backend}"].job.folder for backend in ok}
    return ModelOutcome(entry, model_outcome.sha256, "", with_job_judgments(result, folders), ref, note)


def with_job_judgments(result: Result, folders: Mapping[str, Path]) -> Result:
    """The comparison of captures with each backend's per-node judgment, made by its job where its
    engine ran (captures carry no engine to judge here). A job whose judgment is missing leaves its
    backend not judged, with the reason; without any, the comparison stands as it was."""
    if result.options.noise_samples == 0:
        return result
    local: list[LocalErrors] = []
    base: Explanation | None = None
    for b in [backend.name for backend in result.backends if backend.ok]:
        folder = folders.get(b)
        try:
            job = read_result(folder / "report.json") if folder is not None else None
        except XbackendError as error:
            job, why = None, f"its job's report could not be read ({first_line(error)})"
        else:
            why = "its job kept no report"
        le = job.explanation.local_for(b) if job is not None and job.explanation.ok else None
        if le is None:
            reason = job.explanation.reason if job is not None and job.explanation.reason else why
            local.append(LocalErrors(b, "not-measured", f"its job did not judge it: {reason}"))
            continue
        if base is None and job is not None:  # the rules and the confidence they were judged at
            base = job.explanation
        local.append(le)
    if base is None:
        return result
    ex = replace(base, local=tuple(local), floors=())
    cross = attach(result.cross_backend, ex, result.model.op_types(), result.options.auto_tolerance)
    return replace(result, explanation=ex, cross_backend=cross)


def write_fleet(fleet_result: FleetResult) -> None:
    """Per-model reports, then fleet.json and fleet.md last (each written atomically)."""
    out = fleet_result.spec.output
    for model in fleet_result.models:
        if model.result is not None:
            md = out / model.report
            write_markdown_bundle(model.result, md, md.with_suffix(".json"))
    d = to_dict(fleet_result)
    write_atomic(out / "fleet.json", fleet_json(fleet_result, d), "fleet report")
    write_atomic(out / "fleet.md", fleet_markdown(fleet_result, d), "fleet report")
