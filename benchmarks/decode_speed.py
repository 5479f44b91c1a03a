"""What `--decode` costs per backend against a plain onnxruntime greedy loop, side by side in one run.

For a Llama-style model with a KV cache and a GPT-2-style one without (random init, exported with
dynamic axes by tests/decoder_lm.py, vocabulary 512 or --vocab), it times:
  plain    a greedy loop on one onnxruntime InferenceSession in this process: feeds built with
           numpy, argmax of the last position, N steps per prompt (the unit)
  xbackend `compare --backends ort-cpu --decode N --timings`: the same steps in ort-cpu's worker
           (the step time the report records: a prompt alone, build excluded)
and prints xbackend / plain per step (each side run --repeat times, alternating, its best median
kept: the machine may be busy), beside the target 1.3, and the whole comparison's wall time
(process start, build, decoding and the one step compared layer by layer) for scale.

Usage: python benchmarks/decode_speed.py [--steps 24] [--prompts 4] [--tokens 16] [--dim 64]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import xbackend  # noqa: E402
from tests.decoder_lm import export  # noqa: E402
from xbackend.runners.ort_cpu import physical_cores  # noqa: E402

TARGET = 1.3


def _plain(model: Path, prompts: list[np.ndarray], steps: int) -> float:
    """Median seconds per step of a plain onnxruntime greedy loop."""
    so = ort.SessionOptions()  # as ort-cpu sets its sessions: the same kernels, timed alike
    so.intra_op_num_threads = physical_cores()
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    s = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    names = [i.name for i in s.get_inputs()]
    outs = [o.name for o in s.get_outputs()]
    heads, dim = (s.get_inputs()[3].shape[1], s.get_inputs()[3].shape[3]) if len(names) > 3 else (0, 0)
    times = []
    for prompt in prompts:
        seq = [int(t) for t in prompt]
        past = {n: np.zeros((1, heads, 0, dim), np.float32) for n in names[3:]}
        fed = list(seq)
        for _ in range(steps):
            t0 = time.perf_counter()
            start = len(seq) - len(fed)
            feeds = {
                "input_ids": np.array([fed], np.int64),
                "attention_mask": np.ones((1, len(seq)), np.int64),
                "position_ids": np.arange(start, len(seq), dtype=np.int64)[None],
                **past,
            }
            out = dict(zip(outs, s.run(None, feeds), strict=True))
            token = int(np.argmax(out["logits"][0, -1]))
            seq.append(token)
            if past:
                past = {n: out[n.replace("past_key_values", "present")] for n in past}
                fed = [token]
            else:
                fed = list(seq)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument(
        "--repeat", type=int, default=3, help="each side this often, alternating; the best median"
    )
    a = ap.parse_args()
    head = ("model", "plain ms/step", "xbackend ms/step", "ratio", "target", "compare s")
    print(f"{head[0]:<10} {head[1]:>14} {head[2]:>17} {head[3]:>7} {head[4]:>7} {head[5]:>10}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, style, cache in (("llama-kv", "llama", True), ("gpt2", "gpt2", False)):
            path = Path(tmp) / f"{name}.onnx"
            export(str(path), style, cache=cache, dim=a.dim, vocab=a.vocab)
            rng = np.random.default_rng(0)
            prompts = [rng.integers(0, a.vocab, a.tokens) for _ in range(a.prompts)]
            npz = Path(tmp) / "prompts.npz"
            np.savez(npz, input_ids=np.stack(prompts).astype(np.int64))
            mine_all, plain_all, walls = [], [], []
            for _ in range(a.repeat):  # alternating: a busy moment costs both sides alike
                t0 = time.perf_counter()
                r = xbackend.compare(
                    path, backends="ort-cpu", decode=a.steps, inputs=str(npz), timings=True, probes="none",
                    runs=1, noise_samples=0, outputs_only=True,
                )  # fmt: skip
                walls.append(time.perf_counter() - t0)
                assert r.decode is not None
                mine_all.append(r.decode.backend("ort-cpu").step_ms or float("nan"))
                plain_all.append(_plain(path, prompts, a.steps) * 1e3)
            ours, plain, wall = min(mine_all), min(plain_all), min(walls)
            ratio = ours / plain
            mine = ours
            print(f"{name:<10} {plain:>14.3f} {mine:>17.3f} {ratio:>7.2f} {TARGET:>7.1f} {wall:>10.1f}")


if __name__ == "__main__":
    main()
