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
        return {str(key): _clean(value) for key, value in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x


def _tensor(tensor_diff: TensorDiff, modules: dict[str, str] | None = None) -> dict[str, Any]:
    out = asdict(tensor_diff)
    out["module"] = (modules or {}).get(value_name(tensor_diff.name), "")
    return out


def _backend(backend: BackendResult, times: bool) -> dict[str, Any]:
    return {
        "latency": backend.latency.to_json() if times and backend.latency else None,
        "peak_rss_bytes": backend.peak_rss_bytes if times and backend.peak_rss_bytes else None,
        "start_rss_bytes": backend.start_rss_bytes if times and backend.start_rss_bytes else None,
        "planned_bytes": backend.planned_bytes or None,
        "name": backend.name,
        "status": backend.status,
        "reason": backend.reason,
        "promises": list(backend.promises),
        "deterministic": backend.deterministic,
        "runs": backend.runs,
        "builds": backend.builds,
        "distinct_outputs": backend.distinct_outputs,
        "distinct_run_outputs": backend.distinct_run_outputs,
        "distinct_build_outputs": backend.distinct_build_outputs,
        "first_nondeterministic": backend.first_nondeterministic,
        "exposed_tensors": backend.exposed,
        "not_exposed": [{"tensor": t, "reason": r} for t, r in backend.not_exposed],
        "options": dict(backend.options),
        "info": dict(backend.info),
        "fingerprints": list(backend.fingerprints),
        "varying_tensors": [_tensor(d) for d in backend.varying()],
        "observer_effect": asdict(backend.observer) if backend.observer is not None else None,
        "layers_error": backend.layers_error,
        "constant_outputs": [{"tensor": t, "value": v} for t, v in backend.constant_outputs],
        "loaded_from": backend.loaded_from,
    }


def _drift(drift: Drift, modules: dict[str, str]) -> dict[str, Any]:
    return {
        "backend": drift.backend,
        "baseline": drift.baseline,
        "status": drift.status,
        "reason": drift.reason,
        "measured": drift.measured,
        "bit_identical": drift.status == "identical",
        "max_ulp": drift.max_ulp,
        "scaled_ulp": drift.scaled_ulp,
        "first_moved": drift.first_moved,
        "first_moved_module": modules.get(value_name(drift.first_moved or ""), ""),
        "moved": list(drift.moved),
        "outputs": [_tensor(output, modules) for output in drift.outputs],
    }


def _with_floor(t: dict[str, Any], floors: dict[str, float], cross: CrossBackendResult) -> dict[str, Any]:
    name = value_name(t["name"])
    out = {**t, "noise_floor": floors.get(name), "tolerance": cross.tolerance(name)}
    if cross.judged:  # the tolerance is the allowance of this node's local error against float64
        out["local_scaled_ulp"] = cross.local_error(name)
    return out


def _cross(cross: CrossBackendResult, modules: dict[str, str], floors: dict[str, float]) -> dict[str, Any]:
    return {
        "backend": cross.backend,
        "reference": cross.reference,
        "status": cross.status,
        "reason": cross.reason,
        "bitwise_equal": cross.bitwise_equal if cross.status == "ok" else None,
        "max_ulp": cross.max_ulp,
        "scaled_ulp": cross.scaled_ulp,
        "max_ulp_tolerance": cross.max_ulp_tolerance,
        "tolerance_by": cross.tolerance_by,
        "within_tolerance": (not cross.violates) if cross.status == "ok" else None,
        "first_divergence": cross.first_divergence,
        "first_violation": cross.first_violation,
        "only_in_backend": list(cross.only_in_backend),
        "only_in_reference": list(cross.only_in_reference),
        "outputs": [_tensor(tensor, modules) for tensor in cross.output_tensors],
        "instrumented_outputs_differ": cross.observer_differs,
        "layers_note": cross.layers_note,
        "tensors": [_with_floor(_tensor(tensor, modules), floors, cross) for tensor in cross.tensors],
        "explained": cross.explained,
        "not_judged": cross.not_judged if cross.explained is None else None,
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
            for origin in cross.origins
        ],
    }


def _explanation(result: Result) -> dict[str, Any]:
    ex = result.explanation
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
                "backend": local_errors.backend,
                "status": local_errors.status,
                "reason": local_errors.reason,
                "nodes_compared": local_errors.compared,
                "nodes_not_judged": [
                    {"tensor": node_judgment.tensor, "why": node_judgment.not_judged}
                    for node_judgment in local_errors.unjudged
                ],
                "largest_ratio": local_errors.largest_ratio,
                "largest_at": local_errors.largest_at,
                "judged_on": local_errors.graph,
                "explained": local_errors.explained,
                "origins": [origin.tensor for origin in local_errors.origins],
                # per op, the median smallest relative error on every element its nodes catch
                "detection": [
                    {"op_type": op, "relative": v, "nodes": k} for op, v, k in local_errors.detection()
                ],
            }
            for local_errors in ex.local
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


