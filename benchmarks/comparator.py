"""Comparator throughput and extra memory, side by side in one run, on one core.

For float32 and float16 pairs of N elements (default 32 Mi) with 0%, 1% and 100% of the
elements differing, times `TensorDiff.from_arrays` and prints:

  GB/s     bytes of both inputs per second (best of --repeat)
  extra    peak memory the compare allocates (tracemalloc: numpy's allocations)
  vs copy  the time of copying one input (the memory-speed floor), as a ratio; the
           machine's copy speed at that moment is printed too (memory bandwidth varies
           on shared machines, and every figure here moves with it)
  vs old   the whole-array comparator it replaced (tests/oracle_diff.py), as a speed-up

Targets (issue 8): >= 10 GB/s identical, >= 5 GB/s at 1%, >= 1 GB/s when all differ;
extra memory < 64 MiB at any size.

Usage: python benchmarks/comparator.py [--elements 33554432] [--repeat 5] [--no-old]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

from xbackend.numerics.metrics import TensorDiff

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def pair(dtype: type, n: int, frac: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(n, dtype=np.float32).astype(dtype)
    if frac == 1.0:
        return np.nextafter(ref, dtype(np.inf)), ref
    cand = ref.copy()
    if frac:
        idx = rng.choice(n, int(n * frac), replace=False)
        cand[idx] = (ref[idx].astype(np.float32) * np.float32(1.001)).astype(dtype)
    return cand, ref


def best(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--elements", type=int, default=32 * 2**20)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-old", action="store_true", help="skip the (slow) whole-array comparator")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    from oracle_diff import oracle

    n = args.elements
    print(f"{n} elements per side, one core ({os.cpu_count()} on the machine)")
    head = ("dtype", "differ", "GB/s", "target", "extra MiB", "vs copy", "copy GB/s", "vs old")
    print("{:8s} {:>6s} {:>7s} {:>10s} {:>9s} {:>8s} {:>9s} {:>8s}".format(*head))
    targets = {0.0: 10.0, 0.01: 5.0, 1.0: 1.0}
    for dtype in (np.float32, np.float16):
        for frac, target in targets.items():
            cand, ref = pair(dtype, n, frac)
            TensorDiff.from_arrays("warm", cand[:4096], ref[:4096])  # compile outside the timing
            secs = best(lambda: TensorDiff.from_arrays("t", cand, ref), args.repeat)  # noqa: B023
            dst = np.empty_like(ref)
            copy = best(lambda: np.copyto(dst, ref), args.repeat)  # noqa: B023
            tracemalloc.start()
            TensorDiff.from_arrays("t", cand, ref)
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            old = "-" if args.no_old else f"{best(lambda: oracle(cand, ref), 1) / secs:7.1f}x"  # noqa: B023
            gbs = 2 * ref.nbytes / secs / 1e9
            mark = "ok" if gbs >= target else "MISS"
            print(
                f"{np.dtype(dtype).name:8s} {frac:6.0%} {gbs:7.2f} {target:5.1f} {mark:>4s}"
                f" {peak / 2**20:9.1f} {secs / copy:7.1f}x {2 * ref.nbytes / copy / 1e9:9.1f} {old:>8s}"
            )


if __name__ == "__main__":
    main()
