"""llama.cpp, through llama-cpp-python: the GGUF file of the same model, fed the same token ids.

The ONNX model (an optimum or torch.onnx export of a causal LM) says what is fed and what comes
out; llama.cpp computes from the GGUF file beside it (`MODEL.gguf`, or the `gguf` option), so
it runs the same weights as its own graph. It hands back the logits of every position; with a
KV cache, it keeps its own between calls (a call whose past holds P tokens continues the P it
holds, a past of 0 starts again), and a decode step's `present.*` carry only the cache's length.
Per layer, the tensors of its graph (ggml's eval callback, by name: `attn_norm-0`, `l_out-1`)
are matched to the ONNX model's by layer and role (xbackend.runners.ggml_roles).

Its options are its determinism knobs: threads, the batch and micro-batch sizes, the KV cache's
type, flash attention, and whether the prompt is fed in batches or one token at a time.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.metadata
import importlib.util
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from xbackend.errors import BackendUnavailableError, InputError, ModelLoadError, RunnerFailedError, UsageError
from xbackend.files.capture_folder import file_sha256
from xbackend.files.gguf_header import claims_problem, read_header
from xbackend.files.modelref import ModelRef
from xbackend.files.untrusted import contained
from xbackend.host.environment import cpu_flags
from xbackend.numerics.values import Value
from xbackend.runners.base import RECOMPUTED, Availability, OptionSpec, Runner
from xbackend.runners.buildinfo import BuildFingerprint
from xbackend.runners.ggml_roles import UNINTERLEAVED, Matched, RoleMap, role_map, stage_of
from xbackend.runners.ort_cpu import physical_cores

__all__ = ["GGML_TYPES", "LlamaCppRunner", "gguf_beside"]

GGML_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 8, "bf16": 30}  # ggml_type values (ggml.h)
_NP = {0: np.float32, 1: np.float16}  # the tensor types the callback copies out
_FLASH = {"auto": -1, "off": 0, "on": 1}  # llama_flash_attn_type
_KEPT: list[Any] = []  # ctypes callbacks llama.cpp holds: alive as long as the process
_AUTO_CTX = 512  # tokens of a context made before the first feed is known (llama.cpp's own floor)
_BATCH_LIMIT = 1 << 16  # tokens per llama_decode call at most (llama_batch_init allocates them)
_KV_SHARE = 0.5  # of the memory free here, what a KV cache may take


class _Head(ctypes.Structure):
    """The leading fields of ggml's struct ggml_tensor (ggml.h), stable across its versions."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
    ]


def gguf_beside(model: str | Path) -> Path | None:
    """The GGUF file of an ONNX model: MODEL.gguf beside it, else the one .gguf in its folder;
    inside that folder, links included (one that leads out is an InputError, the same line
    whatever lies outside: nothing there is opened)."""
    path = Path(model)
    same = path.with_suffix(".gguf")
    names = (
        [same.name] if os.path.lexists(same) else sorted(found.name for found in path.parent.glob("*.gguf"))
    )
    if len(names) != 1:
        return None
    fix = "copy the GGUF file into the model's folder, or name it: --set llama.cpp.gguf=FILE"
    return contained(path.parent, names[0], f"the GGUF file {path.parent / names[0]} beside {path.name}", fix)


