"""Determinism certificates: `xbackend certify` and `xbackend verify`.

certify runs the whole battery on one backend (N runs, K fresh builds, the sample alone vs in a
batch, 1 vs several threads) and writes what held, with the evidence, the environment and the
hashes of the model, inputs and outputs. verify re-runs what a certificate claims on this machine
and says whether the outputs match bit for bit, and how the environment differs.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xbackend.compare import compare_with_options
from xbackend.errors import EXIT_ALL_FAILED, EXIT_DIFFERENCES, EXIT_OK, InputError, UsageError
from xbackend.model import load_model
from xbackend.portable import load_capture
from xbackend.progress import ProgressSink
from xbackend.promises import EXIT_PROMISE, PROPERTIES, PromiseCheck, check
from xbackend.report import write_atomic
from xbackend.results import CompareOptions, Result
from xbackend.storage import ValueFile
from xbackend.textfmt import table, with_module
from xbackend.values import value_sha256

__all__ = [
    "SCHEMA",
    "Certificate",
    "Verification",
    "certify",
    "read_certificate",
    "seal",
    "verify",
    "write_certificate",
]

SCHEMA = "xbackend.certificate/1"
CERT_PROBES = ("builds", "threads", "batch")
# What a certificate must show held, whatever the model: the others need a batch dimension or a
# thread-count option, and are "not applicable" where there is none.
REQUIRED = ("run-to-run", "build-to-build")


@dataclass(frozen=True)
class Certificate:
    """The claims and the evidence, as written to CERT.json (`body`) and CERT.md."""

    body: dict[str, Any]

    @property
    def granted(self) -> bool:
        return bool(self.body["granted"])

    @property
    def exit_code(self) -> int:
        if self.body["backend"]["status"] != "ok":
            return EXIT_ALL_FAILED
        return EXIT_OK if self.granted else EXIT_PROMISE

    def broken(self) -> list[dict[str, Any]]:
        return [p for p in self.body["properties"] if p["status"] == "broken"]

    def to_json(self) -> str:
        return (
            json.dumps({**self.body, "certificate_sha256": seal(self.body)}, indent=2, sort_keys=True) + "\n"
        )

    def to_markdown(self) -> str:
        text = "\n".join(_markdown(self.body))
        while "\n\n\n" in text:
            text = text.replace("\n\n\n", "\n\n")
        return text.rstrip() + "\n"


def seal(body: Mapping[str, Any]) -> str:
    """sha256 of the canonical body: any later edit of the JSON shows."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _environment_sha256(env: Mapping[str, str], runner: Mapping[str, str]) -> str:
    text = "".join(f"{k}={v}\n" for k, v in sorted(env.items())) + "".join(
        f"runner.{k}={v}\n" for k, v in sorted(runner.items())
    )
    return hashlib.sha256(text.encode()).hexdigest()


def certify(
    model: str | os.PathLike[str],
    backend: str,
    runs: int = 5,
    builds: int = 3,
    batch: int = 4,
    progress: ProgressSink | None = None,
    **inputs: Any,
) -> Certificate:
    """Run the battery on `backend`; `inputs` are CompareOptions fields (seed, shapes, inputs,
    ranges, runner_options, timeout)."""
    if "," in backend:
        raise UsageError(f"--backend takes one runner, got {backend!r}; certify each on its own")
    if runs < 2 or builds < 2:
        raise UsageError(
            f"a certificate needs --runs >= 2 and --builds >= 2 to show run-to-run and build-to-build "
            f"determinism (got runs={runs}, builds={builds})"
        )
    opts = CompareOptions.create(
        backends=[backend], runs=runs, builds=builds, probes=CERT_PROBES, batch_invariance=batch, **inputs
    )
    with tempfile.TemporaryDirectory(prefix="xbackend-cert-") as tmp:
        result = compare_with_options(model, opts, progress, capture_to=Path(tmp) / "capture")
        outputs = _output_hashes(Path(tmp) / "capture", result)
    return Certificate(_body(result, backend, opts, outputs))


def _output_hashes(capture: Path, r: Result) -> dict[str, str]:
    """Full sha256 of each graph output (run 0 of build 0 of the plain model)."""
    if not (capture / "SHA256SUMS").is_file():
        return {}

    cap = load_capture(capture)
    with ValueFile(cap.run.outputs.capture) as f:
        return {n: value_sha256({n: f[n]}) for n in r.model.output_names if n in f}


