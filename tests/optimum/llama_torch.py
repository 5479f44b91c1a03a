"""optimum's Llama export (a KV cache) as a torch module for xbackend's torch backend.

xbackend calls the module with the ONNX model's inputs, positionally, in the model's input
order: input_ids, attention_mask, position_ids, then past_key_values.0.key,
past_key_values.0.value, past_key_values.1.key, ... It compares what the module returns, in
order, with the model's outputs: logits, present.0.key, present.0.value, ...

The weights are the ONNX file's own, put in the Hugging Face model by the scope each MatMul,
Gather and Mul node is named after (/model/layers.0/self_attn/q_proj/MatMul holds
model.layers.0.self_attn.q_proj.weight, transposed).
"""

from __future__ import annotations

from pathlib import Path

import onnx
import torch
import transformers as tf
from onnx import numpy_helper

HERE = Path(__file__).resolve().parent
CONFIG = tf.LlamaConfig(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    max_position_embeddings=128,
)


class KVCacheLlama(torch.nn.Module):
    """forward(input_ids, attention_mask, position_ids, *past): past as key, value per layer."""

    def __init__(self, model: tf.LlamaForCausalLM) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids, *past):
        cache = tf.DynamicCache()
        for layer in range(len(past) // 2):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
        )
        presents = []
        for layer in out.past_key_values.layers:
            presents += [layer.keys, layer.values]
        return (out.logits, *presents)


def _onnx_weights(model: torch.nn.Module, path: Path) -> None:
    proto = onnx.load(path)
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    params = dict(model.named_parameters())
    for node in proto.graph.node:
        held = next((i for i in node.input if i in inits), None)
        scope = node.name.rsplit("/", 1)[0].strip("/").replace("/", ".")
        if held is None or f"{scope}.weight" not in params:
            continue
        value = inits[held].T if node.op_type == "MatMul" else inits[held]
        with torch.no_grad():
            params[f"{scope}.weight"].copy_(torch.from_numpy(value.copy()))


def build() -> torch.nn.Module:
    model = tf.LlamaForCausalLM(CONFIG).eval()
    model.config._attn_implementation = "eager"
    _onnx_weights(model, HERE / "llama.onnx")
    return KVCacheLlama(model).eval()


def build_lossy() -> torch.nn.Module:
    """The same module with one known loss, for tests: layer 1's o_proj output rounded to
    bfloat16 (a relative 2^-9), as a kernel that writes its result in bfloat16 would."""
    module = build()
    proj = module.model.model.layers[1].self_attn.o_proj
    proj.register_forward_hook(lambda _m, _i, out: out.to(torch.bfloat16).to(out.dtype))
    return module
