"""The optimum exports beside this file: random-init models from configs (seed 0), exported by
optimum's ONNX exporter as users export Hugging Face models. optimum-onnx pins an older
transformers (4.57) than xbackend's, so it runs in an environment of its own (docs/recipes.md):

    python3 -m venv /tmp/optimum-env
    /tmp/optimum-env/bin/pip install torch==2.13.0 optimum-onnx==0.1.0 onnxruntime==1.31.1
    /tmp/optimum-env/bin/python tests/optimum/export.py tests/optimum

Each family's files are written to FOLDER as FAMILY.onnx (decoders with a KV cache unless the
name says nocache; T5 and Whisper as their encoder and their decoder with past).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import transformers as tf

SMALL = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "vocab_size": 256,
}


def llama() -> tf.PreTrainedModel:
    return tf.LlamaForCausalLM(tf.LlamaConfig(**SMALL, num_key_value_heads=2, max_position_embeddings=128))


def qwen2() -> tf.PreTrainedModel:
    return tf.Qwen2ForCausalLM(tf.Qwen2Config(**SMALL, num_key_value_heads=2, max_position_embeddings=128))


def gpt2() -> tf.PreTrainedModel:
    return tf.GPT2LMHeadModel(tf.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=128))


def bert() -> tf.PreTrainedModel:
    return tf.BertModel(tf.BertConfig(**SMALL, max_position_embeddings=128))


def vit() -> tf.PreTrainedModel:
    cfg = tf.ViTConfig(**{**SMALL, "vocab_size": 0}, image_size=32, patch_size=8, num_labels=10)
    return tf.ViTForImageClassification(cfg)


def t5() -> tf.PreTrainedModel:
    cfg = tf.T5Config(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4)
    return tf.T5ForConditionalGeneration(cfg)


def whisper() -> tf.PreTrainedModel:
    cfg = tf.WhisperConfig(
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        vocab_size=256,
        pad_token_id=1,
        bos_token_id=2,
        eos_token_id=3,
        decoder_start_token_id=2,
        num_mel_bins=16,
        max_source_positions=1500,  # optimum's example features are 3000 frames
        max_target_positions=64,
    )
    return tf.WhisperForConditionalGeneration(cfg)


CAUSAL = "text-generation-with-past"
# name -> (model, optimum task, {file optimum writes: its name here})
FAMILIES: dict[str, tuple[Callable[[], tf.PreTrainedModel], str, dict[str, str]]] = {
    "llama": (llama, CAUSAL, {"model.onnx": "llama.onnx"}),
    "llama-nocache": (llama, "text-generation", {"model.onnx": "llama-nocache.onnx"}),
    "qwen2": (qwen2, CAUSAL, {"model.onnx": "qwen2.onnx"}),
    "gpt2": (gpt2, CAUSAL, {"model.onnx": "gpt2.onnx"}),
    "bert": (bert, "feature-extraction", {"model.onnx": "bert.onnx"}),
    "vit": (vit, "image-classification", {"model.onnx": "vit.onnx"}),
    "t5": (
        t5,
        "text2text-generation-with-past",
        {"encoder_model.onnx": "t5-encoder.onnx", "decoder_with_past_model.onnx": "t5-decoder-past.onnx"},
    ),
    "whisper": (
        whisper,
        "automatic-speech-recognition-with-past",
        {
            "encoder_model.onnx": "whisper-encoder.onnx",
            "decoder_with_past_model.onnx": "whisper-decoder-past.onnx",
        },
    ),
}


def main(folder: Path) -> None:
    optimum = Path(sys.executable).with_name("optimum-cli")
    for name, (build, task, files) in FAMILIES.items():
        with tempfile.TemporaryDirectory() as tmp:
            torch.manual_seed(0)
            build().eval().save_pretrained(f"{tmp}/src")
            command = [str(optimum), "export", "onnx", "--model", f"{tmp}/src", "--task", task, f"{tmp}/out"]
            subprocess.run(command, check=True, capture_output=True)
            for written, mine in files.items():
                shutil.copyfile(f"{tmp}/out/{written}", folder / mine)
                print(f"{name}: {folder / mine}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
