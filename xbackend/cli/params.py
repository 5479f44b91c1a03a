"""The command line's options, declared once, and the parsing every command shares."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from xbackend.errors import UsageError
from xbackend.model.inputs import parse_range, parse_shape
from xbackend.probes.registry import PROBES
from xbackend.results.gating import POLICIES

__all__ = ["TORCH_BACKENDS", "run_inputs", "set_option", "torch_options"]


def set_option(text: str) -> tuple[str, str, str]:
    key, sep, value = text.partition("=")
    backend, dot, name = key.rpartition(".")  # a label may hold dots (ort-cpu@1.20.threads)
    if not sep or not dot or not backend or not name:
        raise UsageError(f"--set: expected BACKEND.OPTION=VALUE (e.g. ort-cpu.threads=1), got {text!r}")
    return backend, name, value


TORCH_BACKENDS = ("torch", "torch-compile", "torch-compile-autotune", "torch-cuda")


def torch_options(backends: str, torch_module: str | None, trust: bool) -> tuple[tuple[str, str, str], ...]:
    out: tuple[tuple[str, str, str], ...] = ()
    chosen = [b for b in backends.split(",") if b.partition("@")[0] in TORCH_BACKENDS]
    if (torch_module or trust) and not chosen:
        flag = "--torch-module" if torch_module else "--trust-model-code"
        raise UsageError(
            f"{flag} applies to the torch backends; add torch (or {TORCH_BACKENDS[1]}) to --backends"
        )
    for b in chosen:
        if torch_module:
            out += ((b, "module", torch_module),)
        if trust:
            out += ((b, "trust_model_code", "true"),)
    return out


def run_inputs(
    backends: str,
    seed: int,
    shape: list[str] | None,
    inputs: str | None,
    ranges: list[str] | None,
    sets: list[str] | None,
    torch_module: str | None,
    trust: bool,
) -> dict[str, Any]:
    """The CompareOptions fields compare and capture share: what is fed and how runners are set."""
    return {
        "seed": seed,
        "shapes": tuple(parse_shape(s) for s in shape or ()),
        "inputs": inputs,
        "ranges": tuple(parse_range(r) for r in ranges or ()),
        "runner_options": tuple(set_option(s) for s in sets or ())
        + torch_options(backends, torch_module, trust),
    }


# Options shared by compare and capture, declared once.
ModelArg = Annotated[str, typer.Argument(help="path to an .onnx file", show_default=False)]
Runs = Annotated[int, typer.Option(help="runs per session")]
Builds = Annotated[int, typer.Option(help="fresh sessions, each in a fresh process")]
Seed = Annotated[int, typer.Option(help="seed for generated inputs")]
Shapes = Annotated[
    list[str] | None,
    typer.Option(
        "--shape", metavar="NAME=D1,D2,...", help="shape for an input with dynamic dimensions (repeatable)"
    ),
]
Inputs = Annotated[
    str | None,
    typer.Option(
        metavar="FILE.npz|DIR",
        help="real input data: an .npz keyed by input name, a directory in ONNX's test-data layout "
        "(input_N.pb; output_N.pb beside them join the comparison as the backend 'expected'), or a "
        "capture folder (its inputs)",
    ),
]
Ranges = Annotated[
    list[str] | None,
    typer.Option(
        "--range",
        metavar="NAME=LO:HI",
        help="draw generated values of input NAME from [LO, HI), e.g. input_ids=0:50257 (repeatable)",
    ),
]
OutputsOnly = Annotated[bool, typer.Option("--outputs-only", help="compare graph outputs only")]
MaxMemory = Annotated[
    str | None,
    typer.Option(
        "--max-memory",
        metavar="SIZE",
        help="memory per backend process, e.g. 3GiB: per-layer tensors are exposed in windows that "
        "fit (default: 80% of the memory available at the start)",
    ),
]
Tensors = Annotated[
    str,
    typer.Option(
        "--tensors",
        metavar="all|modules|outputs|GLOB",
        help="tensors to expose: every one; module boundaries (the module map); graph outputs; or "
        "globs over module paths or tensor names, e.g. 'm.transformer.h.3.*' (graph outputs always)",
    ),
]
Timeout = Annotated[float, typer.Option(help="seconds per backend build")]
Sets = Annotated[
    list[str] | None,
    typer.Option(
        "--set", metavar="BACKEND.OPTION=VALUE", help="runner option, e.g. ort-cpu.threads=1 (repeatable)"
    ),
]
NoProgress = Annotated[bool, typer.Option("--no-progress", help="no progress bar on stderr")]
TorchModule = Annotated[
    str | None,
    typer.Option(
        metavar="MODULE_SPEC",
        help="source nn.Module for the torch backends (path/to/file.py:factory or pkg.mod:factory)",
    ),
]
TrustCode = Annotated[
    bool,
    typer.Option(
        "--trust-model-code",
        help="let the torch backends import the Python file the model's metadata names (off: a model "
        "never makes xbackend run code)",
    ),
]

# compare's own options
Backends = Annotated[str, typer.Option(help="comma-separated runner names; see `xbackend backends`")]
OptionalBackends = Annotated[
    str | None,
    typer.Option(
        "--backends",
        help="comma-separated runner names; see `xbackend backends` (default: ort-cpu,reference, or only "
        "the --modes families)",
        show_default=False,
    ),
]
Modes = Annotated[
    str | None,
    typer.Option(
        metavar="RUNNERS",
        help="run each of these runners under its default and each determinism mode it declares "
        "(NAME, NAME@det, ...; `xbackend backends` lists them), timed, with a Cost of determinism table",
    ),
]
TimedRuns = Annotated[
    int | None,
    typer.Option(
        metavar="N",
        help="N more runs of the model users ship per build, timed and compared like the others; puts "
        "latency in the reports (default: 0, or 10 with --modes)",
        show_default=False,
    ),
]
Reference = Annotated[
    str | None,
    typer.Option(
        help="backend every other is compared against (default: 'reference' if listed, else the first)"
    ),
]
MaxUlp = Annotated[
    str,
    typer.Option(
        metavar="auto|N",
        help="cross-backend tolerance: auto (default) judges each node against its own float64 value and "
        "fails a backend with an origin (a node past what rounding allows); N: N scaled ULP at the outputs",
    ),
]
NoiseSamples = Annotated[
    int,
    typer.Option(
        metavar="K",
        help="random orders of every reduction the noise floor is measured over (0: no floor, no "
        "origins; --max-ulp auto then falls back to 64)",
    ),
]
ReportOut = Annotated[
    str | None,
    typer.Option(
        metavar="OUT.md", help="write the Markdown report here, its figures and layer CSV beside it"
    ),
]
JsonOut = Annotated[str | None, typer.Option("--json", metavar="OUT.json", help="write the JSON report here")]
Probes = Annotated[
    str | None,
    typer.Option(
        metavar="LIST",
        help=f"probes to run: {','.join(PROBES)}, 'all' or 'none' "
        f"(default: {','.join(n for n, p in PROBES.items() if p.default)}, "
        "plus batch with --batch-invariance)",
    ),
]
BatchInvariance = Annotated[
    int,
    typer.Option(
        metavar="B", help="probe batch invariance with batches of B (needs a dynamic batch dimension)"
    ),
]
ProbeThreads = Annotated[
    int,
    typer.Option(
        metavar="N", help="thread count the thread probe compares with 1 (default: twice the logical cores)"
    ),
]
Timings = Annotated[
    bool,
    typer.Option(
        "--timings",
        help="put wall times, latency and each backend's peak memory in the reports (off by default: they "
        "would make the reports of two identical comparisons differ)",
    ),
]
Loads = Annotated[
    list[str] | None,
    typer.Option(
        metavar="[NAME=]DIR",
        help="a capture from another host (xbackend capture) compared beside the live backends, named "
        "BACKEND@FOLDER unless NAME is given (repeatable)",
    ),
]
Baseline = Annotated[
    str | None,
    typer.Option(
        metavar="PATH",
        help="a previous release's JSON report, capture folder, or folder of captures: per backend, "
        "whether the outputs moved, by how much and from which layer",
    ),
]
FailOn = Annotated[
    str | None,
    typer.Option(
        metavar="POLICIES",
        help="gate on these, comma-separated: " + ", ".join(p.name for p in POLICIES) + " (e.g. ulp>8); "
        "each has its own exit code (below)",
    ),
]
SaveCaptures = Annotated[
    str | None,
    typer.Option(
        metavar="DIR",
        help="write a portable capture of every backend that ran to DIR/BACKEND "
        "(for a later --baseline or --load)",
    ),
]
