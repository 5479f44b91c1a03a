"""compare and capture: run backends and print what they found."""

from __future__ import annotations

import contextlib
import io
import itertools
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from xbackend.api.compare import compare_with_options
from xbackend.cli.app import EXIT_CODES, app, progress
from xbackend.cli.params import Force, ModelArg, compare_options, with_flags
from xbackend.errors import RunnerFailedError, UsageError
from xbackend.files.atomic import NPZ_MARK, check_outputs, write_atomic_bytes
from xbackend.files.capture_folder import check_folder
from xbackend.files.textfmt import short, with_module
from xbackend.model.extdata import model_files
from xbackend.report import bundle_outputs, write_markdown_bundle
from xbackend.results import CompareOptions, Result
from xbackend.results.capture_record import load_capture

__all__ = ["capture", "capture_export", "compare"]


@app.command(epilog=EXIT_CODES)
@with_flags("compare")
def compare(model: ModelArg, **flags: Any) -> int:
    """Run a model on several backends and compare, per layer, in ULPs."""
    report, json = flags["report"], flags["json"]
    outputs = [*bundle_outputs("--report", report), ("--json", json)]
    opts = compare_options(flags)
    check_outputs(outputs, read_by(model, opts, flags["baseline"]), flags["force"])
    if opts.save_captures:  # a capture per backend: never into someone's folder
        for backend in opts.backends:
            check_folder(Path(opts.save_captures) / backend, "--save-captures", flags["force"])
    result = compare_with_options(model, opts, progress(flags["no_progress"]))
    _write_reports(result, report, json)
    _print_summary(result)
    return result.exit_code


_READ_OPTIONS = ("gguf", "module", "file")  # runner options naming a file the run reads
_FOLDER_FILES = 10_000  # an inputs folder's files looked at


def read_by(model: str, opts: CompareOptions, baseline: str | None = None) -> list[Path]:
    """Every file a comparison reads, none of which an output may name (not even with --force):
    the model and its weights, each candidate's, the GGUF files beside the model, the files its
    runner options name, the inputs (each file of an inputs folder) and the baseline."""
    read = model_files(model)
    for candidate, _ in opts.candidates:
        read += model_files(candidate)
    with contextlib.suppress(OSError):
        read += sorted(Path(model).parent.glob("*.gguf"))
    read += [Path(v.rpartition(":")[0] if k == "module" and ":" in v else v)
             for _, k, v in opts.runner_options if k in _READ_OPTIONS and v]  # fmt: skip
    if opts.inputs:
        given = Path(opts.inputs)
        read.append(given)
        if given.is_dir():
            read += list(
                itertools.islice((path for path in given.rglob("*") if path.is_file()), _FOLDER_FILES)
            )
    if baseline:
        read.append(Path(baseline))
    return read


def _write_reports(result: Result, md: str | None, js: str | None) -> None:
    if md or js:  # the Markdown, its table and figures and the JSON: all of them, or none
        write_markdown_bundle(result, md, js)


