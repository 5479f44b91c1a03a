"""Time and peak memory against model size and sequence length, on GPT-2-style models.

Exports random-init GPT-2 language models (transformers, seed 0, `xbackend export torch` with a
dynamic sequence axis; weights past 2 GiB go to external data) and measures, in one run of this
script, wall time and peak memory (the largest sum of RSS over each command's process tree,
sampled every 10 ms) of:

  floor       a plain script: ONNX Runtime with every tensor exposed, run twice, compared
              with numpy.array_equal (this file with --floor)
  ort-cpu     xbackend compare M --backends ort-cpu --runs 2 --probes none (per layer)
  reference   the same with --backends reference (onnx's evaluator)
  oracle      the same with --backends oracle (float64)
  polygraphy  polygraphy run M --onnxrt --onnxrt --onnx-outputs '*' (where it runs at all)

Two sweeps: sequence length (64/256/1024) at GPT-2 small (12 layers, width 768), and model
size (2/12 layers at width 768, and GPT-2 large: 36 layers, width 1280, 3.1 GB) at sequence 64.
With --static each case is also exported at its fixed length: the memory plan's bytes per run
for both exports, and ort-cpu on the static one, beside the dynamic one's.
Each backend's own peak (`backends[].peak_rss_bytes`, measured in its worker) is printed
beside the whole run's. Targets (issue 28): ort-cpu per layer at T=1024 <= 1.5x the floor;
each backend within 1.3x its weights + one run's activations + 1 GiB.

With --explain it measures, per case instead, what the explanation costs: `compare M --backends
ort-cpu,reference,oracle --runs 2` with the default probes and explanation, against the same
with `--noise-samples 0`, side by side, and prints the ratio (target, issue 48: 1.3x), each
run's peak memory, what the explanation judged (each backend's status) and the windows its
float64 judges and severed runs were cut into.

Usage: python benchmarks/scale.py [--seqs 64,256,1024] [--sizes 2,12,36] [--backends ...]
                                  [--skip-polygraphy] [--static] [--workdir DIR] [--table FILE.md]
                                  [--plot FILE.png] [--log FILE]
       python benchmarks/scale.py --explain [--seqs 512,1024] [--sizes 36] [--workdir DIR]
       python benchmarks/scale.py --floor MODEL --seq T [--runs 2]
       python benchmarks/scale.py --replot LOG --plot FILE.png   (the figure from a run's log)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_polygraphy import measure, tool

SIZES = {2: (2, 768, 12), 12: (12, 768, 12), 36: (36, 1280, 20)}  # layers: (layers, width, heads)

FACTORY = """
import torch, transformers

class LM(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids):
        return self.m(input_ids=input_ids, use_cache=False).logits

def build():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer={layers}, n_embd={width}, n_head={heads}, n_positions=1024, attn_implementation="eager"
    )
    return LM(transformers.GPT2LMHeadModel(cfg).eval())
"""


def floor(model: str, seq: int, runs: int) -> int:
    """What a user would write: expose every node output, run, compare with array_equal. The
    model is rewritten beside the original so that its external data stays where it is."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    m = onnx.load(model, load_external_data=False)
    have = {o.name for o in m.graph.output}
    m.graph.output.extend(
        onnx.ValueInfoProto(name=o) for n in m.graph.node for o in n.output if o and o not in have
    )
    exposed = str(Path(model).with_suffix(".floor.onnx"))
    with open(exposed, "wb") as f:
        f.write(m.SerializeToString())
    del m
    try:
        sess = ort.InferenceSession(exposed, providers=["CPUExecutionProvider"])
    finally:
        os.unlink(exposed)
    names = [o.name for o in sess.get_outputs()]
    ids = np.random.default_rng(0).integers(0, 50257, (1, seq), dtype=np.int64)
    first = sess.run(names, {"input_ids": ids})
    same = True
    for _ in range(runs - 1):
        again = sess.run(names, {"input_ids": ids})
        same = same and all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
        del again
    return 0 if same else 1


