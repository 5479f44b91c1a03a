"""llama.cpp's converter, through xbackend's launcher (or, with --plain, without it), on a
planted Hugging Face folder for every family whose conversion asks transformers for
`trust_remote_code=True`: each folder's tokenizer_config.json maps AutoTokenizer and AutoConfig to
a module of the folder that writes a marker when imported. Run as a script of its own (the
launcher's patches last for the process); prints {family: {"rc": ..., "ran": bool}} as JSON.

argv: LAUNCHER CONVERTER_DIR WORK_FOLDER [--plain]
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import re
import runpy
import sys
from pathlib import Path
from typing import Any

launcher, converter, work = map(Path, sys.argv[1:4])
plain = "--plain" in sys.argv[4:]
spec = importlib.util.spec_from_file_location("gguf_launch", launcher)
assert spec is not None and spec.loader is not None
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
helpers = ("_set_vocab_qwen", "_set_vocab_hybriddna", "_set_vocab_interns1")  # base's, which trust
archs: list[str] = []
for f in sorted((converter / "conversion").glob("*.py")):
    text = f.read_text("utf-8")
    for block in re.split(r"\n(?=(?:@ModelBase\.register\())", text):
        names = re.findall(r"@ModelBase\.register\(([^)]*)\)", block.split("\nclass ", 1)[0])
        body = block.split("\nclass ", 1)[-1].split("\n@", 1)[0]
        if "trust_remote_code=True" in body or any(h + "(" in body for h in helpers):
            for group in names:
                archs += re.findall(r'"([A-Za-z0-9_]+)"', group)


def plain_main(argv: list[str]) -> Any:
    """The converter as llama.cpp ships it, for the control run."""
    sys.path[:0] = [str(converter / "gguf-py"), str(converter)]
    sys.argv = [str(converter / "convert_hf_to_gguf.py"), *argv[1:]]
    runpy.run_path(sys.argv[0], run_name="__main__")
    return 0


results = {}
for arch in sorted(set(archs)) if not plain else ["QWenLMHeadModel", "ChatGLMModel"]:
    folder = work / arch
    folder.mkdir(parents=True, exist_ok=True)
    marker = work / f"{arch}.MARKER"
    cfg = {
        "architectures": [arch],
        "vocab_size": 64,
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-6,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8,
        "kv_lora_rank": 16,
        "v_head_dim": 8,
        "moe_intermediate_size": 32,
        "partial_rotary_factor": 0.5,
        "n_groups": 1,
        "layer_norm_eps": 1e-5,
        "num_shared_experts": 1,
        "num_experts": 2,
        "num_experts_per_tok": 1,
        "n_routed_experts": 2,
        "linear_attn_config": {
            "kda_layers": [],
            "full_attn_layers": [1],
            "short_conv_kernel_size": 4,
            "head_dim": 16,
            "num_heads": 2,
        },
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    auto = {
        "AutoTokenizer": ["tokenization_planted.Planted", None],
        "AutoConfig": "configuration_planted.Planted",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps({"auto_map": auto}))
    code = f"open({str(marker)!r}, 'w').write('ran')\n"
    (folder / "tokenization_planted.py").write_text(code)
    (folder / "configuration_planted.py").write_text(code)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            argv = [str(converter), str(folder), "--vocab-only", "--outfile", str(work / f"{arch}.gguf")]
            rc = plain_main(argv) if plain else mod.main(argv)
    except BaseException as e:
        rc = f"{type(e).__name__}: {str(e)[:80]}"
    results[arch] = {"rc": rc, "ran": marker.exists()}
print(json.dumps(results))
