"""The typer application every command module registers with, and what commands share."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
from typer.core import TyperGroup, TyperOption

from xbackend.execution.progress import LineProgress, NullProgress, ProgressSink, RichProgress
from xbackend.results.gating import POLICIES
from xbackend.version import VERSION

__all__ = ["EXIT_CODES", "ORDER", "app", "export_app", "progress"]

_GATES = "; ".join(
    f"{policy.exit_code} {policy.name}"
    for policy in POLICIES
    if policy.exit_code and policy.name != "promise"
)
EXIT_CODES = (
    "Exit codes: 0 all deterministic and within --max-ulp; 1 nondeterministic, past --max-ulp (auto: a "
    "backend with an origin), a judgment not made (not judged; --noise-samples 0 declines it), a backend "
    "failed/unavailable, a --candidate failed or went past its precision, or a --decode token or "
    "--decisions choice flipped; 2 usage or input error; 3 "
    "every backend failed; 4 internal error; 16 a runner "
    f"broke a determinism property it promises; with --fail-on: {_GATES}."
)

# the commands in the order people reach for them (typer lists them as they were registered)
ORDER = ("compare", "backends", "export", "capture", "capture-export", "report", "diff", "certify",
         "verify", "keygen", "sweep")  # fmt: skip


class _ByUse(TyperGroup):
    def list_commands(self, ctx: Any) -> list[str]:
        names = super().list_commands(ctx)
        return sorted(names, key=lambda name: ORDER.index(name) if name in ORDER else len(ORDER))


_typed = TyperOption.display_type_rich


def _no_flag_type(self: TyperOption, ctx: Any) -> str | None:
    """A flag takes no value: typer would show `<bool>` beside it in help."""
    return None if self.is_flag else _typed(self, ctx)


TyperOption.display_type_rich = _no_flag_type  # type: ignore[method-assign]

app = typer.Typer(
    name="xbackend",
    help="Does your model give the same bits everywhere it runs?",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
    cls=_ByUse,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"xbackend {VERSION}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option("--version", help="print xbackend's version and exit", callback=_version, is_eager=True),
    ] = False,
) -> None:
    """Does your model give the same bits everywhere it runs?"""


export_app = typer.Typer(help="Export a framework model to ONNX.", no_args_is_help=True)
app.add_typer(export_app, name="export")


def progress(no_progress: bool) -> ProgressSink:
    """A bar on stderr when it is a terminal, a line per finished build when it is not;
    nothing with --no-progress."""
    if no_progress:
        return NullProgress()
    return RichProgress() if sys.stderr.isatty() else LineProgress()