class LlamaCppRunner(Runner):
    name = "llama.cpp"
    description = "llama.cpp on CPU (llama-cpp-python): the model's GGUF file, fed the same token ids"
    # asking for a tensor cuts ggml's graph there: the plain build runs uncut
    instrumentation_changes_engine = True
    executes_graph = False  # its own graph, from the GGUF file
    weight_copies = 1.0  # the GGUF's weights, mapped
    option_specs: ClassVar[Sequence[OptionSpec]] = (
        OptionSpec(
            "gguf",
            str,
            "",
            "the GGUF file (default: MODEL.gguf beside the model, else the one .gguf there)",
            path=True,
        ),
        OptionSpec(
            "threads",
            int,
            physical_cores,
            "threads of every decode (its n_threads and n_threads_batch)",
            threads=True,
        ),
        OptionSpec(
            "n_batch", int, 512, "tokens per llama_decode call: a longer prompt is cut into such batches"
        ),
        OptionSpec("n_ubatch", int, 512, "tokens per micro-batch inside one llama_decode call"),
        OptionSpec("type_k", str, "f16", "the KV cache's type for keys", tuple(GGML_TYPES)),
        OptionSpec("type_v", str, "f16", "the KV cache's type for values", tuple(GGML_TYPES)),
        OptionSpec("flash_attn", str, "auto", "flash attention (auto: llama.cpp decides)", tuple(_FLASH)),
        OptionSpec(
            "feed",
            str,
            "batch",
            "the prompt in batches of n_batch tokens, or one token per decode",
            ("batch", "token"),
        ),
        OptionSpec(
            "n_ctx",
            int,
            0,
            f"context length in tokens (0: what the comparison feeds, at least {_AUTO_CTX}, grown as a "
            "decode needs; never the file's training context)",
        ),
        OptionSpec(
            "extra_buffers",
            bool,
            True,
            "llama.cpp's extra weight buffers (its default): quantized weights repacked for the CPU's "
            "own kernels (AMX, AVX-512 tiles); false: ggml's plain CPU kernels (llama.cpp's --no-repack)",
        ),
        OptionSpec(
            "kv_unified",
            bool,
            False,
            "several prompts (a batch of B): one KV cache for all B sequences, as a server's slots share "
            "one, rather than one per sequence",
        ),
    )

    @classmethod
    def crash_hint(cls, backend: str, options: Mapping[str, Any]) -> str:
        """On a CPU with AMX, its extra buffers run llama.cpp's AMX kernels, which crashed on
        quantized weights on such a CPU (docs/backends.md): the knob that keeps its plain kernels."""
        if not options.get("extra_buffers") or "amx_int8" not in cpu_flags():
            return ""
        return (
            "this CPU has AMX, whose llama.cpp kernels of quantized weights can crash: "
            f"--set {backend}.extra_buffers=false runs its plain CPU kernels"
        )

    def __init__(self, options: Mapping[str, str] | None = None) -> None:
        super().__init__(options)
        self._ll: Any = None
        self._g: Any = None
        self._logits = "logits"  # the model output that holds them
        self._cp: Any = None  # the context's parameters (a batch of several makes another)
        self._n_ctx = self._slots = 0
        self._multi = False  # decoding several sequences: no tensor inside is read
        self._model: Any = None
        self._ctx: Any = None
        self._batch: Any = None
        self._batch_size = 0
        self._vocab = 0
        self._pos = 0  # tokens its KV cache holds
        self._roles = RoleMap({}, {})
        self._want: dict[tuple[str, str], Matched] = {}
        # one llama_decode's tensors: a key per micro-batch (n_ubatch), in order
        self._chunk: dict[tuple[str, str], list[tuple[str, np.ndarray]]] = {}
        self._seen: dict[tuple[str, str], list[np.ndarray]] = {}
        self._ever: set[tuple[str, str]] = set()  # the wanted tensors its graph has shown
        self._ran = False
        self._failed = ""
        self._gguf: Path | None = None
        self._meta: dict[str, str] = {}
        self._outputs: tuple[str, ...] = ()
        self._callback: Any = None

    @classmethod
    def availability(cls) -> Availability:
        if importlib.util.find_spec("llama_cpp") is None:
            return Availability.missing("llama-cpp-python not installed (pip install 'xbackend[llama]')")
        return Availability.ok(importlib.metadata.version("llama_cpp_python"))

    @classmethod
    def load_engine(cls) -> None:
        import llama_cpp  # noqa: F401  # engine: llama.cpp

    @classmethod
    def instruments(cls, metadata: Mapping[str, str], model_dir: Path, options: Mapping[str, Any]) -> bool:
        return True

    # --- build -------------------------------------------------------------------------------

    def prepare_impl(self, model: ModelRef, tensors: tuple[str, ...]) -> BuildFingerprint:
        import llama_cpp as ll  # engine: llama.cpp

        self._ll, self._g = ll, _ggml(ll)
        path = Path(self.options["gguf"]) if self.options["gguf"] else gguf_beside(model.path)
        if path is None or not path.is_file():
            where = (
                f"{self.options['gguf']} is not a file"
                if self.options["gguf"]
                else (f"no {Path(model.path).with_suffix('.gguf').name} beside {model.path}")
            )
            raise BackendUnavailableError(
                f"llama.cpp needs the model's GGUF file: {where}; write one from its Hugging Face folder "
                "(xbackend.export.gguf.write_gguf) or give it: --set llama.cpp.gguf=FILE"
            )
        self._gguf = path
        _check_header(path)
        _quiet(ll)
        ll.llama_backend_init()
        mp = ll.llama_model_default_params()
        mp.n_gpu_layers = 0
        if hasattr(mp, "use_extra_bufts"):  # an older llama-cpp-python has no such field
            mp.use_extra_bufts = bool(self.options["extra_buffers"])
        elif not self.options["extra_buffers"]:
            raise BackendUnavailableError(
                f"llama.cpp: this llama-cpp-python ({ll.__version__}) cannot turn off its extra buffers: "
                "pip install 'llama-cpp-python==0.3.36', or leave extra_buffers at its default"
            )
        self._model = ll.llama_model_load_from_file(str(path).encode(), mp)
        if not self._model:
            raise ModelLoadError(f"llama.cpp could not load {path} (not a GGUF file it reads)")
        self._meta = _metadata(ll, self._model)
        arch = self._meta.get("general.architecture", "")
        hparams = {
            "block_count": ll.llama_model_n_layer(self._model),
            "head_count": ll.llama_model_n_head(self._model),
            "head_count_kv": ll.llama_model_n_head_kv(self._model),
        }
        self._outputs = tuple(output for output in model.outputs if output in tensors)
        rest = [output for output in model.outputs if not output.startswith("present")]
        if "logits" not in model.outputs and len(rest) != 1:
            raise RunnerFailedError(
                f"llama.cpp hands back logits: the model's outputs ({', '.join(model.outputs)}) name none "
                "'logits', and more than one is not a cache (present.*)"
            )
        self._logits = "logits" if "logits" in model.outputs else rest[0]
        wanted = [tensor for tensor in tensors if tensor not in model.outputs]
        try:  # matched by role; every build names the rotary constants it computes again (the judge's)
            from xbackend.model.load import load_proto  # imports onnx: the model's graph, to match it
        except ImportError:  # an interpreter without onnx: its outputs only
            if wanted:
                raise
        else:
            self._roles = role_map(load_proto(model.path, load_external=False).graph, wanted, hparams, arch)
            self._want = self._roles.by_ggml()
        self._vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(self._model))
        n_ctx = self.options["n_ctx"] or _AUTO_CTX
        cp = ll.llama_context_default_params()
        cp.n_batch = min(self.options["n_batch"] or 512, _BATCH_LIMIT)
        cp.n_ubatch = min(self.options["n_ubatch"] or 512, cp.n_batch)
        cp.n_threads = cp.n_threads_batch = self.options["threads"] or physical_cores()
        cp.type_k, cp.type_v = GGML_TYPES[self.options["type_k"]], GGML_TYPES[self.options["type_v"]]
        cp.flash_attn_type = _FLASH[self.options["flash_attn"]]
        if self._want:
            self._callback = ll.ggml_backend_sched_eval_callback(self._on_tensor)
            _KEPT.append(self._callback)
            cp.cb_eval = self._callback
        cp.kv_unified = bool(self.options["kv_unified"])
        self._cp = cp
        self._make_context(n_ctx, 1)
        self._batch_size = int(cp.n_batch)
        self._batch = ll.llama_batch_init(self._batch_size, 0, 1)
        digest = file_sha256(path)
        items = [("gguf", digest), ("llama-cpp-python", ll.__version__)]
        items += [(key, str(option)) for key, option in sorted(self.options.items())]
        self._meta["xbackend.gguf_sha256"] = digest
        return BuildFingerprint.from_items(self.name, items)

    # --- runs ----------------------------------------------------------------------------------

    def run(self, feeds: Mapping[str, Value]) -> dict[str, Value]:
        """The outputs it computes (its cache's length carriers, `present.*`, are for decoding)."""
        out = super().run(feeds)
        return {key: value for key, value in out.items() if not key.startswith("present")}

    def run_impl(self, feeds: Mapping[str, Value]) -> Mapping[str, Any]:
        ll = self._ll
        ids = np.asarray(feeds.get("input_ids"))
        if ids.ndim != 2 or ids.shape[0] < 1 or ids.size == 0:
            raise InputError(f"llama.cpp takes input_ids of shape [B, T]: given {list(ids.shape)}")
        past = [np.asarray(feed) for key, feed in feeds.items() if key.startswith("past_key_values")]
        start = int(past[0].shape[2]) if past and past[0].ndim == 4 else 0
        _check_positions(feeds, start, ids.shape[1])
        if np.any(ids < 0) or np.any(ids >= self._vocab):
            raise InputError(f"llama.cpp: a token id outside its vocabulary of {self._vocab}")
        if ids.shape[0] > 1:
            if start:
                raise InputError(
                    "llama.cpp continues one sequence's KV cache: several prompts with a past are "
                    "decoded one prompt at a time here"
                )
            return self._several(ids)
        tokens = [int(t) for t in ids[0]]
        if start == 0:
            ll.llama_memory_clear(ll.llama_get_memory(self._ctx), True)
            self._pos = 0
        elif start != self._pos:
            raise RunnerFailedError(
                f"llama.cpp keeps its own KV cache: fed a past of {start} token(s), it holds {self._pos}"
            )
        self._fit(start + len(tokens))
        step = 1 if self.options["feed"] == "token" else self._batch_size
        self._seen = {}
        logits = []
        for at in range(0, len(tokens), step):
            part = tokens[at : at + step]
            logits.append(self._decode([(t, start + at + index, 0) for index, t in enumerate(part)]))
        self._pos = start + len(tokens)
        self._ever |= set(self._seen)
        self._ran = True
        out: dict[str, Any] = {self._logits: np.concatenate(logits)[None]}
        for key, parts in self._seen.items():
            matched = self._want[key]
            out[matched.onnx] = matched.to_onnx(np.concatenate(parts, axis=0))
        return {**out, **self._presents(1, self._pos)}

    def _several(self, ids: np.ndarray) -> dict[str, Any]:
        """B prompts as B sequences of one context (a server's slots): every token's logits;
        no tensor inside (llama.cpp orders several sequences' tokens in micro-batches of its own),
        and no cache to continue."""
        ll = self._ll
        rows, n = ids.shape
        if rows > self._slots or n > self._n_ctx:  # a context of B sequences, each of the context length
            self._make_context(self._grown(n), max(rows, self._slots))
        ll.llama_memory_clear(ll.llama_get_memory(self._ctx), True)
        self._pos = -1  # no past continues a batch of several
        token_feed = self.options["feed"] == "token"  # one token of each sequence per decode
        order = [(r, t) for t in range(n) for r in range(rows)] if token_feed else list(np.ndindex(rows, n))
        step = rows if token_feed else self._batch_size
        out = np.zeros((rows, n, self._vocab), np.float32)
        self._multi, self._seen = True, {}
        try:
            for at in range(0, len(order), step):
                part = order[at : at + step]
                got = self._decode([(int(ids[r, t]), t, r) for r, t in part])
                for (r, t), row in zip(part, got, strict=True):
                    out[r, t] = row
        finally:
            self._multi = False
        return {self._logits: out, **self._presents(rows, n)}

    def _grown(self, needed: int) -> int:
        """The context length per sequence that holds `needed` tokens: the user's n_ctx as given,
        else doubled from the current one (a decode step at a time stays cheap)."""
        if needed <= self._n_ctx:
            return self._n_ctx
        if self.options["n_ctx"]:
            raise RunnerFailedError(
                f"llama.cpp: {needed} tokens do not fit its context of {self._n_ctx} "
                f"(--set llama.cpp.n_ctx={self._n_ctx}); raise it, or leave it unset"
            )
        return max(needed, 2 * self._n_ctx)

    def _fit(self, needed: int) -> None:
        """A context that holds `needed` tokens of sequence 0: grown where it does not, the tokens
        it holds carried over cell by cell (llama.cpp's sequence state), so the bits go on as they
        were."""
        if needed <= self._n_ctx:
            return
        ll, size = self._ll, self._grown(needed)
        kept = None
        if self._pos > 0:
            n = ll.llama_state_seq_get_size(self._ctx, 0)
            kept = (ctypes.c_uint8 * n)()
            if ll.llama_state_seq_get_data(self._ctx, kept, n, 0) != n:
                raise RunnerFailedError("llama.cpp could not hand over its KV cache to a longer context")
        self._make_context(size, self._slots)
        if kept is not None and ll.llama_state_seq_set_data(self._ctx, kept, len(kept), 0) == 0:
            raise RunnerFailedError("llama.cpp could not take its KV cache into a longer context")

    def _make_context(self, per_sequence: int, sequences: int) -> None:
        """A new context of `sequences` sequences of `per_sequence` tokens each, its KV cache held
        to a share of the memory free here before llama.cpp allocates it."""
        ll, cp = self._ll, self._cp
        total = per_sequence * sequences
        need, free = self._kv_bytes(total), _free_memory()
        if free and need > _KV_SHARE * free:
            raise RunnerFailedError(
                f"llama.cpp: a context of {total} tokens needs {need / 2**30:.1f} GiB of KV cache, past "
                f"{_KV_SHARE:.0%} of the {free / 2**30:.1f} GiB free here; lower --set llama.cpp.n_ctx"
            )
        cp.n_ctx, cp.n_seq_max = total, sequences
        if self._ctx:
            ll.llama_free(self._ctx)
            self._ctx = None
        self._ctx = ll.llama_init_from_model(self._model, cp)
        if not self._ctx:
            raise RunnerFailedError(f"llama.cpp could not make a context of {total} tokens for {self._gguf}")
        self._n_ctx, self._slots = per_sequence, sequences

    def _kv_bytes(self, tokens: int) -> int:
        """The KV cache of `tokens` tokens at 4 bytes an element (its widest type)."""
        ll, m = self._ll, self._model
        head = ll.llama_model_n_embd(m) // max(ll.llama_model_n_head(m), 1)
        return int(tokens * ll.llama_model_n_layer(m) * 2 * head * ll.llama_model_n_head_kv(m) * 4)

    def _presents(self, rows: int, length: int) -> dict[str, np.ndarray]:
        """Each present.* the model's past calls for: empty, its shape the cache's length (what
        the next step's past carries; the cache itself stays llama.cpp's)."""
        heads = self._ll.llama_model_n_head_kv(self._model)
        return {
            "present" + k[len("past_key_values") :]: np.zeros((rows, heads, length, 0), np.float32)
            for k in self._inputs
            if k.startswith("past_key_values")
        }

    def _decode(self, entries: list[tuple[int, int, int]]) -> np.ndarray:
        """One llama_decode of (token, position, sequence) entries: each one's logits."""
        ll, b = self._ll, self._batch
        b.n_tokens = len(entries)
        for i, (t, pos, seq) in enumerate(entries):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, pos, 1, True
            b.seq_id[i][0] = seq
        self._chunk, self._failed = {}, ""
        rc = ll.llama_decode(self._ctx, b)
        if rc != 0:
            raise RunnerFailedError(
                f"llama_decode returned {rc} at position {entries[0][1]} ({len(entries)} token(s); its "
                f"context holds {ll.llama_n_ctx(self._ctx)}: raise --set llama.cpp.n_ctx=N)"
            )
        if self._failed:
            raise RunnerFailedError(f"llama.cpp's eval callback: {self._failed}")
        for key, parts in self._chunk.items():
            self._seen.setdefault(key, []).extend(v for _, v in parts)
        rows = [
            np.ctypeslib.as_array(ll.llama_get_logits_ith(self._ctx, i), (self._vocab,)).copy()
            for i in range(len(entries))
        ]
        return np.stack(rows).astype(np.float32)

    def _on_tensor(self, tensor: int, ask: bool, _user: int) -> bool:
        """ggml's eval callback: asked whether a tensor is wanted, then handed it computed."""
        try:
            name = self._g.ggml_get_name(tensor).decode(errors="replace")
            op = self._g.ggml_op_desc(tensor).decode(errors="replace")
            key = (name, stage_of(name, op))
            if key not in self._want or self._multi:
                return not ask  # ask: not wanted; computed: go on
            if ask:
                return True
            parts = self._chunk.setdefault(key, [])
            value = self._copy(tensor, self._want[key])
            if parts and parts[-1][0] == "MUL_MAT" and op == "ADD":  # its bias: the projection's end
                parts[-1] = (op, value)
            else:  # the next micro-batch's
                parts.append((op, value))
        except Exception as error:  # an exception cannot cross the C callback: kept, raised after
            self._failed = self._failed or f"{type(error).__name__}: {error}"
        return True

    def _copy(self, tensor: int, matched: Matched) -> np.ndarray:
        head = ctypes.cast(tensor, ctypes.POINTER(_Head)).contents
        dtype = _NP.get(int(head.type))
        if dtype is None or not self._g.ggml_is_contiguous(tensor):
            raise RunnerFailedError(
                f"{matched.ggml} is {'not contiguous' if dtype else 'of a type it does not copy'}"
            )
        size = int(self._g.ggml_nbytes(tensor))
        buf = np.empty(size, np.uint8)
        self._g.ggml_backend_tensor_get(tensor, buf.ctypes.data, 0, size)
        dims = 3 if matched.layout.startswith("heads") else 2
        shape = tuple(int(n) for n in reversed(list(head.ne)[:dims]))
        return buf.view(dtype).astype(np.float32).reshape(shape)

    # --- what it says --------------------------------------------------------------------------

    def not_exposed(self) -> dict[str, str]:
        out = dict(self._roles.unmatched)
        arch = self._meta.get("general.architecture", "")
        for key, matched in self._want.items() if self._ran else ():
            if key not in self._ever:
                out[matched.onnx] = (
                    f"llama.cpp's {arch} graph names no tensor {matched.ggml} ({key[1]}): not handed out"
                )
        for name in self._tensors:
            if name.startswith("present"):
                out[name] = "llama.cpp keeps its KV cache inside (its own layout and type): not handed out"
        return out

    def info(self) -> dict[str, str]:
        out = super().info()
        if self._ll is not None:
            out["llama_cpp_python"] = self._ll.__version__
            out["system"] = self._ll.llama_print_system_info().decode(errors="replace").strip(" |")
        if self._gguf is not None:
            out["gguf"] = f"{self._gguf.name} ({self._meta.get('xbackend.gguf_sha256', '')[:16]})"
            out["gguf_type"] = self._meta.get("general.file_type", "")
        if self._meta.get("general.architecture") == "llama":  # said by either build
            out["layout"] = f"per layer, Q and K: {UNINTERLEAVED}"
        if self._roles.recomputed:  # its own rotary frequencies, from the GGUF's rope base
            out[RECOMPUTED] = ",".join(self._roles.recomputed)
        return out

    def close(self) -> None:
        ll = self._ll
        if ll is None:
            return
        with contextlib.suppress(Exception):
            if self._batch is not None:
                ll.llama_batch_free(self._batch)
            if self._ctx:
                ll.llama_free(self._ctx)
            if self._model:
                ll.llama_model_free(self._model)
        self._batch = self._ctx = self._model = None


