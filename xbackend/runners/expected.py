"""Golden outputs as a backend: the output_N.pb files that came with --inputs DIR.

Nothing runs: the worker hands back the stored outputs, so every backend is
compared with them exactly as with any other backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from xbackend.errors import UsageError
from xbackend.files.modelref import ModelRef
from xbackend.files.storage import ValueFile
from xbackend.numerics.values import Value, value_sha256
from xbackend.runners.base import Availability, BuildFingerprint, OptionSpec, Runner

__all__ = ["ExpectedRunner"]


class ExpectedRunner(Runner):
    name = "expected"
    description = "the expected outputs (output_N.pb) that came with --inputs DIR; added automatically"
    instrumentation_changes_engine = False
    executes_graph = False
    option_specs = (
        OptionSpec("file", str, "", "value file holding the expected outputs (set by xbackend)", path=True),
    )

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        super().__init__(options)
        self._values: dict[str, Value] = {}

    @classmethod
    def availability(cls) -> Availability:
        return Availability.ok()

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        if not self.options["file"]:
            raise UsageError("expected needs --inputs DIR with output_N.pb files")
        with ValueFile(self.options["file"]) as f:
            self._values = {tensor: f[tensor] for tensor in tensors if tensor in f}
        return BuildFingerprint.from_items(self.name, [("outputs", value_sha256(self._values))])

    def run_impl(self, feeds: Mapping[str, Value]) -> Mapping[str, Any]:
        return dict(self._values)

    def not_exposed(self) -> dict[str, str]:
        return {
            tensor: "golden outputs hold graph outputs only"
            for tensor in self._tensors
            if tensor not in self._values
        }

    def info(self) -> dict[str, str]:
        return {"source": "output_N.pb beside --inputs"}