def export(workdir: Path, layers: int, static: int = 0) -> tuple[Path, int]:
    """The GPT-2-style model with `layers` layers (cached in workdir) and its weight bytes: with
    a dynamic sequence axis, or fixed at `static` tokens."""
    n, width, heads = SIZES[layers]
    model = workdir / f"gpt2-{n}x{width}{f'-T{static}' if static else ''}" / "model.onnx"
    if not model.exists():
        model.parent.mkdir(parents=True, exist_ok=True)
        factory = model.parent / "factory.py"
        factory.write_text(FACTORY.format(layers=n, width=width, heads=heads))
        t = time.perf_counter()
        shape = ["--input", f"input_ids=1,{static}:int64"] if static else [
            "--input", "input_ids=1,8:int64", "--dynamic", "input_ids=1:sequence"]  # fmt: skip
        subprocess.run(
            [tool("xbackend"), "export", "torch", f"{factory}:build", "-o", str(model),
             "--range", "input_ids=0:50257", *shape],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        print(f"  (exported {model.parent.name} in {time.perf_counter() - t:.0f} s)", flush=True)
    weights = sum(p.stat().st_size for p in model.parent.glob("model.onnx*"))  # the proto and its data
    return model, weights


def xbackend_row(
    model: Path, seq: int, backend: str, tmp: Path, dynamic: bool = True
) -> tuple[float, int, int, int]:
    """(wall s, whole-run peak, the backend's own peak, exit code) of one per-layer compare."""
    js = tmp / "r.json"
    cmd = [
        tool("xbackend"), "compare", str(model), "--backends", backend, "--runs", "2",
        "--probes", "none", *(["--shape", f"sequence={seq}"] if dynamic else []),
        "--range", "input_ids=0:50257", "--timings", "--no-progress", "--json", str(js),
    ]  # fmt: skip
    wall, peak, code = measure(cmd)
    own = 0
    if js.exists():
        for b in json.loads(js.read_text()).get("backends", []):
            own = max(own, int(b.get("peak_rss_bytes") or 0))
        js.unlink()
    return wall, peak, own, code


def explain_rows(model: Path, seq: int, say: Callable[[str], None]) -> float:
    """The default comparison with and without the explanation, side by side: their ratio."""
    base = [
        tool("xbackend"), "compare", str(model), "--backends", "ort-cpu,reference,oracle", "--runs", "2",
        "--shape", f"sequence={seq}", "--range", "input_ids=0:50257", "--no-progress",
    ]  # fmt: skip
    walls = []
    with tempfile.TemporaryDirectory() as tmp:
        js = Path(tmp) / "r.json"
        for label, extra in (("without", ["--noise-samples", "0"]), ("explained", ["--json", str(js)])):
            wall, peak, code = measure([*base, *extra])
            walls.append(wall)
            say(f"  {label:11s} {wall:7.1f} s  peak {peak / 2**30:5.2f} GiB  exit {code}")
        # what the explanation judged, and how its runs were cut to fit
        r = json.loads(js.read_text()) if js.exists() else {}
        ex = r.get("explanation") or {}
        local = {x.get("backend"): x.get("status") for x in ex.get("local_errors") or []}
        say(f"  explanation {ex.get('status', '?')}: {local or ex.get('reason', '')}")
        for note in r.get("notes") or []:
            if "windows" in note:
                say(f"    {note}")
    ratio = walls[1] / walls[0]
    say(f"  ratio       {ratio:.2f}x (target 1.3x)")
    return ratio


def planned_run(model: Path, seq: int) -> int:
    """Bytes of one run's tensors as xbackend's memory plan sizes them before running."""
    import onnx

    from xbackend.model.footprint import tensor_bytes

    proto = onnx.load(str(model), load_external_data=False)
    sizes = tensor_bytes(proto, {"input_ids": (1, seq)})
    return sum(sizes.get(o, 0) for n in proto.graph.node for o in n.output if o)


LINE = re.compile(r"^  (\S+)\s+([\d.]+) s  peak\s+([\d.]+) GiB(?: \(backend\s+([\d.]+) GiB\))?  exit (-?\d+)")


def parse_log(text: str) -> list[tuple[str, str, float, float, int]]:
    """(case, tool, wall s, peak GiB, exit) from the lines this script prints; a backend's own
    peak where it was measured, else the whole command's."""
    rows, case = [], ""
    for line in text.splitlines():
        if line and not line.startswith(" ") and " T=" in line:
            case = line.split(" (")[0]
        elif m := LINE.match(line):
            tool_, wall, peak, own, code = m.groups()
            rows.append((case, tool_, float(wall), float(own or peak), int(code)))
    return rows


def plot(rows: list[tuple[str, str, float, float, int]], png: str) -> None:
    """Wall time and peak memory per tool, one point per case (model size, then sequence)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    cases = list(dict.fromkeys(r[0] for r in rows))
    tools = list(dict.fromkeys(r[1] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, col, label in ((axes[0], 2, "wall time (s)"), (axes[1], 3, "peak memory (GiB)")):
        for t in tools:
            # xbackend's exit 1 is a finding (differences); another tool's is a failure
            ok = (0, 1) if t not in ("floor", "polygraphy") else (0,)
            pts = [(cases.index(r[0]), r[col]) for r in rows if r[1] == t and r[4] in ok]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=t)
        ax.set_xticks(range(len(cases)), [c.replace("gpt2-", "").replace(" T=", "\nT=") for c in cases])
        ax.set_ylabel(label)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("xbackend per layer (2 runs) against the floor script and Polygraphy, GPT-2-style models")
    fig.tight_layout()
    fig.savefig(png, dpi=110, metadata={"Software": None})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqs", default="64,256,1024", help="sequence lengths at 12 layers")
    ap.add_argument("--sizes", default="2,12,36", help="layer counts at sequence 64 (of 2, 12, 36)")
    ap.add_argument("--backends", default="ort-cpu,reference,oracle")
    ap.add_argument("--skip-polygraphy", action="store_true")
    ap.add_argument(
        "--explain", action="store_true", help="the explanation's cost: compare with and without it"
    )
    ap.add_argument(
        "--static",
        action="store_true",
        help="also export each length statically: its plan and ort-cpu beside",
    )
    ap.add_argument("--workdir", help="where exported models are kept between runs (default: a temp dir)")
    ap.add_argument("--table", help="also write the table as Markdown to FILE")
    ap.add_argument("--floor", metavar="MODEL", help="run the plain-script floor on MODEL and exit")
    ap.add_argument("--seq", type=int, default=64, help="with --floor: sequence length")
    ap.add_argument("--runs", type=int, default=2, help="with --floor: inferences")
    ap.add_argument("--plot", help="draw wall time and peak memory per tool to FILE.png")
    ap.add_argument(
        "--replot", metavar="LOG", help="with --plot: draw from the printed log of an earlier run"
    )
    args = ap.parse_args()
    if args.floor:
        sys.exit(floor(args.floor, args.seq, args.runs))
    if args.replot:
        plot(parse_log(Path(args.replot).read_text()), args.plot or "scale.png")
        return
    backends = [b for b in args.backends.split(",") if b]
    cases = [(12, int(s)) for s in args.seqs.split(",") if s]
    cases += [(int(n), 64) for n in args.sizes.split(",") if n and (int(n), 64) not in cases]
    rows: list[str] = []
    printed: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        printed.append(text)

    with tempfile.TemporaryDirectory(prefix="xbackend-scale-") as t:
        tmp = Path(t)
        workdir = Path(args.workdir) if args.workdir else tmp
        for layers, seq in sorted(cases, key=lambda c: (c[0], c[1])):
            model, weights = export(workdir, layers)
            name = f"{model.parent.name} T={seq}"
            say(f"{name} ({weights / 2**30:.2f} GiB of weights)")
            if args.explain:
                ratio = explain_rows(model, seq, say)
                rows.append(f"| {name} | {weights / 2**30:.2f} GiB | {ratio:.2f}x |")
                continue
            fl = measure([sys.executable, __file__, "--floor", str(model), "--seq", str(seq)])
            say(f"  floor       {fl[0]:7.1f} s  peak {fl[1] / 2**30:5.2f} GiB  exit {fl[2]}")
            cells = [f"{fl[0]:.1f} s, {fl[1] / 2**30:.2f} GiB" if fl[2] == 0 else f"failed ({fl[2]})"]
            for b in backends:
                wall, peak, own, code = xbackend_row(model, seq, b, tmp)
                ratio = f"  {wall / fl[0]:.2f}x floor" if b == "ort-cpu" and fl[2] == 0 else ""
                say(
                    f"  {b:11s} {wall:7.1f} s  peak {peak / 2**30:5.2f} GiB (backend "
                    f"{own / 2**30:5.2f} GiB)  exit {code}{ratio}"
                )
                cells.append(f"{wall:.1f} s, {own / 2**30:.2f} GiB" if code in (0, 1) else f"failed ({code})")
            if args.static:  # the same model exported at this length: the plan and ort-cpu beside
                fixed, _ = export(workdir, layers, static=seq)
                plans = (planned_run(model, seq), planned_run(fixed, seq))
                dyn, fix = (f"{p / 2**30:.3f}" for p in plans)
                say(f"  plan        {dyn} GiB per run (dynamic export), {fix} (static)")
                wall, peak, own, code = xbackend_row(fixed, seq, "ort-cpu", tmp, dynamic=False)
                ratio = f"  {wall / fl[0]:.2f}x floor" if fl[2] == 0 else ""
                say(
                    f"  static      {wall:7.1f} s  peak {peak / 2**30:5.2f} GiB (backend "
                    f"{own / 2**30:5.2f} GiB)  exit {code}{ratio}"
                )
                cells.append(f"{wall:.1f} s, {own / 2**30:.2f} GiB" if code in (0, 1) else f"failed ({code})")
            if not args.skip_polygraphy:
                pg = measure(
                    [tool("polygraphy"), "run", str(model), "--onnxrt", "--onnxrt", "--onnx-outputs", "*",
                     "--input-shapes", f"input_ids:[1,{seq}]", "--val-range", "input_ids:[0,50256]"]
                )  # fmt: skip
                say(f"  polygraphy  {pg[0]:7.1f} s  peak {pg[1] / 2**30:5.2f} GiB  exit {pg[2]}")
                cells.append(f"{pg[0]:.1f} s, {pg[1] / 2**30:.2f} GiB" if pg[2] == 0 else "fails")
            rows.append(f"| {name} | {weights / 2**30:.2f} GiB | " + " | ".join(cells) + " |")
    head = ["model", "weights", "floor", *backends, *(["ort-cpu, static export"] if args.static else [])]
    head += [] if args.skip_polygraphy else ["polygraphy"]
    if args.explain:
        head = ["model", "weights", "explained / without"]
    table = "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *rows])
    print(table)
    if args.table:
        Path(args.table).write_text(table + "\n")
    if args.plot:
        plot(parse_log("\n".join(printed)), args.plot)


if __name__ == "__main__":
    main()