def _check_header(path: Path) -> None:
    """The GGUF header read first, in Python: a damaged one, or one whose sizes its tensors do not
    hold, is one line before llama.cpp allocates for it."""
    try:
        header = read_header(path)
    except UsageError as error:
        raise ModelLoadError(str(error)) from None
    except OSError as error:
        raise ModelLoadError(f"cannot read {path} ({error.strerror})") from None
    bad = claims_problem(header)
    if bad:
        raise ModelLoadError(f"{path.name}: {bad}: not this model's size; llama.cpp was not started on it")


def _free_memory() -> int:
    """Bytes of memory available here (0 where the system does not say)."""
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 0


def _check_positions(feeds: Mapping[str, Value], start: int, n: int) -> None:
    """llama.cpp numbers positions itself: the feeds' positions and mask must be its own."""
    pos = feeds.get("position_ids")
    if pos is not None and not np.all(np.asarray(pos).reshape(-1, n) == np.arange(start, start + n)):
        raise InputError(f"llama.cpp numbers positions {start}..{start + n - 1} itself: position_ids differ")
    mask = feeds.get("attention_mask")
    if mask is not None and not np.all(np.asarray(mask) == 1):
        raise InputError("llama.cpp attends to every token it is fed: an attention_mask with zeros (padding)")


