"""Conformance sweep: xbackend with ort-cpu and reference over ONNX's own node tests.

For every node test case (``onnx.backend.test.loader.load_node_model_tests()``, built by
onnx on the fly) it writes the model and its first data set in ONNX's test-data layout,
checks whether ONNX Runtime and the reference evaluator run it directly (plain Python,
no xbackend), then runs ``xbackend.compare(model, inputs=DIR)`` and sorts the outcome:

- ran: the engine ran directly and under xbackend;
- LOST: it ran directly but xbackend failed or refused it (a bug in xbackend);
- both refuse: neither runs it (the engine lacks the op, type or opset);
- xbackend only: xbackend ran what the plain API could not (e.g. bfloat16 outputs).

Usage: python benchmarks/conformance.py [--every N] [--match SUBSTRING] [--jobs J] [--limit K]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import io
import os
import sys
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

BACKENDS = ("ort-cpu", "reference")
ORT_MAX_IR = 13


@dataclass(frozen=True)
class CaseOutcome:
    """What happened to one node test case."""

    name: str
    direct: tuple[bool, bool]  # ort-cpu, reference ran it directly
    status: tuple[str, str]  # xbackend status per backend ('ok', 'failed', 'unavailable', 'refused')
    reasons: tuple[str, str]
    compared: bool  # ort-cpu and reference compared at the outputs
    verdict: str  # first verdict line, or the error
    explained: bool | None = None  # ort-cpu has no origin against the reference
    largest: float | None = None  # ort-cpu's largest local error / its allowance
    origins: str = ""  # ort-cpu's origins: tensor (op) local/allowed

    def category(self, i: int) -> str:
        direct, ok = self.direct[i], self.status[i] == "ok"
        if direct and ok:
            return "ran"
        if direct:
            return "LOST"
        return "xbackend only" if ok else "both refuse"


def load_cases(match: str = "", every: int = 1, limit: int = 0) -> list[Any]:
    from onnx.backend.test.loader import load_node_model_tests

    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        cases = [c for c in load_node_model_tests() if c.data_sets and match in c.name]
    cases = sorted(cases, key=lambda c: c.name)[::every]
    return cases[:limit] if limit else cases


def _proto(value: Any, vi: onnx.ValueInfoProto) -> bytes:
    """One value as onnx's own test generator writes it (cmd_tools.generate_data)."""
    if isinstance(value, onnx.TensorProto):
        return value.SerializeToString()
    which = vi.type.WhichOneof("value")
    if which == "map_type":
        return numpy_helper.from_dict(value, vi.name).SerializeToString()
    if which == "sequence_type":
        return numpy_helper.from_list(value, vi.name).SerializeToString()
    if which == "optional_type":
        return numpy_helper.from_optional(value, vi.name).SerializeToString()
    return numpy_helper.from_array(np.asarray(value), vi.name).SerializeToString()


def write_case(case: Any, root: Path) -> tuple[Path, Path]:
    """model.onnx and test_data_set_0/{input,output}_N.pb under root."""
    model = root / "model.onnx"
    model.write_bytes(case.model.SerializeToString())
    data = root / "test_data_set_0"
    data.mkdir()
    inputs, outputs = case.data_sets[0]
    init = {t.name for t in case.model.graph.initializer}
    graph_inputs = [vi for vi in case.model.graph.input if vi.name not in init]
    for i, (v, vi) in enumerate(zip(inputs, graph_inputs, strict=False)):
        (data / f"input_{i}.pb").write_bytes(_proto(v, vi))
    for i, (v, vi) in enumerate(zip(outputs, case.model.graph.output, strict=False)):
        (data / f"output_{i}.pb").write_bytes(_proto(v, vi))
    return model, data


def _direct_feeds(case: Any) -> dict[str, Any]:
    init = {t.name for t in case.model.graph.initializer}
    names = [vi.name for vi in case.model.graph.input if vi.name not in init]
    feeds = {}
    for n, v in zip(names, case.data_sets[0][0], strict=False):
        feeds[n] = numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else v
    return feeds


def ort_runs_directly(case: Any) -> bool:
    """ONNX Runtime's own API on the model (restamped to IR 13, as any user would) and its data."""
    import onnxruntime as ort

    m = onnx.ModelProto()
    m.CopyFrom(case.model)
    m.ir_version = min(m.ir_version, ORT_MAX_IR)
    try:
        so = ort.SessionOptions()
        so.log_severity_level = 4
        sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        sess.run(None, _direct_feeds(case))
    except Exception:
        return False
    return True


def reference_runs_directly(case: Any) -> bool:
    from onnx.reference import ReferenceEvaluator

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ReferenceEvaluator(case.model).run(None, _direct_feeds(case))
    except Exception:
        return False
    return True


