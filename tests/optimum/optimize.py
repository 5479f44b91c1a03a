"""The optimum exports beside this file as ONNX Runtime's transformer optimizer rewrites them
(what `optimum-cli export onnx --optimize O2` ships): FAMILY-opt.onnx for BERT (EmbedLayerNormalization,
Attention), Llama (RotaryEmbedding, SimplifiedLayerNormalization in the ONNX domain) and the T5
encoder (RelativePositionBias, Attention with a bias). The rotary fusion writes cos/sin caches of
131072 positions; they are cut to the config's 128 (the same rows), to keep the file small.
It runs in xbackend's own environment:

    .venv/bin/python tests/optimum/optimize.py tests/optimum
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from onnx import numpy_helper
from onnxruntime.transformers import optimizer

# family: (the optimizer's model type, heads, hidden size)
FAMILIES = {"bert": ("bert", 4, 64), "llama": ("gpt2", 4, 64), "t5-encoder": ("t5", 4, 64)}


def main(folder: Path) -> None:
    for family, (kind, heads, hidden) in FAMILIES.items():
        m = optimizer.optimize_model(
            str(folder / f"{family}.onnx"), model_type=kind, num_heads=heads, hidden_size=hidden, opt_level=0
        )
        for t in m.model.graph.initializer:
            if t.name in ("cos_cache", "sin_cache") and t.dims[0] > 128:
                t.CopyFrom(
                    numpy_helper.from_array(np.ascontiguousarray(numpy_helper.to_array(t)[:128]), t.name)
                )
        m.save_model_to_file(str(folder / f"{family}-opt.onnx"))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
