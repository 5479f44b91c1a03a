"""Runs llama.cpp's convert_hf_to_gguf.py so that no code from the model folder can run.

Started by xbackend.export.gguf as a script of its own (no xbackend import), in a process whose
HOME, caches and TMPDIR lie in xbackend's run folder. The converter asks transformers to trust a
folder's own code in the conversions of 41 architecture names; here transformers never grants it: a
tokenizer or config that needs a class from the folder stops the run, naming the file, before
that class is imported, and torch.load reads tensors alone (weights_only).

argv: CONVERTER_DIR HF_FOLDER then the converter's own arguments.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from typing import Any

REMOTE_CODE_EXIT = 17  # the folder needs code of its own: the last stderr line names the file


class RemoteCodeRefused(Exception):
    pass


def _names_code(folder: str) -> str:
    """The first JSON file of the folder that maps a class to its own code (auto_map)."""
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as handle:
                data = json.loads(handle.read(1 << 22))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("auto_map"):
            return f"{name} (auto_map: {json.dumps(data['auto_map'])[:120]})"
    return "its own Python code"


def _refuse(folder: str) -> Any:
    def refused(*_args: Any, **_kwargs: Any) -> Any:
        raise RemoteCodeRefused(_names_code(folder))

    return refused


def _close_transformers(folder: str) -> None:
    import transformers.dynamic_module_utils as dynamic  # transformers: the converter's, in its process

    def resolve(trust_remote_code: Any, model_name: Any, has_local_code: bool, has_remote_code: bool,
                *_args: Any, **_kwargs: Any) -> bool:  # fmt: skip
        if has_remote_code and not has_local_code:
            raise RemoteCodeRefused(_names_code(folder))
        return False  # transformers' own class, never the folder's

    dynamic.resolve_trust_remote_code = resolve
    dynamic.get_class_from_dynamic_module = _refuse(folder)
    dynamic.get_cached_module_file = _refuse(folder)
    for module in list(sys.modules.values()):  # the names the auto classes imported
        if getattr(module, "__name__", "").startswith("transformers.") and module is not dynamic:
            for attr in ("resolve_trust_remote_code", "get_class_from_dynamic_module"):
                if hasattr(module, attr):
                    setattr(module, attr, resolve if attr == "resolve_trust_remote_code" else _refuse(folder))


def _tensors_only() -> None:
    try:
        import torch  # torch: the converter's, in its process
    except ImportError:
        return
    real = torch.load

    def load(*args: Any, **kwargs: Any) -> Any:
        kwargs["weights_only"] = True  # a pickle's objects are code
        return real(*args, **kwargs)

    torch.load = load


def main(argv: list[str]) -> int:
    """Run llama.cpp's converter (`argv`: its folder, the HF folder, its arguments) with remote code refused;
    its exit code."""
    converter, folder, *rest = argv
    sys.path[:0] = [os.path.join(converter, "gguf-py"), converter]
    try:
        import transformers.models.auto.configuration_auto  # transformers: the converter's auto classes
        import transformers.models.auto.tokenization_auto  # noqa: F401  # transformers: likewise
    except ImportError:
        pass
    else:
        _close_transformers(folder)
    _tensors_only()
    sys.argv = [os.path.join(converter, "convert_hf_to_gguf.py"), folder, *rest]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except RemoteCodeRefused as error:
        print(f"the folder needs code of its own to load: {error}", file=sys.stderr)
        return REMOTE_CODE_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
