"""The fleet report: models x backends verdicts, the worst pairs, every job and node.

Same sweep, same inputs, same nodes and environments: same bytes (no times, no Ray ids).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from xbackend.files.textfmt import inert, prose, short, with_module
from xbackend.report.markup import Ours, fenced, only_our_html, strong, table
from xbackend.results import Result
from xbackend.results.findings import Finding, Kind, Label, labelled
from xbackend.sweep.outcomes import FleetJob, FleetResult, ModelOutcome, node_label, relpath

__all__ = ["FLEET_SCHEMA", "cell_for", "fleet_findings", "fleet_json", "fleet_markdown", "fleet_verdict"]

FLEET_SCHEMA = "xbackend.fleet/1"
WORST = 10


def _failure_kind(reason: str) -> str:
    r = reason.lower()
    for needle, kind in (
        ("timed out", "timed out"),
        ("no node", "no node"),
        ("died", "died"),
        ("model not run", "model"),
        ("crashed", "crashed"),
    ):
        if needle in r:
            return kind
    return "failed"


def _job_warnings(model_outcome: ModelOutcome, fleet_job: FleetJob) -> list[Finding]:
    """The job's own findings (its probes) that the model's comparison does not repeat."""
    seen = set(model_outcome.findings)
    return [warning for warning in fleet_job.warnings if warning not in seen]


def _entry(model_outcome: ModelOutcome, fleet_job: FleetJob) -> dict[str, Any]:
    """One matrix cell as data."""
    if not fleet_job.ok:
        status = "unavailable" if fleet_job.status == "unavailable" else "error"
        return {
            "verdict": status,
            "status": fleet_job.status,
            "reason": fleet_job.reason,
            "kind": _failure_kind(fleet_job.reason),
        }
    result = model_outcome.result
    if result is None:
        return {
            "verdict": "error",
            "status": "ok",
            "reason": model_outcome.error or "no comparison",
            "kind": "failed",
        }
    backend = result.backend(fleet_job.job.backend)
    out: dict[str, Any] = {
        "status": "ok",
        "deterministic": backend.deterministic,
        "distinct_outputs": backend.distinct_outputs,
        "runs": backend.runs,
        "builds": backend.builds,
        "reference": result.reference_used,
    }
    fail = backend.deterministic is False
    if backend.name != result.reference_used:
        try:
            cross = result.cross(backend.name)
        except KeyError:
            cross = None
        if cross is not None and cross.status == "ok":
            out.update(
                scaled_ulp=cross.scaled_ulp,
                max_ulp=cross.max_ulp,
                within_tolerance=not cross.violates,
                first_divergence=cross.first_divergence,
            )
            fail = fail or cross.violates
    broken = [promise.name for promise in result.broken_promises if promise.backend == backend.name]
    out["promises_broken"] = broken
    out["job_warnings"] = [warning.line for warning in _job_warnings(model_outcome, fleet_job)]
    fail = fail or bool(broken)
    out["verdict"] = "fail" if fail else ("warn" if out["job_warnings"] else "pass")
    return out


def cell_for(e: Mapping[str, Any]) -> str:
    """A matrix cell in a few words: verdict, determinism, distance from the reference."""
    if e["verdict"] in ("error", "unavailable"):
        return strong(e["verdict"], f" ({e['kind']})")
    parts = [e["verdict"].upper()]
    parts.append("det" if e["deterministic"] else f"NONDET ({e['distinct_outputs']} outputs)")
    if "scaled_ulp" in e:
        tol = "" if e["within_tolerance"] else " > tol"
        parts.append(f"{short(e['scaled_ulp'])} ULP{tol}")
    elif e.get("reference") is not None:
        parts.append("reference")
    if e["promises_broken"]:
        parts.append("promise broken")
    if e["job_warnings"]:
        parts.append(f"{len(e['job_warnings'])} warning(s)")
    return " · ".join(parts)


def _matrix(fleet_result: FleetResult) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for model in fleet_result.models:
        row = {}
        for backend in model.entry.backends:
            row[backend] = _entry(model, fleet_result.job(model.entry.name, backend))
        out[model.entry.name] = row
    return out


def _worst_pairs(fleet_result: FleetResult) -> list[dict[str, Any]]:
    rows = []
    for model in fleet_result.models:
        res = model.result
        if res is None:
            continue
        mods = res.model.modules()
        for pair in res.pairs:
            if pair.bitwise_equal:
                continue
            first = None
            for name, other in ((pair.a, pair.b), (pair.b, pair.a)):
                if other == res.reference_used:
                    try:
                        fd = res.cross(name).first_divergence
                    except KeyError:
                        fd = None
                    first = with_module(fd, mods) if fd else None
            rows.append(
                {
                    "model": model.entry.name,
                    "a": pair.a,
                    "b": pair.b,
                    "scaled_ulp": pair.scaled_ulp,
                    "max_ulp": pair.max_ulp,
                    "first_divergence": first,
                }
            )
    rows.sort(
        key=lambda row: (
            -(float(row["scaled_ulp"]) if row["scaled_ulp"] is not None else -1.0),
            str(row["model"]),
            str(row["a"]),
            str(row["b"]),
        )
    )
    return rows[:WORST]


def _nodes(fleet_result: FleetResult) -> list[dict[str, Any]]:
    nodes: dict[str, dict[str, Any]] = {}
    for job in fleet_result.jobs:
        if not job.node:
            continue
        n = nodes.setdefault(
            node_label(job.node),
            {
                "node": node_label(job.node),
                "labels": dict(job.node.get("labels", {})),
                "jobs": 0,
                "environment": {},
            },
        )
        n["jobs"] += 1
        env = (job.record or {}).get("environment")
        if env and not n["environment"]:
            n["environment"] = dict(env)
            n["environment_sha256"] = (job.record or {}).get("environment_sha256", "")
    return [nodes[node] for node in sorted(nodes)]


def _job_row(fleet_result: FleetResult, fleet_job: FleetJob) -> dict[str, Any]:
    folder = fleet_result.spec.output / "jobs" / fleet_job.job.folder
    has_report = fleet_job.record is not None and (folder / "report.md").is_file()
    return {
        "id": fleet_job.job.id,
        "model": fleet_job.job.model,
        "backend": fleet_job.job.backend,
        "status": fleet_job.status,
        "reason": fleet_job.reason,
        "node": node_label(fleet_job.node) if fleet_job.node else None,
        "assigned": dict(fleet_job.node.get("assigned", {})) if fleet_job.node else {},
        "attempts": fleet_job.attempts,
        "requires": fleet_job.job.requires.to_json(),
        "key": fleet_job.job.key,
        "report": f"jobs/{fleet_job.job.folder}/report.md" if has_report else None,
        "capture": f"jobs/{fleet_job.job.folder}/capture" if fleet_job.ok else None,
    }


def fleet_findings(fleet_result: FleetResult) -> list[Finding]:
    """The fleet's findings, failures first: each model's (but its passes and notes), each job's
    own; one PASS when nothing failed."""
    found = []
    for m in fleet_result.models:
        if m.error:
            found.append(Finding(Label.FAIL, Kind.SWEEP_MODEL_FAILED, f"{m.entry.name}: {m.error}"))
    for j in fleet_result.failed:
        why = f"job {j.job.id} {j.status}: {j.reason}"
        found.append(Finding(Label.FAIL, Kind.SWEEP_JOB_FAILED, why, backend=j.job.backend))
    for m in fleet_result.models:
        found += [
            finding.with_sentence(f"{m.entry.name}: {finding.sentence}")
            for finding in m.findings
            if finding.label not in (Label.PASS, Label.NOTE)
        ]
        if m.note:
            found.append(Finding(Label.WARN, Kind.SWEEP_NOTE, f"{m.entry.name}: {m.note}"))
    for j in fleet_result.jobs:
        m = fleet_result.model(j.job.model)
        found += [
            warning.with_sentence(f"job {j.job.id}: {warning.sentence}") for warning in _job_warnings(m, j)
        ]
    found.sort(key=lambda f: 0 if f.label is Label.FAIL else 1)
    if not labelled(found, Label.FAIL):
        words = (
            f"{len(fleet_result.jobs)} job(s) on {len(fleet_result.models)} model(s) ran; every backend "
            "deterministic and within "
            "tolerance of its model's reference"
        )
        found.insert(0, Finding(Label.PASS, Kind.PASS, words))
    return found


def fleet_verdict(fleet_result: FleetResult) -> list[str]:
    """The fleet's findings as verdict lines, most important first."""
    return [finding.line for finding in fleet_findings(fleet_result)]


