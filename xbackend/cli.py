"""Command line (typer): parse, call the library, print. No logic lives here.

Exit codes: 0 ran and nothing failed; 1 a backend was nondeterministic, a
cross-backend difference exceeded --max-ulp, or a backend failed or was
unavailable while others ran (`diff`: the two reports differ); 2 usage or input
error; 3 every backend failed; 4 internal error; 10-15 the --fail-on policy that
fired (xbackend.gating); 130 interrupted.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Annotated, Any

import typer

from xbackend.errors import EXIT_INTERNAL, EXIT_USAGE, UsageError, XbackendError
from xbackend.gating import POLICIES
from xbackend.inputs import parse_range, parse_shape
from xbackend.probes import PROBES
from xbackend.results import DEFAULT_BACKENDS, DEFAULT_MAX_ULP, CompareOptions
from xbackend.textfmt import short

__all__ = ["app", "main"]

_GATES = "; ".join(f"{p.exit_code} {p.name}" for p in POLICIES if p.exit_code and p.name != "promise")
EXIT_CODES = (
    "Exit codes: 0 all deterministic and within --max-ulp; 1 nondeterministic, past --max-ulp, or a backend "
    "failed/unavailable; 2 usage or input error; 3 every backend failed; 4 internal error; 16 a runner "
    f"broke a determinism property it promises; with --fail-on: {_GATES}."
)

app = typer.Typer(
    name="xbackend",
    help="Does your model give the same bits everywhere it runs?",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)
export_app = typer.Typer(help="Export a framework model to ONNX.", no_args_is_help=True)
app.add_typer(export_app, name="export")


def _set_option(text: str) -> tuple[str, str, str]:
    key, sep, value = text.partition("=")
    backend, dot, name = key.rpartition(".")  # a label may hold dots (ort-cpu@1.20.threads)
    if not sep or not dot or not backend or not name:
        raise UsageError(f"--set: expected BACKEND.OPTION=VALUE (e.g. ort-cpu.threads=1), got {text!r}")
    return backend, name, value


TORCH_BACKENDS = ("torch", "torch-compile", "torch-compile-autotune", "torch-cuda")


def _torch_options(backends: str, torch_module: str | None, trust: bool) -> tuple[tuple[str, str, str], ...]:
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


def _run_inputs(
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
        "runner_options": tuple(_set_option(s) for s in sets or ())
        + _torch_options(backends, torch_module, trust),
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


def _progress(no_progress: bool) -> Any:
    from xbackend.progress import NullProgress, RichProgress

    return NullProgress() if no_progress or not sys.stderr.isatty() else RichProgress()


@app.command(epilog=EXIT_CODES)
def compare(
    model: ModelArg,
    backends: Annotated[
        str, typer.Option(help="comma-separated runner names; see `xbackend backends`")
    ] = ",".join(DEFAULT_BACKENDS),
    reference: Annotated[
        str | None,
        typer.Option(
            help="backend every other is compared against (default: 'reference' if listed, else the first)"
        ),
    ] = None,
    runs: Runs = 3,
    builds: Builds = 1,
    seed: Seed = 0,
    shape: Shapes = None,
    inputs: Inputs = None,
    ranges: Ranges = None,
    max_ulp: Annotated[float, typer.Option(help="cross-backend tolerance in scaled ULP")] = DEFAULT_MAX_ULP,
    outputs_only: OutputsOnly = False,
    timeout: Timeout = 600.0,
    sets: Sets = None,
    report: Annotated[
        str | None,
        typer.Option(
            metavar="OUT.md", help="write the Markdown report here, its figures and layer CSV beside it"
        ),
    ] = None,
    json: Annotated[
        str | None, typer.Option("--json", metavar="OUT.json", help="write the JSON report here")
    ] = None,
    no_progress: NoProgress = False,
    probes: Annotated[
        str | None,
        typer.Option(
            metavar="LIST",
            help=f"probes to run: {','.join(PROBES)}, 'all' or 'none' "
            f"(default: {','.join(n for n, p in PROBES.items() if p.default)}, "
            "plus batch with --batch-invariance)",
        ),
    ] = None,
    batch_invariance: Annotated[
        int,
        typer.Option(
            metavar="B", help="probe batch invariance with batches of B (needs a dynamic batch dimension)"
        ),
    ] = 0,
    probe_threads: Annotated[
        int,
        typer.Option(
            metavar="N",
            help="thread count the thread probe compares with 1 (default: twice the logical cores)",
        ),
    ] = 0,
    timings: Annotated[
        bool,
        typer.Option(
            "--timings",
            help="put each build's wall time in the reports (off by default: times would make the reports of "
            "two identical comparisons differ)",
        ),
    ] = False,
    torch_module: TorchModule = None,
    trust_model_code: TrustCode = False,
    load: Annotated[
        list[str] | None,
        typer.Option(
            metavar="[NAME=]DIR",
            help="a capture from another host (xbackend capture) compared beside the live backends, named "
            "BACKEND@FOLDER unless NAME is given (repeatable)",
        ),
    ] = None,
    baseline: Annotated[
        str | None,
        typer.Option(
            metavar="PATH",
            help="a previous release's JSON report, capture folder, or folder of captures: per backend, "
            "whether the outputs moved, by how much and from which layer",
        ),
    ] = None,
    fail_on: Annotated[
        str | None,
        typer.Option(
            metavar="POLICIES",
            help="gate on these, comma-separated: " + ", ".join(p.name for p in POLICIES) + " (e.g. ulp>8); "
            "each has its own exit code (below)",
        ),
    ] = None,
    save_captures: Annotated[
        str | None,
        typer.Option(
            metavar="DIR",
            help="write a portable capture of every backend that ran to DIR/BACKEND "
            "(for a later --baseline or --load)",
        ),
    ] = None,
) -> int:
    """Run a model on several backends and compare, per layer, in ULPs."""
    from xbackend.compare import compare_with_options

    opts = CompareOptions.create(
        backends=backends,
        reference=reference,
        runs=runs,
        builds=builds,
        max_ulp=max_ulp,
        outputs_only=outputs_only,
        timeout=timeout,
        probes=probes,
        batch_invariance=batch_invariance,
        probe_threads=probe_threads,
        timings=timings,
        **_run_inputs(backends, seed, shape, inputs, ranges, sets, torch_module, trust_model_code),
        loads=list(load or ()),
        baseline=baseline,
        fail_on=fail_on,
        save_captures=save_captures,
    )
    result = compare_with_options(model, opts, _progress(no_progress))
    _write_reports(result, report, json)
    _print_summary(result)
    return result.exit_code


def _write_reports(result: Any, md: str | None, js: str | None) -> None:
    from xbackend.report import to_json, write_atomic, write_markdown_bundle

    if md:
        write_markdown_bundle(result, md)
    if js:
        write_atomic(js, to_json(result))


@app.command(
    epilog="Exit codes: 0 captured; 1 captured, but the backend was nondeterministic; 2 usage or "
    "input error; 3 the backend failed (nothing written); 4 internal error."
)
def capture(
    model: ModelArg,
    backend: Annotated[str, typer.Option(help="the runner to capture; see `xbackend backends`")],
    output: Annotated[str, typer.Option("-o", "--output", metavar="DIR", help="capture folder to write")],
    runs: Runs = 3,
    builds: Builds = 1,
    seed: Seed = 0,
    shape: Shapes = None,
    inputs: Inputs = None,
    ranges: Ranges = None,
    outputs_only: OutputsOnly = False,
    timeout: Timeout = 600.0,
    sets: Sets = None,
    no_progress: NoProgress = False,
    torch_module: TorchModule = None,
    trust_model_code: TrustCode = False,
) -> int:
    """Run one backend and write a portable capture: inputs, outputs, layers, fingerprints, environment."""
    from xbackend.compare import compare_with_options
    from xbackend.errors import RunnerFailedError

    if "," in backend:
        raise UsageError(f"--backend takes one runner, got {backend!r}; capture each into its own folder")
    opts = CompareOptions.create(
        backends=[backend],
        runs=runs,
        builds=builds,
        outputs_only=outputs_only,
        timeout=timeout,
        probes="none",
        **_run_inputs(backend, seed, shape, inputs, ranges, sets, torch_module, trust_model_code),
    )
    result = compare_with_options(model, opts, _progress(no_progress), capture_to=output)
    b = result.backend(backend)
    if not b.ok:
        raise RunnerFailedError(f"{backend} {b.status}: {b.reason}; nothing was captured")
    det = "deterministic" if b.deterministic else f"NONDETERMINISTIC ({b.distinct_outputs} distinct outputs)"
    print(
        f"wrote {output}: {backend}, {det} over {b.runs} run(s) x {b.builds} build(s), "
        f"{b.exposed} tensors; compare it elsewhere with `xbackend compare MODEL --load {output}`"
    )
    return 0 if b.deterministic else 1


@app.command(
    epilog="Exit codes: 0 granted (every property held, or does not apply); 16 a property broke (it names "
    "itself and the first layer where it broke); 2 usage or input error; 3 the backend failed; "
    "4 internal error."
)
def certify(
    model: ModelArg,
    backend: Annotated[str, typer.Option(help="the runner to certify (NAME or NAME@LABEL)")],
    output: Annotated[
        str, typer.Option("-o", "--output", metavar="STEM", help="writes STEM.json and STEM.md")
    ] = "certificate",
    runs: Annotated[int, typer.Option(help="runs per session")] = 5,
    builds: Annotated[int, typer.Option(help="fresh builds, each in a fresh process")] = 3,
    batch: Annotated[int, typer.Option(help="batch size for the sample-alone vs in-a-batch check")] = 4,
    seed: Seed = 0,
    shape: Shapes = None,
    inputs: Inputs = None,
    ranges: Ranges = None,
    timeout: Timeout = 600.0,
    sets: Sets = None,
    no_progress: NoProgress = False,
    torch_module: TorchModule = None,
    trust_model_code: TrustCode = False,
) -> int:
    """Certify one backend's determinism: run to run, build to build, batch position, thread count."""
    from xbackend.certify import certify as run_certify
    from xbackend.certify import write_certificate

    cert = run_certify(
        model,
        backend,
        runs,
        builds,
        batch,
        _progress(no_progress),
        timeout=timeout,
        **_run_inputs(backend, seed, shape, inputs, ranges, sets, torch_module, trust_model_code),
    )
    js, md = write_certificate(cert, output)
    body = cert.body
    if body["backend"]["status"] != "ok":
        print(f"{backend} {body['backend']['status']}: {body['backend']['reason']}", file=sys.stderr)
    for p in body["properties"]:
        first = f"; first broke at {p['first_layer']}" if p["first_layer"] else ""
        print(f"  {p['name']}: {p['status']} ({p['evidence']}{first})")
    verdict = "GRANTED" if cert.granted else "REFUSED"
    print(f"{verdict}: wrote {js} and {md}; check it with `xbackend verify {js}`")
    return cert.exit_code


