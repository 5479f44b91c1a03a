"""The JSON twin of the Markdown report (schema "xbackend.report/2").

Readable sections for machines and people (verdict, backends, cross_backend, ...)
and, under "result", the whole Result losslessly (xbackend.files.codec): what
`xbackend report` renders the Markdown from, and what baselines and `xbackend diff`
read back (xbackend.comparison.saved_report).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from typing import Any

from xbackend.comparison.saved_report import SCHEMA
from xbackend.files.codec import encode
from xbackend.numerics.metrics import TensorDiff
from xbackend.numerics.values import value_name
from xbackend.report.candidate_section import candidate_json
from xbackend.report.decode_section import decisions_json, decode_json
from xbackend.report.text import METRIC_DEFINITIONS
from xbackend.results import BackendResult, CrossBackendResult, Drift, PairResult, Result

__all__ = ["to_dict", "to_json"]


def _clean(x: Any) -> Any:
    """JSON-safe: non-finite floats as strings, tuples as lists."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def _tensor(d: TensorDiff, modules: dict[str, str] | None = None) -> dict[str, Any]:
    out = asdict(d)
    out["module"] = (modules or {}).get(value_name(d.name), "")
    return out


def _backend(b: BackendResult, times: bool) -> dict[str, Any]:
    return {
        "latency": b.latency.to_json() if times and b.latency else None,
        "peak_rss_bytes": b.peak_rss_bytes if times and b.peak_rss_bytes else None,
        "start_rss_bytes": b.start_rss_bytes if times and b.start_rss_bytes else None,
        "planned_bytes": b.planned_bytes or None,
        "name": b.name,
        "status": b.status,
        "reason": b.reason,
        "promises": list(b.promises),
        "deterministic": b.deterministic,
        "runs": b.runs,
        "builds": b.builds,
        "distinct_outputs": b.distinct_outputs,
        "distinct_run_outputs": b.distinct_run_outputs,
        "distinct_build_outputs": b.distinct_build_outputs,
        "first_nondeterministic": b.first_nondeterministic,
        "exposed_tensors": b.exposed,
        "not_exposed": [{"tensor": t, "reason": r} for t, r in b.not_exposed],
        "options": dict(b.options),
        "info": dict(b.info),
        "fingerprints": list(b.fingerprints),
        "varying_tensors": [_tensor(d) for d in b.varying()],
        "observer_effect": asdict(b.observer) if b.observer is not None else None,
        "layers_error": b.layers_error,
        "constant_outputs": [{"tensor": t, "value": v} for t, v in b.constant_outputs],
        "loaded_from": b.loaded_from,
    }


def _drift(d: Drift, modules: dict[str, str]) -> dict[str, Any]:
    return {
        "backend": d.backend,
        "baseline": d.baseline,
        "status": d.status,
        "reason": d.reason,
        "measured": d.measured,
        "bit_identical": d.status == "identical",
        "max_ulp": d.max_ulp,
        "scaled_ulp": d.scaled_ulp,
        "first_moved": d.first_moved,
        "first_moved_module": modules.get(value_name(d.first_moved or ""), ""),
        "moved": list(d.moved),
        "outputs": [_tensor(x, modules) for x in d.outputs],
    }


def _with_floor(t: dict[str, Any], floors: dict[str, float], c: CrossBackendResult) -> dict[str, Any]:
    name = value_name(t["name"])
    out = {**t, "noise_floor": floors.get(name), "tolerance": c.tolerance(name)}
    if c.judged:  # the tolerance is the allowance of this node's local error against float64
        out["local_scaled_ulp"] = c.local_error(name)
    return out