def run_case(case: Any, timeout: float = 120.0) -> CaseOutcome:
    import xbackend
    from xbackend.errors import XbackendError

    direct = (ort_runs_directly(case), reference_runs_directly(case))
    with tempfile.TemporaryDirectory(prefix="xbackend-conf-") as tmp:
        model, data = write_case(case, Path(tmp))
        try:
            r = xbackend.compare(
                model, backends=list(BACKENDS), inputs=data, runs=1, probes="none", timeout=timeout
            )
        except XbackendError as e:
            why = str(e)
            return CaseOutcome(case.name, direct, ("refused", "refused"), (why, why), False, f"error: {why}")
    status = tuple(r.backend(b).status for b in BACKENDS)
    reasons = tuple(r.backend(b).reason for b in BACKENDS)
    cross = [c for c in r.cross_backend if c.backend == "ort-cpu" and c.reference == "reference"]
    compared = bool(cross) and cross[0].status == "ok"
    explained, largest, origins = local_summary(r, "ort-cpu")
    return CaseOutcome(  # type: ignore[arg-type]
        case.name, direct, status, reasons, compared, r.verdict()[0], explained, largest, origins
    )


def local_summary(r: Any, engine: str) -> tuple[bool | None, float | None, str]:
    """ENGINE's local errors in a Result: explained, its largest local error over its node's
    allowance (the judgment's own ratio: 1 is the allowance), and its origins as
    'tensor (op) local/allowed detail'."""
    le = r.explanation.local_for(engine)
    if le is None:
        return None, None, ""
    origins = ", ".join(
        f"{o.tensor} ({o.op_type}) {o.local_scaled_ulp or 0:.3g}/{o.allowed_scaled_ulp:.3g} "
        f"{o.detail}".rstrip()
        for o in le.origins
    )
    return le.explained, le.largest_ratio, origins


def _run_one(case: Any) -> CaseOutcome:
    try:
        return run_case(case)
    except Exception as e:  # a crash of the sweep itself is an outcome too
        why = f"{type(e).__name__}: {e}"
        return CaseOutcome(case.name, (False, False), ("crashed", "crashed"), (why, why), False, why)


def summarize(outcomes: list[CaseOutcome]) -> str:
    lines = [f"{len(outcomes)} node test cases", ""]
    lines.append("| backend | ran | LOST | both refuse | xbackend only |")
    lines.append("|---|---|---|---|---|")
    for i, b in enumerate(BACKENDS):
        c = Counter(o.category(i) for o in outcomes)
        lines.append(f"| {b} | {c['ran']} | {c['LOST']} | {c['both refuse']} | {c['xbackend only']} |")
    either = [o for o in outcomes if any(o.direct)]
    both = [o for o in outcomes if all(o.direct)]
    lost = [o for o in outcomes if "LOST" in (o.category(0), o.category(1))]
    lines += [
        "",
        f"run directly by ONNX Runtime or the reference evaluator: {len(either)}; by both: {len(both)}",
        f"of those run by both, compared by xbackend: {sum(o.compared for o in both)}",
        f"lost by xbackend (ran directly, not under xbackend): {len(lost)}",
        f"refused outright by xbackend: {sum(o.status[0] == 'refused' for o in outcomes)}",
    ]
    for o in lost:
        which = [b for i, b in enumerate(BACKENDS) if o.category(i) == "LOST"]
        lines.append(f"  LOST {o.name} ({', '.join(which)}): {' | '.join(o.reasons)}"[:300])
    measured = [o for o in outcomes if o.explained is not None]
    explained = [o for o in measured if o.explained]
    top = sorted((o for o in explained if o.largest is not None), key=lambda o: -(o.largest or 0))[:5]
    lines += [
        "",
        f"calibration: ort-cpu's local errors measured on {len(measured)} cases; explained on "
        f"{len(explained)}; largest local error / its allowance among them: "
        + ", ".join(f"{o.name} {o.largest:.2f}" for o in top),
    ]
    for o in measured:
        if not o.explained:
            lines.append(f"  ORIGIN {o.name}: {o.origins}"[:300])
    verdicts = Counter(o.verdict.split(":")[0] for o in outcomes)
    lines.append("verdicts: " + ", ".join(f"{k} {v}" for k, v in sorted(verdicts.items())))
    return "\n".join(lines)