@app.command(
    epilog="Exit codes: 0 the outputs match the certificate bit for bit and no property broke; 1 they "
    "differ, or a property the certificate holds broke here; 2 the certificate is missing, modified, or "
    "of another model or inputs; 4 internal error."
)
def verify(
    certificate: Annotated[
        str, typer.Argument(metavar="CERT.json", help="a certificate from xbackend certify")
    ],
    model: Annotated[
        str | None, typer.Option(help="the certified model, when it is not at the path the certificate names")
    ] = None,
    inputs: Inputs = None,
    no_progress: NoProgress = False,
) -> int:
    """Re-run what a certificate claims on this machine; compare outputs bit for bit and the environment."""
    from xbackend.certify import verify as run_verify

    v = run_verify(certificate, model, inputs, _progress(no_progress))
    for line in v.lines():
        print(line)
    return v.exit_code


@app.command(
    epilog="Exit codes: 0 written; 2 the JSON is missing, damaged, or from another schema; 4 internal error."
)
def report(
    result_json: Annotated[str, typer.Argument(metavar="RESULT.json", help="a JSON report (compare --json)")],
    output: Annotated[str, typer.Option("-o", "--output", metavar="OUT.md", help="Markdown to write")],
) -> int:
    """Re-render the Markdown report (figures and layer CSV too) from a JSON report, running no engine."""
    from xbackend.report import write_markdown_bundle
    from xbackend.report.jsonreport import read_result

    write_markdown_bundle(read_result(result_json), output)
    print(f"wrote {output}")
    return 0


