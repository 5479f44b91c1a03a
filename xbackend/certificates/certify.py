"""Determinism certificates: `xbackend certify` and `xbackend verify`.

certify runs the whole battery on one backend (N runs, K fresh builds, the sample alone vs in a
batch, 1 vs several threads) and writes what held, with the evidence, the environment and the
hashes of the model, inputs and outputs. verify re-runs what a certificate claims on this machine
and says whether the outputs match bit for bit, and how the environment differs.

A certificate is an in-toto Statement (subject: the model's files; predicate: the body below),
signed into a DSSE envelope with the user's key (xbackend/files/attest.py). It is untrusted input to
verify: its signature is checked first, its paths must stay inside its own folder, and nothing it
names is run: interpreters, modules and pin files come from the verifier's command line.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xbackend.api.compare import compare_with_options
from xbackend.certificates.markdown import certificate_markdown
from xbackend.certificates.schema import SCHEMA, check_body
from xbackend.errors import EXIT_ALL_FAILED, EXIT_DIFFERENCES, EXIT_OK, InputError, UsageError
from xbackend.execution.progress import ProgressSink
from xbackend.files import attest
from xbackend.files.capture_folder import file_sha256
from xbackend.files.runfolders import run_temp_folder
from xbackend.files.storage import ValueFile
from xbackend.files.untrusted import contained, json_loads
from xbackend.files.userfile import read_user_text
from xbackend.model.extdata import external_files
from xbackend.model.load import load_model
from xbackend.numerics.values import value_sha256
from xbackend.report import write_atomic
from xbackend.results import CompareOptions, Result
from xbackend.results.capture_record import open_capture
from xbackend.results.promises import EXIT_PROMISE, PROPERTIES, PromiseCheck, check
from xbackend.runners.base import CODE_OPTIONS
from xbackend.runners.registry import get_runner, split_instance

__all__ = [
    "SCHEMA",
    "Certificate",
    "Verification",
    "certify",
    "model_signature_path",
    "read_certificate",
    "verify",
    "write_certificate",
]

CERTIFICATE_LIMIT = 1 << 26  # 64 MiB: a certificate holds digests, never tensors

PREDICATE_TYPE = "https://xbackend.dev/attestation/certificate/v2"
CERT_PROBES = ("builds", "threads", "batch")
# What a certificate must show held, whatever the model: the others need a batch dimension or a
# thread-count option, and are "not applicable" where there is none.
REQUIRED = ("run-to-run", "build-to-build")


@dataclass(frozen=True)
class Certificate:
    """The claims and the evidence, as written to CERT.json (`body`) and CERT.md."""

    body: dict[str, Any]
    subjects: dict[str, str]  # the model's files (relative to its folder) -> sha256

    @property
    def granted(self) -> bool:
        """Every property the certificate claims held."""
        return bool(self.body["granted"])

    @property
    def exit_code(self) -> int:
        """0 granted, 16 a property broke, 3 the backend did not run."""
        if self.body["backend"]["status"] != "ok":
            return EXIT_ALL_FAILED
        return EXIT_OK if self.granted else EXIT_PROMISE

    def broken(self) -> list[dict[str, Any]]:
        """The properties that broke, as the certificate's body records them."""
        return [prop for prop in self.body["properties"] if prop["status"] == "broken"]

    def statement(self) -> dict[str, Any]:
        """The in-toto Statement: the model's files as subjects, the body as its predicate."""
        return attest.statement(self.subjects, PREDICATE_TYPE, self.body)

    def to_json(self, key: Any | None = None) -> str:
        """The bare Statement, or with a private key the signed bundle."""
        data = self.statement() if key is None else attest.sign_statement(self.statement(), key)
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    def to_markdown(self) -> str:
        """The certificate's Markdown twin (CERT.md)."""
        return certificate_markdown(self.body)


