"""xbackend's overhead and memory against Polygraphy and a plain ONNX Runtime script.

Builds a 20-block residual MLP (width 768, hidden 3072, batch 1) and measures, in one run
of this script, wall time and peak memory (the largest sum of RSS over each command's
process tree, sampled every 10 ms):

Overhead, at sequence 128 (161 tensors):
  floor       a plain script: ONNX Runtime with every tensor exposed, run twice, compared
              with numpy.array_equal (this file with --floor)
  none        xbackend compare M --backends ort-cpu --runs 2 --probes none
  default     xbackend compare M --backends ort-cpu (default probes: builds, threads)
  opt-levels  the same plus the opt-in opt-levels probe (--probes builds,threads,opt-levels)
  polygraphy  polygraphy run M --onnxrt --onnxrt --onnx-outputs '*'
  Targets (issue 8): none <= 1.5x floor; default <= 0.6x polygraphy.

Memory, at a long sequence (--long-seq, default 2048: intermediates over 2 GiB):
  engine      the plain script, one inference with every tensor exposed (--floor --runs 1)
  none        xbackend as above, --runs 2 and --runs 10
  Target: none <= 1.3x engine, and flat in the number of runs.

Usage: python benchmarks/vs_polygraphy.py [--repeat 3] [--blocks 20] [--long-seq 2048]
       python benchmarks/vs_polygraphy.py --floor MODEL [--runs 2]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil


def tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue
    return total


def measure(cmd: list[str]) -> tuple[float, int, int]:
    """(wall seconds, peak tree RSS bytes, exit code) of one command."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ps = psutil.Process(proc.pid)
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            with contextlib.suppress(psutil.Error):
                peak = max(peak, tree_rss(ps))
            time.sleep(0.01)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    _, err = proc.communicate()
    wall = time.perf_counter() - start
    done.set()
    t.join()
    if proc.returncode not in (0, 1):
        sys.stderr.write(err.decode(errors="replace")[-2000:])
    return wall, peak, proc.returncode


def tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        sys.exit(f"{name} not found; install the dev extras: pip install -e '.[dev]'")
    return found


def floor(model: str, runs: int) -> int:
    """What a user would write: expose every node output, run, compare with array_equal."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    m = onnx.load(model)
    have = {o.name for o in m.graph.output}
    m.graph.output.extend(
        onnx.ValueInfoProto(name=o) for n in m.graph.node for o in n.output if o and o not in have
    )
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    del m
    names = [o.name for o in sess.get_outputs()]
    x = np.random.default_rng(0).standard_normal(sess.get_inputs()[0].shape).astype(np.float32)
    first = sess.run(names, {"x": x})
    same = True
    for _ in range(runs - 1):
        again = sess.run(names, {"x": x})
        same = same and all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
        del again
    return 0 if same else 1


def write_model(path: Path, blocks: int, seq: int) -> str:
    import onnx

    from xbackend.model.samples import mlp_layernorm

    m = mlp_layernorm(blocks=blocks, width=768, hidden=3072, seq=seq)
    onnx.save(m, str(path))
    per_row = blocks * (3072 * 4 + 768 * 4)  # per block: fc1, bias, sigmoid, mul; fc2, bias, add, ln
    return (
        f"{blocks} blocks, seq {seq}: {len(m.graph.node)} tensors, about {per_row * 4 * seq / 2**30:.1f} GiB"
    )


def timed(name: str, cmd: list[str], repeat: int) -> tuple[float, float]:
    samples = [measure(cmd) for _ in range(repeat)]
    wall = statistics.median(s[0] for s in samples)
    peak = statistics.median(s[1] for s in samples) / 2**20
    codes = sorted({c for _, _, c in samples})
    print(f"  {name:28s} wall {wall:7.2f} s   peak RSS {peak:8.0f} MiB   exit {codes}")
    return wall, peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3, help="measurements per command; the median is printed")
    ap.add_argument("--blocks", type=int, default=20)
    ap.add_argument("--long-seq", type=int, default=2048, help="sequence for the memory part (0: skip it)")
    ap.add_argument("--floor", metavar="MODEL", help="run the plain-script floor on MODEL and exit")
    ap.add_argument("--runs", type=int, default=2, help="with --floor: inferences")
    args = ap.parse_args()
    if args.floor:
        sys.exit(floor(args.floor, args.runs))
    xb, pg = tool("xbackend"), tool("polygraphy")
    me = [sys.executable, __file__, "--floor"]

    def xbackend(model: Path, *extra: str) -> list[str]:
        return [xb, "compare", str(model), "--backends", "ort-cpu", "--no-progress", *extra]

    with tempfile.TemporaryDirectory(prefix="xbackend-bench-") as tmp:
        model = Path(tmp) / "mlp.onnx"
        print(f"overhead: {write_model(model, args.blocks, 128)}")
        fl = timed("floor (plain script)", [*me, str(model), "--runs", "2"], args.repeat)
        none = timed(
            "xbackend --probes none", xbackend(model, "--runs", "2", "--probes", "none"), args.repeat
        )
        dflt = timed("xbackend default probes", xbackend(model), args.repeat)
        opt = timed(
            "xbackend + opt-levels", xbackend(model, "--probes", "builds,threads,opt-levels"), args.repeat
        )
        poly = timed(
            "polygraphy", [pg, "run", str(model), "--onnxrt", "--onnxrt", "--onnx-outputs", "*"], args.repeat
        )
        print(f"  --probes none / floor:        {none[0] / fl[0]:.2f}x  (target <= 1.5x)")
        print(f"  default probes / polygraphy:  {dflt[0] / poly[0]:.2f}x  (target <= 0.6x)")
        print(f"  --probes none / polygraphy:   {none[0] / poly[0]:.2f}x")
        print(f"  + opt-levels / polygraphy:    {opt[0] / poly[0]:.2f}x")
        if args.long_seq:
            print(f"memory: {write_model(model, args.blocks, args.long_seq)}")
            eng = timed("engine (one inference)", [*me, str(model), "--runs", "1"], 1)
            x2 = timed(
                "xbackend --probes none --runs 2", xbackend(model, "--runs", "2", "--probes", "none"), 1
            )
            x10 = timed(
                "xbackend --probes none --runs 10", xbackend(model, "--runs", "10", "--probes", "none"), 1
            )
            print(f"  peak xbackend (--runs 2) / engine: {x2[1] / eng[1]:.2f}x  (target <= 1.3x)")
            print(f"  peak --runs 10 / --runs 2:         {x10[1] / x2[1]:.2f}x  (target: flat)")


if __name__ == "__main__":
    main()
