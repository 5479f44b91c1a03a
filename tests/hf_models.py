"""Tiny random-init transformers models (BERT, GPT-2, Llama, ViT, ConvNeXt, Mamba, T5, ...) from
their configs, as the README's recipe builds them: factories for `xbackend export torch` and
`--torch-module`."""

from __future__ import annotations

from typing import Any

import torch
import transformers


class LastHidden(torch.nn.Module):
    """A transformers model's last hidden state as one plain tensor (no cache, no output dict)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any = None) -> Any:
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **extra)
        return out.last_hidden_state


def bert() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
    )
    return LastHidden(transformers.AutoModel.from_config(cfg)).eval()


def gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0
    )
    return LastHidden(transformers.AutoModel.from_config(cfg)).eval()


def gpt2_long() -> torch.nn.Module:
    """GPT-2 small's shape of block at width 64, with 1024 positions (long-sequence runs)."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=1024, bos_token_id=0, eos_token_id=0
    )
    cfg._attn_implementation = "eager"
    return LastHidden(transformers.AutoModel.from_config(cfg)).eval()


class UNetNoise(torch.nn.Module):
    """A diffusers UNet's predicted noise as one plain tensor."""

    def __init__(self, unet: Any) -> None:
        super().__init__()
        self.unet = unet

    def forward(self, sample: Any, timestep: Any, encoder_hidden_states: Any) -> Any:
        return self.unet(sample, timestep, encoder_hidden_states=encoder_hidden_states, return_dict=False)[0]


def unet() -> torch.nn.Module:
    """diffusers' UNet2DConditionModel, random init: 2 blocks (one with cross-attention), 8x8 latents."""
    import diffusers

    torch.manual_seed(0)
    model = diffusers.UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        layers_per_block=1,
        block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=8,
        norm_num_groups=8,
    )
    return UNetNoise(model).eval()


def llama() -> torch.nn.Module:
    """A Llama-style decoder (rotary embeddings, RMSNorm, SwiGLU), 2 layers of width 64."""
    torch.manual_seed(0)
    cfg = _llama_config(attn_implementation="eager")
    return LastHidden(transformers.AutoModel.from_config(cfg)).eval()


def _llama_config(**more: Any) -> Any:
    return transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        **more,
    )


def llama_lm() -> torch.nn.Module:
    """The same Llama with its head (SDPA attention, as transformers picks by default), untied."""
    torch.manual_seed(0)
    return Tokens(
        transformers.LlamaForCausalLM(_llama_config(tie_word_embeddings=False)), out="logits"
    ).eval()


class WhisperEncoder(torch.nn.Module):
    """A Whisper-style audio encoder (two convolutions, sinusoidal positions, pre-norm blocks)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_features: Any) -> Any:
        return self.model(input_features).last_hidden_state


def whisper() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.WhisperConfig(
        num_mel_bins=16,
        d_model=64,
        encoder_layers=2,
        encoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_layers=1,
        decoder_attention_heads=4,
        decoder_ffn_dim=128,
        max_source_positions=32,
        attn_implementation="eager",
    )
    return WhisperEncoder(transformers.WhisperModel(cfg).get_encoder()).eval()


class Pixels(torch.nn.Module):
    """A vision model's `out` (its last hidden state, or a classifier's logits) from pixel values."""

    def __init__(self, model: Any, out: str = "last_hidden_state") -> None:
        super().__init__()
        self.model = model
        self.out = out

    def forward(self, pixel_values: Any) -> Any:
        return getattr(self.model(pixel_values=pixel_values), self.out)


def vit() -> torch.nn.Module:
    """A ViT of 2 layers, width 64, 8x8 patches of a 32x32 image."""
    torch.manual_seed(0)
    cfg = transformers.ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
    )
    return Pixels(transformers.ViTModel(cfg)).eval()


def resnet() -> torch.nn.Module:
    """A ResNet of basic blocks (ResNet-18's kind), one per stage, narrow: ONNX Runtime runs its
    convolutions as one NCHWc stack, as it does ResNet-18's."""
    torch.manual_seed(0)
    cfg = transformers.ResNetConfig(
        layer_type="basic",
        depths=[1, 1, 1, 1],
        hidden_sizes=[16, 32, 64, 128],
        embedding_size=16,
        num_labels=10,
    )
    return Pixels(transformers.ResNetForImageClassification(cfg), out="logits").eval()


def convnext() -> torch.nn.Module:
    """A ConvNeXt of 2 stages; its layer scale at 1 (trained models' are far from the 1e-6 it
    starts at, which would absorb any loss before it)."""
    torch.manual_seed(0)
    cfg = transformers.ConvNextConfig(
        num_channels=3,
        num_stages=2,
        hidden_sizes=[16, 32],
        depths=[1, 1],
        image_size=32,
        layer_scale_init_value=1.0,
    )
    return Pixels(transformers.ConvNextModel(cfg)).eval()


class Tokens(torch.nn.Module):
    """A model's `out` from token ids alone, no cache (its last hidden state, or a causal LM's
    logits: as `xbackend export torch` writes a decoder for llama.cpp to run beside it)."""

    def __init__(self, model: Any, out: str = "last_hidden_state") -> None:
        super().__init__()
        self.model = model
        self.out = out

    def forward(self, input_ids: Any) -> Any:
        return getattr(self.model(input_ids=input_ids, use_cache=False), self.out)


def mamba() -> torch.nn.Module:
    """A Mamba (selective state space) of 2 layers, width 64, state 8, its sequential scan."""
    torch.manual_seed(0)
    cfg = transformers.MambaConfig(
        vocab_size=512, hidden_size=64, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4
    )
    return Tokens(transformers.MambaModel(cfg)).eval()


class T5Encoder(torch.nn.Module):
    """T5's encoder (relative position buckets, RMS norms) with its attention mask."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Any, attention_mask: Any) -> Any:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def t5() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.T5Config(
        vocab_size=512,
        d_model=64,
        d_kv=16,
        d_ff=128,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
    )
    return T5Encoder(transformers.T5EncoderModel(cfg)).eval()