def _cross(c: CrossBackendResult, modules: dict[str, str], floors: dict[str, float]) -> dict[str, Any]:
    return {
        "backend": c.backend,
        "reference": c.reference,
        "status": c.status,
        "reason": c.reason,
        "bitwise_equal": c.bitwise_equal if c.status == "ok" else None,
        "max_ulp": c.max_ulp,
        "scaled_ulp": c.scaled_ulp,
        "max_ulp_tolerance": c.max_ulp_tolerance,
        "tolerance_by": c.tolerance_by,
        "within_tolerance": (not c.violates) if c.status == "ok" else None,
        "first_divergence": c.first_divergence,
        "first_violation": c.first_violation,
        "only_in_backend": list(c.only_in_backend),
        "only_in_reference": list(c.only_in_reference),
        "outputs": [_tensor(tensor, modules) for tensor in c.output_tensors],
        "instrumented_outputs_differ": c.observer_differs,
        "layers_note": c.layers_note,
        "tensors": [_with_floor(_tensor(tensor, modules), floors, c) for tensor in c.tensors],
        "explained": c.explained,
        "not_judged": c.not_judged if c.explained is None else None,
        "origins": [
            {
                "tensor": origin.tensor,
                "module": origin.module,
                "op_type": origin.op_type,
                "local_scaled_ulp": origin.local_scaled_ulp,
                "allowed_scaled_ulp": origin.allowed_scaled_ulp,
                "detail": origin.detail,
                "element": list(origin.element),
                "rule": origin.rule,
                "past_deterministic_bound": origin.certain,
            }
            for origin in c.origins
        ],
    }


def _explanation(r: Result) -> dict[str, Any]:
    ex = r.explanation
    return {
        "status": ex.status,
        "reason": ex.reason,
        "floor_engine": ex.engine,
        "noise_samples": ex.samples,
        "floor_note": ex.floor_note,
        "conditioning": ex.conditioning,
        "margin": ex.margin,
        "reductions_permuted": ex.permuted,
        "reductions_left_in_order": [{"node": n, "op_type": o, "why": w} for n, o, w in ex.skipped],
        "local_errors": [
            {
                "backend": x.backend,
                "status": x.status,
                "reason": x.reason,
                "nodes_compared": x.compared,
                "nodes_not_judged": [{"tensor": n.tensor, "why": n.not_judged} for n in x.unjudged],
                "largest_ratio": x.largest_ratio,
                "largest_at": x.largest_at,
                "judged_on": x.graph,
                "explained": x.explained,
                "origins": [origin.tensor for origin in x.origins],
                # per op, the median smallest relative error on every element its nodes catch
                "detection": [{"op_type": op, "relative": v, "nodes": k} for op, v, k in x.detection()],
            }
            for x in ex.local
        ],
        "confidence_per_node": ex.confidence,
        "amplifiers": [
            {
                "tensor": amplifier.tensor,
                "module": amplifier.module,
                "op_type": amplifier.op_type,
                "gain_scaled_ulp": amplifier.gain_scaled_ulp,
                "input_max": amplifier.input_max,
            }
            for amplifier in ex.amplifiers
        ],
        "reorder_check": {
            "status": ex.reorder_check.status,
            "reason": ex.reorder_check.reason,
            "engine": ex.reorder_check.engine,
            "orders": ex.reorder_check.samples,
            "largest_ratio": ex.reorder_check.largest_ratio,
            "largest_at": ex.reorder_check.largest_at,
            "past_allowance": list(ex.reorder_check.over),
        },
        "rules": [{"op_type": op, "allowed": rule, "source": src} for op, rule, src in ex.rules],
    }


def _pair(p: PairResult) -> dict[str, Any]:
    return {
        "a": p.a,
        "b": p.b,
        "bitwise_equal": p.bitwise_equal,
        "max_ulp": p.max_ulp,
        "scaled_ulp": p.scaled_ulp,
        "max_rel": p.max_rel,
    }


def _oracle(c: CrossBackendResult, modules: dict[str, str]) -> dict[str, Any]:
    outs = c.output_diffs()
    return {
        "backend": c.backend,
        "max_ulp": c.max_ulp,
        "scaled_ulp": c.scaled_ulp,
        "max_rel": max((out.max_rel for out in outs), default=0.0),
        "bitwise_equal": c.bitwise_equal,
        "first_divergence": c.first_divergence,
        "outputs": [_tensor(tensor, modules) for tensor in c.output_tensors],
        "tensors": [_tensor(tensor, modules) for tensor in c.tensors],
    }


