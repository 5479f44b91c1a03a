"""The typer application every command module registers with, and what commands share."""

from __future__ import annotations

import sys

import typer

from xbackend.execution.progress import LineProgress, NullProgress, ProgressSink, RichProgress
from xbackend.results.gating import POLICIES

__all__ = ["EXIT_CODES", "app", "export_app", "progress"]

_GATES = "; ".join(f"{p.exit_code} {p.name}" for p in POLICIES if p.exit_code and p.name != "promise")
EXIT_CODES = (
    "Exit codes: 0 all deterministic and within --max-ulp; 1 nondeterministic, past --max-ulp (auto: a "
    "backend with an origin), a judgment not made (not judged; --noise-samples 0 declines it), a backend "
    "failed/unavailable, or a --candidate failed or passed its precision; 2 usage or input error; 3 "
    "every backend failed; 4 internal error; 16 a runner "
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


def progress(no_progress: bool) -> ProgressSink:
    """A bar on stderr when it is a terminal, a line per finished build when it is not;
    nothing with --no-progress."""
    if no_progress:
        return NullProgress()
    return RichProgress() if sys.stderr.isatty() else LineProgress()
