"""Groq LPU through GroqFlow: groqit() on the ONNX file, GroqModel.run().

GroqFlow pins an older Python (>= 3.8, < 3.11), onnxruntime, torch and onnx, and needs Groq's
proprietary SDK, so this runner's worker runs in GroqFlow's own environment: `python=PATH`, or
the XBACKEND_GROQ_PYTHON environment variable. GroqFlow converts models to fp16 by default; the
precision is an explicit option, and the report records it. The compiler schedules statically,
so the runner promises run-to-run and build-to-build determinism, and xbackend checks both.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from xbackend.errors import RunnerFailedError
from xbackend.files.modelref import ModelRef
from xbackend.runners.base import PYTHON_OPTION, Availability, BuildFingerprint, OptionSpec, Runner

__all__ = ["GroqRunner", "build_items", "missing_parts"]

PYTHON_ENV = "XBACKEND_GROQ_PYTHON"
GROQ_PCI_ID = "1de0:0000"  # GroqCard's PCI vendor:device, as GroqFlow's sdk_helpers counts chips
# Files in a build folder that change on every build without changing the program: GroqFlow's
# state (timestamps, paths) and logs. Everything else is the build fingerprint.
_VOLATILE_SUFFIXES = (".yaml", ".log", ".txt")


def _find_tool(tool: str) -> str | None:
    """Where GroqFlow looks for an SDK tool: PATH, then /usr/local/groq/bin."""
    found = shutil.which(tool)
    if found:
        return found
    path = f"/usr/local/groq/bin/{tool}"
    return path if os.path.isfile(path) else None


def count_chips() -> int | None:
    """GroqCards on the PCI bus (lspci -n); None where lspci is missing."""
    lspci = shutil.which("lspci") or ("/usr/bin/lspci" if os.path.isfile("/usr/bin/lspci") else None)
    if lspci is None:
        return None
    try:
        out = subprocess.run([lspci, "-n"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return sum(GROQ_PCI_ID in line for line in out.splitlines())


def missing_parts() -> list[str]:
    """What this interpreter and host lack to build and run on Groq hardware, each with its fix."""
    out = []
    if importlib.util.find_spec("groqflow") is None:
        out.append(
            "groqflow is not installed in this interpreter (install GroqFlow 4.x into a Python >= 3.8, "
            f"< 3.11 environment and point python= or {PYTHON_ENV} at its interpreter)"
        )
    if _find_tool("groq-compiler") is None:
        out.append(
            "groq-devtools is missing (no groq-compiler on PATH or in /usr/local/groq/bin; "
            "from support.groq.com)"
        )
    try:
        runtime = importlib.util.find_spec("groq.runtime") is not None
    except ModuleNotFoundError:
        runtime = False
    if not runtime:
        out.append("groq-runtime is missing (the groq.runtime module does not import; from support.groq.com)")
    chips = count_chips()
    if chips is None:
        out.append("cannot count GroqCards: lspci is not installed (apt install pciutils)")
    elif chips == 0:
        out.append(f"no GroqCard on this host (lspci -n shows no {GROQ_PCI_ID} device)")
    return out


def build_items(folder: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """(relative path, sha256) of every file GroqFlow's build left, but its state and logs."""
    root = Path(folder)
    items = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.name.endswith(_VOLATILE_SUFFIXES) and "log" not in path.name.lower():
            digest = hashlib.sha256()
            with open(path, "rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
            items.append((str(path.relative_to(root)), digest.hexdigest()))
    return items


def _fp32_sequence() -> Any:
    """GroqFlow's ONNX-file sequence without its ConvertOnnxToFp16 stage (the documented way to
    keep fp32: pass groqit() a sequence that skips the conversion)."""
    of_export = importlib.import_module("onnxflow.justbuildit.export")
    stage = importlib.import_module("onnxflow.justbuildit.stage")
    gf_export = importlib.import_module("groqflow.justgroqit.export")
    compile_ = importlib.import_module("groqflow.justgroqit.compile")
    return stage.Sequence(
        "xbackend_onnx_fp32",
        "Building ONNX model without fp16 conversion",
        [
            of_export.OnnxLoad(),
            gf_export.CheckOnnxCompatibility(),
            compile_.CompileOnnx(),
            compile_.Assemble(),
        ],
        enable_model_validation=True,
    )


class GroqRunner(Runner):
    name = "groq"
    description = (
        "Groq LPU through GroqFlow's groqit() (its own interpreter: python= or XBACKEND_GROQ_PYTHON)"
    )
    promises: ClassVar[frozenset[str]] = frozenset({"run-to-run", "build-to-build"})
    stages_model = True
    option_specs: ClassVar[Sequence[OptionSpec]] = (
        OptionSpec(
            "precision",
            str,
            "fp16",
            "fp16: GroqFlow's default sequence (converts the model to fp16); fp32: the same without "
            "ConvertOnnxToFp16",
            ("fp16", "fp32"),
        ),
        OptionSpec(
            "compiler_flags", str, "", "groq-compiler flags, space-separated ('' = GroqFlow's defaults)"
        ),
        OptionSpec("assembler_flags", str, "", "assembler flags, space-separated ('' = GroqFlow's defaults)"),
        OptionSpec("num_chips", int, 0, "GroqChips to build for (0 = groqit decides from the model's size)"),
        OptionSpec(
            PYTHON_OPTION.name,
            str,
            lambda: os.environ.get(PYTHON_ENV, ""),
            f"GroqFlow's interpreter (default: ${PYTHON_ENV})",
        ),
    )

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        super().__init__(options)
        self._model: Any = None
        self._outputs: list[str] = []
        self._build_dir = ""
        self._cache: str | None = None
        self._groqit: Any = None
        self._kwargs: dict[str, Any] = {}
        self._path = ""

    @classmethod
    def availability(cls) -> Availability:
        missing = missing_parts()
        if missing:
            return Availability.missing("; ".join(missing))

        try:
            return Availability.ok(metadata.version("groqflow"))
        except metadata.PackageNotFoundError:
            return Availability.ok("unknown")

    def _groqit_kwargs(self, build_name: str, cache_dir: str) -> dict[str, Any]:
        kw: dict[str, Any] = {
            "build_name": build_name,
            "cache_dir": cache_dir,
            "monitor": False,
            "rebuild": "always",
        }
        if self.options["compiler_flags"]:
            kw["compiler_flags"] = self.options["compiler_flags"].split()
        if self.options["assembler_flags"]:
            kw["assembler_flags"] = self.options["assembler_flags"].split()
        if self.options["num_chips"]:
            kw["num_chips"] = int(self.options["num_chips"])
        if self.options["precision"] == "fp32":
            kw["sequence"] = _fp32_sequence()
        return kw

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        from groqflow import groqit  # optional: GroqFlow, in its own interpreter

        missing = [tensor for tensor in tensors if tensor not in model.outputs]
        if missing:
            # the worker has no onnx to expose them: xbackend stages the model in its own process
            raise RunnerFailedError(
                f"groq: {len(missing)} requested tensors are not graph outputs of the model it was given"
            )
        self._outputs = [output for output in model.outputs if output in set(tensors)]
        self._cache = tempfile.mkdtemp(prefix="xbackend-groq-")  # a fresh build every time
        build_name = "xbackend_" + hashlib.sha256(model.path.encode()).hexdigest()[:12]
        self._groqit = groqit
        self._kwargs = self._groqit_kwargs(build_name, self._cache)
        self._build_dir = os.path.join(self._cache, build_name)
        self._path = model.path
        return BuildFingerprint.from_items(self.name, sorted(self.info().items()))

    def _build(self, feeds: Mapping[str, Any]) -> None:
        """groqit() compiles for the static shapes of its example inputs: the first run's feeds."""
        try:
            self._model = self._groqit(self._path, dict(feeds), **self._kwargs)
        except Exception as error:
            raise RunnerFailedError(f"groqit() failed: {type(error).__name__}: {error}") from error
        items = build_items(self._build_dir)
        if not items:
            raise RunnerFailedError(f"groqit() left no build files in {self._build_dir}")
        self._fingerprint = BuildFingerprint.from_items(
            self.name, [*items, *(("option " + key, value) for key, value in sorted(self.info().items()))]
        )

    def run_impl(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        if self._model is None:
            self._build(feeds)
        try:
            out = self._model.run(dict(feeds))
        except Exception as error:
            raise RunnerFailedError(f"GroqModel.run() failed: {type(error).__name__}: {error}") from error
        names = list(getattr(self._model.state, "expected_output_names", None) or self._outputs)
        if isinstance(out, dict):
            values = dict(out)
        elif isinstance(out, (tuple, list)):
            values = dict(zip(names, out))
        else:
            values = {names[0]: out}
        return {key: np.asarray(value) for key, value in values.items()}

    def info(self) -> dict[str, str]:
        out = super().info()
        out["precision"] = self.options["precision"] + (
            " (GroqFlow's default: ConvertOnnxToFp16)"
            if self.options["precision"] == "fp16"
            else " (no fp16 conversion)"
        )
        out["compiler_flags"] = self.options["compiler_flags"] or "GroqFlow's defaults"
        out["num_chips"] = str(self.options["num_chips"] or "groqit decides")
        state = getattr(self._model, "state", None)
        if state is not None:
            used = getattr(state, "num_chips_used", None)
            if used is not None:
                out["num_chips_used"] = str(used)
            command = getattr(getattr(state, "info", None), "compiler_command", None)
            if command:
                out["compiler_command"] = (
                    " ".join(command) if isinstance(command, (list, tuple)) else str(command)
                )
        return dict(sorted(out.items()))

    def close(self) -> None:
        self._model = None
        if self._cache:
            shutil.rmtree(self._cache, ignore_errors=True)
            self._cache = None
