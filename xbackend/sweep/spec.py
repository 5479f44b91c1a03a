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
    field.name: get_type_hints(CompareOptions)[field.name]
    for field, fl in declared(CompareOptions)
    if fl.sweep_file
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
        """The requirements in words (CPUs, GPUs, accelerator, resources, labels)."""
        parts = [f"{self.num_cpus:g} CPU"]
        if self.num_gpus:
            parts.append(f"{self.num_gpus:g} GPU")
        if self.accelerator_type:
            parts.append(f"accelerator {self.accelerator_type}")
        parts += [f"{value:g} {key}" for key, value in self.resources]
        parts += [f"label {key}={value}" for key, value in self.labels]
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        """The requirements as JSON data."""
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
        """The job's name: model/backend."""
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
        """The job's comparison options."""
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
        """The sweep's backend entry `name`."""
        return next(backend for backend in self.backends if backend.name == name)

    def jobs(self, model_sha256: Mapping[str, str]) -> list[JobSpec]:
        """Every model x backend job, in file order (models outer)."""
        out = []
        for model in self.models:
            for name in model.backends:
                backend = self.backend(name)
                sets = {key: value for key, value in backend.options}
                sets.update({key: value for bk, key, value in model.options if bk == name})
                kw = dict(model.compare)
                kw["backends"] = [name]
                kw["reference"] = name
                kw["runner_options"] = [[name, key, value] for key, value in sorted(sets.items())]
                out.append(
                    JobSpec(model.name, str(model.path), model_sha256[model.name], name, kw, backend.requires)
                )
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
        names = kind.__name__ if isinstance(kind, type) else " or ".join(key.__name__ for key in kind)
        raise _bad(path, where, f"{key} must be {names}, got {value!r}")
    return value


