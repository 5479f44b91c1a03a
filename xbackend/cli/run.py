"""compare and capture: run backends and print what they found."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from xbackend.cli.app import EXIT_CODES, app, progress
from xbackend.cli.params import ModelArg, compare_options, with_flags
from xbackend.compare import compare_with_options
from xbackend.errors import RunnerFailedError, UsageError
from xbackend.files.atomic import check_outputs
from xbackend.files.capture_folder import check_folder
from xbackend.files.textfmt import short, with_module
from xbackend.report import to_json, write_atomic, write_markdown_bundle
from xbackend.results import Result

__all__ = ["capture", "compare"]


@app.command(epilog=EXIT_CODES)
@with_flags("compare")
def compare(model: ModelArg, **flags: Any) -> int:
    """Run a model on several backends and compare, per layer, in ULPs."""
    report, json = flags["report"], flags["json"]
    check_outputs([("--report", report), ("--json", json)], [model, flags["inputs"], flags["baseline"]])
    opts = compare_options(flags)
    if opts.save_captures:  # a capture per backend: never into someone's folder
        for b in opts.backends:
            check_folder(Path(opts.save_captures) / b)
    result = compare_with_options(model, opts, progress(flags["no_progress"]))
    _write_reports(result, report, json)
    _print_summary(result)
    return result.exit_code


def _write_reports(result: Result, md: str | None, js: str | None) -> None:
    if md:
        write_markdown_bundle(result, md)
    if js:
        write_atomic(js, to_json(result))


@app.command(
    epilog="Exit codes: 0 captured; 1 captured, but the backend was nondeterministic; 2 usage or "
    "input error; 3 the backend failed (nothing written); 4 internal error."
)
@with_flags("capture")
def capture(
    model: ModelArg,
    backend: Annotated[str, typer.Option(help="the runner to capture; see `xbackend backends`")],
    output: Annotated[str, typer.Option("-o", "--output", metavar="DIR", help="capture folder to write")],
    **flags: Any,
) -> int:
    """Run one backend and write a portable capture: inputs, outputs, layers, fingerprints, environment."""
    if "," in backend:
        raise UsageError(f"--backend takes one runner, got {backend!r}; capture each into its own folder")
    check_folder(Path(output))  # before anything runs: never into someone's folder
    opts = compare_options(flags, backends=[backend], probes="none")
    result = compare_with_options(model, opts, progress(flags["no_progress"]), capture_to=output)
    b = result.backend(backend)
    if not b.ok:
        raise RunnerFailedError(f"{backend} {b.status}: {b.reason}; nothing was captured")
    det = "deterministic" if b.deterministic else f"NONDETERMINISTIC ({b.distinct_outputs} distinct outputs)"
    print(
        f"wrote {output}: {backend}, {det} over {b.runs} run(s) x {b.builds} build(s), "
        f"{b.exposed} tensors; compare it elsewhere with `xbackend compare MODEL --load {output}`"
    )
    return 0 if b.deterministic else 1


def _print_summary(result: Result) -> None:
    modules = result.model.modules()
    for line in result.verdict():
        print(line)
    for b in result.backends:
        if not b.ok:
            print(f"  {b.name}: {b.status} ({b.reason})")
            continue
        where = f" (loaded from {b.loaded_from})" if b.loaded_from else ""
        if b.deterministic:
            print(f"  {b.name}: deterministic over {b.runs} run(s) x {b.builds} build(s){where}")
        else:
            print(f"  {b.name}: {b.variance_words()}{where}")
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
            + f" at outputs; first divergence {with_module(c.first_divergence or 'none', modules)}"
        )