@app.command(
    epilog="Its values as one .npz: `xbackend capture export DIR --npz OUT`. Exit codes: 0 captured; 1 "
    "captured, but the backend was nondeterministic; 2 usage or input error; 3 the backend failed "
    "(nothing written); 4 internal error."
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
    check_folder(Path(output), "-o", flags["force"])  # before anything runs: never into someone's folder
    opts = compare_options(flags, backends=[backend], probes="none")
    result = compare_with_options(model, opts, progress(flags["no_progress"]), capture_to=output)
    backend_result = result.backend(backend)
    if not backend_result.ok:
        raise RunnerFailedError(
            f"{backend} {backend_result.status}: {backend_result.reason}; nothing was captured"
        )
    det = (
        "deterministic"
        if backend_result.deterministic
        else f"NONDETERMINISTIC ({backend_result.distinct_outputs} distinct outputs)"
    )
    print(
        f"wrote {output}: {backend}, {det} over {backend_result.runs} run(s) x {backend_result.builds} "
        "build(s), "
        f"{backend_result.exposed} tensors; compare it elsewhere with `xbackend compare MODEL --load "
        f"{output}`"
    )
    return 0 if backend_result.deterministic else 1


@app.command(
    "capture-export",
    epilog="Also as `xbackend capture export DIR --npz OUT`. Exit codes: 0 written; 2 the folder is not a "
    "capture, a checksum does not match, or OUT exists and xbackend did not write it; 4 internal error.",
)
def capture_export(
    folder: Annotated[str, typer.Argument(metavar="DIR", help="a capture folder (xbackend capture)")],
    npz: Annotated[str, typer.Option("--npz", metavar="OUT.npz", help="write its values here")],
    force: Force = False,
) -> int:
    """Write a capture's values as one .npz (inputs/NAME, outputs/NAME, layers/NAME, and
    xbackend.capture-export: the folder's name), checksums checked first: numpy alone can then
    check any figure in a report."""
    if not npz.endswith(".npz"):
        raise UsageError(f"--npz takes a file name ending in .npz, got {npz!r}")
    check_outputs([("--npz", npz)], [folder], force)  # before anything is read
    arrays = load_capture(folder)
    marked = {**arrays, NPZ_MARK: np.array(Path(folder).name)}  # lets a later export replace it
    write_atomic_bytes(npz, _npz(marked))
    print(f"wrote {npz}: {len(arrays)} arrays from {folder}; read them with numpy.load({npz!r})")
    return 0


def _npz(arrays: dict[str, np.ndarray]) -> bytes:
    """numpy's .npz layout with fixed timestamps: the same capture gives the same bytes."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in arrays.items():
            one = io.BytesIO()
            np.lib.format.write_array(one, np.asanyarray(array), allow_pickle=False)
            archive.writestr(zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0)), one.getvalue())
    return buf.getvalue()


def _print_summary(result: Result) -> None:
    modules = result.model.modules()
    for line in result.verdict():
        print(line)
    for backend in result.backends:
        if not backend.ok:
            print(f"  {backend.name}: {backend.status} ({backend.reason})")
            continue
        where = f" (loaded from {backend.loaded_from})" if backend.loaded_from else ""
        if backend.deterministic:
            print(
                f"  {backend.name}: deterministic over {backend.runs} run(s) x {backend.builds} "
                f"build(s){where}"
            )
        else:
            print(f"  {backend.name}: {backend.variance_words()}{where}")
    for cross in result.cross_backend:
        if cross.status != "ok":
            print(f"  {cross.backend} vs {cross.reference}: not compared ({cross.reason})")
            continue
        print(
            f"  {cross.backend} vs {cross.reference}: bitwise "
            f"{'equal' if cross.bitwise_equal else 'different'}, "
            + (
                f"{short(cross.scaled_ulp)} scaled ULP (raw max ULP {cross.max_ulp})"
                if cross.scaled_ulp is not None
                else "compared exactly"
            )
            + f" at outputs; {_divergence(cross.bitwise_equal, cross.first_divergence, modules)}"
        )
    for line in _cost_lines(result):
        print(line)


def _cost_lines(result: Result) -> list[str]:
    """--modes: each mode's promises and its latency against the default's, on the terminal too."""
    out = []
    for fam in result.cost_of_determinism():
        out.append(f"  modes of {fam.runner} (latency against {fam.default}'s):")
        for row in fam.rows:
            if row.latency is None:
                cost = "not timed (--timed-runs N times it)"
            else:
                ratio = f", {row.ratio:.2f}x" if row.ratio is not None and row.mode != "default" else ""
                cost = f"{row.latency.words()}{ratio}"
            promises = row.promise_words()
            out.append(f"    {row.mode}: {cost}; promises {promises}")
    return out


def _divergence(outputs_equal: bool, first: str | None, modules: Mapping[str, str]) -> str:
    """Where the tensors first differ, never read as contradicting equal outputs."""
    if first is None:
        return "first divergence none"
    where = with_module(first, modules)
    return (
        f"the outputs agree, an intermediate first differs at {where}"
        if outputs_equal
        else f"first divergence {where}"
    )
