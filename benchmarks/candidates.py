"""What a release candidate costs, and what the advisor costs, side by side in one run.

For each original and candidate it times (best of --repeat):
  original   `compare ORIGINAL` with the default backends and probes (and --decode 24 for a causal LM)
  +candidate the same with `--candidate C`: the ratio (target <= 2: the candidate's comparison, its
             matching and judgment cost at most the original's own comparison again)
  +advise    the same with `--advise`: the re-conversions it confirmed by a run (at most its budget,
             --advise-budget, 8 by default), the nodes it keeps, its seconds
and, for a float16 candidate, onnxconverter-common's auto_convert_mixed_precision on the same
inputs with a callback that asks for the same top-1 choices (the next token of each prompt for
a causal LM): its conversions, the nodes it keeps in float32, its seconds. It exits 1 when a
ratio passes 2 or the advisor passes its budget.

Then the quick question: a static QDQ Llama's per-tensor SQNR on one feed, by ONNX Runtime's
`quantization.qdq_loss_debug`, by `xbackend compare ORIGINAL --candidate C --probes none --runs 1`
(the CLI as docs/candidates.md writes it) and by xbackend.compare, each a fresh process timed
whole (start to exit) with its peak memory (the process and its workers): the target is 3x
qdq_loss_debug's time and memory, and the benchmark exits 1 past it.

Models (random weights): models/torch_mlp.onnx as float16 (ONNX Runtime's tool), with its first
weight scaled 1e5 as float16 (it overflows), as static QDQ int8 and with one scale 10x too small,
with --decisions auto; optimum's Llama with a KV cache (tests/optimum/llama.onnx) as float16
and dynamic int8, with --decode 24.

Usage: python benchmarks/candidates.py [--repeat 1]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx

import xbackend

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests import candidate_models as cm  # noqa: E402

LLAMA = ROOT / "tests" / "optimum" / "llama.onnx"


def _best(repeat: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def _auto_mixed(original: Path, feeds: dict[str, np.ndarray], top1: Callable[[list[Any]], Any]) -> str:
    """onnxconverter-common's search with a callback asking for the original's top-1 choices."""
    from onnxconverter_common import auto_mixed_precision, float16

    calls: list[list[str]] = []
    convert = float16.convert_float_to_float16

    def counted(model: Any, *a: Any, **kw: Any) -> Any:
        calls.append(list(kw.get("node_block_list") or []))
        return convert(model, *a, **kw)

    auto_mixed_precision.float16.convert_float_to_float16 = counted  # type: ignore[attr-defined]
    t = time.perf_counter()
    try:
        auto_mixed_precision.auto_convert_mixed_precision(
            onnx.load(original),
            feeds,
            validate_fn=lambda a, b: bool(np.all(top1(a) == top1(b))),
            keep_io_types=True,
        )
        done = f"{len(calls)} conversions, keeps {len(calls[-1]) if calls else 0} node(s) in float32"
    except Exception as e:  # its search fails on some graphs: said as it is
        done = f"failed after {len(calls)} conversions: {type(e).__name__}: {str(e)[:120]}"
    finally:
        auto_mixed_precision.float16.convert_float_to_float16 = convert  # type: ignore[attr-defined]
    return f"{done}, {time.perf_counter() - t:.1f} s"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    bad = 0
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = Path(tmp)
        big = cm.big_weights(d / "big.onnx")
        cases = [
            ("torch_mlp fp16", cm.MLP, cm.fp16(cm.MLP, d / "mlp16.onnx"), {"decisions": "auto"}),
            ("torch_mlp x1e5 fp16", big, cm.fp16(big, d / "big16.onnx"), {"decisions": "auto"}),
            ("torch_mlp QDQ int8", cm.MLP, cm.qdq(d / "mlpq.onnx"), {"decisions": "auto"}),
            (
                "torch_mlp QDQ scale/10",
                cm.MLP,
                cm.scaled_q(cm.qdq(d / "mlpq2.onnx"), d / "mlpq_small.onnx", 0.1),
                {"decisions": "auto"},
            ),
            ("llama fp16", LLAMA, cm.fp16(LLAMA, d / "llama16.onnx"), {"decode": 24}),
            ("llama dynamic int8", LLAMA, cm.dynamic_int8(d / "llama8.onnx", LLAMA), {"decode": 24}),
        ]
        print(f"{'case':<22} {'original s':>10} {'+cand s':>8} {'ratio':>6} {'+advise s':>9}  advice")
        for name, original, cand, kw in cases:
            t0, _ = _best(args.repeat, lambda o=original, k=kw: xbackend.compare(o, **k))
            t1, _ = _best(
                args.repeat, lambda o=original, c=cand, k=kw: xbackend.compare(o, candidates=[str(c)], **k)
            )
            t2, r = _best(
                args.repeat,
                lambda o=original, c=cand, k=kw: xbackend.compare(o, candidates=[str(c)], advise=True, **k),
            )
            a = r.candidates[0].advice
            tries = len(a.tried) if a is not None else 0
            words = (
                f"{a.status}: keeps {len(a.keep)} node(s) ({a.scored} scored), {tries} re-conversion(s), "
                f"{a.seconds:.1f} s"
                if a is not None
                else "none"
            )
            ratio = t1 / t0
            print(f"{name:<22} {t0:>10.2f} {t1:>8.2f} {ratio:>6.2f} {t2:>9.2f}  {words}")
            bad += ratio > 2.0 or (a is not None and tries > a.budget)
            if "fp16" in name:
                if "llama" in name:
                    feeds = _llama_feeds(original, 12)

                    def top1(res: list[Any]) -> Any:
                        return np.argmax(res[0][:, -1], axis=-1)  # the next token
                else:
                    feeds = {"x": np.random.default_rng(0).standard_normal((1, 16, 64)).astype(np.float32)}

                    def top1(res: list[Any]) -> Any:
                        return np.argmax(res[0], axis=-1)

                print(f"{'':<22} auto_convert_mixed_precision: {_auto_mixed(original, feeds, top1)}")
        print()
        lines, worst = quick_table(d, args.repeat + 2)
        for line in lines:
            print(line)
        bad += worst > 3.0
    return 1 if bad else 0


_QUICK = """
import json, logging, sys, tempfile, warnings
import numpy as np
warnings.simplefilter("ignore")
logging.getLogger().setLevel(logging.ERROR)
what, original, candidate, npz = sys.argv[1:5]
if what == "qdq_loss_debug":
    from onnxruntime.quantization import CalibrationDataReader
    from onnxruntime.quantization import qdq_loss_debug as q

    feeds = dict(np.load(npz))

    class Once(CalibrationDataReader):
        def __init__(self):
            self.it = iter([feeds])

        def get_next(self):
            return next(self.it, None)

    d = tempfile.mkdtemp()
    q.modify_model_output_intermediate_tensors(original, d + "/f.onnx")
    q.modify_model_output_intermediate_tensors(candidate, d + "/q.onnx")
    pairs = q.create_activation_matching(
        q.collect_activations(d + "/q.onnx", Once()), q.collect_activations(d + "/f.onnx", Once())
    )
    n = len(q.compute_activation_error(pairs))