def _environment_sha256(env: Mapping[str, str], runner: Mapping[str, str]) -> str:
    text = "".join(f"{key}={value}\n" for key, value in sorted(env.items())) + "".join(
        f"runner.{key}={value}\n" for key, value in sorted(runner.items())
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
    """Run the battery on `backend`; `inputs` are CompareOptions.create's keywords (seed, shapes,
    inputs, ranges, runner_options, timeout, timed_runs, torch_module, trust_model_code)."""
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
    with run_temp_folder("xbackend-cert-") as tmp:
        result = compare_with_options(model, opts, progress, capture_to=Path(tmp) / "capture")
        outputs = _output_hashes(Path(tmp) / "capture", result)
    return Certificate(_body(result, backend, opts, outputs), model_files(Path(result.model.path)))


def model_files(path: Path) -> dict[str, str]:
    """sha256 of the model file and of each external data file, named relative to its folder."""
    import onnx  # heavy: onnx

    names = [path.name, *external_files(onnx.load(str(path), load_external_data=False))]
    return {name: file_sha256(path.parent / name) for name in names if (path.parent / name).is_file()}


def _output_hashes(capture: Path, result: Result) -> dict[str, str]:
    """Full sha256 of each graph output (run 0 of build 0 of the plain model)."""
    if not (capture / "SHA256SUMS").is_file():
        return {}

    cap = open_capture(capture)
    with ValueFile(cap.run.outputs.capture) as handle:
        return {
            output_name: value_sha256({output_name: handle[output_name]})
            for output_name in result.model.output_names
            if output_name in handle
        }


def _combined(outputs: Mapping[str, str]) -> str:
    return hashlib.sha256(
        "".join(f"{key}={output}\n" for key, output in sorted(outputs.items())).encode()
    ).hexdigest()


def _property(promise_check: PromiseCheck, modules: Mapping[str, str]) -> dict[str, Any]:
    applicable = not (promise_check.status == "unchecked" and promise_check.name not in REQUIRED)
    return {
        "name": promise_check.name,
        "meaning": PROPERTIES[promise_check.name],
        "status": promise_check.status if applicable else "not applicable",
        "evidence": promise_check.evidence,
        "first_layer": promise_check.first_layer,
        "first_layer_module": modules.get(promise_check.first_layer, "") if promise_check.first_layer else "",
        "promised_by_runner": promise_check.promised,
    }


def _body(result: Result, backend: str, opts: CompareOptions, outputs: Mapping[str, str]) -> dict[str, Any]:
    backend_result = result.backend(backend)
    modules = result.model.modules()
    props = (
        [_property(promise_check, modules) for promise_check in check(backend_result, result.probes)]
        if backend_result.ok
        else []
    )
    granted = backend_result.ok and all(prop["status"] in ("held", "not applicable") for prop in props)
    granted = granted and all(prop["status"] == "held" for prop in props if prop["name"] in REQUIRED)
    env = dict(result.environment)
    info = dict(backend_result.info)
    return {
        "schema": SCHEMA,
        "granted": granted,
        "backend": {
            "name": backend,
            "status": backend_result.status,
            "reason": backend_result.reason,
            "options": dict(backend_result.options),
            "info": info,
            "promises": list(backend_result.promises),
        },
        # what this configuration costs here: the certified runs themselves, timed
        "latency": backend_result.latency.to_json() if backend_result.ok and backend_result.latency else None,
        "battery": {
            "runs": opts.runs,
            "timed_runs": opts.timed_runs,
            "builds": opts.builds,
            "batch": opts.batch_invariance,
            "probes": list(CERT_PROBES),
            "runner_options": [list(option) for option in opts.runner_options],
        },
        "properties": props,
        "model": {
            "name": Path(result.model.path).name,
            "path": result.model.path,
            "sha256": result.model.sha256,
        },
        "inputs": {
            "sha256": result.feeds.sha256,
            "source": result.feeds.source,
            "seed": opts.seed,
            "shapes": [[name, list(dims)] for name, dims in opts.shapes],
            "ranges": [list(range_spec) for range_spec in opts.ranges],
            "file": opts.inputs,
            "tensors": [list(shape) for shape in result.feeds.shapes],
        },
        "outputs": {
            "sha256": _combined(outputs) if outputs else "",
            "tensors": dict(sorted(outputs.items())),
        },
        "environment": env,
        "environment_sha256": _environment_sha256(env, info),
        "verify": f"xbackend verify CERT.json (re-runs {backend} on {Path(result.model.path).name} here)",
    }


def write_certificate(
    cert: Certificate, stem: str | os.PathLike[str], key: Any | None = None
) -> tuple[Path, Path]:
    """STEM.json and STEM.md, each written atomically (the JSON is what verify reads); signed with
    `key` (a private key from attest.load_private_key) when one is given."""
    js, md = certificate_paths(stem)
    # paths relative to the certificate: verify then works from any directory, and reads them
    # only where they stay inside the certificate's folder
    model = dict(cert.body["model"])
    model["path"] = os.path.relpath(Path(model["path"]).resolve(), js.parent.resolve())
    given = dict(cert.body["inputs"])
    if given.get("file"):
        given["file"] = os.path.relpath(Path(given["file"]).resolve(), js.parent.resolve())
    body = {**cert.body, "model": model, "inputs": given}
    body["signature"] = {"key_id": attest.key_id(key.public_key()) if key is not None else ""}
    cert = Certificate(body, cert.subjects)
    write_atomic(js, cert.to_json(key), "certificate")
    write_atomic(md, cert.to_markdown().replace("CERT.json", js.name), "certificate")
    return js, md


def model_signature_path(stem: str | os.PathLike[str]) -> Path:
    """STEM.model.sig: the model file signed in OpenSSF model-signing's format (certify --key)."""
    js, _ = certificate_paths(stem)
    return js.with_name(js.name.removesuffix(".json") + ".model.sig")


def certificate_paths(stem: str | os.PathLike[str]) -> tuple[Path, Path]:
    """The certificate's JSON and Markdown paths from `stem` (a .json or .md suffix dropped)."""
    base = Path(stem)
    if base.suffix in (".json", ".md"):
        base = base.with_suffix("")
    return base.with_name(base.name + ".json"), base.with_name(base.name + ".md")


def read_certificate(
    path: str | os.PathLike[str], public_key: Any | None = None, allow_unsigned: bool = False
) -> tuple[dict[str, Any], dict[str, str], attest.Envelope]:
    """The certificate's body and its envelope: the signature checked first, then the body's
    shape, so nothing in a forged or damaged file reaches a runner."""
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        raise InputError(f"certificate not found: {p}; pass the CERT.json that `xbackend certify` wrote")
    text = read_user_text(
        p, "the certificate", "pass the CERT.json `xbackend certify` wrote", CERTIFICATE_LIMIT
    )
    try:
        data = json_loads(text)
    except (ValueError, RecursionError) as error:
        raise InputError(
            f"{p} is not a certificate JSON ({str(error).splitlines()[0][:200]}); pass the CERT.json "
            "`xbackend certify` wrote"
        ) from None
    if isinstance(data, dict) and "certificate_sha256" in data:
        raise InputError(
            f"{p} is an unsigned certificate from an older xbackend (sealed only by its own hash, which "
            "anyone can recompute); certify the model again, with --key to sign it"
        )
    if not isinstance(data, dict):
        raise InputError(f"{p} is not a certificate (a JSON {type(data).__name__}); certify the model again")
    env = attest.open_attestation(data, p, public_key, allow_unsigned)
    stmt = env.statement
    if stmt.get("predicateType") != PREDICATE_TYPE or not isinstance(stmt.get("predicate"), dict):
        raise InputError(
            f"{p} does not attest an {SCHEMA} certificate (predicate "
            f"{str(stmt.get('predicateType'))[:80]!r}); certify the model again"
        )
    body = stmt["predicate"]
    check_body(body, p)
    subjects = stmt.get("subject")
    if not isinstance(subjects, list) or not all(
        isinstance(subject, dict)
        and isinstance(subject.get("name"), str)
        and isinstance(subject.get("digest"), dict)
        for subject in subjects
    ):
        raise InputError(
            f"{p}: its subject is not a list of named files with digests; certify the model again"
        )
    return body, {subject["name"]: str(subject["digest"].get("sha256", "")) for subject in subjects}, env


@dataclass(frozen=True)
class Verification:
    """What re-running a certificate here showed."""

    certificate: dict[str, Any]
    rerun: dict[str, Any]
    envelope: attest.Envelope
    files_checked: int = 0  # the model's files whose digests matched the certificate's subject

    @property
    def outputs_match(self) -> bool:
        """Every digest the certificate records for the outputs, each tensor and all of them."""
        old, new = self.certificate["outputs"], self.rerun["outputs"]
        return bool(old["sha256"]) and old["sha256"] == new["sha256"] and old["tensors"] == new["tensors"]

    def moved_outputs(self) -> list[str]:
        """The graph outputs whose digest the re-run did not reproduce."""
        old, new = self.certificate["outputs"]["tensors"], self.rerun["outputs"]["tensors"]
        return sorted(name for name in set(old) | set(new) if old.get(name) != new.get(name))

    def property_changes(self) -> list[tuple[str, str, str]]:
        """(property, the certificate's status, the re-run's) for each that differs."""
        old = {prop["name"]: prop["status"] for prop in self.certificate["properties"]}
        new = {prop["name"]: prop["status"] for prop in self.rerun["properties"]}
        return [
            (name, old.get(name, "–"), new.get(name, "–"))
            for name in PROPERTIES
            if old.get(name) != new.get(name)
        ]

    def environment_changes(self) -> list[tuple[str, str, str]]:
        """(key, the certificate's value, the re-run's) for each environment key that differs."""

        def flat(body: Mapping[str, Any]) -> dict[str, str]:
            out = dict(body["environment"])
            out.update({f"runner.{key}": value for key, value in body["backend"]["info"].items()})
            return out

        old, new = flat(self.certificate), flat(self.rerun)
        return [
            (key, old.get(key, "–"), new.get(key, "–"))
            for key in sorted(set(old) | set(new))
            if old.get(key) != new.get(key)
        ]

    def false_claims(self) -> list[tuple[str, str]]:
        """Properties the certificate holds that this re-run did not show held: (name, here).
        "not applicable" here is a false claim whatever signs it (the model is the same file, so
        what applies is the same); an unsigned certificate's claim stands only where it held here."""
        out = []
        for name, old, new in self.property_changes():
            if old == "held" and (new == "not applicable" or (new != "broken" and not self.envelope.signed)):
                out.append((name, new))
        return out

    @property
    def ok(self) -> bool:
        """The re-run reproduced the outputs, broke no property, and found no false claim."""
        broke = any(new == "broken" for _, _, new in self.property_changes())
        return self.outputs_match and not broke and not self.false_claims()

    @property
    def exit_code(self) -> int:
        """0 verified, 1 otherwise."""
        return EXIT_OK if self.ok else EXIT_DIFFERENCES

    def lines(self) -> list[str]:
        """What verify prints: the signature, then what the re-run reproduced and what it did not."""
        c, r = self.certificate, self.rerun
        head = f"{c['backend']['name']} on {c['model']['name']}"
        files = (
            f"; the model's {self.files_checked} file(s) match their digests" if self.files_checked else ""
        )
        sign = [self.envelope.describe() + files]
        if self.outputs_match:
            out = [
                *sign,
                f"VERIFIED: {head}: the outputs match the certificate bit for bit "
                f"(sha256 {c['outputs']['sha256'][:16]}, {len(c['outputs']['tensors'])} tensor(s))",
            ]
        else:
            moved = ", ".join(self.moved_outputs()) or "all"
            out = [
                *sign,
                f"MISMATCH: {head}: outputs differ from the certificate ({moved}); "
                f"certified {c['outputs']['sha256'][:16] or 'none'}, "
                f"here {r['outputs']['sha256'][:16] or 'none'}",
            ]
        false = dict(self.false_claims())
        for name, old, new in self.property_changes():
            if name in false:
                why = "it does not apply to this model" if new == "not applicable" else f"it was {new} here"
                out.append(f"FALSE CLAIM: {name} is held in the certificate, but {why}; the claim is refused")
            else:
                out.append(f"PROPERTY: {name} was {old} in the certificate, {new} here")
        out += _latency_line(c.get("latency"), r.get("latency"))
        env = self.environment_changes()
        if not env:
            out.append("ENVIRONMENT: the same as the certificate's")
        else:
            out.append(f"ENVIRONMENT: {len(env)} difference(s) from the certificate's:")
            out += [f"  {key}: {old} -> {new}" for key, old, new in env]
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


def _ms(seconds: float) -> str:
    return f"{seconds:.3g}"


def verify(
    cert_path: str | os.PathLike[str],
    model: str | os.PathLike[str] | None = None,
    inputs: str | None = None,
    progress: ProgressSink | None = None,
    public_key: Any | None = None,
    allow_unsigned: bool = False,
    runner_options: tuple[tuple[str, str, str], ...] = (),
    torch_module: str | None = None,
    trust_model_code: bool = False,
) -> Verification:
    """Re-run the certificate's battery here on the same model and inputs. The signature is
    checked before anything is read from the body; `runner_options` (--set), `torch_module` and
    `trust_model_code` are the verifier's own, for the certified backend: a certificate's
    interpreters, modules and files are never used."""
    cert = Path(cert_path)
    certificate, subjects, envelope = read_certificate(cert, public_key, allow_unsigned)
    _consistent(certificate, cert)
    path = Path(model) if model is not None else _certified_path(certificate, cert)
    files = _check_subjects(subjects, path, certificate["model"]["name"])
    spec, _ = load_model(path)
    if spec.sha256 != certificate["model"]["sha256"]:
        raise InputError(
            f"{path} is not the certified model (sha256 {spec.sha256[:12]}, certified "
            f"{certificate['model']['sha256'][:12]} {certificate['model']['name']}); pass --model with the "
            "certified file"
        )
    battery, given = certificate["battery"], certificate["inputs"]
    feeds: dict[str, Any] = {"seed": given["seed"]}
    if inputs:
        feeds["inputs"] = inputs
    elif given["file"]:
        feeds["inputs"] = str(
            contained(
                cert.parent, given["file"], f"{cert}: inputs.file", "pass --inputs with the certified file"
            )
        )
    else:
        feeds["shapes"] = tuple((name, tuple(dims)) for name, dims in given["shapes"])
        feeds["ranges"] = tuple(tuple(range_spec) for range_spec in given["ranges"])
    name = certificate["backend"]["name"]
    rerun = certify(
        path,
        name,
        battery["runs"],
        battery["builds"],
        battery["batch"],
        progress,
        runner_options=replayed_options(
            name,
            battery["runner_options"],
            (*runner_options, *_own_module(name, torch_module, trust_model_code)),
        ),
        timed_runs=battery["timed_runs"],
        **feeds,
    ).body
    if rerun["inputs"]["sha256"] != given["sha256"]:
        raise InputError(
            f"the inputs here (sha256 {rerun['inputs']['sha256'][:12]}) are not the certified ones "
            f"({given['sha256'][:12]}); pass --inputs with the certified file"
        )
    return Verification(certificate, rerun, envelope, files)


def replayed_options(
    backend: str, recorded: list[list[str]], given: tuple[tuple[str, str, str], ...]
) -> tuple[tuple[str, str, str], ...]:
    """The certificate's runner options that only choose among values (booleans, numbers, a
    fixed set of choices) are replayed; a free-form one (an interpreter, a module, a pin or
    cache file, compiler flags) and any grant to run code must come from the verifier's command
    line. `given` wins."""
    own = {(backend, key) for backend, key, _ in given}
    try:
        specs = {option.name: option for option in get_runner(split_instance(backend)[0]).all_option_specs()}
    except Exception:  # an engine this host lacks: the runner says so when it is built
        specs = {}
    kept, refused = [], []
    for backend_result, k, value in recorded:
        if (backend_result, k) in own:
            continue
        spec = specs.get(k)
        value_only = spec is not None and (spec.choices or spec.kind in (bool, int, float))
        if backend_result == backend and value_only and k not in CODE_OPTIONS:  # trust_model_code is a bool
            kept.append((backend_result, k, value))
        else:
            refused.append(f"{backend_result}.{k}={value[:200]}")
    if refused:
        raise InputError(
            f"the certificate sets {', '.join(refused)}: verify never runs or reads what a certificate "
            "names; pass each yourself with --set (and --trust-model-code for a module)"
        )
    return (*kept, *given)


def _own_module(name: str, module: str | None, trust: bool) -> tuple[tuple[str, str, str], ...]:
    """--torch-module and --trust-model-code, given to the certified backend (a runner without
    these options says so when its options are resolved)."""
    out: tuple[tuple[str, str, str], ...] = ((name, "module", module),) if module else ()
    return (*out, (name, "trust_model_code", "true")) if trust else out


def _consistent(certificate: Mapping[str, Any], cert: Path) -> None:
    """The certificate's own digests agree with what it lists, before anything runs."""
    out = certificate["outputs"]
    if out["tensors"] and out["sha256"] != _combined(out["tensors"]):
        raise InputError(
            f"{cert}: its outputs.sha256 is not the digest of its own per-tensor digests (it was edited); "
            "do not trust it, certify the model again"
        )
    if certificate["environment_sha256"] != _environment_sha256(
        certificate["environment"], certificate["backend"]["info"]
    ):
        raise InputError(
            f"{cert}: its environment_sha256 does not match its own environment (it was edited); "
            "do not trust it, certify the model again"
        )


def _check_subjects(subjects: Mapping[str, str], model: Path, model_name: str) -> int:
    """The digest of each model file the certificate's subject names: the model (under whatever
    name it has here) and its external data, beside it."""
    for name, digest in sorted(subjects.items()):
        path = (
            model
            if name == model_name
            else contained(model.parent, name, "the certificate's subject", "certify the model again")
        )
        if not path.is_file():
            raise InputError(
                f"the certified model file {name!r} is not beside {model.name}; pass --model with the "
                "certified model, its external data beside it"
            )
        if file_sha256(path) != digest:
            raise InputError(
                f"{path} is not the certified {name} (its sha256 differs from the certificate's subject); "
                "pass --model with the certified model"
            )
    return len(subjects)


def _certified_path(certificate: Mapping[str, Any], cert: Path) -> Path:
    """The model the certificate names, relative to the certificate and inside its folder."""
    fix = "pass --model PATH to the model file"
    here = contained(cert.parent, certificate["model"]["path"], f"{cert}: model.path", fix)
    if here.is_file():
        return here
    raise InputError(
        f"the certified model {certificate['model']['name']!r} is not at {certificate['model']['path']!r} "
        "(where the "
        f"certificate records it, relative to itself); {fix}"
    )