def _combined(outputs: Mapping[str, str]) -> str:
    return hashlib.sha256("".join(f"{k}={v}\n" for k, v in sorted(outputs.items())).encode()).hexdigest()


def _property(c: PromiseCheck, modules: Mapping[str, str]) -> dict[str, Any]:
    applicable = not (c.status == "unchecked" and c.name not in REQUIRED)
    return {
        "name": c.name,
        "meaning": PROPERTIES[c.name],
        "status": c.status if applicable else "not applicable",
        "evidence": c.evidence,
        "first_layer": c.first_layer,
        "first_layer_module": modules.get(c.first_layer, "") if c.first_layer else "",
        "promised_by_runner": c.promised,
    }


def _body(r: Result, backend: str, opts: CompareOptions, outputs: Mapping[str, str]) -> dict[str, Any]:
    b = r.backend(backend)
    modules = r.model.modules()
    props = [_property(c, modules) for c in check(b, r.probes)] if b.ok else []
    granted = b.ok and all(p["status"] in ("held", "not applicable") for p in props)
    granted = granted and all(p["status"] == "held" for p in props if p["name"] in REQUIRED)
    env = dict(r.environment)
    info = dict(b.info)
    return {
        "schema": SCHEMA,
        "granted": granted,
        "backend": {
            "name": backend,
            "status": b.status,
            "reason": b.reason,
            "options": dict(b.options),
            "info": info,
            "promises": list(b.promises),
        },
        # what this configuration costs here: the certified runs themselves, timed
        "latency": b.latency.to_json() if b.ok and b.latency else None,
        "battery": {
            "runs": opts.runs,
            "timed_runs": opts.timed_runs,
            "builds": opts.builds,
            "batch": opts.batch_invariance,
            "probes": list(CERT_PROBES),
            "runner_options": [list(t) for t in opts.runner_options],
        },
        "properties": props,
        "model": {"name": Path(r.model.path).name, "path": r.model.path, "sha256": r.model.sha256},
        "inputs": {
            "sha256": r.feeds.sha256,
            "source": r.feeds.source,
            "seed": opts.seed,
            "shapes": [[n, list(d)] for n, d in opts.shapes],
            "ranges": [list(x) for x in opts.ranges],
            "file": opts.inputs,
            "tensors": [list(t) for t in r.feeds.shapes],
        },
        "outputs": {
            "sha256": _combined(outputs) if outputs else "",
            "tensors": dict(sorted(outputs.items())),
        },
        "environment": env,
        "environment_sha256": _environment_sha256(env, info),
        "verify": f"xbackend verify CERT.json (re-runs {backend} on {Path(r.model.path).name} here)",
    }


def write_certificate(cert: Certificate, stem: str | os.PathLike[str]) -> tuple[Path, Path]:
    """STEM.json and STEM.md, each written atomically (the JSON is what verify reads)."""
    base = Path(stem)
    if base.suffix in (".json", ".md"):
        base = base.with_suffix("")
    js, md = base.with_name(base.name + ".json"), base.with_name(base.name + ".md")
    # the model's path relative to the certificate: verify then works from any directory
    model = dict(cert.body["model"])
    model["path"] = os.path.relpath(Path(model["path"]).resolve(), js.parent.resolve())
    cert = Certificate({**cert.body, "model": model})
    write_atomic(js, cert.to_json(), "certificate")
    write_atomic(md, cert.to_markdown().replace("CERT.json", js.name), "certificate")
    return js, md


