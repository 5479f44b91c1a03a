"""A minimal xbackend runner plugin: onnxruntime, one thread, sequential execution."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from xbackend.runners.base import Availability, BuildFingerprint, Runner


class ExampleOrtRunner(Runner):
    name = "example-ort"
    description = "onnxruntime on one thread (an example plugin)"
    promises: ClassVar[frozenset] = frozenset({"run-to-run"})  # checked on every comparison
    stages_model = True  # xbackend exposes the requested tensors as graph outputs before prepare

    @classmethod
    def availability(cls) -> Availability:
        try:
            import onnxruntime
        except ImportError:
            return Availability.missing("onnxruntime not installed (pip install onnxruntime)")
        return Availability.ok(onnxruntime.__version__)

    def prepare_impl(self, model: Any, tensors: tuple[str, ...]) -> BuildFingerprint:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        self.session = ort.InferenceSession(model.path, so, providers=["CPUExecutionProvider"])
        have = {o.name for o in self.session.get_outputs()}
        self.names: list[str] = [t for t in tensors if t in have]
        return BuildFingerprint.from_items(self.name, [("onnxruntime", ort.__version__)])

    def run_impl(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        return dict(zip(self.names, self.session.run(self.names, dict(feeds))))  # noqa: B905 (Python 3.8)

    def info(self) -> dict[str, str]:
        import onnxruntime

        return {**super().info(), "onnxruntime": onnxruntime.__version__, "threads": "1"}
