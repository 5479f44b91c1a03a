"""What each determinism mode costs, here: every mode of each runner side by side in one run.

For each case, `xbackend compare --modes RUNNER` on one model: each mode's promises as observed
(run-to-run over the runs, build-to-build over the fresh builds, batch-position by the batch
probe where the model has a batch dimension), its distinct outputs, and its median latency
over the same runs whose bits were compared, as a ratio of the default mode's.

Cases (CPU; `--device cuda` adds the GPU families where the runners are available):
- ort-cpu on the scatter-add sample (ScatterND add: a race at 2+ threads) and on the
  residual MLP (models/torch_mlp.onnx);
- torch and torch-compile-autotune on the 2-block 512->1024 MLP (tests/wide_mlp.py), batch 64;
- torch on models/torch_index_add.onnx (index_add_ of 2048 points into 2 cells).

Usage: python benchmarks/determinism_cost.py [--builds 3] [--timed-runs 20] [--only NAME]
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

import xbackend
from xbackend.execution.progress import NullProgress
from xbackend.export.torch_onnx import InputDecl, export_torch
from xbackend.model.samples import scatter_add

ROOT = Path(__file__).resolve().parent.parent
WIDE = f"{ROOT / 'tests' / 'wide_mlp.py'}:build"
INDEX_ADD = f"{ROOT / 'models' / 'torch_index_add.py'}:build"


@dataclass
class Case:
    name: str
    model: str
    runner: str
    options: dict[str, str] = field(default_factory=dict)  # for every instance of the runner
    shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    batch: int = 0  # batch probe with batches of this size (0: none)


def cases(work: Path, device: str) -> list[Case]:
    scatter = work / "scatter_add.onnx"
    onnx.save(scatter_add(points=2048), scatter)
    wide = work / "wide_mlp.onnx"
    export_torch(WIDE, [InputDecl.parse("x=64,512")], wide, output_names=["y"], dynamic={"x": {0: "batch"}})
    mlp = str(ROOT / "models" / "torch_mlp.onnx")
    index_add = str(ROOT / "models" / "torch_index_add.onnx")
    torch_opts = {"module": WIDE}
    shape = (("x", (64, 512)),)
    out = [
        Case("scatter-add", str(scatter), "ort-cpu"),
        Case("residual-mlp", mlp, "ort-cpu"),
        Case("wide-mlp", str(wide), "torch", torch_opts, shape, 4),
        Case("wide-mlp", str(wide), "torch-compile-autotune", torch_opts, shape, 4),
        Case("index-add", index_add, "torch", {"module": INDEX_ADD}),
    ]
    if device == "cuda":
        out += [
            Case("scatter-add", str(scatter), "ort-cuda"),
            Case("index-add", index_add, "torch-cuda", {"module": INDEX_ADD}),
            Case("wide-mlp", str(wide), "torch-compile", {**torch_opts, "device": "cuda"}, shape, 4),
        ]
    return out


def measure(c: Case, builds: int, timed: int) -> Any:
    from xbackend.results.options import expand_modes

    listed, _ = expand_modes((), (c.runner,))
    return xbackend.compare(
        c.model,
        NullProgress(),
        modes=c.runner,
        runs=3,
        builds=builds,
        timed_runs=timed,
        shapes=c.shapes,
        batch_invariance=c.batch,
        probes=["batch"] if c.batch else ["none"],
        noise_samples=0,
        runner_options={b: c.options for b in listed} if c.options else None,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--builds", type=int, default=3)
    ap.add_argument("--timed-runs", type=int, default=20)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--only", default="", help="run only the cases whose runner or model name contains this")
    args = ap.parse_args()
    header = "case | mode | promises | distinct outputs (runs / builds) | median ms | min-max ms | x default"
    print(header)
    print("|".join("---" for _ in header.split("|")))
    with tempfile.TemporaryDirectory(prefix="xbackend-cost-") as tmp:
        for c in cases(Path(tmp), args.device):
            if args.only and args.only not in c.runner and args.only not in c.name:
                continue
            r = measure(c, args.builds, args.timed_runs)
            for fam in r.cost_of_determinism():
                for m in fam.rows:
                    if m.status != "ok":
                        print(f"{c.name} | {m.backend} | {m.status}: {r.backend(m.backend).reason}")
                        continue
                    lat = m.latency
                    spread = f"{lat.min_ms:.3g}-{lat.max_ms:.3g}" if lat else "-"
                    median = f"{lat.median_ms:.3g}" if lat else "-"
                    ratio = f"{m.ratio:.2f}" if m.ratio is not None else "-"
                    distinct = f"{m.distinct_run_outputs} / {m.distinct_build_outputs}"
                    words = m.promise_words().replace("**", "")
                    row = [c.name, m.backend, words, distinct, median, spread, ratio]
                    print(" | ".join(row), flush=True)


if __name__ == "__main__":
    main()
