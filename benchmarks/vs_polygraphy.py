"""xbackend vs Polygraphy on a per-layer run-to-run check of one ONNX Runtime model.

Builds a 20-block residual MLP (width 768, hidden 3072, sequence 128, batch 1),
then times, in one run of this script:

  xbackend compare M --backends ort-cpu --runs 2 --probes none   (every layer captured)
  polygraphy run M --onnxrt --onnxrt --onnx-outputs '*'  (every layer captured)

Probes are off because Polygraphy runs none (they spawn further engine builds).
Peak memory is the largest sum of RSS over each command's whole process tree,
sampled every 10 ms. xbackend is also measured at --runs 10 to show that its
peak does not grow with the number of runs. Targets: wall time <= 0.5x
Polygraphy's; peak at --runs 10 within 10% of --runs 2.

Usage: python benchmarks/vs_polygraphy.py [--repeat 3] [--blocks 20]
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

import onnx
import psutil

from xbackend.samples import mlp_layernorm


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3, help="measurements per command; the median is printed")
    ap.add_argument("--blocks", type=int, default=20)
    args = ap.parse_args()
    xb, pg = tool("xbackend"), tool("polygraphy")
    with tempfile.TemporaryDirectory(prefix="xbackend-bench-") as tmp:
        model = Path(tmp) / "mlp20.onnx"
        onnx.save(mlp_layernorm(blocks=args.blocks, width=768, hidden=3072, seq=128), str(model))
        size_mb = model.stat().st_size / 2**20
        tensors = len(onnx.load(str(model), load_external_data=False).graph.node)
        print(
            f"model: {args.blocks} blocks, width 768, hidden 3072, seq 128; "
            f"{size_mb:.0f} MiB, {tensors} tensors"
        )

        def xbackend_cmd(runs: int) -> list[str]:
            return [
                xb,
                "compare",
                str(model),
                "--backends",
                "ort-cpu",
                "--runs",
                str(runs),
                "--no-progress",
                "--probes",
                "none",
            ]

        cmds = {
            "xbackend --runs 2": xbackend_cmd(2),
            "xbackend --runs 10": xbackend_cmd(10),
            "polygraphy": [pg, "run", str(model), "--onnxrt", "--onnxrt", "--onnx-outputs", "*"],
        }
        results: dict[str, tuple[float, float]] = {}
        for name, cmd in cmds.items():
            samples = [measure(cmd) for _ in range(args.repeat)]
            codes = {c for _, _, c in samples}
            wall = statistics.median(s[0] for s in samples)
            peak = statistics.median(s[1] for s in samples) / 2**20
            results[name] = (wall, peak)
            print(f"{name:20s} wall {wall:7.2f} s   peak RSS {peak:8.0f} MiB   exit {sorted(codes)}")
    x2, x10, p = results["xbackend --runs 2"], results["xbackend --runs 10"], results["polygraphy"]
    print(f"wall time ratio xbackend/polygraphy (--runs 2): {x2[0] / p[0]:.2f}x  (target <= 0.50x)")
    print(f"peak memory ratio xbackend/polygraphy (--runs 2): {x2[1] / p[1]:.2f}x")
    print(f"peak memory --runs 10 / --runs 2: {x10[1] / x2[1]:.2f}x  (target: flat, <= 1.10x)")


if __name__ == "__main__":
    main()
