"""The sweep file: models x backends, with per-model options and per-backend host requirements.

[sweep]                         # all optional
name = "zoo"                    # default: the file's stem
output = "fleet"                # folder for the fleet report, relative to this file
runs = 3
builds = 2
probes = ["builds", "threads"]  # or "none", "all"
timeout = 600                   # seconds per backend build (compare --timeout)
job_timeout = 3600              # seconds per job, then it is failed and the sweep goes on
retries = 1                     # re-runs of a job whose process or node died
reference = "ort-cpu"           # default: 'reference' if listed, else the first backend
max_ulp = 8

[[models]]
path = "models/torch_mlp.onnx"  # relative to this file
name = "mlp"                    # default: the file's stem
shapes = { x = [8, 64] }        # or inputs = "data/", seed, ranges = { ids = [0, 100] }
backends = ["ort-cpu"]          # default: every backend
set = { "ort-cpu.threads" = 1 } # runner options for this model
runs = 5                        # also: builds, probes, batch_invariance, probe_threads,
                                # outputs_only, timeout, max_ulp, reference

[[backends]]
name = "ort-cuda@h100"
set = { device_id = 0 }
requires = { num_gpus = 1, accelerator_type = "H100", resources = { groq = 1 },
             labels = { pool = "gpu" }, num_cpus = 1 }
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from xbackend.errors import BackendUnavailableError, UsageError
from xbackend.files.textfmt import CONTROL, HIDDEN, visible
from xbackend.files.untrusted import contained
from xbackend.probes.registry import select_probes
from xbackend.results import DEFAULT_MAX_ULP, CompareOptions
from xbackend.results.flags import declared
from xbackend.runners.base import CODE_OPTIONS, COMMON_OPTIONS, OptionSpec
from xbackend.runners.registry import get_runner
from xbackend.version import VERSION

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["BackendEntry", "JobSpec", "ModelEntry", "Requirements", "SweepSpec", "load_sweep"]

# What a model may override, and how it maps onto CompareOptions: the fields that declare
# sweep_file (xbackend.results.options), each checked against its type.
_RUN_TYPES = {
    f.name: get_type_hints(CompareOptions)[f.name] for f, fl in declared(CompareOptions) if fl.sweep_file
}
_RUN_KEYS = set(_RUN_TYPES)
_SWEEP_KEYS = {"name", "output", "job_timeout", "retries", "reference", "max_ulp", *_RUN_KEYS}
_MODEL_KEYS = {
    "path",
    "name",
    "shapes",
    "inputs",
    "seed",
    "ranges",
    "backends",
    "set",
    "max_ulp",
    "reference",
    *_RUN_KEYS,
}
_BACKEND_KEYS = {"name", "set", "requires"}
_REQUIRE_KEYS = {"num_cpus", "num_gpus", "accelerator_type", "resources", "labels"}
_SAFE = re.compile(r"[^A-Za-z0-9._@-]+")


@dataclass(frozen=True)
class Requirements:
    """What a node must have to run a backend's jobs (Ray's scheduling terms)."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    accelerator_type: str = ""
    resources: tuple[tuple[str, float], ...] = ()
    labels: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        parts = [f"{self.num_cpus:g} CPU"]
        if self.num_gpus:
            parts.append(f"{self.num_gpus:g} GPU")
        if self.accelerator_type:
            parts.append(f"accelerator {self.accelerator_type}")
        parts += [f"{v:g} {k}" for k, v in self.resources]
        parts += [f"label {k}={v}" for k, v in self.labels]
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "num_cpus": self.num_cpus,
            "num_gpus": self.num_gpus,
            "accelerator_type": self.accelerator_type,
            "resources": dict(self.resources),
            "labels": dict(self.labels),
        }


@dataclass(frozen=True)
class BackendEntry:
    name: str
    options: tuple[tuple[str, str], ...] = ()
    requires: Requirements = field(default_factory=Requirements)


