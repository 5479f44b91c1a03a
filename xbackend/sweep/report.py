"""The fleet report: models x backends verdicts, the worst pairs, every job and node.

Same sweep, same inputs, same nodes and environments: same bytes (no times, no Ray ids).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from xbackend.files.textfmt import (
    Ours,
    fenced,
    inert,
    only_our_html,
    prose,
    short,
    strong,
    table,
    with_module,
)
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


def _job_warnings(m: ModelOutcome, j: FleetJob) -> list[Finding]:
    """The job's own findings (its probes) that the model's comparison does not repeat."""
    seen = set(m.findings)
    return [warning for warning in j.warnings if warning not in seen]


def _entry(m: ModelOutcome, j: FleetJob) -> dict[str, Any]:
    """One matrix cell as data."""
    if not j.ok:
        status = "unavailable" if j.status == "unavailable" else "error"
        return {"verdict": status, "status": j.status, "reason": j.reason, "kind": _failure_kind(j.reason)}
    r = m.result
    if r is None:
        return {"verdict": "error", "status": "ok", "reason": m.error or "no comparison", "kind": "failed"}
    b = r.backend(j.job.backend)
    out: dict[str, Any] = {
        "status": "ok",
        "deterministic": b.deterministic,
        "distinct_outputs": b.distinct_outputs,
        "runs": b.runs,
        "builds": b.builds,
        "reference": r.reference_used,
    }
    fail = b.deterministic is False
    if b.name != r.reference_used:
        try:
            c = r.cross(b.name)
        except KeyError:
            c = None
        if c is not None and c.status == "ok":
            out.update(
                scaled_ulp=c.scaled_ulp,
                max_ulp=c.max_ulp,
                within_tolerance=not c.violates,
                first_divergence=c.first_divergence,
            )
            fail = fail or c.violates
    broken = [promise.name for promise in r.broken_promises if promise.backend == b.name]
    out["promises_broken"] = broken
    out["job_warnings"] = [warning.line for warning in _job_warnings(m, j)]
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


def _matrix(r: FleetResult) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for m in r.models:
        row = {}
        for backend in m.entry.backends:
            row[backend] = _entry(m, r.job(m.entry.name, backend))
        out[m.entry.name] = row
    return out


def _worst_pairs(r: FleetResult) -> list[dict[str, Any]]:
    rows = []
    for m in r.models:
        res = m.result
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
                    "model": m.entry.name,
                    "a": pair.a,
                    "b": pair.b,
                    "scaled_ulp": pair.scaled_ulp,
                    "max_ulp": pair.max_ulp,
                    "first_divergence": first,
                }
            )
    rows.sort(
        key=lambda x: (
            -(float(x["scaled_ulp"]) if x["scaled_ulp"] is not None else -1.0),
            str(x["model"]),
            str(x["a"]),
            str(x["b"]),
        )
    )
    return rows[:WORST]


def _nodes(r: FleetResult) -> list[dict[str, Any]]:
    nodes: dict[str, dict[str, Any]] = {}
    for j in r.jobs:
        if not j.node:
            continue
        n = nodes.setdefault(
            node_label(j.node),
            {
                "node": node_label(j.node),
                "labels": dict(j.node.get("labels", {})),
                "jobs": 0,
                "environment": {},
            },
        )
        n["jobs"] += 1
        env = (j.record or {}).get("environment")
        if env and not n["environment"]:
            n["environment"] = dict(env)
            n["environment_sha256"] = (j.record or {}).get("environment_sha256", "")
    return [nodes[k] for k in sorted(nodes)]


def _job_row(r: FleetResult, j: FleetJob) -> dict[str, Any]:
    folder = r.spec.output / "jobs" / j.job.folder
    has_report = j.record is not None and (folder / "report.md").is_file()
    return {
        "id": j.job.id,
        "model": j.job.model,
        "backend": j.job.backend,
        "status": j.status,
        "reason": j.reason,
        "node": node_label(j.node) if j.node else None,
        "assigned": dict(j.node.get("assigned", {})) if j.node else {},
        "attempts": j.attempts,
        "requires": j.job.requires.to_json(),
        "key": j.job.key,
        "report": f"jobs/{j.job.folder}/report.md" if has_report else None,
        "capture": f"jobs/{j.job.folder}/capture" if j.ok else None,
    }


def fleet_findings(r: FleetResult) -> list[Finding]:
    """The fleet's findings, failures first: each model's (but its passes and notes), each job's
    own; one PASS when nothing failed."""
    found = []
    for m in r.models:
        if m.error:
            found.append(Finding(Label.FAIL, Kind.SWEEP_MODEL_FAILED, f"{m.entry.name}: {m.error}"))
    for j in r.failed:
        why = f"job {j.job.id} {j.status}: {j.reason}"
        found.append(Finding(Label.FAIL, Kind.SWEEP_JOB_FAILED, why, backend=j.job.backend))
    for m in r.models:
        found += [
            finding.with_sentence(f"{m.entry.name}: {finding.sentence}")
            for finding in m.findings
            if finding.label not in (Label.PASS, Label.NOTE)
        ]
        if m.note:
            found.append(Finding(Label.WARN, Kind.SWEEP_NOTE, f"{m.entry.name}: {m.note}"))
    for j in r.jobs:
        m = r.model(j.job.model)
        found += [
            warning.with_sentence(f"job {j.job.id}: {warning.sentence}") for warning in _job_warnings(m, j)
        ]
    found.sort(key=lambda f: 0 if f.label is Label.FAIL else 1)
    if not labelled(found, Label.FAIL):
        words = (
            f"{len(r.jobs)} job(s) on {len(r.models)} model(s) ran; every backend deterministic and within "
            "tolerance of its model's reference"
        )
        found.insert(0, Finding(Label.PASS, Kind.PASS, words))
    return found


def fleet_verdict(r: FleetResult) -> list[str]:
    """The fleet's findings as verdict lines, most important first."""
    return [finding.line for finding in fleet_findings(r)]


