"""optimum's Llama export (tests/optimum/llama.onnx) with its GGUF file beside it: the Hugging Face
model holding the ONNX file's weights (tests/optimum/optimum_torch.py), a sentencepiece tokenizer
trained on a few lines (the converter needs one; the ids are what is compared), and llama.cpp's
own converter (xbackend.export.gguf)."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

from tests.optimum import optimum_torch
from tests.trained_lm import trained
from xbackend.export.gguf import write_gguf

HERE = Path(__file__).resolve().parent / "optimum"


def hf_folder(family: str, dest: Path, trained_steps: int = 0) -> Path:
    """The Hugging Face folder of tests/optimum/FAMILY.onnx's model, with a tokenizer; trained
    `trained_steps` steps (tests/trained_lm.py), its ONNX file then written beside as
    FAMILY.onnx."""
    dest.mkdir(parents=True, exist_ok=True)
    if trained_steps:
        trained(family, dest.parent / f"{family}.onnx", steps=trained_steps, hf=dest)
    else:
        getattr(optimum_torch, family)().model.save_pretrained(dest, safe_serialization=True)
    return with_tokenizer(dest)


def with_tokenizer(dest: Path) -> Path:
    """A sentencepiece tokenizer in Hugging Face folder `dest` (llama.cpp's converter reads one)."""
    import sentencepiece as spm

    text = ["".join(chr(32 + (i * 7 + k) % 90) for i in range(100)) for k in range(200)]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text), model_writer=buf, vocab_size=120, model_type="bpe",
        character_coverage=1.0, hard_vocab_limit=False, minloglevel=2,
    )  # fmt: skip
    (dest / "tokenizer.model").write_bytes(buf.getvalue())
    return dest


def with_gguf(family: str, folder: Path, kinds: tuple[str, ...] = ("f32",), trained_steps: int = 0) -> Path:
    """FAMILY.onnx in `folder` (a copy, or trained `trained_steps` steps) with FAMILY.gguf (the
    first kind) beside it, and FAMILY-KIND.gguf for each kind; the ONNX file's path."""
    onnx_path = folder / f"{family}.onnx"
    if not trained_steps:
        shutil.copy(HERE / f"{family}.onnx", onnx_path)
    hf = hf_folder(family, folder / "hf", trained_steps)
    for k, kind in enumerate(kinds):
        write_gguf(hf, folder / f"{family}-{kind}.gguf", kind)
        if k == 0:
            shutil.copy(folder / f"{family}-{kind}.gguf", folder / f"{family}.gguf")
    return onnx_path


def dynamo_llama(folder: Path) -> Path:
    """tests/hf_models.py's llama_lm exported by `xbackend export torch` (torch.onnx's dynamo
    exporter: nodes named node_linear_3, the module path in their metadata, the logits output
    named by the exporter), with the GGUF of the same weights beside it; the ONNX file's path."""
    import importlib.util

    from xbackend.export.example_inputs import InputDecl
    from xbackend.export.torch_onnx import export_torch

    shutil.copy(Path(__file__).resolve().parent / "hf_models.py", folder / "hf_models.py")
    spec = importlib.util.spec_from_file_location("hf_models_gguf", folder / "hf_models.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.llama_lm().model.save_pretrained(folder / "hf", safe_serialization=True)
    with_tokenizer(folder / "hf")
    path = folder / "llama_lm.onnx"
    decls = [InputDecl("input_ids", (1, 12), "int64")]
    export_torch(f"{folder / 'hf_models.py'}:llama_lm", decls, path, ranges={"input_ids": (0, 512)})
    write_gguf(folder / "hf", folder / "llama_lm.gguf", "f32")
    return path
