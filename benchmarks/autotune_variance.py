"""Does autotuning make builds differ, here? K fresh builds each of TorchInductor with autotune
off, on, and on with a pin file, side by side in one run.

Each build is a fresh worker process with an empty Inductor cache, as `xbackend compare
--builds K` makes them. Prints, per configuration: distinct outputs and distinct fingerprints
over the K builds, the tuned ops whose kernel choice moved (with their module paths), the
largest scaled ULP between build 0 and the others, and the seconds each build took.

Usage: python benchmarks/autotune_variance.py [--builds 4] [--device cpu|cuda]
           [--module tests/wide_mlp.py:build --input x=64,512]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from xbackend.execution.executor import Executor, Job, standard_phases
from xbackend.execution.progress import NullProgress
from xbackend.export.torch_onnx import InputDecl, export_torch
from xbackend.model.inputs import generate_feeds
from xbackend.model.load import load_model
from xbackend.probes.autotune import variant_row
from xbackend.probes.builds import BuildVariance
from xbackend.runners.registry import get_runner

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--builds", type=int, default=4)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--module", default=f"{ROOT / 'tests' / 'wide_mlp.py'}:build")
    ap.add_argument("--input", default="x=64,512", help="NAME=D1,D2,... for the export")
    ap.add_argument("--timeout", type=float, default=1200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="xbackend-autotune-") as tmp:
        work = Path(tmp)
        model = work / "model.onnx"
        export_torch(args.module, [InputDecl.parse(args.input)], model, output_names=["y"])
        spec, _ = load_model(model)
        feeds = work / "feeds.xbv"
        generate_feeds(spec, 0).save(feeds)
        ex = Executor(spec, work / "jobs", args.timeout, NullProgress())
        pin = work / "pin.json"
        configs = [
            ("autotune off", "torch-compile", {}),
            ("autotune on", "torch-compile-autotune", {}),
            ("autotune on, pinned", "torch-compile-autotune", {"pin": str(pin)}),
        ]
        print(f"{args.module} ({args.input}) on {args.device}, {args.builds} fresh builds each")
        n = 0
        for label, backend, extra in configs:
            cls = get_runner(backend)
            raw = tuple(sorted({"module": args.module, "device": args.device, **extra}.items()))
            phases = standard_phases(cls, spec, 1, layers=False)
            outs = []
            for _ in range(args.builds):
                n += 1
                o = ex.run(Job(f"b{n}", backend, cls, raw, feeds, phases, fingerprint=True))
                if not o.ok:
                    sys.exit(f"{label}: build failed: {o.reason}")
                outs.append(o)
            row = variant_row(spec, backend, label, backend, outs)
            seconds = row.build_s
            tuned = dict(outs[0].result.info).get("tuned_ops", "?")
            print(
                f"  {label:22s} distinct outputs {row.distinct_outputs}/{args.builds}  distinct fingerprints "
                f"{row.distinct_fingerprints}/{args.builds}  tuned ops {tuned}  worst scaled ULP between "
                f"builds {row.scaled_ulp:g}  build s median {statistics.median(seconds):.1f} "
                f"(min {min(seconds):.1f}, max {max(seconds):.1f})"
            )
            v = BuildVariance.from_fingerprints(backend, [o.outputs.fingerprint for o in outs], False)
            others = [k for k, _ in v.varying_layers if not k.startswith("tuned ")]
            if others:
                print(f"      also differs between builds: {', '.join(others)}")
            for op, choices in row.moved:
                print(f"      choice moved: {op}: {' | '.join(choices)}")


if __name__ == "__main__":
    main()
