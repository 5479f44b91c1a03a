"""The command line's side of every option: its help, metavar, the type typer parses, the
commands that take it and their defaults. The option itself (its flag's name, how a value is
read and checked, how a comparison's command line is written back) is declared with its field in
xbackend.results.options; this table holds one entry per declared option, and a test keeps the
two in step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["COMMANDS", "FLAGS", "CliFlag"]

COMMANDS = ("compare", "capture", "certify")
_ALL = (*COMMANDS, "sweep")
_SAME = ("the field's default",)  # cli_default unset (dataclasses' MISSING would mean required)


@dataclass(frozen=True)
class CliFlag:
    """One option as the command line shows it."""

    help: str
    metavar: str | None = None
    commands: tuple[str, ...] = ("compare",)
    # the type typer parses, when not the field's own (e.g. list[str] | None for a tuple of pairs)
    typer_type: Any = None
    cli_default: Any = _SAME  # typer's default, when not the field's
    defaults: tuple[tuple[str, Any], ...] = ()  # another default for one command: (("certify", 5),)
    hidden_default: bool = False  # the help shows no default (it depends on other options)
    cli: str = ""  # the flag of an option only the command line has (the others' is their field's)

    def default_for(self, command: str, field_default: Any) -> Any:
        """This flag's default in `command`: the command's own, else the CLI's, else the field's."""
        own = dict(self.defaults)
        if command in own:
            return own[command]
        return field_default if self.cli_default is _SAME else self.cli_default


_INPUTS_HELP = (
    "real input data: an .npz keyed by input name, a directory in ONNX's test-data layout "
    "(input_N.pb; output_N.pb beside them join the comparison as the backend 'expected'), or a "
    "capture folder (its inputs)"
)


# Every option of xbackend.results.options (CompareOptions' fields, then INPUT_FLAGS), by name.
FLAGS: dict[str, CliFlag] = {
    "backends": CliFlag(
        help="comma-separated runner names; see `xbackend backends` (default: ort-cpu,reference, or only "
        "the --modes families)",
        typer_type=str | None,
        cli_default=None,
        hidden_default=True,
    ),
    "reference": CliFlag(
        help="backend every other is compared against (default: 'reference' if listed, else the first)",
    ),
    "runs": CliFlag(
        help="runs per session",
        commands=COMMANDS,
        defaults=(("certify", 5),),
    ),
    "builds": CliFlag(
        help="fresh sessions, each in a fresh process",
        commands=COMMANDS,
        defaults=(("certify", 3),),
    ),
    "max_ulp": CliFlag(
        help="cross-backend tolerance: auto (default) judges each node against its own float64 value and "
        "fails a backend with an origin (a node past what rounding allows); N: N scaled ULP at the outputs",
        metavar="auto|N",
        typer_type=str,
        cli_default="auto",
    ),
    "timeout": CliFlag(
        help="seconds per backend build",
        commands=COMMANDS,
    ),
    "inputs": CliFlag(
        help=_INPUTS_HELP,
        metavar="FILE.npz|DIR",
        commands=COMMANDS,
    ),
    "seed": CliFlag(
        help="seed for generated inputs",
        commands=COMMANDS,
    ),
    "shapes": CliFlag(
        help="shape for an input with dynamic dimensions (repeatable)",
        metavar="NAME=D1,D2,...",
        commands=COMMANDS,
        typer_type=list[str] | None,
        cli_default=None,
    ),
    "runner_options": CliFlag(
        help="runner option, e.g. ort-cpu.threads=1 (repeatable)",
        metavar="BACKEND.OPTION=VALUE",
        commands=_ALL,
        typer_type=list[str] | None,
        cli_default=None,
    ),
    "outputs_only": CliFlag(
        help="compare graph outputs only",
        commands=("compare", "capture"),
    ),
    "tensors": CliFlag(
        help="tensors to expose: every one; module boundaries (the module map); graph outputs; or "
        "globs over module paths or tensor names, e.g. 'm.transformer.h.3.*' (graph outputs always)",
        metavar="all|modules|outputs|GLOB",
    ),
    "probes": CliFlag(
        help="probes to run: {probes}, 'all' or 'none' (default: {default_probes}, plus batch with "
        "--batch-invariance)",
        metavar="LIST",
        typer_type=str | None,
    ),
    "batch_invariance": CliFlag(
        help="probe batch invariance with batches of B (needs a dynamic batch dimension)",
        metavar="B",
    ),
    "probe_threads": CliFlag(
        help="thread count the thread probe compares with 1 (default: twice the logical cores)",
        metavar="N",
    ),
    "ranges": CliFlag(
        help="draw generated values of input NAME from [LO, HI), e.g. input_ids=0:50257 (repeatable)",
        metavar="NAME=LO:HI",
        commands=COMMANDS,
        typer_type=list[str] | None,
        cli_default=None,
    ),
    "timings": CliFlag(
        help="put wall times, latency and each backend's peak memory in the reports (off by default: they "
        "would make the reports of two identical comparisons differ)",
    ),
    "loads": CliFlag(
        help="a capture from another host (xbackend capture) compared beside the live backends, named "
        "BACKEND@FOLDER unless NAME is given (repeatable)",
        metavar="[NAME=]DIR",
        typer_type=list[str] | None,
        cli_default=None,
    ),
    "baseline": CliFlag(
        help="a previous release's JSON report, capture folder, or folder of captures: per backend, "
        "whether the outputs moved, by how much and from which layer",
        metavar="PATH",
    ),
    "fail_on": CliFlag(
        help="gate on these, comma-separated: {policies} (e.g. ulp>8); each has its own exit code (below)",
        metavar="POLICIES",
        typer_type=str | None,
        cli_default=None,
    ),
    "save_captures": CliFlag(
        help="write a portable capture of every backend that ran to DIR/BACKEND "
        "(for a later --baseline or --load)",
        metavar="DIR",
    ),
    "noise_samples": CliFlag(
        help="measure the noise floor over K random orders of every reduction (default: only for "
        "backends that cannot be judged against float64, with 8; 0: no explanation, no origins; "
        "--max-ulp auto then falls back to 64)",
        metavar="K",
        typer_type=int | None,
    ),
    "timed_runs": CliFlag(
        help="N more runs of the model users ship per build, timed and compared like the others; puts "
        "latency in the reports (default: 0, or 10 with --modes)",
        metavar="N",
        commands=("compare", "certify"),
        typer_type=int | None,
        cli_default=None,
        defaults=(("certify", 0),),
        hidden_default=True,
    ),
    "max_memory": CliFlag(
        help="memory per backend process, e.g. 3GiB: per-layer tensors are exposed in windows that "
        "fit (default: 80% of the memory available at the start)",
        metavar="SIZE",
        typer_type=str | None,
    ),
    "decode": CliFlag(
        help="greedy-decode N tokens from each prompt on every backend (a causal LM: input_ids in, logits "
        "out; KV cache as past_key_values.N.*/present.N.*): where each backend's tokens leave the "
        "reference's, the margins, and with --batch-invariance B the completions over batch compositions",
        metavar="N",
    ),
    "decisions": CliFlag(
        help="top-1 agreement with the reference along a class axis: auto (every float output's last axis), "
        "or OUTPUT[:AXIS],...: per backend the decisions that flipped and the reference's margin there",
        metavar="auto|OUTPUT[:AXIS]",
        typer_type=str | None,
        cli_default=None,
    ),
    "candidates": CliFlag(
        help="a release candidate of the model (a float16, bf16 or int8 conversion, an optimized or "
        "re-exported graph) against it, per layer at the precision the candidate declares, and in "
        "tokens and decisions: "
        "FILE[@BACKEND,...] (default backends: those listed besides reference and oracle, else ort-cpu; "
        "repeatable)",
        metavar="FILE[@BACKENDS]",
        typer_type=list[str] | None,
        cli_default=None,
    ),
    "advise": CliFlag(
        help="with --candidate and --decode or --decisions: the nodes to keep in float32 so each candidate's "
        "tokens or decisions match the original's, in its converter's lists (node_block_list, "
        "nodes_to_exclude) with the command that re-converts, confirmed by re-converting and running",
    ),
    "advise_budget": CliFlag(
        help="with --advise: the re-conversions (each run) the search for the smallest keep-list may take",
        metavar="N",
    ),
    "modes": CliFlag(
        help="run each of these runners under its default and each determinism mode it declares "
        "(NAME, NAME@det, ...; `xbackend backends` lists them), timed, with a Cost of determinism table",
        metavar="RUNNERS",
        typer_type=str | None,
        cli_default=None,
    ),
    "threads": CliFlag(
        help="thread count for every backend whose runner has a threads option (a --set overrides it)",
        metavar="N",
        commands=("compare", "capture"),
        typer_type=int | None,
        cli_default=None,
    ),
    "torch_module": CliFlag(
        help="source nn.Module for the torch backends (path/to/file.py:factory or pkg.mod:factory)",
        metavar="MODULE_SPEC",
        commands=COMMANDS,
        typer_type=str | None,
        cli_default=None,
    ),
    "trust_model_code": CliFlag(
        help="let the torch backends import the Python file the model's metadata names (off: a model "
        "never makes xbackend run code)",
        commands=COMMANDS,
        typer_type=bool,
        cli_default=False,
    ),
}
