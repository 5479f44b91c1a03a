"""What runs on a node: one model on one backend, as `compare` runs it, into a job folder.

A job folder holds:

    capture/      the backend's portable capture (xbackend.results.capture_record), when it ran
    report.md     the job's own report: its determinism and its probes (threads, batch, ...)
    report.json
    job.json      the record: status, reason, node, verdict lines and findings; written last

Each backend build still runs in its own worker process (xbackend.execution.isolation), so an engine
that crashes fails its job, not the node's task. The local executor runs this module as a
process per job (`main(["JOB.json", "DEST"])`); on Ray a task calls `run_job` on its node.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from xbackend.api.compare import compare_with_options
from xbackend.errors import XbackendError, first_line
from xbackend.files.owned import allow, new_part, replace_tree
from xbackend.files.untrusted import json_loads
from xbackend.host.environment import collect_environment
from xbackend.report import to_json, to_markdown, write_atomic
from xbackend.results.backend import BackendStatus
from xbackend.sweep.outcomes import environment_sha256
from xbackend.sweep.spec import JobSpec, Requirements

__all__ = [
    "JOB_FILE",
    "job_from_json",
    "job_to_json",
    "node_identity",
    "read_record",
    "record_status",
    "run_job",
]

JOB_FILE = "job.json"
RECORD_FORMAT = "xbackend.sweep-job/2"  # 2: the findings as records beside the verdict lines


def job_to_json(job: JobSpec) -> dict[str, Any]:
    """The job as JSON data, for the node that runs it."""
    return {
        "model": job.model,
        "model_path": job.model_path,
        "model_sha256": job.model_sha256,
        "backend": job.backend,
        "compare": dict(job.compare),
        "requires": job.requires.to_json(),
    }


def job_from_json(d: Mapping[str, Any]) -> JobSpec:
    """The job as job_to_json wrote it."""
    requires = d["requires"]
    req = Requirements(
        float(requires["num_cpus"]),
        float(requires["num_gpus"]),
        str(requires["accelerator_type"]),
        tuple(sorted((str(key), float(value)) for key, value in requires["resources"].items())),
        tuple(sorted((str(key), str(value)) for key, value in requires["labels"].items())),
    )
    return JobSpec(
        str(d["model"]), str(d["model_path"]), str(d["model_sha256"]), str(d["backend"]), d["compare"], req
    )


def node_identity() -> dict[str, Any]:
    """Which node this is, in terms that stay the same from one sweep to the next (no Ray ids)."""
    ident: dict[str, Any] = {"hostname": socket.gethostname()}
    try:
        import ray  # optional: only on a Ray worker

        if ray.is_initialized():
            ctx = ray.get_runtime_context()
            ident["address"] = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
            labels = ctx.get_node_labels() if hasattr(ctx, "get_node_labels") else {}
            ident["labels"] = {key: label for key, label in sorted(labels.items()) if key != "ray.io/node-id"}
            assigned = ctx.get_assigned_resources()  # type: ignore[no-untyped-call]
            ident["assigned"] = {key: float(value) for key, value in sorted(assigned.items())}
    except ImportError:
        pass
    return ident


def _record(job: JobSpec, status: str, reason: str, **extra: Any) -> dict[str, Any]:
    return {
        "format": RECORD_FORMAT,
        "id": job.id,
        "key": job.key,
        "model": job.model,
        "backend": job.backend,
        "status": status,
        "reason": reason,
        "node": node_identity(),
        **extra,
    }


def run_job(
    job: JobSpec,
    dest: str | os.PathLike[str],
    model_path: str | None = None,
    inputs_path: str | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Run `job` and leave its folder at `dest` (replaced whole, if what is there is xbackend's
    unchanged files, or `force`); returns the record. Backend trouble is a failed record, never an
    exception. `model_path`, `inputs_path`: where this node holds the job's files, when they were
    shipped to it."""
    out = Path(dest)
    if force:
        allow([out])
    part = new_part(out)
    try:
        return _run_job(job, out, part, model_path, inputs_path)
    finally:
        shutil.rmtree(part, ignore_errors=True)  # a failure or a signal leaves no part behind


def _run_job(
    job: JobSpec, out: Path, part: Path, model_path: str | None, inputs_path: str | None
) -> dict[str, Any]:
    env = collect_environment()
    common = {"environment": env, "environment_sha256": environment_sha256(env)}
    opts = job.options()
    if inputs_path is not None:
        opts = replace(opts, inputs=inputs_path)
    try:
        # its backend judged against float64 here, where its engine runs: the fleet's comparison
        # of captures takes each job's judgment
        result = compare_with_options(
            model_path or job.model_path, opts, None, part / "capture", judge_alone=True
        )
    except XbackendError as error:
        rec = _record(job, "failed", first_line(error), **common)
    else:
        b = result.backend(job.backend)
        status = "ok" if b.ok else ("unavailable" if b.status == "unavailable" else "failed")
        write_atomic(part / "report.md", to_markdown(result))
        write_atomic(part / "report.json", to_json(result))
        rec = _record(
            job,
            status,
            "" if b.ok else b.reason,
            verdict=result.verdict(),
            findings=[finding.to_json() for finding in result.findings()],
            exit_code=result.exit_code,
            **common,
        )
    write_atomic(part / JOB_FILE, json.dumps(rec, indent=2, sort_keys=True) + "\n", "job record")
    replace_tree(part, out, "the job folder")
    return rec


def read_record(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The job record in `folder`, or None when there is none (never ran, or interrupted)."""
    try:
        rec = json_loads((Path(folder) / JOB_FILE).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and rec.get("format") == RECORD_FORMAT else None


def main(argv: list[str]) -> int:
    """JOB.json DEST [--force]: the local executor's process per job."""
    job = job_from_json(json.loads(Path(argv[0]).read_text("utf-8")))
    run_job(job, argv[1], force="--force" in argv[2:])
    return 0


def record_status(record: Mapping[str, Any]) -> BackendStatus:
    """A job record's status: ok, failed or unavailable (anything else a record holds: failed)."""
    status = record.get("status")
    if status == "ok":
        return "ok"
    return "unavailable" if status == "unavailable" else "failed"