def to_dict(fleet_result: FleetResult) -> dict[str, Any]:
    """The fleet's result as the fleet JSON's dictionary: the sweep, each job, the fleet's verdict."""
    out = fleet_result.spec.output
    return {
        "schema": FLEET_SCHEMA,
        "sweep": {
            "name": fleet_result.spec.name,
            "file": relpath(fleet_result.spec.path, out),
            "retries": fleet_result.spec.retries,
            "job_timeout": fleet_result.spec.job_timeout,
            "backends": [
                {
                    "name": backend.name,
                    "options": dict(backend.options),
                    "requires": backend.requires.to_json(),
                }
                for backend in fleet_result.spec.backends
            ],
        },
        "executor": fleet_result.executor,
        "exit_code": fleet_result.exit_code,
        "verdict": fleet_verdict(fleet_result),
        "summary": {
            "jobs": len(fleet_result.jobs),
            "ok": sum(job.ok for job in fleet_result.jobs),
            "failed": sum(not job.ok for job in fleet_result.jobs),
            "models": len(fleet_result.models),
            "backends": len(fleet_result.spec.backends),
        },
        "models": [_model_json(model) for model in fleet_result.models],
        "matrix": _matrix(fleet_result),
        "worst_pairs": _worst_pairs(fleet_result),
        "jobs": [_job_row(fleet_result, job) for job in fleet_result.jobs],
        "nodes": _nodes(fleet_result),
    }