def _probes(path: Path, where: str, key: str, value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return ",".join(value) or "none"
    raise _bad(path, where, f"{key} must be a list of names or a string, got {value!r}")


def _run_options(path: Path, where: str, table: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in sorted(_RUN_KEYS & set(table)):
        value, kind = table[key], _RUN_TYPES[key]
        if kind is bool:
            out[key] = _typed(path, where, key, value, bool)
        elif kind is float:
            out[key] = float(_typed(path, where, key, value, (int, float)))
        elif kind is int:
            out[key] = _typed(path, where, key, value, int)
        else:  # a list of names, or one comma-separated string (probes)
            out[key] = _probes(path, where, key, value)
    return out


def _requirements(path: Path, where: str, value: Any) -> Requirements:
    table = _table(path, f"{where}.requires", value)
    _check_keys(path, f"{where}.requires", table, _REQUIRE_KEYS)
    resources = _table(path, f"{where}.requires.resources", table.get("resources", {}))
    labels = _table(path, f"{where}.requires.labels", table.get("labels", {}))
    for k, v in resources.items():
        _typed(path, f"{where}.requires.resources", k, v, (int, float))
    for k, v in labels.items():
        _typed(path, f"{where}.requires.labels", k, v, str)
    req = Requirements(
        num_cpus=float(_typed(path, where, "requires.num_cpus", table.get("num_cpus", 1), (int, float))),
        num_gpus=float(_typed(path, where, "requires.num_gpus", table.get("num_gpus", 0), (int, float))),
        accelerator_type=_typed(
            path, where, "requires.accelerator_type", table.get("accelerator_type", ""), str
        ),
        resources=tuple(sorted((str(key), float(resource)) for key, resource in resources.items())),
        labels=tuple(sorted((str(key), str(label)) for key, label in labels.items())),
    )
    if req.num_cpus < 0 or req.num_gpus < 0 or any(value < 0 for _, value in req.resources):
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
    return next((spec for spec in (*runner.option_specs, *COMMON_OPTIONS) if spec.name == option), None)


def _set_table(path: Path, where: str, value: Any, backend: str | None = None) -> dict[str, str]:
    """A table of runner options from the file: none that runs code; a path only inside the file's
    folder (resolved there); a thread count at most this machine's CPUs."""
    table = _table(path, where, value)
    out = {}
    for key, v in table.items():
        if isinstance(v, (dict, list)):
            raise _bad(path, where, f"{key} must be a single value, got {v!r}")
        owner, _, option = str(key).rpartition(".")
        if option in CODE_OPTIONS:
            raise _bad(
                path,
                where,
                f"{key} names code to run, which a sweep file may not (it is not trusted to); pass it on "
                f"the command line: xbackend sweep {path} --set BACKEND.{option}=VALUE",
            )
        text = str(v).lower() if isinstance(v, bool) else str(v)
        spec = _option_spec(backend or owner, option)
        if (spec is not None and spec.path) or option.endswith(_PATH_SUFFIXES):
            fix = (
                f"give a path inside its folder, or pass it on the command line: --set BACKEND.{option}=PATH"
            )
            text = str(contained(path.parent, v, f"{path}: {where}: {key}", fix).resolve())
        threads = spec.threads if spec is not None else option in _THREAD_NAMES
        cpus = os.cpu_count() or 1
        if threads and text.isdigit() and int(text) > cpus:
            raise _bad(path, where, f"{key} = {text[:20]} is past this machine's {cpus} CPUs; lower it")
        out[str(key)] = text
    return out


def _with_sets(
    backends: tuple[BackendEntry, ...], sets: Sequence[tuple[str, str, str]]
) -> tuple[BackendEntry, ...]:
    """The command line's --set over the file's, per backend."""
    names = [backend.name for backend in backends]
    stray = sorted({backend for backend, _, _ in sets} - set(names))
    if stray:
        raise UsageError(
            f"--set names {', '.join(stray)}, which the sweep file does not list ({', '.join(names)})"
        )
    out = []
    for backend_result in backends:
        opts = dict(backend_result.options)
        opts.update({key: value for name, key, value in sets if name == backend_result.name})
        out.append(BackendEntry(backend_result.name, tuple(sorted(opts.items())), backend_result.requires))
    return tuple(out)


def _backends(path: Path, raw: Any) -> tuple[BackendEntry, ...]:
    if not isinstance(raw, list) or not raw:
        raise _bad(path, "backends", 'list at least one backend: [[backends]] with name = "ort-cpu"')
    out: list[BackendEntry] = []
    for index, item in enumerate(raw):
        where = f"backends[{index}]"
        table = _table(path, where, item)
        _check_keys(path, where, table, _BACKEND_KEYS)
        if not isinstance(table.get("name"), str) or not table["name"]:
            raise _bad(path, where, 'needs name = "RUNNER" or "RUNNER@LABEL"')
        name = table["name"]
        if any(backend_entry.name == name for backend_entry in out):
            other = f"{name.partition('@')[0]}@other"
            raise _bad(path, where, f"{name} is listed twice; list it again under a label, e.g. {other}")
        opts = _set_table(path, f"{where}.set", table.get("set", {}), name)
        out.append(
            BackendEntry(
                name, tuple(sorted(opts.items())), _requirements(path, where, table.get("requires", {}))
            )
        )
    return tuple(out)


def _model(
    path: Path, index: int, table: dict[str, Any], sweep: Mapping[str, Any], backends: Sequence[str]
) -> ModelEntry:
    where = f"models[{index}]"
    _check_keys(path, where, table, _MODEL_KEYS)
    if not isinstance(table.get("path"), str):
        raise _bad(path, where, 'needs path = "model.onnx" (relative to the sweep file)')
    fix = "give a path relative to the sweep file, inside its folder"
    file = contained(path.parent, table["path"], f"{path}: {where}: path", fix).resolve()
    if not file.is_file():
        raise _bad(path, where, f"model {table['path']} not found (looked at {file})")
    name = table.get("name", file.stem)
    _typed(path, where, "name", name, str)
    _printable(path, where, name)
    chosen = table.get("backends", list(backends))
    if not isinstance(chosen, list) or not all(isinstance(backend, str) for backend in chosen) or not chosen:
        raise _bad(path, where, "backends must be a non-empty list of names from [[backends]]")
    stray = [backend for backend in chosen if backend not in backends]
    if stray:
        raise _bad(
            path, where, f"backends {', '.join(stray)} are not in [[backends]] ({', '.join(backends)})"
        )
    kw: dict[str, Any] = _run_options(path, "sweep", sweep)
    kw.update(_run_options(path, where, table))
    if "seed" in table:
        kw["seed"] = _typed(path, where, "seed", table["seed"], int)
    if "inputs" in table:
        given = _typed(path, where, "inputs", table["inputs"], str)
        kw["inputs"] = str(contained(path.parent, given, f"{path}: {where}: inputs", fix).resolve())
    if "shapes" in table:
        shapes = _table(path, f"{where}.shapes", table["shapes"])
        for k, v in shapes.items():
            if not isinstance(v, list) or not all(
                isinstance(dim, int) and not isinstance(dim, bool) for dim in v
            ):
                raise _bad(path, f"{where}.shapes", f"{k} must be a list of integers, got {v!r}")
        kw["shapes"] = {key: list(shape) for key, shape in sorted(shapes.items())}
    if "ranges" in table:
        ranges = _table(path, f"{where}.ranges", table["ranges"])
        for k, v in ranges.items():
            if not isinstance(v, list) or len(v) != 2:
                raise _bad(path, f"{where}.ranges", f"{k} must be [LO, HI], got {v!r}")
        kw["ranges"] = {key: [float(value[0]), float(value[1])] for key, value in sorted(ranges.items())}
    options = []
    for key, value in sorted(_set_table(path, f"{where}.set", table.get("set", {})).items()):
        backend, dot, option = key.rpartition(".")
        if not dot or backend not in chosen:
            raise _bad(
                path,
                f"{where}.set",
                f"{key!r}: expected BACKEND.OPTION with a backend this model runs ({', '.join(chosen)})",
            )
        options.append((backend, option, value))
    reference = table.get("reference", sweep.get("reference"))
    if reference is not None and reference not in chosen:
        where_ref = where if "reference" in table else "sweep"
        raise _bad(
            path, where_ref, f"reference {reference!r} is not among {name}'s backends ({', '.join(chosen)})"
        )
    max_ulp = table.get("max_ulp", sweep.get("max_ulp", DEFAULT_MAX_ULP))
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
    sweep_file = Path(path)
    if not sweep_file.is_file():
        raise UsageError(f"sweep file {sweep_file} not found; pass a .toml file (see docs/fleet.md)")
    try:
        raw = tomllib.loads(sweep_file.read_text("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise UsageError(f"{sweep_file} is not valid TOML ({error}); fix the file") from error
    except RecursionError:  # tomllib recurses once per nested array or table
        raise UsageError(
            f"{sweep_file} nests arrays or tables too deep for a sweep file; fix the file"
        ) from None
    _check_keys(sweep_file, "top level", raw, {"sweep", "models", "backends"})
    sweep = _table(sweep_file, "sweep", raw.get("sweep", {}))
    _check_keys(sweep_file, "sweep", sweep, _SWEEP_KEYS)
    backends = _with_sets(_backends(sweep_file, raw.get("backends")), sets)
    names = [backend.name for backend in backends]
    models_raw = raw.get("models")
    if not isinstance(models_raw, list) or not models_raw:
        raise _bad(sweep_file, "models", 'list at least one model: [[models]] with path = "model.onnx"')
    models = tuple(
        _model(sweep_file, index, _table(sweep_file, f"models[{index}]", table), sweep, names)
        for index, table in enumerate(models_raw)
    )
    seen: set[str] = set()
    for m in models:
        if safe_name(m.name) in seen:
            raise _bad(sweep_file, "models", f"two models are named {m.name}; give one another name = ...")
        seen.add(safe_name(m.name))
    job_timeout = float(
        _typed(sweep_file, "sweep", "job_timeout", sweep.get("job_timeout", 3600.0), (int, float))
    )
    retries = _typed(sweep_file, "sweep", "retries", sweep.get("retries", 1), int)
    if job_timeout <= 0 or retries < 0:
        raise _bad(sweep_file, "sweep", "job_timeout must be > 0 seconds and retries >= 0")
    if output is None:
        named = _typed(sweep_file, "sweep", "output", sweep.get("output", f"{sweep_file.stem}-fleet"), str)
        output = contained(
            sweep_file.parent, named, f"{sweep_file}: sweep: output", "or pass -o DIR on the command line"
        )
    out = Path(os.path.normpath(output))
    name = _typed(sweep_file, "sweep", "name", sweep.get("name", sweep_file.stem), str)
    _printable(sweep_file, "sweep", name)
    spec = SweepSpec(
        path=sweep_file,
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
            raise _bad(sweep_file, f"model {job.model} on {job.backend}", str(error)) from error
    return spec


def check_backends(spec: SweepSpec) -> None:
    """Every backend name and option, checked against the runners installed here (for a sweep run
    here; a cluster's nodes may have runners this machine lacks)."""
    for job in spec.jobs({model.name: "" for model in spec.models}):
        try:
            get_runner(job.backend).resolve_options(job.options().options_for(job.backend))
        except (BackendUnavailableError, UsageError) as error:
            raise _bad(spec.path, f"backend {job.backend} (model {job.model})", str(error)) from error