@dataclass(frozen=True)
class ModelEntry:
    name: str
    path: Path
    backends: tuple[str, ...]
    compare: Mapping[str, Any]  # CompareOptions keywords this model's jobs share
    options: tuple[tuple[str, str, str], ...] = ()  # (backend, option, value) for this model
    reference: str | None = None  # of the cross-backend comparison; None: compare's default
    max_ulp: float = DEFAULT_MAX_ULP


@dataclass(frozen=True)
class JobSpec:
    """One model on one backend: what a node runs. Plain data, so it travels to any node."""

    model: str  # the model's name in the sweep
    model_path: str
    model_sha256: str
    backend: str
    compare: Mapping[str, Any]  # CompareOptions keywords (one backend, its options included)
    requires: Requirements

    @property
    def id(self) -> str:
        return f"{self.model}/{self.backend}"

    @property
    def folder(self) -> str:
        """Where its capture and report live, under the sweep's jobs/ folder."""
        return f"{safe_name(self.model)}/{safe_name(self.backend)}"

    @property
    def key(self) -> str:
        """sha256 of everything that decides the job's figures: a capture made under another key
        is stale and runs again."""
        body = {
            "model_sha256": self.model_sha256,
            "backend": self.backend,
            "compare": dict(self.compare),
            "xbackend": VERSION,
        }
        return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()

    def options(self) -> CompareOptions:
        return CompareOptions.create(**self.compare)


@dataclass(frozen=True)
class SweepSpec:
    path: Path
    name: str
    output: Path
    models: tuple[ModelEntry, ...]
    backends: tuple[BackendEntry, ...]
    job_timeout: float
    retries: int

    def backend(self, name: str) -> BackendEntry:
        return next(backend for backend in self.backends if backend.name == name)

    def jobs(self, model_sha256: Mapping[str, str]) -> list[JobSpec]:
        """Every model x backend job, in file order (models outer)."""
        out = []
        for m in self.models:
            for name in m.backends:
                b = self.backend(name)
                sets = {k: v for k, v in b.options}
                sets.update({k: v for bk, k, v in m.options if bk == name})
                kw = dict(m.compare)
                kw["backends"] = [name]
                kw["reference"] = name
                kw["runner_options"] = [[name, k, v] for k, v in sorted(sets.items())]
                out.append(JobSpec(m.name, str(m.path), model_sha256[m.name], name, kw, b.requires))
        return out


def safe_name(name: str) -> str:
    """A model or backend name as one path component."""
    return _SAFE.sub("_", name).strip(".") or "_"


def _printable(path: Path, where: str, name: str) -> None:
    """A name is printed in headings and used in folder names: no line break or control."""
    if CONTROL.search(name) or HIDDEN.search(name):
        raise _bad(
            path,
            where,
            f"name {visible(CONTROL.sub(' ', name))!r} holds a line break or control character; rename it",
        )


def _bad(path: Path, where: str, what: str) -> UsageError:
    return UsageError(f"{path}: {where}: {what}")


