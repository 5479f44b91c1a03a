"""sweep: models x backends x hosts, and the fleet report."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from xbackend.cli.app import app
from xbackend.cli.params import with_flags
from xbackend.errors import UsageError
from xbackend.results.flags import pairs
from xbackend.sweep import load_sweep, run_sweep
from xbackend.sweep.executors import LocalExecutor, RayExecutor
from xbackend.sweep.outcomes import NullFleetProgress
from xbackend.sweep.progress import LineProgress, RichFleetProgress
from xbackend.sweep.report import fleet_verdict

__all__ = ["sweep"]


@app.command(
    epilog="Exit codes: 0 every job ran and every model's comparison passed; 1 a job failed, or a "
    "comparison found a nondeterministic backend or one past max_ulp; 16 a runner broke a property it "
    "promises; 3 no job ran; 2 usage error (a bad sweep file, Ray missing or unreachable); 4 internal error."
)
@with_flags("sweep")
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
    **flags: Any,
) -> int:
    """Run every model x backend job of a sweep file, compare each model's captures, write a fleet report."""
    if executor not in ("local", "ray"):
        raise UsageError(f"--executor must be local or ray, got {executor!r}")
    if executor == "local" and (address or shared_storage):
        raise UsageError("--address and --shared-storage apply to --executor ray; add --executor ray")
    spec = load_sweep(sweep_file, output, pairs(flags["runner_options"]))
    ex = LocalExecutor() if executor == "local" else RayExecutor(address, shared_storage)
    bar: Any = (
        NullFleetProgress()
        if flags["no_progress"]
        else (RichFleetProgress() if sys.stderr.isatty() else LineProgress())
    )
    result = run_sweep(spec, ex, bar, resume=not no_resume, force=flags["force"])
    for line in fleet_verdict(result):
        print(line)
    resumed = sum(job.resumed for job in result.jobs)
    again = f" ({resumed} resumed from earlier captures)" if resumed else ""
    print(f"wrote {spec.output / 'fleet.md'} and fleet.json: {len(result.jobs)} job(s){again}")
    return result.exit_code