def read_certificate(path: str | os.PathLike[str]) -> dict[str, Any]:
    p = Path(path)
    try:
        data = json.loads(p.read_text("utf-8"))
    except FileNotFoundError:
        raise InputError(
            f"certificate not found: {p}; pass the CERT.json that `xbackend certify` wrote"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(
            f"{p} is not a certificate JSON ({e}); pass the CERT.json `xbackend certify` wrote"
        ) from e
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        got = data.get("schema") if isinstance(data, dict) else None
        raise InputError(f"{p} is not an {SCHEMA} certificate (schema {got!r}); certify the model again")
    recorded = data.pop("certificate_sha256", None)
    if recorded != seal(data):
        raise InputError(
            f"{p} was modified after it was written (its certificate_sha256 does not match its content); "
            "certify the model again instead of editing the certificate"
        )
    return data


@dataclass(frozen=True)
class Verification:
    """What re-running a certificate here showed."""

    certificate: dict[str, Any]
    rerun: dict[str, Any]

    @property
    def outputs_match(self) -> bool:
        return bool(self.certificate["outputs"]["sha256"]) and (
            self.certificate["outputs"]["sha256"] == self.rerun["outputs"]["sha256"]
        )

    def moved_outputs(self) -> list[str]:
        old, new = self.certificate["outputs"]["tensors"], self.rerun["outputs"]["tensors"]
        return sorted(n for n in set(old) | set(new) if old.get(n) != new.get(n))

    def property_changes(self) -> list[tuple[str, str, str]]:
        old = {p["name"]: p["status"] for p in self.certificate["properties"]}
        new = {p["name"]: p["status"] for p in self.rerun["properties"]}
        return [(n, old.get(n, "–"), new.get(n, "–")) for n in PROPERTIES if old.get(n) != new.get(n)]

    def environment_changes(self) -> list[tuple[str, str, str]]:
        def flat(body: Mapping[str, Any]) -> dict[str, str]:
            out = dict(body["environment"])
            out.update({f"runner.{k}": v for k, v in body["backend"]["info"].items()})
            return out

        old, new = flat(self.certificate), flat(self.rerun)
        return [
            (k, old.get(k, "–"), new.get(k, "–"))
            for k in sorted(set(old) | set(new))
            if old.get(k) != new.get(k)
        ]

    @property
    def ok(self) -> bool:
        return self.outputs_match and not any(new == "broken" for _, _, new in self.property_changes())

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.ok else EXIT_DIFFERENCES

    def lines(self) -> list[str]:
        c, r = self.certificate, self.rerun
        head = f"{c['backend']['name']} on {c['model']['name']}"
        if self.outputs_match:
            out = [
                f"VERIFIED: {head}: the outputs match the certificate bit for bit "
                f"(sha256 {c['outputs']['sha256'][:16]})"
            ]
        else:
            moved = ", ".join(self.moved_outputs()) or "all"
            out = [
                f"MISMATCH: {head}: outputs differ from the certificate ({moved}); "
                f"certified {c['outputs']['sha256'][:16] or 'none'}, "
                f"here {r['outputs']['sha256'][:16] or 'none'}"
            ]
        for name, old, new in self.property_changes():
            out.append(f"PROPERTY: {name} was {old} in the certificate, {new} here")
        out += _latency_line(c.get("latency"), r.get("latency"))
        env = self.environment_changes()
        if not env:
            out.append("ENVIRONMENT: the same as the certificate's")
        else:
            out.append(f"ENVIRONMENT: {len(env)} difference(s) from the certificate's:")
            out += [f"  {k}: {old} -> {new}" for k, old, new in env]
        return out


def _latency_line(certified: Mapping[str, Any] | None, here: Mapping[str, Any] | None) -> list[str]:
    """Latency is reported, never judged: times move with load and machine."""
    if not certified or not here:
        return []
    ratio = here["median_ms"] / certified["median_ms"] if certified["median_ms"] > 0 else float("nan")
    return [
        f"LATENCY: median {_ms(here['median_ms'])} ms here, {_ms(certified['median_ms'])} ms in the "
        f"certificate ({ratio:.2f}x; reported, not judged)"
    ]


def _ms(x: float) -> str:
    return f"{x:.3g}"


def verify(
    cert_path: str | os.PathLike[str],
    model: str | os.PathLike[str] | None = None,
    inputs: str | None = None,
    progress: ProgressSink | None = None,
) -> Verification:
    """Re-run the certificate's battery here on the same model and inputs."""
    c = read_certificate(cert_path)
    path = Path(model) if model is not None else _certified_path(c, Path(cert_path))

    spec, _ = load_model(path)
    if spec.sha256 != c["model"]["sha256"]:
        raise InputError(
            f"{path} is not the certified model (sha256 {spec.sha256[:12]}, certified "
            f"{c['model']['sha256'][:12]} {c['model']['name']}); pass --model with the certified file"
        )
    battery, given = c["battery"], c["inputs"]
    feeds: dict[str, Any] = {"seed": given["seed"]}
    if inputs or given["file"]:
        feeds["inputs"] = inputs or given["file"]
    else:
        feeds["shapes"] = tuple((n, tuple(d)) for n, d in given["shapes"])
        feeds["ranges"] = tuple(tuple(x) for x in given["ranges"])
    rerun = certify(
        path,
        c["backend"]["name"],
        battery["runs"],
        battery["builds"],
        battery["batch"],
        progress,
        runner_options=tuple(tuple(t) for t in battery["runner_options"]),
        timed_runs=int(battery.get("timed_runs", 0)),
        **feeds,
    ).body
    if rerun["inputs"]["sha256"] != given["sha256"]:
        raise InputError(
            f"the inputs here (sha256 {rerun['inputs']['sha256'][:12]}) are not the certified ones "
            f"({given['sha256'][:12]}); pass --inputs with the certified file"
        )
    return Verification(c, rerun)


def _certified_path(c: Mapping[str, Any], cert: Path) -> Path:
    """The model the certificate names: its path is relative to the certificate (certificates
    written before that recorded it relative to the working directory of certify)."""
    recorded = Path(c["model"]["path"])
    here = recorded if recorded.is_absolute() else cert.parent / recorded
    if here.is_file():
        return here
    if recorded.is_file():
        return recorded
    raise InputError(
        f"the certified model {c['model']['name']} is not at {here} (where the certificate records "
        "it, relative to itself); pass --model PATH to the model file"
    )


def _markdown(c: Mapping[str, Any]) -> list[str]:
    """The certificate's Markdown twin: verdict, properties, hashes, environment, how to check it."""
    return [
        *_md_verdict(c),
        *_md_properties(c),
        *_md_hashes(c),
        *_md_environment(c),
        "## Check it",
        "",
        "`xbackend verify CERT.json` re-runs this battery on the machine it runs on and says whether the",
        "outputs match these hashes bit for bit, and how its environment differs from this one.",
    ]


def _first_layer(p: Mapping[str, Any]) -> str:
    return (
        with_module(p["first_layer"], {p["first_layer"]: p["first_layer_module"]}) if p["first_layer"] else ""
    )


def _md_verdict(c: Mapping[str, Any]) -> list[str]:
    b = c["backend"]
    verdict = "GRANTED" if c["granted"] else "REFUSED"
    out = [f"# Determinism certificate: {c['model']['name']} on {b['name']}", "", f"**{verdict}**", ""]
    if b["status"] != "ok":
        out += [f"{b['name']} {b['status']}: {b['reason']}", ""]
    for p in c["properties"]:
        if p["status"] == "broken":
            first = _first_layer(p)
            out.append(
                f"- BROKEN: {p['name']}: {p['evidence']}" + (f"; first broke at {first}" if first else "")
            )
    bat = c["battery"]
    timed = f" (and {bat['timed_runs']} timed runs)" if bat.get("timed_runs") else ""
    lat = c.get("latency")
    cost = (
        [
            f"Latency of the certified configuration on this machine: median {_ms(lat['median_ms'])} ms "
            f"(min {_ms(lat['min_ms'])}, max {_ms(lat['max_ms'])}) over {lat['runs']} of the certified "
            "runs (each build's first run left out as warm-up).",
            "",
        ]
        if lat
        else []
    )
    return [
        *out,
        "",
        f"Battery: {bat['runs']} runs{timed} in each of {bat['builds']} fresh builds; the first sample alone "
        f"vs in a batch of {bat['batch']}; 1 thread vs the runner's other thread counts.",
        "",
        *cost,
    ]


def _md_properties(c: Mapping[str, Any]) -> list[str]:
    rows = [
        [
            p["name"],
            p["meaning"],
            f"**{p['status']}**" if p["status"] == "broken" else p["status"],
            p["evidence"],
            _first_layer(p) or "–",
            "yes" if p["promised_by_runner"] else "no",
        ]
        for p in c["properties"]
    ]
    header = ["property", "meaning", "status", "evidence", "first layer that broke", "promised by the runner"]
    return ["## Properties", "", *table(header, rows), ""]


def _md_hashes(c: Mapping[str, Any]) -> list[str]:
    rows = [
        [f"model {c['model']['name']}", c["model"]["sha256"]],
        [f"inputs ({c['inputs']['source']})", c["inputs"]["sha256"]],
        ["outputs (all)", c["outputs"]["sha256"] or "–"],
        *[[f"output {n}", h] for n, h in c["outputs"]["tensors"].items()],
        ["environment", c["environment_sha256"]],
    ]
    return ["## Hashes", "", *table(["what", "sha256"], rows), ""]


def _md_environment(c: Mapping[str, Any]) -> list[str]:
    rows = [
        *([k, v] for k, v in sorted(c["environment"].items())),
        *([f"runner.{k}", v] for k, v in sorted(c["backend"]["info"].items())),
    ]
    return ["## Environment", "", *table(["key", "value"], rows), ""]