else:
    import xbackend

    r = xbackend.compare(original, candidates=[candidate], probes=["none"], runs=1, inputs=npz)
    n = sum(1 for m in r.candidates[0].matches if m.sqnr_db is not None)
print(json.dumps({"tensors": n}))
"""


def quick_table(d: Path, repeat: int = 3) -> tuple[list[str], float]:
    """qdq_loss_debug, the CLI as documented and the Python API on the same model and feed, each
    a fresh process timed whole (start, imports, work, exit: what a user waits for), best of
    `repeat` after one run that writes the bytecode caches; and the largest ratio to
    qdq_loss_debug's time or peak memory."""
    import json
    import os
    import re
    import subprocess

    cand = d / "llama_qdq.onnx"
    _qdq_llama(cand)
    npz = d / "feed.npz"
    np.savez(npz, **_llama_feeds(LLAMA, 12))
    # a user's interpreter caches bytecode; without it every start compiles xbackend (0.3 s)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    xb = str(Path(sys.executable).with_name("xbackend"))
    runs = {
        "qdq_loss_debug": [sys.executable, "-c", _QUICK, "qdq_loss_debug"],
        "xbackend compare (CLI)": [
            *(xb, "compare", str(LLAMA), "--candidate", str(cand), "--probes", "none", "--runs", "1"),
            *("--inputs", str(npz), "--no-progress"),
        ],
        "xbackend.compare (Python)": [sys.executable, "-c", _QUICK, "python"],
    }
    head = f"{'process s':>9} {'peak MB':>8} {'tensors':>8} {'x time':>7} {'x mem':>6}"
    out = [f"{'quick SQNR table (llama, static QDQ, 12 tokens)':<48} {head}"]
    base: dict[str, float] = {}
    worst = 0.0
    for what, argv in runs.items():
        if what != "xbackend compare (CLI)":
            argv = [*argv, str(LLAMA), str(cand), str(npz)]
        best: dict[str, float] = {}
        for _ in range(repeat + 1):
            # GNU time's peak: the process's own (a fork inherits its parent's high-water mark, so
            # a process started from this one would report ours) and its workers'
            done = subprocess.run(
                ["/usr/bin/time", "-f", "PEAK %M WALL %e", *argv], capture_output=True, text=True, env=env
            )
            tail = done.stderr.rsplit("PEAK ", 1)[1].split()
            got = {"mb": int(tail[0]) / 1024, "s": float(tail[2])}
            matched = re.search(r"(\d+) of \d+ tensors matched", done.stdout)
            if matched:
                got["tensors"] = int(matched.group(1))
            else:
                got["tensors"] = json.loads(done.stdout.strip().splitlines()[-1])["tensors"]
            best = got if not best or got["s"] < best["s"] else best
        base = base or best
        x_time, x_mem = best["s"] / base["s"], best["mb"] / base["mb"]
        worst = max(worst, x_time, x_mem)
        figures = f"{best['s']:>9.2f} {best['mb']:>8.0f} {best['tensors']:>8.0f}"
        out.append(f"{what:<48} {figures} {x_time:>7.1f} {x_mem:>6.1f}")
    return out, worst


def _llama_feeds(model: Path, t: int) -> dict[str, np.ndarray]:
    feeds: dict[str, np.ndarray] = {
        "input_ids": np.random.default_rng(0).integers(0, 256, (1, t)).astype(np.int64),
        "attention_mask": np.ones((1, t), np.int64),
        "position_ids": np.arange(t, dtype=np.int64)[None],
    }
    for i in onnx.load(model, load_external_data=False).graph.input:
        if i.name.startswith("past_key_values"):
            dims = [x.dim_value for x in i.type.tensor_type.shape.dim]
            feeds[i.name] = np.zeros((1, dims[1], 0, dims[3]), np.float32)
    return feeds


def _qdq_llama(dest: Path) -> None:
    """Static QDQ int8 of every op, calibrated on three 12-token prompts."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter([_llama_feeds(LLAMA, 12) for _ in range(3)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.it, None)

    quantize_static(
        str(LLAMA), str(dest), Reader(), quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
