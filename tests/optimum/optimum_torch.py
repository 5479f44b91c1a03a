"""The optimum exports beside this file as torch modules for xbackend's torch backend, one
factory per family (`--torch-module tests/optimum/optimum_torch.py:gpt2`): each builds the
Hugging Face model from the config export.py exported, puts the ONNX file's own weights in it,
and wraps it to take the ONNX model's inputs positionally, in its input order, and return its
outputs in its order. docs/recipes.md shows the Llama one in full (llama_torch.py).

Weights are found by name: an initializer named as a parameter is that parameter (transposed
where its shape says so); otherwise the node that reads it names the module by its scope
(/model/layers.0/self_attn/q_proj/MatMul holds model.layers.0.self_attn.q_proj.weight,
transposed). Identical tensors the exporter kept once (random init's zero biases, unit norms)
are already the model's.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import onnx
import torch
import transformers as tf
from onnx import numpy_helper

HERE = Path(__file__).resolve().parent


def _configs() -> Any:
    spec = importlib.util.spec_from_file_location("optimum_export", HERE / "export.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# transformers 5 renamed ViT's modules; the export (transformers 4.57) scopes them the old way
VIT_RENAMES = (
    ("encoder.layer.", "layers."),
    ("attention.attention.query", "attention.q_proj"),
    ("attention.attention.key", "attention.k_proj"),
    ("attention.attention.value", "attention.v_proj"),
    ("attention.output.dense", "attention.o_proj"),
    ("intermediate.dense", "mlp.fc1"),
    ("output.dense", "mlp.fc2"),
)


def _renamed(scope: str, renames: tuple[tuple[str, str], ...]) -> str:
    for old, new in renames:
        scope = scope.replace(old, new)
    return scope


def onnx_weights(model: torch.nn.Module, path: Path, renames: tuple[tuple[str, str], ...] = ()) -> int:
    """The ONNX file's float weights put in `model` (`renames`: exported scope -> module name
    parts); how many parameters were set."""
    proto = onnx.load(path)
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    params = dict(model.named_parameters())
    done: set[str] = set()

    def put(name: str, value: Any) -> None:
        p = params[name]
        if (
            tuple(value.shape) != tuple(p.shape)
            and value.ndim == 2
            and tuple(value.T.shape) == tuple(p.shape)
        ):
            value = value.T
        if tuple(value.shape) == tuple(p.shape) and name not in done:
            with torch.no_grad():
                p.copy_(torch.from_numpy(value.copy()))
            done.add(name)

    for name, value in inits.items():
        if _renamed(name, renames) in params:
            put(_renamed(name, renames), value)
    for node in proto.graph.node:
        scope = _renamed(node.name.rsplit("/", 1)[0].strip("/").replace("/", "."), renames)
        kind = {"MatMul": "weight", "Gemm": "weight", "Conv": "weight", "Gather": "weight", "Mul": "weight",
                "Add": "bias"}.get(node.op_type)  # fmt: skip
        for i in node.input:
            # a Linear's weight is read by MatMul transposed
            if kind and i in inits and _renamed(i, renames) not in params and f"{scope}.{kind}" in params:
                put(f"{scope}.{kind}", inits[i].T if node.op_type == "MatMul" else inits[i])
    return len(done)


class ByName(torch.nn.Module):
    """A model called with the ONNX model's inputs positionally, read back by their names."""

    def __init__(self, model: tf.PreTrainedModel, names: list[str]) -> None:
        super().__init__()
        self.model = model
        self.names = names

    def given(self, args: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
        return dict(zip(self.names, args, strict=True))


class CausalLM(ByName):
    """forward(*inputs) in the ONNX model's input order: ids, mask, positions and each layer's
    past key and value, by name; returns logits, then each layer's present key and value."""

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        given = self.given(args)
        cache = tf.DynamicCache()
        for layer in range(sum(1 for n in given if n.endswith(".key"))):
            cache.update(
                given[f"past_key_values.{layer}.key"], given[f"past_key_values.{layer}.value"], layer
            )
        out = self.model(
            input_ids=given["input_ids"],
            attention_mask=given.get("attention_mask"),
            position_ids=given.get("position_ids"),
            past_key_values=cache,
            use_cache=True,
        )
        presents = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
        return (out.logits, *presents)


class FirstOutput(ByName):
    """forward(*inputs) by the ONNX input names; returns the model's first output."""

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.model(**self.given(args))[0]


class Seq2SeqDecoder(ByName):
    """optimum's decoder with past: forward(*inputs) by name, each layer's self-attention past
    (decoder) and cross-attention keys and values (encoder, already computed); returns logits
    and each layer's present self-attention key and value."""

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        given = self.given(args)
        mine, cross = tf.DynamicCache(), tf.DynamicCache()
        layers = sum(1 for n in given if n.endswith(".decoder.key"))
        for k in range(layers):
            mine.update(
                given[f"past_key_values.{k}.decoder.key"], given[f"past_key_values.{k}.decoder.value"], k
            )
            cross.update(
                given[f"past_key_values.{k}.encoder.key"], given[f"past_key_values.{k}.encoder.value"], k
            )
        cache = tf.EncoderDecoderCache(mine, cross)
        for k in range(layers):  # the cross keys and values are given: never recomputed
            cache.is_updated[k] = True
        ids = given["input_ids"]
        frames = given["past_key_values.0.encoder.key"].shape[2]
        encoded = torch.zeros(ids.shape[0], frames, self.model.config.d_model)  # read only for its shape
        out = self.model(
            decoder_input_ids=ids,
            encoder_outputs=(encoded,),
            attention_mask=given.get("encoder_attention_mask"),
            past_key_values=cache,
            use_cache=True,
        )
        presents = [
            t for layer in out.past_key_values.self_attention_cache.layers for t in (layer.keys, layer.values)
        ]
        return (out.logits, *presents)


def _build(
    family: str, wrapper: type[ByName], renames: tuple[tuple[str, str], ...] = (), file: str = ""
) -> torch.nn.Module:
    """`family`'s model (or, with `file` FAMILY-encoder, its encoder) with `file`'s weights."""
    model = getattr(_configs(), family)().eval()
    model.config._attn_implementation = "eager"
    if file.endswith("-encoder"):
        model = model.get_encoder()
    path = HERE / f"{file or family}.onnx"
    onnx_weights(model, path, renames)
    names = [i.name for i in onnx.load(path, load_external_data=False).graph.input]
    return wrapper(model, names).eval()


def llama() -> torch.nn.Module:
    return _build("llama", CausalLM)


def qwen2() -> torch.nn.Module:
    return _build("qwen2", CausalLM)


def gpt2() -> torch.nn.Module:
    return _build("gpt2", CausalLM)


def bert() -> torch.nn.Module:
    return _build("bert", FirstOutput)


def vit() -> torch.nn.Module:
    return _build("vit", FirstOutput, VIT_RENAMES)


def t5_encoder() -> torch.nn.Module:
    return _build("t5", FirstOutput, file="t5-encoder")


def whisper_encoder() -> torch.nn.Module:
    return _build("whisper", FirstOutput, file="whisper-encoder")


def t5_decoder_past() -> torch.nn.Module:
    return _build("t5", Seq2SeqDecoder, file="t5-decoder-past")


def whisper_decoder_past() -> torch.nn.Module:
    return _build("whisper", Seq2SeqDecoder, file="whisper-decoder-past")