@app.command(
    epilog="Exit codes: 0 nothing moved; 1 outputs, layers, verdicts or the environment differ; "
    "2 a report is missing or unreadable; 4 internal error."
)
def diff(
    old: Annotated[str, typer.Argument(metavar="OLD.json", help="the earlier JSON report")],
    new: Annotated[str, typer.Argument(metavar="NEW.json", help="the later JSON report")],
    output: Annotated[
        str | None, typer.Option("-o", "--output", metavar="OUT.md", help="also write the diff here")
    ] = None,
) -> int:
    """Compare two JSON reports: environment, options, verdicts, and the first layer that moved."""
    from xbackend.report import write_atomic
    from xbackend.report.diff import diff_results
    from xbackend.report.jsonreport import read_result

    d = diff_results(read_result(old, "OLD.json"), read_result(new, "NEW.json"))
    text = d.markdown(old, new)
    print(text, end="")
    if output:
        write_atomic(output, text)
    return 1 if d.changed else 0


@app.command(
    epilog="Exit codes: 0 every job ran and every model's comparison passed; 1 a job failed, or a "
    "comparison found a nondeterministic backend or one past max_ulp; 16 a runner broke a property it "
    "promises; 3 no job ran; 2 usage error (a bad sweep file, Ray missing or unreachable); 4 internal error."
)
def sweep(
    sweep_file: Annotated[
        str, typer.Argument(metavar="SWEEP.toml", help="models, backends, runs, host needs")
    ],
    executor: Annotated[
        str, typer.Option(metavar="local|ray", help="where jobs run: this machine, or a Ray cluster")
    ] = "local",
    address: Annotated[
        str | None,
        typer.Option(
            metavar="ADDR",
            help="Ray cluster to use (auto, HEAD:6379, ray://HEAD:10001); none: a local Ray instance "
            "started and stopped for this sweep",
        ),
    ] = None,
    shared_storage: Annotated[
        bool,
        typer.Option(
            "--shared-storage",
            help="the output folder is mounted at the same path on every node: jobs write there "
            "instead of returning captures through Ray's object store",
        ),
    ] = False,
    output: Annotated[
        str | None,
        typer.Option("-o", "--output", metavar="DIR", help="fleet report folder (default: [sweep] output)"),
    ] = None,
    no_resume: Annotated[
        bool, typer.Option("--no-resume", help="run every job again, even those with a valid capture")
    ] = False,
    no_progress: NoProgress = False,
) -> int:
    """Run every model x backend job of a sweep file, compare each model's captures, write a fleet report."""
    from xbackend.sweep import load_sweep, run_sweep
    from xbackend.sweep.executors import LocalExecutor, RayExecutor
    from xbackend.sweep.fleet import NullFleetProgress
    from xbackend.sweep.progress import LineProgress, RichFleetProgress

    if executor not in ("local", "ray"):
        raise UsageError(f"--executor must be local or ray, got {executor!r}")
    if executor == "local" and (address or shared_storage):
        raise UsageError("--address and --shared-storage apply to --executor ray; add --executor ray")
    spec = load_sweep(sweep_file, output)
    ex = LocalExecutor() if executor == "local" else RayExecutor(address, shared_storage)
    bar: Any = (
        NullFleetProgress()
        if no_progress
        else (RichFleetProgress() if sys.stderr.isatty() else LineProgress())
    )
    result = run_sweep(spec, ex, bar, resume=not no_resume)
    from xbackend.report.fleet import fleet_verdict

    for line in fleet_verdict(result):
        print(line)
    resumed = sum(j.resumed for j in result.jobs)
    again = f" ({resumed} resumed from earlier captures)" if resumed else ""
    print(f"wrote {spec.output / 'fleet.md'} and fleet.json: {len(result.jobs)} job(s){again}")
    return result.exit_code