def to_dict(r: FleetResult) -> dict[str, Any]:
    out = r.spec.output
    return {
        "schema": FLEET_SCHEMA,
        "sweep": {
            "name": r.spec.name,
            "file": relpath(r.spec.path, out),
            "retries": r.spec.retries,
            "job_timeout": r.spec.job_timeout,
            "backends": [
                {
                    "name": backend.name,
                    "options": dict(backend.options),
                    "requires": backend.requires.to_json(),
                }
                for backend in r.spec.backends
            ],
        },
        "executor": r.executor,
        "exit_code": r.exit_code,
        "verdict": fleet_verdict(r),
        "summary": {
            "jobs": len(r.jobs),
            "ok": sum(job.ok for job in r.jobs),
            "failed": sum(not job.ok for job in r.jobs),
            "models": len(r.models),
            "backends": len(r.spec.backends),
        },
        "models": [_model_json(model) for model in r.models],
        "matrix": _matrix(r),
        "worst_pairs": _worst_pairs(r),
        "jobs": [_job_row(r, job) for job in r.jobs],
        "nodes": _nodes(r),
    }


def _model_json(m: ModelOutcome) -> dict[str, Any]:
    res: Result | None = m.result
    return {
        "name": m.entry.name,
        "path": m.entry.path.name,
        "sha256": m.sha256,
        "backends": list(m.entry.backends),
        "error": m.error,
        "reference": res.reference_used if res else None,
        "note": m.note,
        "report": m.report if res else None,
        "exit_code": res.exit_code if res else None,
        "verdict": list(m.verdict),
    }


def fleet_json(r: FleetResult, d: Mapping[str, Any] | None = None) -> str:
    """`d`: to_dict(r), when the caller has it already."""
    return json.dumps(d or to_dict(r), indent=2, sort_keys=True, allow_nan=False) + "\n"


def fleet_markdown(r: FleetResult, d: Mapping[str, Any] | None = None) -> str:
    """`d`: to_dict(r), when the caller has it already."""
    d = d or to_dict(r)
    lines = [
        *_md_verdict(r, d),
        *_md_matrix(r, d),
        *_md_worst_pairs(d),
        *_md_jobs(d),
        *_md_nodes(d),
        "## Reproduce",
        "",
        "From this report's folder:",
        "",
        *fenced(f"xbackend sweep {d['sweep']['file']}" + (" --executor ray" if r.executor == "ray" else "")),
        "",
    ]
    return only_our_html("\n".join(lines))


def _md_verdict(r: FleetResult, d: Mapping[str, Any]) -> list[str]:
    s = d["summary"]
    lines = [f"# xbackend fleet report: {inert(r.spec.name)}", ""]
    found = fleet_findings(r)
    lines += [
        f"**{prose(f.line)}**" if f.label in (Label.PASS, Label.FAIL) else f"- {prose(f.line)}"
        for f in found[:1]
    ]
    lines += [f"- {prose(f.line)}" for f in found[1:]]
    return [
        *lines,
        "",
        f"{s['models']} model(s) x {s['backends']} backend(s): {s['jobs']} job(s), {s['ok']} ok, "
        f"{s['failed']} failed; executor {r.executor}; exit code {r.exit_code}.",
        "",
    ]


def _md_matrix(r: FleetResult, d: Mapping[str, Any]) -> list[str]:
    backends = [backend.name for backend in r.spec.backends]
    rows = []
    for m in r.models:
        name = Ours(f"[{inert(m.entry.name)}]({m.report})") if m.result is not None else inert(m.entry.name)
        cells = [d["matrix"][m.entry.name].get(backend) for backend in backends]
        rows.append([name, *("–" if e is None else cell_for(e) for e in cells)])
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
            w["model"],
            f"{w['a']} vs {w['b']}",
            short(w["scaled_ulp"]),
            w["max_ulp"] if w["max_ulp"] is not None else "–",
            w["first_divergence"] or "–",
        ]
        for w in d["worst_pairs"]
    ]
    header = ["model", "pair", "scaled ULP", "max ULP", "first divergent tensor (vs reference)"]
    return ["## Worst pairs", "", *table(header, rows)]


def _md_jobs(d: Mapping[str, Any]) -> list[str]:
    rows = [
        [
            j["id"],
            j["status"],
            j["node"] or "–",
            j["attempts"],
            f"[report]({j['report']})" if j["report"] else "–",
            j["reason"] or "",
        ]
        for j in d["jobs"]
    ]
    return ["## Jobs", "", *table(["job", "status", "node", "attempts", "report", "reason"], rows)]


def _md_nodes(d: Mapping[str, Any]) -> list[str]:
    if not d["nodes"]:
        return ["## Nodes", "", "No job reached a node.", ""]
    rows = [
        [
            n["node"],
            ", ".join(f"{k}={v}" for k, v in sorted(n["labels"].items())) or "–",
            n["jobs"],
            n["environment"].get("python", "?"),
            n["environment"].get("package.xbackend", "?"),
            f"{n['environment'].get('cpu.model', '?')} ({n['environment'].get('cpu.isa', '?')})",
            n.get("environment_sha256", "")[:16],
        ]
        for n in d["nodes"]
    ]
    header = ["node", "labels", "jobs", "python", "xbackend", "cpu", "environment sha256"]
    return ["## Nodes", "", *table(header, rows)]
