"""groqit() and GroqModel with GroqFlow's signatures, computing with onnxruntime."""

import hashlib
import os
import shutil
import time
from types import SimpleNamespace

import numpy as np
import onnxflow.justbuildit.export as of_export
import onnxruntime as ort
from onnxflow.justbuildit.stage import Sequence

from groqflow.justgroqit import compile as gf_compile
from groqflow.justgroqit import export as gf_export

DEFAULT_CACHE_DIR = os.path.expanduser("~/.cache/groqflow")
DEFAULT_COMPILER_FLAGS = ["--large-program"]
_DEFAULT_ONNX_SEQUENCE = Sequence(
    "default_onnx_sequence",
    "Building ONNX Model",
    [
        of_export.OnnxLoad(),
        gf_export.CheckOnnxCompatibility(),
        of_export.ConvertOnnxToFp16(),
        gf_compile.CompileOnnx(),
        gf_compile.Assemble(),
    ],
)


class GroqModel:
    def __init__(self, state, session, fp16):
        self.state = state
        self._session = session
        self._fp16 = fp16

    def run(self, inputs):
        if not isinstance(inputs, dict):
            raise TypeError("GroqModel.run() inputs must be a dictionary")
        for name, shape in self.state.expected_input_shapes.items():
            if tuple(np.shape(inputs[name])) != shape:
                raise ValueError(
                    f"input {name} has shape {np.shape(inputs[name])}; the model was built for {shape}"
                )
        outs = self._session.run(list(self.state.expected_output_names), dict(inputs))
        if self._fp16:
            outs = [o.astype(np.float16).astype(o.dtype) if o.dtype == np.float32 else o for o in outs]
        return outs[0] if len(outs) == 1 else tuple(outs)


def groqit(
    model=None,
    inputs=None,
    build_name=None,
    cache_dir=DEFAULT_CACHE_DIR,
    monitor=True,
    rebuild=None,
    compiler_flags=None,
    assembler_flags=None,
    num_chips=None,
    groqview=False,
    sequence=None,
    quantization_samples=None,
):
    if not (isinstance(model, str) and model.endswith(".onnx") and os.path.isfile(model)):
        raise ValueError("this stand-in takes the path of an ONNX file")
    sequence = sequence or _DEFAULT_ONNX_SEQUENCE
    fp16 = any(isinstance(s, of_export.ConvertOnnxToFp16) for s in sequence.stages)
    flags = list(compiler_flags) if compiler_flags is not None else list(DEFAULT_COMPILER_FLAGS)
    out_dir = os.path.join(cache_dir, build_name or "build")
    if rebuild == "always":
        shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(os.path.join(out_dir, "compile"), exist_ok=True)
    with open(model, "rb") as f:
        data = f.read()
    program = hashlib.sha256(data + repr((flags, assembler_flags, num_chips, fp16)).encode()).digest()
    with open(os.path.join(out_dir, "compile", "program.iop"), "wb") as f:
        f.write(program * 64)
    with open(os.path.join(out_dir, f"{build_name}_state.yaml"), "w") as f:
        f.write(f"build_time: {time.time()}\n")  # changes with every build, like GroqFlow's state
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    session = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    state = SimpleNamespace(
        cache_dir=cache_dir,
        config=SimpleNamespace(build_name=build_name, compiler_flags=flags),
        expected_output_names=[o.name for o in session.get_outputs()],
        expected_input_shapes={k: tuple(np.shape(v)) for k, v in (inputs or {}).items()},
        num_chips_used=num_chips or 1,
        info=SimpleNamespace(compiler_command=["groq-compiler", *flags]),
    )
    return GroqModel(state, session, fp16)