def _pair(pair_result: PairResult) -> dict[str, Any]:
    return {
        "a": pair_result.a,
        "b": pair_result.b,
        "bitwise_equal": pair_result.bitwise_equal,
        "max_ulp": pair_result.max_ulp,
        "scaled_ulp": pair_result.scaled_ulp,
        "max_rel": pair_result.max_rel,
    }


def _oracle(cross: CrossBackendResult, modules: dict[str, str]) -> dict[str, Any]:
    outs = cross.output_diffs()
    return {
        "backend": cross.backend,
        "max_ulp": cross.max_ulp,
        "scaled_ulp": cross.scaled_ulp,
        "max_rel": max((out.max_rel for out in outs), default=0.0),
        "bitwise_equal": cross.bitwise_equal,
        "first_divergence": cross.first_divergence,
        "outputs": [_tensor(tensor, modules) for tensor in cross.output_tensors],
        "tensors": [_tensor(tensor, modules) for tensor in cross.tensors],
    }


def to_dict(result: Result) -> dict[str, Any]:
    """The result as the JSON report's dictionary (schema xbackend.report/2)."""
    model = result.model
    modules = model.modules()
    found = result.findings()
    findings = [f.to_json() for f in found]
    out: dict[str, Any] = _clean(
        {
            "schema": SCHEMA,
            "verdict": {
                "exit_code": result.exit_code,
                "lines": [finding.line for finding in found],
                "findings": findings,
            },
            "promises": [asdict(check) for check in result.promise_checks()],
            "model": {
                "path": model.path,
                "sha256": model.sha256,
                "ir_version": model.ir_version,
                "opsets": dict(model.opsets),
                "producer": model.producer,
                "external_data": model.external_data,
                "weight_bytes": model.weight_bytes,
                "inputs": [asdict(input_name) for input_name in model.inputs],
                "modules": modules,
                "outputs": [asdict(output) for output in model.outputs],
                "tensors": len(model.tensors),
                "exposed": len(model.tensor_order()),
                "metadata": dict(model.metadata),
            },
            "inputs": {
                "sha256": result.feeds.sha256,
                "seed": result.feeds.seed,
                "source": result.feeds.source,
                "values": [{"name": n, "dtype": d, "shape": s} for n, d, s in result.feeds.shapes],
                "ranges": dict(result.feeds.ranges),
                "made": dict(result.feeds.made),
                "expected_outputs": result.feeds.expected,
            },
            "options": {
                "backends": list(result.options.backends),
                "reference": result.options.reference_name,
                "reference_used": result.reference_used,
                "runs": result.options.runs,
                "builds": result.options.builds,
                "max_ulp": result.options.tolerance_text
                if result.options.max_ulp is None
                else result.options.max_ulp,
                "outputs_only": result.options.outputs_only,
                "tensors": result.options.tensors,
                "probes": list(result.probes_ran),
                "batch_invariance": result.options.batch_invariance,
                "timeout_s": result.options.timeout,
            },
            "command": result.command,
            "backends": [_backend(backend, result.options.shows_times) for backend in result.backends],
            "cost_of_determinism": [
                f.to_json(result.options.shows_times) for f in result.cost_of_determinism()
            ],
            "cross_backend": [
                _cross(c, modules, result.explanation.floor_map()) for c in result.cross_backend
            ],
            "explanation": _explanation(result),
            "ill_conditioned": [
                {
                    "tensor": ill_conditioned.tensor,
                    "module": ill_conditioned.module,
                    "scaled_ulp": ill_conditioned.scaled_ulp,
                    "cause": ill_conditioned.cause,
                    "criterion": ill_conditioned.criterion,
                }
                for ill_conditioned in result.explanation.ill_conditioned
            ],
            "pairs": [_pair(pair) for pair in result.pairs],
            "oracle_error": [_oracle(c, modules) for c in result.oracle_error],
            "expected_error": [_oracle(c, modules) for c in result.expected_error],
            "probes": {probe.name: probe.to_json() for probe in result.probes},
            "baseline": [_drift(d, modules) for d in result.baseline],
            "gates": [asdict(gate) for gate in result.gates()],
            "notes": list(result.notes),
            "metrics": dict(METRIC_DEFINITIONS),
            "environment": dict(result.environment),
        }
    )
    if result.decode is not None:
        out["decode"] = _clean(decode_json(result.decode))
    if result.decisions:
        out["decisions"] = _clean(decisions_json(result))
    if result.candidates:
        out["candidates"] = _clean(candidate_json(result))
    out["result"] = encode(result, times=result.options.shows_times)
    if result.options.shows_times:  # only on request: times differ between identical comparisons
        out["build_seconds"] = {
            backend.name: [round(t, 3) for t in backend.build_s] for backend in result.backends
        }
        out["probe_build_seconds"] = {
            f"{probe.name}: {label}": [round(time, 3) for time in times]
            for probe in result.probes
            for label, times in probe.build_times()
        }
    return out


def to_json(result: Result) -> str:
    """Stable text: sorted keys, fixed indentation, trailing newline."""
    return json.dumps(to_dict(result), indent=2, sort_keys=True, allow_nan=False) + "\n"