@app.command()
def backends() -> int:
    """List every registered backend, available or not, and why."""
    from xbackend.foreign import probe_interpreter
    from xbackend.runners.base import PYTHON_OPTION, Availability
    from xbackend.runners.registry import get_runner, list_runners

    for e in list_runners():
        avail, where = e.availability, ""
        try:
            python = get_runner(e.name).resolve_options({})[PYTHON_OPTION.name]
        except XbackendError:
            python = ""
        if python:  # its own interpreter by default (e.g. $XBACKEND_GROQ_PYTHON): ask that one
            it = probe_interpreter(python, e.target)
            avail, where = Availability(it.available, it.reason, it.version), f" in python={python}"
        state = f"available{where} ({avail.version})" if avail.available else f"unavailable: {avail.reason}"
        print(f"{e.name:12s} {state}")
        if e.description:
            print(f"{'':12s} {e.description}")
        try:
            specs = get_runner(e.name).all_option_specs()
        except XbackendError:
            specs = ()
        for s in specs:
            choices = f" [{'|'.join(s.choices)}]" if s.choices else ""
            print(f"{'':12s}   --set {e.name}.{s.name}=...{choices}  {s.help}")
    return 0


@export_app.command("torch")
def export_torch_cmd(
    module: Annotated[
        str, typer.Argument(metavar="MODULE_SPEC", help="path/to/file.py:factory or package.module:factory")
    ],
    input: Annotated[
        list[str],
        typer.Option(
            "--input",
            metavar="NAME=D1,D2,...[:DTYPE]",
            help="example input, in forward() order (repeatable); dtype defaults to float32",
        ),
    ],
    output: Annotated[str, typer.Option("-o", "--output", metavar="OUT.onnx", help="ONNX file to write")],
    opset: Annotated[int, typer.Option(help="ONNX opset")] = 18,
    dynamic: Annotated[
        list[str] | None,
        typer.Option(
            metavar="NAME=AXIS:DIMNAME", help="make an input axis dynamic, e.g. x=0:batch (repeatable)"
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="seed for the example inputs")] = 0,
    output_name: Annotated[
        list[str] | None,
        typer.Option(metavar="NAME", help="name for the graph output(s), in order (default: the exporter's)"),
    ] = None,
) -> int:
    """Export a PyTorch nn.Module (records its source in the ONNX metadata)."""
    from xbackend.torch_export import InputDecl, export_torch, parse_dynamic

    res = export_torch(
        module,
        [InputDecl.parse(i) for i in input],
        output,
        opset=opset,
        dynamic=parse_dynamic(dynamic or []),
        seed=seed,
        output_names=output_name or [],
    )
    print(
        f"wrote {res.path}: opset {res.opset}, torch {res.torch_version}, inputs "
        f"{', '.join(i.name for i in res.inputs)}, outputs {', '.join(res.outputs)}; "
        f"{len(res.module_outputs)} module outputs mapped to ONNX tensors"
    )
    return 0


