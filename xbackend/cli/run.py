"""compare and capture: run backends and print what they found."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from xbackend.cli.app import EXIT_CODES, app, progress
from xbackend.cli.params import (
    Baseline,
    BatchInvariance,
    Builds,
    FailOn,
    Inputs,
    JsonOut,
    Loads,
    MaxMemory,
    MaxUlp,
    ModelArg,
    Modes,
    NoiseSamples,
    NoProgress,
    OptionalBackends,
    OutputsOnly,
    Probes,
    ProbeThreads,
    Ranges,
    Reference,
    ReportOut,
    Runs,
    SaveCaptures,
    Seed,
    Sets,
    Shapes,
    Tensors,
    TimedRuns,
    Timeout,
    Timings,
    TorchModule,
    TrustCode,
    run_inputs,
)
from xbackend.compare import compare_with_options
from xbackend.errors import RunnerFailedError, UsageError
from xbackend.files.atomic import check_outputs
from xbackend.files.capture_folder import check_folder
from xbackend.files.textfmt import short, with_module
from xbackend.report import to_json, write_atomic, write_markdown_bundle
from xbackend.results import DEFAULT_BACKENDS, CompareOptions, Result
from xbackend.results.options import MODES_TIMED_RUNS, expand_modes

__all__ = ["capture", "compare"]

_DEFAULT_BACKENDS = ",".join(DEFAULT_BACKENDS)


@app.command(epilog=EXIT_CODES)
def compare(
    model: ModelArg,
    backends: OptionalBackends = None,
    modes: Modes = None,
    timed_runs: TimedRuns = None,
    reference: Reference = None,
    runs: Runs = 3,
    builds: Builds = 1,
    seed: Seed = 0,
    shape: Shapes = None,
    inputs: Inputs = None,
    ranges: Ranges = None,
    max_ulp: MaxUlp = "auto",
    noise_samples: NoiseSamples = 8,
    outputs_only: OutputsOnly = False,
    tensors: Tensors = "all",
    max_memory: MaxMemory = None,
    timeout: Timeout = 600.0,
    sets: Sets = None,
    report: ReportOut = None,
    json: JsonOut = None,
    no_progress: NoProgress = False,
    probes: Probes = None,
    batch_invariance: BatchInvariance = 0,
    probe_threads: ProbeThreads = 0,
    timings: Timings = False,
    torch_module: TorchModule = None,
    trust_model_code: TrustCode = False,
    load: Loads = None,
    baseline: Baseline = None,
    fail_on: FailOn = None,
    save_captures: SaveCaptures = None,
) -> int:
    """Run a model on several backends and compare, per layer, in ULPs."""
    check_outputs([("--report", report), ("--json", json)], [model, inputs, baseline])  # before anything runs
    families = tuple(m for m in (modes or "").split(",") if m)
    given = tuple(b for b in (backends or ("" if families else _DEFAULT_BACKENDS)).split(",") if b)
    listed, mode_sets = expand_modes(given, families)
    if save_captures:  # a capture per backend: never into someone's folder
        for b in listed:
            check_folder(Path(save_captures) / b)
    inputs_kw = run_inputs(
        ",".join(listed), seed, shape, inputs, ranges, sets, torch_module, trust_model_code
    )
    inputs_kw["runner_options"] = mode_sets + inputs_kw["runner_options"]  # a --set overrides a mode
    opts = CompareOptions.create(
        backends=listed,
        timed_runs=timed_runs if timed_runs is not None else (MODES_TIMED_RUNS if families else 0),
        reference=reference,
        runs=runs,
        builds=builds,
        max_ulp=max_ulp,
        noise_samples=noise_samples,
        outputs_only=outputs_only,
        tensors=tensors,
        max_memory=max_memory,
        timeout=timeout,
        probes=probes,
        batch_invariance=batch_invariance,
        probe_threads=probe_threads,
        timings=timings,
        **inputs_kw,
        loads=list(load or ()),
        baseline=baseline,
        fail_on=fail_on,
        save_captures=save_captures,
    )
    result = compare_with_options(model, opts, progress(no_progress))
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
    if "," in backend:
        raise UsageError(f"--backend takes one runner, got {backend!r}; capture each into its own folder")
    check_folder(Path(output))  # before anything runs: never into someone's folder
    opts = CompareOptions.create(
        backends=[backend],
        runs=runs,
        builds=builds,
        outputs_only=outputs_only,
        timeout=timeout,
        probes="none",
        **run_inputs(backend, seed, shape, inputs, ranges, sets, torch_module, trust_model_code),
    )
    result = compare_with_options(model, opts, progress(no_progress), capture_to=output)
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
