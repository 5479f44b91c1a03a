"""Command line: parse, call the library, print. No logic lives here.

Exit codes: 0 ran and nothing failed; 1 a backend was nondeterministic, a
cross-backend difference exceeded --max-ulp, or a backend failed or was
unavailable while others ran; 2 usage or input error; 3 every backend failed;
4 internal error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from xbackend.errors import EXIT_INTERNAL, UsageError, XbackendError
from xbackend.inputs import parse_range, parse_shape
from xbackend.probes import PROBES
from xbackend.results import DEFAULT_BACKENDS, DEFAULT_MAX_ULP, CompareOptions

__all__ = ["main"]


def _set_option(text: str) -> tuple[str, str, str]:
    key, sep, value = text.partition("=")
    backend, dot, name = key.partition(".")
    if not sep or not dot or not backend or not name:
        raise argparse.ArgumentTypeError(
            f"expected BACKEND.OPTION=VALUE (e.g. ort-cpu.threads=1), got {text!r}"
        )
    return backend, name, value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="xbackend", description="Does your model give the same bits everywhere it runs?"
    )
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser(
        "compare",
        help="run a model on several backends and compare, per layer, in ULPs",
        epilog="exit codes: 0 all deterministic and within --max-ulp; 1 nondeterministic, past --max-ulp, "
        "or a backend failed/unavailable; 2 usage or input error; 3 every backend failed; 4 internal error",
    )
    c.add_argument("model", help="path to an .onnx file")
    c.add_argument(
        "--backends",
        default=",".join(DEFAULT_BACKENDS),
        help="comma-separated runner names (default: %(default)s); see `xbackend backends`",
    )
    c.add_argument(
        "--reference",
        default=None,
        help="backend every other is compared against (default: 'reference' if listed, else the first)",
    )
    c.add_argument("--runs", type=int, default=3, help="runs per session (default: %(default)s)")
    c.add_argument(
        "--builds", type=int, default=1, help="fresh sessions, each in a fresh process (default: %(default)s)"
    )
    c.add_argument("--seed", type=int, default=0, help="seed for generated inputs (default: %(default)s)")
    c.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME=D1,D2,...",
        help="shape for an input with dynamic dimensions (repeatable)",
    )
    c.add_argument(
        "--inputs",
        metavar="FILE.npz|DIR",
        help="real input data: an .npz keyed by input name, or a directory in ONNX's test-data layout "
        "(input_N.pb; output_N.pb beside them join the comparison as the backend 'expected')",
    )
    c.add_argument(
        "--range",
        dest="ranges",
        action="append",
        default=[],
        metavar="NAME=LO:HI",
        help="draw generated values of input NAME from [LO, HI), e.g. input_ids=0:50257 (repeatable)",
    )
    c.add_argument(
        "--max-ulp",
        type=float,
        default=DEFAULT_MAX_ULP,
        help="cross-backend tolerance in scaled ULP (default: %(default)g)",
    )
    c.add_argument("--outputs-only", action="store_true", help="compare graph outputs only")
    c.add_argument(
        "--timeout", type=float, default=600.0, help="seconds per backend build (default: %(default)g)"
    )
    c.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        type=_set_option,
        metavar="BACKEND.OPTION=VALUE",
        help="runner option, e.g. ort-cpu.threads=1 (repeatable)",
    )
    c.add_argument("--report", metavar="OUT.md", help="write the Markdown report here")
    c.add_argument("--json", metavar="OUT.json", help="write the JSON report here")
    c.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    c.add_argument(
        "--probes",
        default=None,
        metavar="LIST",
        help=f"probes to run: {','.join(PROBES)}, 'all' or 'none' "
        "(default: builds,threads, plus batch with --batch-invariance)",
    )
    c.add_argument(
        "--batch-invariance",
        type=int,
        default=0,
        metavar="B",
        help="probe batch invariance with batches of B (the model needs a dynamic batch dimension)",
    )
    c.add_argument(
        "--probe-threads",
        type=int,
        default=0,
        metavar="N",
        help="thread count the thread probe compares with 1 (default: twice the logical cores)",
    )
    c.add_argument(
        "--timings",
        action="store_true",
        help="put each build's wall time in the reports (off by default: times would make the "
        "reports of two identical comparisons differ)",
    )
    c.add_argument(
        "--torch-module",
        metavar="MODULE_SPEC",
        help="source nn.Module for the torch backends (path/to/file.py:factory or pkg.mod:factory)",
    )
    c.add_argument(
        "--trust-model-code",
        action="store_true",
        help="let the torch backends import the Python file the model's metadata names (off: a model "
        "never makes xbackend run code)",
    )
    sub.add_parser("backends", help="list every registered backend, available or not, and why")
    e = sub.add_parser("export", help="export a framework model to ONNX")
    esub = e.add_subparsers(dest="framework", required=True)
    t = esub.add_parser("torch", help="export a PyTorch nn.Module (records its source in the ONNX metadata)")
    t.add_argument("module", metavar="MODULE_SPEC", help="path/to/file.py:factory or package.module:factory")
    t.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME=D1,D2,...[:DTYPE]",
        required=True,
        help="example input, in forward() order (repeatable); dtype defaults to float32",
    )
    t.add_argument("-o", "--output", required=True, metavar="OUT.onnx")
    t.add_argument("--opset", type=int, default=18, help="ONNX opset (default: %(default)s)")
    t.add_argument(
        "--dynamic",
        action="append",
        default=[],
        metavar="NAME=AXIS:DIMNAME",
        help="make an input axis dynamic, e.g. x=0:batch (repeatable)",
    )
    t.add_argument("--seed", type=int, default=0, help="seed for the example inputs")
    t.add_argument(
        "--output-name",
        action="append",
        default=[],
        metavar="NAME",
        help="name for the graph output(s), in order (default: the exporter's)",
    )
    return p


def _compare(args: argparse.Namespace) -> int:
    from xbackend.compare import compare_with_options
    from xbackend.progress import NullProgress, ProgressSink, RichProgress
    from xbackend.report import to_json, to_markdown, write_atomic

    opts = CompareOptions.create(
        backends=args.backends,
        reference=args.reference,
        runs=args.runs,
        builds=args.builds,
        seed=args.seed,
        shapes=tuple(parse_shape(s) for s in args.shape),
        inputs=args.inputs,
        max_ulp=args.max_ulp,
        outputs_only=args.outputs_only,
        timeout=args.timeout,
        probes=args.probes,
        batch_invariance=args.batch_invariance,
        probe_threads=args.probe_threads,
        timings=args.timings,
        ranges=tuple(parse_range(r) for r in args.ranges),
        runner_options=tuple(args.sets) + _torch_options(args),
    )
    progress: ProgressSink = NullProgress() if args.no_progress or not sys.stderr.isatty() else RichProgress()
    result = compare_with_options(args.model, opts, progress)
    if args.report:
        write_atomic(args.report, to_markdown(result))
    if args.json:
        write_atomic(args.json, to_json(result))
    _print_summary(result)
    return result.exit_code


TORCH_BACKENDS = ("torch", "torch-compile", "torch-compile-autotune", "torch-cuda")


def _torch_options(args: argparse.Namespace) -> tuple[tuple[str, str, str], ...]:
    out: tuple[tuple[str, str, str], ...] = ()
    chosen = [b for b in args.backends.split(",") if b in TORCH_BACKENDS]
    if (args.torch_module or args.trust_model_code) and not chosen:
        flag = "--torch-module" if args.torch_module else "--trust-model-code"
        raise UsageError(
            f"{flag} applies to the torch backends; add torch (or {TORCH_BACKENDS[1]}) to --backends"
        )
    for b in chosen:
        if args.torch_module:
            out += ((b, "module", args.torch_module),)
        if args.trust_model_code:
            out += ((b, "trust_model_code", "true"),)
    return out


def _print_summary(result: object) -> None:
    from xbackend.results import Result

    assert isinstance(result, Result)
    for line in result.verdict():
        print(line)
    for b in result.backends:
        if not b.ok:
            print(f"  {b.name}: {b.status} ({b.reason})")
            continue
        det = (
            "deterministic"
            if b.deterministic
            else f"NONDETERMINISTIC ({b.distinct_outputs} distinct outputs)"
        )
        print(f"  {b.name}: {det} over {b.runs} run(s) x {b.builds} build(s)")
    for c in result.cross_backend:
        if c.status != "ok":
            print(f"  {c.backend} vs {c.reference}: not compared ({c.reason})")
            continue
        print(
            f"  {c.backend} vs {c.reference}: bitwise {'equal' if c.bitwise_equal else 'different'}, "
            + (
                f"{_fmt(c.scaled_ulp)} scaled ULP (raw max ULP {c.max_ulp})"
                if c.scaled_ulp is not None
                else "compared exactly"
            )
            + f" at outputs; first divergence {c.first_divergence or 'none'}"
        )


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def _export(args: argparse.Namespace) -> int:
    from xbackend.torch_export import InputDecl, export_torch, parse_dynamic

    res = export_torch(
        args.module,
        [InputDecl.parse(i) for i in args.input],
        args.output,
        opset=args.opset,
        dynamic=parse_dynamic(args.dynamic),
        seed=args.seed,
        output_names=args.output_name,
    )
    print(
        f"wrote {res.path}: opset {res.opset}, torch {res.torch_version}, inputs "
        f"{', '.join(i.name for i in res.inputs)}, outputs {', '.join(res.outputs)}; "
        f"{len(res.module_outputs)} module outputs mapped to ONNX tensors"
    )
    return 0


def _backends() -> int:
    from xbackend.runners.registry import get_runner, list_runners

    for e in list_runners():
        state = (
            f"available ({e.availability.version})"
            if e.availability.available
            else (f"unavailable: {e.availability.reason}")
        )
        print(f"{e.name:12s} {state}")
        if e.description:
            print(f"{'':12s} {e.description}")
        try:
            specs = get_runner(e.name).option_specs
        except XbackendError:
            specs = ()
        for s in specs:
            choices = f" [{'|'.join(s.choices)}]" if s.choices else ""
            print(f"{'':12s}   --set {e.name}.{s.name}=...{choices}  {s.help}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "backends":
            return _backends()
        if args.command == "export":
            return _export(args)
        return _compare(args)
    except XbackendError as e:
        print(f"xbackend: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("xbackend: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug in xbackend, not in the user's input
        print(f"xbackend: internal error: {type(e).__name__}: {e}; please report it", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