def _metadata(ll: Any, model: Any) -> dict[str, str]:
    out = {}
    buf = ctypes.create_string_buffer(256)
    for key in ("general.architecture", "general.file_type", "general.name"):
        if ll.llama_model_meta_val_str(model, key.encode(), buf, len(buf)) >= 0:
            out[key] = buf.value.decode(errors="replace")
    return out


def _quiet(ll: Any) -> None:
    """llama.cpp's log goes nowhere (its load and context lines would fill the worker's stderr)."""
    if not _KEPT or not isinstance(_KEPT[0], ll.llama_log_callback):
        cb = ll.llama_log_callback(lambda _level, _text, _user: None)
        _KEPT.insert(0, cb)
        ll.llama_log_set(cb, ctypes.c_void_p(0))


def _ggml(ll: Any) -> Any:
    """ggml's functions the callback reads a tensor with, from the library llama-cpp-python ships."""
    lib = ctypes.CDLL(str(Path(ll.__file__).parent / "lib" / "libggml-base.so"))
    for fn, res, args in (
        ("ggml_get_name", ctypes.c_char_p, [ctypes.c_void_p]),
        ("ggml_op_desc", ctypes.c_char_p, [ctypes.c_void_p]),
        ("ggml_nbytes", ctypes.c_size_t, [ctypes.c_void_p]),
        ("ggml_is_contiguous", ctypes.c_bool, [ctypes.c_void_p]),
        (
            "ggml_backend_tensor_get",
            None,
            [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t],
        ),
    ):
        f = getattr(lib, fn)
        f.restype, f.argtypes = res, args
    return lib
