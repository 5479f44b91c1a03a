"""The command line's options, generated from their declarations (CompareOptions' fields and
INPUT_FLAGS in xbackend.results.options, each with its command-line side in xbackend.cli.flags,
and the few below that only the CLI has): `with_flags` gives a command the typer parameters of
every option that names it."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any, TypeVar, get_type_hints

import typer

from xbackend.cli.flags import COMMANDS, FLAGS, CliFlag
from xbackend.probes.registry import PROBES
from xbackend.results import CompareOptions
from xbackend.results.flags import declared
from xbackend.results.gating import POLICIES
from xbackend.results.options import INPUT_FLAGS

__all__ = [
    "CLI_FLAGS",
    "PANELS",
    "Force",
    "ModelArg",
    "compare_options",
    "flag_parameters",
    "panel",
    "with_flags",
]

_VERIFY = ("verify",)
# Options only the command line has: where reports go, and the progress bar.
CLI_FLAGS = {
    "report": CliFlag(
        "write the Markdown report here, its figures and layer CSV beside it",
        metavar="OUT.md",
        typer_type=str | None,
        cli_default=None,
        cli="--report",
    ),
    "json": CliFlag(
        "write the JSON report here",
        metavar="OUT.json",
        typer_type=str | None,
        cli_default=None,
        cli="--json",
    ),
    "force": CliFlag(
        "replace output files xbackend did not write (or that changed since); never a model, an "
        "input or a link",
        commands=(*COMMANDS, "sweep"),
        typer_type=bool,
        cli_default=False,
        cli="--force",
    ),
    "no_progress": CliFlag(
        "no progress bar on stderr",
        commands=(*COMMANDS, "sweep", *_VERIFY),
        typer_type=bool,
        cli_default=False,
        cli="--no-progress",
    ),
}
# Declared options verify takes too: what it feeds and how its runners are set here.
_ALSO_VERIFY = {"inputs", "runner_options", "torch_module", "trust_model_code"}
# Names help texts may cite, filled from the registries.
_HELP_NAMES = {
    "probes": ",".join(PROBES),
    "default_probes": ",".join(key for key, value in PROBES.items() if value.default),
    "policies": ", ".join(p.name for p in POLICIES),
}

ModelArg = Annotated[str, typer.Argument(help="path to an .onnx file", show_default=False)]
# --force for the commands that declare their options by hand (report, diff, keygen, export, capture export)
Force = Annotated[bool, typer.Option("--force", help=CLI_FLAGS["force"].help)]


def _declarations(options: type) -> list[tuple[str, Any, Any, str, CliFlag]]:
    """(name, type, default, flag, its command-line side) of every declared option, fields first."""
    hints = get_type_hints(options)
    out = [(f.name, hints[f.name], f.default, fl.cli, FLAGS[f.name]) for f, fl in declared(options)]
    out += [(key, None, None, fl.cli, FLAGS[key]) for key, fl in INPUT_FLAGS.items()]
    out += [(key, None, None, fl.cli, fl) for key, fl in CLI_FLAGS.items()]
    return out


def flag_parameters(command: str, options: type = CompareOptions) -> list[inspect.Parameter]:
    """The typer parameters of every option `command` takes, keyword-only, in declaration order."""
    out = []
    for name, tp, default, cli, fl in _declarations(options):
        if command not in fl.commands and not (command == "verify" and name in _ALSO_VERIFY):
            continue
        text = fl.help.format(**_HELP_NAMES)
        stated = "(default" in text  # the help says it in words: typer does not repeat it
        info = typer.Option(
            cli,
            metavar=fl.metavar,
            help=text,
            show_default=not (fl.hidden_default or stated),
            rich_help_panel=panel(cli),
        )
        out.append(
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=fl.default_for(command, default),
                annotation=Annotated[fl.typer_type or tp, info],
            )
        )
    return out


# compare --help in the panels a person looks for; an option not named here sits in "Other"
PANELS: dict[str, tuple[str, ...]] = {
    "Backends": ("--backends", "--reference", "--set", "--load", "--torch-module", "--trust-model-code",
                 "--modes", "--threads", "--timeout", "--max-memory"),
    "Inputs": ("--inputs", "--seed", "--shape", "--range"),
    "Runs and probes": ("--runs", "--builds", "--probes", "--batch-invariance", "--probe-threads",
                        "--timed-runs", "--outputs-only", "--tensors"),
    "Explanation": ("--max-ulp", "--noise-samples"),
    "Decoding and candidates": ("--decode", "--decisions", "--candidate", "--advise", "--advise-budget"),
    "Reports and captures": ("--report", "--json", "--save-captures", "--baseline", "--timings",
                             "--force", "--no-progress"),
    "Gates": ("--fail-on",),
}  # fmt: skip
_PANEL_OF = {cli: name for name, clis in PANELS.items() for cli in clis}


def panel(cli: str) -> str:
    """The help panel option `cli` is listed in."""
    return _PANEL_OF.get(cli, "Other")


F = TypeVar("F", bound=Callable[..., Any])


def with_flags(command: str) -> Callable[[F], F]:
    """Give `command`'s function (its own parameters, then **flags) the declared options' typer
    parameters; typer reads the signature, and calls the function with each by name."""

    def wrap(fn: F) -> F:
        sig = inspect.signature(fn, eval_str=True)
        own = [
            parameter
            for parameter in sig.parameters.values()
            if parameter.kind is not inspect.Parameter.VAR_KEYWORD
        ]
        fn.__signature__ = sig.replace(parameters=[*own, *flag_parameters(command)])  # type: ignore[attr-defined]
        return fn

    return wrap


def compare_options(given: dict[str, Any], **fixed: Any) -> CompareOptions:
    """CompareOptions from a command's declared options (those the CLI alone has left out),
    with `fixed` fields the command decides itself."""
    chosen = {key: value for key, value in given.items() if key not in CLI_FLAGS}
    return CompareOptions.create(**{**chosen, **fixed})