def _print_summary(result: Any) -> None:
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
        where = f" (loaded from {b.loaded_from})" if b.loaded_from else ""
        print(f"  {b.name}: {det} over {b.runs} run(s) x {b.builds} build(s){where}")
    for c in result.cross_backend:
        if c.status != "ok":
            print(f"  {c.backend} vs {c.reference}: not compared ({c.reason})")
            continue
        print(
            f"  {c.backend} vs {c.reference}: bitwise {'equal' if c.bitwise_equal else 'different'}, "
            + (
                f"{short(c.scaled_ulp)} scaled ULP (raw max ULP {c.max_ulp})"
                if c.scaled_ulp is not None
                else "compared exactly"
            )
            + f" at outputs; first divergence {c.first_divergence or 'none'}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    try:
        code = app(
            args=list(sys.argv[1:] if argv is None else argv), prog_name="xbackend", standalone_mode=False
        )
        return int(code or 0)
    except XbackendError as e:
        print(f"xbackend: error: {e}", file=sys.stderr)
        return e.exit_code
    except typer.Exit as e:
        return int(e.exit_code)
    except (KeyboardInterrupt, typer.Abort):
        print("xbackend: interrupted", file=sys.stderr)
        return 130
    except typer.TyperException as e:  # typer's own usage errors: unknown option, missing argument
        msg = e.format_message() if hasattr(e, "format_message") else str(e)
        hint = _help_hint(argv)
        print(f"xbackend: error: {' '.join(msg.split()).rstrip('.')}; see `{hint}`", file=sys.stderr)
        return int(getattr(e, "exit_code", EXIT_USAGE))
    except Exception as e:  # a bug in xbackend, not in the user's input
        print(f"xbackend: internal error: {type(e).__name__}: {e}; please report it", file=sys.stderr)
        return EXIT_INTERNAL


def _help_hint(argv: Sequence[str] | None) -> str:
    args = list(sys.argv[1:] if argv is None else argv)
    cmds = {"compare", "capture", "certify", "verify", "report", "diff", "backends", "export", "sweep"}
    first = next((a for a in args if not a.startswith("-")), None)
    if first in cmds:
        sub = " torch" if first == "export" and "torch" in args else ""
        return f"xbackend {first}{sub} --help"
    return "xbackend --help"


if __name__ == "__main__":
    sys.exit(main())
