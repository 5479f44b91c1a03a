"""Each option declared once (xbackend.results.flags): the CLI's parameters, create()'s coercion
and checks, and command() all come from the declaration."""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any

import pytest
import typer.main
from roots import ROOT

from xbackend.cli import main as _registered  # noqa: F401  (registers every command with the app)
from xbackend.cli.app import app
from xbackend.cli.params import CLI_FLAGS, flag_parameters
from xbackend.errors import UsageError
from xbackend.results import CompareOptions
from xbackend.results.flags import count, declared, flag
from xbackend.results.options import INPUT_FLAGS

pytestmark = pytest.mark.unit  # the unit tier: make check


def _cli_params(command: str) -> dict[str, Any]:
    click_cmd = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    return {p.name: p for p in click_cmd.params}


def test_every_field_declares_its_flag_once() -> None:
    fields = dataclasses.fields(CompareOptions)
    assert [f.name for f in fields if "flag" not in f.metadata] == []
    clis = [fl.cli for _, fl in declared(CompareOptions)] + [
        f.cli for f in {**INPUT_FLAGS, **CLI_FLAGS}.values()
    ]
    assert len(clis) == len(set(clis))


@pytest.mark.parametrize("command", ["compare", "capture", "certify", "sweep", "verify"])
def test_each_command_takes_exactly_its_declared_options(command: str) -> None:
    """The typer parameters the app registered are the generated ones (plus the command's own)."""
    generated = {p.name: p for p in flag_parameters(command)}
    registered = _cli_params(command)
    own = {"compare": {"model"}, "capture": {"model", "backend", "output"}}.get(command)
    if own is not None:
        assert set(registered) == set(generated) | own
    assert set(generated) <= set(registered)
    cli = {f.name: fl.cli for f, fl in declared(CompareOptions)} | {
        n: fl.cli for n, fl in {**INPUT_FLAGS, **CLI_FLAGS}.items()
    }
    for name, p in generated.items():
        assert registered[name].opts == [cli[name]]
        assert registered[name].default == p.default


def test_defaults_are_written_once() -> None:
    """noise_samples' None (floors only where a backend cannot be judged) is the field's; the CLI
    and create() take it from there. certify's own defaults (5 runs, 3 builds) are declared
    beside the field's."""
    field = {f.name: f for f in dataclasses.fields(CompareOptions)}
    assert _cli_params("compare")["noise_samples"].default is field["noise_samples"].default is None
    assert CompareOptions.create().noise_samples is None
    assert (_cli_params("certify")["runs"].default, _cli_params("certify")["builds"].default) == (5, 3)
    assert (_cli_params("compare")["runs"].default, _cli_params("capture")["builds"].default) == (3, 1)


def test_help_names_come_from_the_registries() -> None:
    helps = {n: p.help for n, p in _cli_params("compare").items()}
    assert "builds,threads,opt-levels" in helps["probes"] and "{" not in helps["probes"]
    assert "not-judged" in helps["fail_on"] and "{" not in helps["fail_on"]


def test_command_parses_back_to_the_same_options() -> None:
    """command() writes every non-default option; typer parses it back into equal options."""
    opts = CompareOptions.create(
        backends="ort-cpu,reference,oracle",
        runs=2,
        builds=3,
        max_ulp=16,
        timeout=30.5,
        shapes={"x": [2, 3]},
        runner_options={"ort-cpu": {"threads": "1"}},
        tensors="m.block.*",
        probes="builds,threads",
        batch_invariance=4,
        probe_threads=3,
        ranges={"ids": (0, 50257)},
        timings=True,
        fail_on="ulp>8",
        noise_samples=4,
        timed_runs=5,
        max_memory="3GiB",
        seed=7,
    )
    argv = shlex.split(opts.command("m.onnx"))[2:]
    click_cmd = typer.main.get_command(app).commands["compare"]  # type: ignore[attr-defined]
    params = click_cmd.make_context("compare", argv).params
    params.pop("model")
    again = CompareOptions.create(**{k: v for k, v in params.items() if k not in CLI_FLAGS})
    assert again == opts


@dataclasses.dataclass(frozen=True)
class _WithTicks(CompareOptions):
    """CompareOptions with one more declaration, as a new flag would add it."""

    ticks: int = flag(2, "--ticks", check=count(1))


def test_every_declared_option_has_its_command_line_side_and_no_other() -> None:
    """The field (xbackend.results.options) and its help, metavar and typer type (xbackend.cli.flags)
    name the same options."""
    from xbackend.cli.flags import FLAGS

    declared_names = [f.name for f, _ in declared(CompareOptions)] + list(INPUT_FLAGS)
    assert sorted(FLAGS) == sorted(declared_names)


def test_one_new_declaration_reaches_the_cli_create_and_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new field and its command-line entry: the CLI takes it, create() checks it, command()
    writes it."""
    from xbackend.cli import flags as cli_flags

    monkeypatch.setitem(cli_flags.FLAGS, "ticks", cli_flags.CliFlag("planted: a new option"))
    param = {p.name: p for p in flag_parameters("compare", _WithTicks)}["ticks"]
    assert (param.default, param.annotation.__metadata__[0].default) == (2, "--ticks")
    assert "--ticks" not in _WithTicks.create().command("m.onnx")  # at its default
    assert _WithTicks.create(ticks=5).command("m.onnx").endswith("--ticks 5")
    with pytest.raises(UsageError, match="--ticks must be >= 1, got 0"):
        _WithTicks.create(ticks=0)


def test_threads_sets_every_backend_that_has_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    """--threads, added as one declaration (INPUT_FLAGS) and the lines in create() that use it:
    each listed backend whose runner has a threads option gets it; a --set wins over it."""
    opts = CompareOptions.create(
        backends="ort-cpu,reference,trt-pinned", threads=1, runner_options=["reference.threads=4"]
    )
    assert opts.options_for("ort-cpu") == {"threads": "1"}
    assert opts.options_for("reference") == {"threads": "4"}
    assert opts.options_for("trt-pinned") == {}  # TensorRT has no threads option
    assert "--set ort-cpu.threads=1" in opts.command("m.onnx")
    params = _cli_params("compare")
    assert params["threads"].opts == ["--threads"] and "threads" in _cli_params("capture")
    assert "threads" not in _cli_params("certify")  # certify checks thread counts itself
    with pytest.raises(UsageError, match="--threads must be >= 1, got 0"):
        CompareOptions.create(threads=0)
    with pytest.raises(UsageError, match="none of trt-pinned has one; add ort-cpu"):
        CompareOptions.create(backends="trt-pinned", threads=2)


def test_the_python_api_page_names_every_option() -> None:
    """docs/python-api.md lists the keywords xbackend.compare takes: every field, and the inputs
    create() folds into fields."""

    page = (ROOT / "docs" / "python-api.md").read_text("utf-8")
    names = [f.name for f in dataclasses.fields(CompareOptions)] + list(INPUT_FLAGS)
    assert [n for n in names if f"`{n}`" not in page and f"`{n}=" not in page] == []