def _model_json(model_outcome: ModelOutcome) -> dict[str, Any]:
    res: Result | None = model_outcome.result
    return {
        "name": model_outcome.entry.name,
        "path": model_outcome.entry.path.name,
        "sha256": model_outcome.sha256,
        "backends": list(model_outcome.entry.backends),
        "error": model_outcome.error,
        "reference": res.reference_used if res else None,
        "note": model_outcome.note,
        "report": model_outcome.report if res else None,
        "exit_code": res.exit_code if res else None,
        "verdict": list(model_outcome.verdict),
    }


def fleet_json(fleet_result: FleetResult, d: Mapping[str, Any] | None = None) -> str:
    """`d`: to_dict(r), when the caller has it already."""
    return json.dumps(d or to_dict(fleet_result), indent=2, sort_keys=True, allow_nan=False) + "\n"


def fleet_markdown(fleet_result: FleetResult, d: Mapping[str, Any] | None = None) -> str:
    """`d`: to_dict(r), when the caller has it already."""
    d = d or to_dict(fleet_result)
    lines = [
        *_md_verdict(fleet_result, d),
        *_md_matrix(fleet_result, d),
        *_md_worst_pairs(d),
        *_md_jobs(d),
        *_md_nodes(d),
        "## Reproduce",
        "",
        "From this report's folder:",
        "",
        *fenced(
            f"xbackend sweep {d['sweep']['file']}"
            + (" --executor ray" if fleet_result.executor == "ray" else "")
        ),
        "",
    ]
    return only_our_html("\n".join(lines))


def _md_verdict(fleet_result: FleetResult, d: Mapping[str, Any]) -> list[str]:
    summary = d["summary"]
    lines = [f"# xbackend fleet report: {inert(fleet_result.spec.name)}", ""]
    found = fleet_findings(fleet_result)
    lines += [
        f"**{prose(finding.line)}**"
        if finding.label in (Label.PASS, Label.FAIL)
        else f"- {prose(finding.line)}"
        for finding in found[:1]
    ]
    lines += [f"- {prose(finding.line)}" for finding in found[1:]]
    return [
        *lines,
        "",
        f"{summary['models']} model(s) x {summary['backends']} backend(s): {summary['jobs']} job(s), "
        f"{summary['ok']} ok, "
        f"{summary['failed']} failed; executor {fleet_result.executor}; exit code {fleet_result.exit_code}.",
        "",
    ]


def _md_matrix(fleet_result: FleetResult, d: Mapping[str, Any]) -> list[str]:
    backends = [backend.name for backend in fleet_result.spec.backends]
    rows = []
    for model in fleet_result.models:
        name = (
            Ours(f"[{inert(model.entry.name)}]({model.report})")
            if model.result is not None
            else inert(model.entry.name)
        )
        cells = [d["matrix"][model.entry.name].get(backend) for backend in backends]
        rows.append([name, *("–" if cell is None else cell_for(cell) for cell in cells)])
    return [
        "## Verdicts",
        "",
        "Each cell: the verdict; `det` (bit-identical over every run and build) or `NONDET`; the distance "
        "from the model's reference at the graph outputs in scaled ULP (`> tol` past its max_ulp); "
        "warnings from the job's own probes. Model names link to each model's report.",
        "",
        *table(["model", *backends], rows),
    ]


def _md_worst_pairs(d: Mapping[str, Any]) -> list[str]:
    if not d["worst_pairs"]:
        return [
            "## Worst pairs",
            "",
            "Every pair of backends that ran agrees bit for bit at the graph outputs.",
            "",
        ]
    rows = [
        [
            worst_pair["model"],
            f"{worst_pair['a']} vs {worst_pair['b']}",
            short(worst_pair["scaled_ulp"]),
            worst_pair["max_ulp"] if worst_pair["max_ulp"] is not None else "–",
            worst_pair["first_divergence"] or "–",
        ]
        for worst_pair in d["worst_pairs"]
    ]
    header = ["model", "pair", "scaled ULP", "max ULP", "first divergent tensor (vs reference)"]
    return ["## Worst pairs", "", *table(header, rows)]


def _md_jobs(d: Mapping[str, Any]) -> list[str]:
    rows = [
        [
            job["id"],
            job["status"],
            job["node"] or "–",
            job["attempts"],
            f"[report]({job['report']})" if job["report"] else "–",
            job["reason"] or "",
        ]
        for job in d["jobs"]
    ]
    return ["## Jobs", "", *table(["job", "status", "node", "attempts", "report", "reason"], rows)]


def _md_nodes(d: Mapping[str, Any]) -> list[str]:
    if not d["nodes"]:
        return ["## Nodes", "", "No job reached a node.", ""]
    rows = [
        [
            node["node"],
            ", ".join(f"{key}={value}" for key, value in sorted(node["labels"].items())) or "–",
            node["jobs"],
            node["environment"].get("python", "?"),
            node["environment"].get("package.xbackend", "?"),
            f"{node['environment'].get('cpu.model', '?')} ({node['environment'].get('cpu.isa', '?')})",
            node.get("environment_sha256", "")[:16],
        ]
        for node in d["nodes"]
    ]
    header = ["node", "labels", "jobs", "python", "xbackend", "cpu", "environment sha256"]
    return ["## Nodes", "", *table(header, rows)]