def to_dict(r: Result) -> dict[str, Any]:
    m = r.model
    modules = m.modules()
    found = r.findings()
    findings = [f.to_json() for f in found]
    out: dict[str, Any] = _clean(
        {
            "schema": SCHEMA,
            "verdict": {"exit_code": r.exit_code, "lines": [f.line for f in found], "findings": findings},
            "promises": [asdict(check) for check in r.promise_checks()],
            "model": {
                "path": m.path,
                "sha256": m.sha256,
                "ir_version": m.ir_version,
                "opsets": dict(m.opsets),
                "producer": m.producer,
                "external_data": m.external_data,
                "weight_bytes": m.weight_bytes,
                "inputs": [asdict(i) for i in m.inputs],
                "modules": modules,
                "outputs": [asdict(o) for o in m.outputs],
                "tensors": len(m.tensors),
                "exposed": len(m.tensor_order()),
                "metadata": dict(m.metadata),
            },
            "inputs": {
                "sha256": r.feeds.sha256,
                "seed": r.feeds.seed,
                "source": r.feeds.source,
                "values": [{"name": n, "dtype": d, "shape": s} for n, d, s in r.feeds.shapes],
                "ranges": dict(r.feeds.ranges),
                "made": dict(r.feeds.made),
                "expected_outputs": r.feeds.expected,
            },
            "options": {
                "backends": list(r.options.backends),
                "reference": r.options.reference_name,
                "reference_used": r.reference_used,
                "runs": r.options.runs,
                "builds": r.options.builds,
                "max_ulp": r.options.tolerance_text if r.options.max_ulp is None else r.options.max_ulp,
                "outputs_only": r.options.outputs_only,
                "tensors": r.options.tensors,
                "probes": list(r.probes_ran),
                "batch_invariance": r.options.batch_invariance,
                "timeout_s": r.options.timeout,
            },
            "command": r.command,
            "backends": [_backend(backend, r.options.shows_times) for backend in r.backends],
            "cost_of_determinism": [f.to_json(r.options.shows_times) for f in r.cost_of_determinism()],
            "cross_backend": [_cross(c, modules, r.explanation.floor_map()) for c in r.cross_backend],
            "explanation": _explanation(r),
            "ill_conditioned": [
                {
                    "tensor": t.tensor,
                    "module": t.module,
                    "scaled_ulp": t.scaled_ulp,
                    "cause": t.cause,
                    "criterion": t.criterion,
                }
                for t in r.explanation.ill_conditioned
            ],
            "pairs": [_pair(pair) for pair in r.pairs],
            "oracle_error": [_oracle(c, modules) for c in r.oracle_error],
            "expected_error": [_oracle(c, modules) for c in r.expected_error],
            "probes": {probe.name: probe.to_json() for probe in r.probes},
            "baseline": [_drift(d, modules) for d in r.baseline],
            "gates": [asdict(gate) for gate in r.gates()],
            "notes": list(r.notes),
            "metrics": dict(METRIC_DEFINITIONS),
            "environment": dict(r.environment),
        }
    )
    if r.decode is not None:
        out["decode"] = _clean(decode_json(r.decode))
    if r.decisions:
        out["decisions"] = _clean(decisions_json(r))
    if r.candidates:
        out["candidates"] = _clean(candidate_json(r))
    out["result"] = encode(r, times=r.options.shows_times)
    if r.options.shows_times:  # only on request: times differ between identical comparisons
        out["build_seconds"] = {
            backend.name: [round(t, 3) for t in backend.build_s] for backend in r.backends
        }
        out["probe_build_seconds"] = {
            f"{probe.name}: {label}": [round(time, 3) for time in times]
            for probe in r.probes
            for label, times in probe.build_times()
        }
    return out


def to_json(r: Result) -> str:
    """Stable text: sorted keys, fixed indentation, trailing newline."""
    return json.dumps(to_dict(r), indent=2, sort_keys=True, allow_nan=False) + "\n"