def _table(path: Path, where: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(path, where, f"expected a table, got {type(value).__name__}")
    return value


def _check_keys(path: Path, where: str, table: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise _bad(path, where, f"unknown key(s) {', '.join(unknown)}; valid: {', '.join(sorted(allowed))}")


def _typed(path: Path, where: str, key: str, value: Any, kind: type | tuple[type, ...]) -> Any:
    if isinstance(value, bool) and kind in (int, float, (int, float)):
        raise _bad(path, where, f"{key} must be a number, got {value!r}")
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise _bad(path, where, f"{key} must be {names}, got {value!r}")
    return value


def _probes(path: Path, where: str, key: str, value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(x, str) for x in value):
        return ",".join(value) or "none"
    raise _bad(path, where, f"{key} must be a list of names or a string, got {value!r}")


def _run_options(path: Path, where: str, table: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in sorted(_RUN_KEYS & set(table)):
        v, kind = table[k], _RUN_TYPES[k]
        if kind is bool:
            out[k] = _typed(path, where, k, v, bool)
        elif kind is float:
            out[k] = float(_typed(path, where, k, v, (int, float)))
        elif kind is int:
            out[k] = _typed(path, where, k, v, int)
        else:  # a list of names, or one comma-separated string (probes)
            out[k] = _probes(path, where, k, v)
    return out


def _requirements(path: Path, where: str, value: Any) -> Requirements:
    t = _table(path, f"{where}.requires", value)
    _check_keys(path, f"{where}.requires", t, _REQUIRE_KEYS)
    resources = _table(path, f"{where}.requires.resources", t.get("resources", {}))
    labels = _table(path, f"{where}.requires.labels", t.get("labels", {}))
    for k, v in resources.items():
        _typed(path, f"{where}.requires.resources", k, v, (int, float))
    for k, v in labels.items():
        _typed(path, f"{where}.requires.labels", k, v, str)
    req = Requirements(
        num_cpus=float(_typed(path, where, "requires.num_cpus", t.get("num_cpus", 1), (int, float))),
        num_gpus=float(_typed(path, where, "requires.num_gpus", t.get("num_gpus", 0), (int, float))),
        accelerator_type=_typed(path, where, "requires.accelerator_type", t.get("accelerator_type", ""), str),
        resources=tuple(sorted((str(k), float(v)) for k, v in resources.items())),
        labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
    )
    if req.num_cpus < 0 or req.num_gpus < 0 or any(v < 0 for _, v in req.resources):
        raise _bad(path, f"{where}.requires", "amounts must be >= 0")
    return req


_PATH_SUFFIXES = ("_path", "_file", "_dir")  # a plugin's options of these names are paths too
_THREAD_NAMES = ("threads", "inter_op_threads", "n_threads")


def _option_spec(backend: str, option: str) -> OptionSpec | None:
    """What the runner behind `backend` (RUNNER or RUNNER@LABEL) declares of `option`, where that
    runner is installed here."""
    try:
        runner = get_runner(backend.partition("@")[0])
    except (BackendUnavailableError, UsageError):
        return None
    return next((o for o in (*runner.option_specs, *COMMON_OPTIONS) if o.name == option), None)


def _set_table(path: Path, where: str, value: Any, backend: str | None = None) -> dict[str, str]:
    """A table of runner options from the file: none that runs code; a path only inside the file's
    folder (resolved there); a thread count at most this machine's CPUs."""
    t = _table(path, where, value)
    out = {}
    for k, v in t.items():
        if isinstance(v, (dict, list)):
            raise _bad(path, where, f"{k} must be a single value, got {v!r}")
        owner, _, option = str(k).rpartition(".")
        if option in CODE_OPTIONS:
            raise _bad(
                path,
                where,
                f"{k} names code to run, which a sweep file may not (it is not trusted to); pass it on "
                f"the command line: xbackend sweep {path} --set BACKEND.{option}=VALUE",
            )
        text = str(v).lower() if isinstance(v, bool) else str(v)
        spec = _option_spec(backend or owner, option)
        if (spec is not None and spec.path) or option.endswith(_PATH_SUFFIXES):
            fix = (
                f"give a path inside its folder, or pass it on the command line: --set BACKEND.{option}=PATH"
            )
            text = str(contained(path.parent, v, f"{path}: {where}: {k}", fix).resolve())
        threads = spec.threads if spec is not None else option in _THREAD_NAMES
        cpus = os.cpu_count() or 1
        if threads and text.isdigit() and int(text) > cpus:
            raise _bad(path, where, f"{k} = {text[:20]} is past this machine's {cpus} CPUs; lower it")
        out[str(k)] = text
    return out


def _with_sets(
    backends: tuple[BackendEntry, ...], sets: Sequence[tuple[str, str, str]]
) -> tuple[BackendEntry, ...]:
    """The command line's --set over the file's, per backend."""
    names = [backend.name for backend in backends]
    stray = sorted({b for b, _, _ in sets} - set(names))
    if stray:
        raise UsageError(
            f"--set names {', '.join(stray)}, which the sweep file does not list ({', '.join(names)})"
        )
    out = []
    for b in backends:
        opts = dict(b.options)
        opts.update({k: v for name, k, v in sets if name == b.name})
        out.append(BackendEntry(b.name, tuple(sorted(opts.items())), b.requires))
    return tuple(out)


def _backends(path: Path, raw: Any) -> tuple[BackendEntry, ...]:
    if not isinstance(raw, list) or not raw:
        raise _bad(path, "backends", 'list at least one backend: [[backends]] with name = "ort-cpu"')
    out: list[BackendEntry] = []
    for i, item in enumerate(raw):
        where = f"backends[{i}]"
        t = _table(path, where, item)
        _check_keys(path, where, t, _BACKEND_KEYS)
        if not isinstance(t.get("name"), str) or not t["name"]:
            raise _bad(path, where, 'needs name = "RUNNER" or "RUNNER@LABEL"')
        name = t["name"]
        if any(b.name == name for b in out):
            other = f"{name.partition('@')[0]}@other"
            raise _bad(path, where, f"{name} is listed twice; list it again under a label, e.g. {other}")
        opts = _set_table(path, f"{where}.set", t.get("set", {}), name)
        out.append(
            BackendEntry(name, tuple(sorted(opts.items())), _requirements(path, where, t.get("requires", {})))
        )
    return tuple(out)


def _model(
    path: Path, i: int, t: dict[str, Any], sweep: Mapping[str, Any], backends: Sequence[str]
) -> ModelEntry:
    where = f"models[{i}]"
    _check_keys(path, where, t, _MODEL_KEYS)
    if not isinstance(t.get("path"), str):
        raise _bad(path, where, 'needs path = "model.onnx" (relative to the sweep file)')
    fix = "give a path relative to the sweep file, inside its folder"
    file = contained(path.parent, t["path"], f"{path}: {where}: path", fix).resolve()
    if not file.is_file():
        raise _bad(path, where, f"model {t['path']} not found (looked at {file})")
    name = t.get("name", file.stem)
    _typed(path, where, "name", name, str)
    _printable(path, where, name)
    chosen = t.get("backends", list(backends))
    if not isinstance(chosen, list) or not all(isinstance(b, str) for b in chosen) or not chosen:
        raise _bad(path, where, "backends must be a non-empty list of names from [[backends]]")
    stray = [b for b in chosen if b not in backends]
    if stray:
        raise _bad(
            path, where, f"backends {', '.join(stray)} are not in [[backends]] ({', '.join(backends)})"
        )
    kw: dict[str, Any] = _run_options(path, "sweep", sweep)
    kw.update(_run_options(path, where, t))
    if "seed" in t:
        kw["seed"] = _typed(path, where, "seed", t["seed"], int)
    if "inputs" in t:
        given = _typed(path, where, "inputs", t["inputs"], str)
        kw["inputs"] = str(contained(path.parent, given, f"{path}: {where}: inputs", fix).resolve())
    if "shapes" in t:
        shapes = _table(path, f"{where}.shapes", t["shapes"])
        for k, v in shapes.items():
            if not isinstance(v, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in v):
                raise _bad(path, f"{where}.shapes", f"{k} must be a list of integers, got {v!r}")
        kw["shapes"] = {k: list(v) for k, v in sorted(shapes.items())}
    if "ranges" in t:
        ranges = _table(path, f"{where}.ranges", t["ranges"])
        for k, v in ranges.items():
            if not isinstance(v, list) or len(v) != 2:
                raise _bad(path, f"{where}.ranges", f"{k} must be [LO, HI], got {v!r}")
        kw["ranges"] = {k: [float(v[0]), float(v[1])] for k, v in sorted(ranges.items())}
    options = []
    for key, value in sorted(_set_table(path, f"{where}.set", t.get("set", {})).items()):
        backend, dot, option = key.rpartition(".")
        if not dot or backend not in chosen:
            raise _bad(
                path,
                f"{where}.set",
                f"{key!r}: expected BACKEND.OPTION with a backend this model runs ({', '.join(chosen)})",
            )
        options.append((backend, option, value))
    reference = t.get("reference", sweep.get("reference"))
    if reference is not None and reference not in chosen:
        where_ref = where if "reference" in t else "sweep"
        raise _bad(
            path, where_ref, f"reference {reference!r} is not among {name}'s backends ({', '.join(chosen)})"
        )
    max_ulp = t.get("max_ulp", sweep.get("max_ulp", DEFAULT_MAX_ULP))
    max_ulp = float(_typed(path, where, "max_ulp", max_ulp, (int, float)))
    return ModelEntry(name, file, tuple(chosen), kw, tuple(options), reference, max_ulp)


def load_sweep(
    path: str | os.PathLike[str],
    output: str | os.PathLike[str] | None = None,
    sets: Sequence[tuple[str, str, str]] = (),
) -> SweepSpec:
    """Read and check a sweep file; every mistake is one UsageError naming the file and the key.
    The file is not trusted: its paths stay inside its folder and it names no code to run;
    `output` and `sets` come from the command line, which is."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"sweep file {p} not found; pass a .toml file (see docs/fleet.md)")
    try:
        raw = tomllib.loads(p.read_text("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise UsageError(f"{p} is not valid TOML ({error}); fix the file") from error
    except RecursionError:  # tomllib recurses once per nested array or table
        raise UsageError(f"{p} nests arrays or tables too deep for a sweep file; fix the file") from None
    _check_keys(p, "top level", raw, {"sweep", "models", "backends"})
    sweep = _table(p, "sweep", raw.get("sweep", {}))
    _check_keys(p, "sweep", sweep, _SWEEP_KEYS)
    backends = _with_sets(_backends(p, raw.get("backends")), sets)
    names = [backend.name for backend in backends]
    models_raw = raw.get("models")
    if not isinstance(models_raw, list) or not models_raw:
        raise _bad(p, "models", 'list at least one model: [[models]] with path = "model.onnx"')
    models = tuple(_model(p, i, _table(p, f"models[{i}]", t), sweep, names) for i, t in enumerate(models_raw))
    seen: set[str] = set()
    for m in models:
        if safe_name(m.name) in seen:
            raise _bad(p, "models", f"two models are named {m.name}; give one another name = ...")
        seen.add(safe_name(m.name))
    job_timeout = float(_typed(p, "sweep", "job_timeout", sweep.get("job_timeout", 3600.0), (int, float)))
    retries = _typed(p, "sweep", "retries", sweep.get("retries", 1), int)
    if job_timeout <= 0 or retries < 0:
        raise _bad(p, "sweep", "job_timeout must be > 0 seconds and retries >= 0")
    if output is None:
        named = _typed(p, "sweep", "output", sweep.get("output", f"{p.stem}-fleet"), str)
        output = contained(p.parent, named, f"{p}: sweep: output", "or pass -o DIR on the command line")
    out = Path(os.path.normpath(output))
    name = _typed(p, "sweep", "name", sweep.get("name", p.stem), str)
    _printable(p, "sweep", name)
    spec = SweepSpec(
        path=p,
        name=name,
        output=out,
        models=models,
        backends=backends,
        job_timeout=job_timeout,
        retries=retries,
    )
    for job in spec.jobs(
        {model.name: "" for model in models}
    ):  # checked now (bad probe, bad option), not on a node
        try:
            opts = job.options()
            select_probes(opts.probes, opts.batch_invariance)
        except UsageError as error:
            raise _bad(p, f"model {job.model} on {job.backend}", str(error)) from error
    return spec


def check_backends(spec: SweepSpec) -> None:
    """Every backend name and option, checked against the runners installed here (for a sweep run
    here; a cluster's nodes may have runners this machine lacks)."""
    for job in spec.jobs({model.name: "" for model in spec.models}):
        try:
            get_runner(job.backend).resolve_options(job.options().options_for(job.backend))
        except (BackendUnavailableError, UsageError) as error:
            raise _bad(spec.path, f"backend {job.backend} (model {job.model})", str(error)) from error
