"""What the explanation costs: each node judged against float64 (the float64 judge, one severed
run per backend) and, asked for, the noise floor (K permuted runs), against the comparison
without it, side by side in one run.

For each model it times, in this order:
  plain    `compare --backends ort-cpu --runs 1 --outputs-only --probes none --noise-samples 0`:
           one worker that builds ort-cpu and runs the model once (the unit)
  compare  `compare --backends ort-cpu,reference --runs 1 --probes none --noise-samples 0`
  explain  the same with the default explanation (no floor: every backend is judged)
  default  `compare --backends ort-cpu,reference` (3 runs, the default probes) without
           (`--noise-samples 0`) and with the default explanation: the comparison users run,
           where the explanation starts beside the probes (the ratio, target 1.5)
  +floors  the default comparison with `--noise-samples K`: the floors and the per-node check
           of the allowances against K orders, asked for
and the arithmetic floor of the float64 judge (benchmarks/arithmetic_floor.py: numpy's float64
products of each MatMul and Gemm, and their magnitudes'). It prints explain - compare in units
of plain, explain / compare, and the default comparison's ratio; it exits 1 when a default
ratio passes 1.5. Peak memory of this process and its workers is printed from
resource.getrusage (max RSS of any child).

Usage: python benchmarks/explain_cost.py [--samples 8] [--repeat 1]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import onnx

import xbackend
from xbackend.model.samples import mlp_layernorm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arithmetic_floor import gemm_operands, seconds

ROOT = Path(__file__).resolve().parent.parent


def _time(model: Path, repeat: int, **kw: object) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        xbackend.compare(model, runs=1, probes=[], **kw)
        best = min(best, time.perf_counter() - t)
    return best


def _default(model: Path, repeat: int, **kw: object) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        xbackend.compare(model, backends="ort-cpu,reference", **kw)
        best = min(best, time.perf_counter() - t)
    return best


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stack = Path(tmp) / "residual_stack_20x768.onnx"
        onnx.save(mlp_layernorm(blocks=20, width=768, hidden=768, seq=128), str(stack))
        models = [ROOT / "models" / "torch_mlp.onnx", stack]
        target = "the default comparison with the explanation <= 1.5 x without it"
        print(f"K = {a.samples}; targets: {target}")
        print(
            f"{'model':32s} {'plain s':>8s} {'compare s':>10s} {'explain s':>10s} {'cost / plain':>13s}"
            f" {'explain / compare':>18s} {'default s':>10s} {'+explain s':>11s} {'ratio':>6s}"
            f" {'f64 floor s':>12s} {'+floors s':>10s}"
        )
        worst = 0.0
        worst_share = 0.0
        for m in models:
            plain = _time(m, a.repeat, backends="ort-cpu", outputs_only=True, noise_samples=0)
            base = _time(m, a.repeat, backends="ort-cpu,reference", noise_samples=0)
            full = _time(m, a.repeat, backends="ort-cpu,reference")
            dbase = _default(m, a.repeat, noise_samples=0)
            dfull = _default(m, a.repeat)
            floors = _default(m, a.repeat, noise_samples=a.samples)
            ratio = (full - base) / plain
            worst = max(worst, ratio)
            worst_share = max(worst_share, dfull / dbase)
            floor = seconds(gemm_operands(m, {}), max(a.repeat, 3))
            print(
                f"{m.name:32s} {plain:8.2f} {base:10.2f} {full:10.2f} {ratio:13.2f} {full / base:18.2f}"
                f" {dbase:10.2f} {dfull:11.2f} {dfull / dbase:6.2f} {floor:12.3f} {floors:10.2f}"
            )
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"largest worker peak RSS: {peak:.0f} MiB")
    return 0 if worst_share <= 1.5 else 1


if __name__ == "__main__":
    sys.exit(main())