def engine_outputs(case: Any, engine: str, model: Path) -> list[Any]:
    """ENGINE's outputs on the case's data, through the engine's own API (no xbackend)."""
    feeds = _direct_feeds(case)
    if engine == "ort-cpu":
        import onnxruntime as ort

        m = onnx.ModelProto()
        m.CopyFrom(case.model)
        m.ir_version = min(m.ir_version, ORT_MAX_IR)
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return list(sess.run(None, feeds))
    if engine == "openvino-cpu":
        import openvino as ov

        compiled = ov.Core().compile_model(str(model), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        out = compiled(feeds)
        return [out[o] for o in compiled.outputs]
    raise ValueError(f"no direct path for {engine}")


def against_expected(case: Any, engine: str, model: Path) -> str:
    """Whether ENGINE passes the node test itself: its outputs against the test's expected
    outputs, with ONNX's backend-test tolerances (rtol 1e-3, atol 1e-7)."""
    try:
        got = engine_outputs(case, engine, model)
    except Exception as e:
        return f"{engine} direct: {type(e).__name__}"
    try:
        return _check_expected(got, case.data_sets[0][1])
    except (ValueError, TypeError) as e:  # sequences, maps: not plain tensors
        return f"its expected output is not a plain tensor ({type(e).__name__})"


def _check_expected(got: list[Any], expected: list[Any]) -> str:
    for g, want in zip(got, expected, strict=False):
        w = numpy_helper.to_array(want) if isinstance(want, onnx.TensorProto) else np.asarray(want)
        g = np.asarray(g)
        if g.shape != w.shape:
            return f"fails the node test: shape {list(g.shape)} where {list(w.shape)} is expected"
        if g.dtype.kind in "fc" and not np.allclose(g, w, rtol=1e-3, atol=1e-7, equal_nan=True):
            worst = float(np.nanmax(np.abs(g.astype(np.float64) - w.astype(np.float64))))
            return f"fails the node test: off its expected output by up to {worst:.3g}"
        if g.dtype.kind not in "fc" and not np.array_equal(g, w):
            return "fails the node test: integer output differs from the expected"
    return "passes the node test (its expected output)"


def calibrate_one(args: tuple[Any, str]) -> tuple[str, str, float | None, str]:
    """(case, 'explained' | 'origin' | why not measured, largest local error / its allowance,
    origins) for ENGINE against the reference evaluator; an origin says whether ENGINE passes
    the node test on its own."""
    import xbackend

    case, engine = args
    with tempfile.TemporaryDirectory(prefix="xbackend-cal-") as tmp:
        model, data = write_case(case, Path(tmp))
        try:
            r = xbackend.compare(model, backends=[engine, "reference"], inputs=data, runs=1, probes="none")
        except Exception as e:
            return case.name, f"refused: {e}"[:120], None, ""
        verdict = against_expected(case, engine, model)
    le = r.explanation.local_for(engine)
    if le is None or le.status != "ok":
        why = (
            r.backend(engine).reason
            if not r.backend(engine).ok
            else (le.reason if le else r.explanation.reason)
        )
        return case.name, f"not measured: {why}"[:120], None, ""
    _, largest, origins = local_summary(r, engine)
    if le.origins:
        return case.name, "origin", largest, f"{origins}; {engine} {verdict}"
    return case.name, "explained", largest, origins


def calibrate(cases: list[Any], engine: str, jobs: int) -> None:
    """How ENGINE's local errors sit against their allowances on the node tests."""
    rows = []
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs) as pool:
        for i, row in enumerate(pool.map(calibrate_one, [(c, engine) for c in cases]), 1):
            rows.append(row)
            print(f"[{i}/{len(cases)}] {row[0]}: {row[1]}"[:200], file=sys.stderr, flush=True)
    measured = [r for r in rows if r[1] in ("explained", "origin")]
    explained = [r for r in measured if r[1] == "explained"]
    top = sorted((r for r in explained if r[2] is not None), key=lambda r: -(r[2] or 0.0))[:5]
    n, m, e = len(cases), len(measured), len(explained)
    print(f"{engine}: {n} cases, local errors measured on {m}, explained on {e}")
    print(
        "largest local error / its allowance among the explained: "
        + ", ".join(f"{n} {x:.2f}" for n, _, x, _ in top)
    )
    for n, what, _, origins in rows:
        if what == "origin":
            print(f"  ORIGIN {n}: {origins}"[:400])
    why = Counter(what.split(":")[0] for _, what, _, _ in rows if what not in ("explained", "origin"))
    print("not measured: " + ", ".join(f"{k} {v}" for k, v in sorted(why.items())))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--every", type=int, default=1, help="take every N-th case (sorted by name)")
    ap.add_argument("--match", default="", help="only cases whose name contains this")
    ap.add_argument("--limit", type=int, default=0, help="at most this many cases")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="cases run side by side")
    ap.add_argument(
        "--calibrate", metavar="ENGINE", default="", help="only ENGINE's local errors vs reference"
    )
    args = ap.parse_args()
    cases = load_cases(args.match, args.every, args.limit)
    if args.calibrate:
        calibrate(cases, args.calibrate, args.jobs)
        return
    start = time.monotonic()
    outcomes = []
    with concurrent.futures.ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for i, o in enumerate(pool.map(_run_one, cases), 1):
            outcomes.append(o)
            print(f"[{i}/{len(cases)}] {o.name}: {o.status[0]}/{o.status[1]}", file=sys.stderr, flush=True)
    print(summarize(outcomes))
    print(f"({time.monotonic() - start:.0f} s)")


if __name__ == "__main__":
    main()
