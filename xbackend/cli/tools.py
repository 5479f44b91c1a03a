"""backends and export: what this machine can run, and getting a model into ONNX."""

from __future__ import annotations

from typing import Annotated

import typer

from xbackend.cli.app import app, export_app
from xbackend.cli.params import Force
from xbackend.errors import XbackendError
from xbackend.execution.foreign import probe_interpreter
from xbackend.export.gguf import TYPES as GGUF_TYPES
from xbackend.export.gguf import write_gguf
from xbackend.export.torch_onnx import InputDecl, export_torch, parse_dynamic, read_examples
from xbackend.files.atomic import check_export_output
from xbackend.model.inputs import parse_range
from xbackend.results.promises import PROPERTIES
from xbackend.runners.base import PYTHON_OPTION, Availability
from xbackend.runners.registry import get_runner, list_runners

__all__ = ["backends", "export_gguf_cmd", "export_torch_cmd"]


@app.command()
def backends() -> int:
    """List every registered backend, available or not, and why."""
    for list_runner in list_runners():
        avail, where = list_runner.availability, ""
        try:
            python = get_runner(list_runner.name).resolve_options({})[PYTHON_OPTION.name]
        except XbackendError:
            python = ""
        if python:  # its own interpreter by default (e.g. $XBACKEND_GROQ_PYTHON): ask that one
            it = probe_interpreter(python, list_runner.target)
            avail, where = Availability(it.available, it.reason, it.version), f" in python={python}"
        state = f"available{where} ({avail.version})" if avail.available else f"unavailable: {avail.reason}"
        print(f"{list_runner.name:12s} {state}")
        if list_runner.description:
            print(f"{'':12s} {list_runner.description}")
        try:
            cls = get_runner(list_runner.name)
            specs, modes = cls.all_option_specs(), cls.determinism_modes()
        except XbackendError:
            specs, modes = (), {}
        for spec in specs:
            choices = f" [{'|'.join(spec.choices)}]" if spec.choices else ""
            print(f"{'':12s}   --set {list_runner.name}.{spec.name}=...{choices}  {spec.help}")
        for label, opts in modes.items():
            promises = cls.promises_for(cls.resolve_options(opts))
            promised = ", ".join(p for p in PROPERTIES if p in promises) or "nothing"
            sets = ", ".join(f"{key}={opt}" for key, opt in opts.items())
            print(
                f"{'':12s}   mode {list_runner.name}@{label} ({sets}): promises {promised}  [--modes "
                f"{list_runner.name}]"
            )
    return 0


@export_app.command("torch")
def export_torch_cmd(
    module: Annotated[
        str, typer.Argument(metavar="MODULE_SPEC", help="path/to/file.py:factory or package.module:factory")
    ],
    output: Annotated[str, typer.Option("-o", "--output", metavar="OUT.onnx", help="ONNX file to write")],
    input: Annotated[
        list[str] | None,
        typer.Option(
            "--input",
            metavar="NAME=D1,D2,...[:DTYPE]",
            help="example input, in forward() order (repeatable); dtype defaults to float32; NAME "
            "alone takes shape and dtype from --inputs",
        ),
    ] = None,
    inputs: Annotated[
        str | None,
        typer.Option(
            "--inputs",
            metavar="FILE.npz|DIR",
            help="real example inputs: an .npz keyed by input name, or a folder of input_N.pb",
        ),
    ] = None,
    ranges: Annotated[
        list[str] | None,
        typer.Option(
            "--range",
            metavar="NAME=LO:HI",
            help="draw the example values of input NAME from [LO, HI), e.g. token_type_ids=0:2 (repeatable)",
        ),
    ] = None,
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
    force: Force = False,
) -> int:
    """Export a PyTorch nn.Module (records its source in the ONNX metadata)."""
    check_export_output(output, module, inputs, force)  # before the module is loaded or anything read
    data = read_examples(inputs) if inputs else None
    res = export_torch(
        module,
        [InputDecl.parse(i, data) for i in input or ()],
        output,
        opset=opset,
        dynamic=parse_dynamic(dynamic or []),
        seed=seed,
        output_names=output_name or [],
        ranges={name: (lo, hi) for name, lo, hi in (parse_range(r) for r in ranges or ())},
        data=data,
    )
    print(
        f"wrote {res.path}: opset {res.opset}, torch {res.torch_version}, inputs "
        f"{', '.join(i.name for i in res.inputs)}, outputs {', '.join(res.outputs)}; "
        f"{len(res.module_outputs)} module outputs mapped to ONNX tensors"
    )
    return 0


@export_app.command("gguf")
def export_gguf_cmd(
    hf_folder: Annotated[
        str,
        typer.Argument(
            metavar="HF_FOLDER", help="a Hugging Face model folder (config.json, weights, tokenizer)"
        ),
    ],
    output: Annotated[str, typer.Option("-o", "--output", metavar="OUT.gguf", help="GGUF file to write")],
    kind: Annotated[str, typer.Option("--type", help=f"one of {', '.join(GGUF_TYPES)}")] = "f32",
    force: Force = False,
) -> int:
    """Write a GGUF file for the llama.cpp backend with llama.cpp's own converter and quantizer."""
    out = write_gguf(hf_folder, output, kind, force)
    print(f"wrote {out} ({kind}, {out.stat().st_size:,} bytes): compare with --backends ort-cpu,llama.cpp")
    return 0
