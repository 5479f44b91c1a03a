"""certify, verify, report and diff: what a release attaches and checks."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from xbackend.certificates.certify import certificate_paths, model_signature_path, write_certificate
from xbackend.certificates.certify import certify as run_certify
from xbackend.certificates.certify import verify as run_verify
from xbackend.cli.app import app, progress
from xbackend.cli.params import CLI_FLAGS, Force, ModelArg, with_flags
from xbackend.comparison.saved_report import read_result
from xbackend.errors import UsageError
from xbackend.files import attest
from xbackend.files.atomic import check_outputs
from xbackend.model.extdata import external_files
from xbackend.model.load import load_proto
from xbackend.report import bundle_outputs, write_atomic, write_markdown_bundle
from xbackend.report.diff import diff_results
from xbackend.results.flags import pairs

__all__ = ["certify", "diff", "keygen", "report", "verify"]


@app.command(
    epilog="Exit codes: 0 granted (every property held, or does not apply); 16 a property broke (it names "
    "itself and the first layer where it broke); 2 usage or input error; 3 the backend failed; "
    "4 internal error."
)
@with_flags("certify")
def certify(
    model: ModelArg,
    backend: Annotated[str, typer.Option(help="the runner to certify (NAME or NAME@LABEL)")],
    output: Annotated[
        str, typer.Option("-o", "--output", metavar="STEM", help="writes STEM.json and STEM.md")
    ] = "certificate",
    batch: Annotated[int, typer.Option(help="batch size for the sample-alone vs in-a-batch check")] = 4,
    key: Annotated[
        str | None,
        typer.Option(metavar="PRIVATE.key", help="sign the certificate with this key (xbackend keygen)"),
    ] = None,
    **flags: Any,
) -> int:
    """Certify one backend's determinism: run to run, build to build, batch position, thread count."""
    stem = Path(output)
    if stem.exists() and not stem.is_file() and not stem.is_dir():  # /dev/null: STEM.json in /dev
        raise UsageError(
            f"-o {output} is a device or a pipe; -o takes a STEM in a folder of yours (STEM.json, STEM.md)"
        )
    js, md = certificate_paths(output)
    sig = model_signature_path(output)
    outs = [("-o", js), ("-o", md), *([("-o", sig)] if key else [])]
    check_outputs(outs, [model, flags["inputs"]], flags["force"])  # before anything runs
    private = attest.load_private_key(key) if key else None  # a bad key is found before the battery
    given = {key: flag for key, flag in flags.items() if key not in CLI_FLAGS}
    cert = run_certify(model, backend, batch=batch, progress=progress(flags["no_progress"]), **given)
    js, md = write_certificate(cert, output, private)
    body = cert.body
    if body["backend"]["status"] != "ok":
        print(f"{backend} {body['backend']['status']}: {body['backend']['reason']}", file=sys.stderr)
    for p in body["properties"]:
        where = f"{p['first_layer']} ({p['first_layer_module']})" if p.get("first_layer_module") else ""
        first = f"; first broke at {where or p['first_layer']}" if p["first_layer"] else ""
        print(f"  {p['name']}: {p['status']} ({p['evidence']}{first})")
    lat = body.get("latency")
    if lat:
        print(f"  latency: median {lat['median_ms']:.3g} ms over {lat['runs']} runs")
    verdict = "GRANTED" if cert.granted else "REFUSED"
    how = f"--key {Path(key).with_suffix('.pub')}" if key else "--allow-unsigned"
    signed = "signed" if key else "unsigned (sign it with --key PRIVATE.key)"
    print(f"{verdict}: wrote {js} ({signed}) and {md}; check it with `xbackend verify {js} {how}`")
    if key:
        _model_signature(model, key, sig)
    return cert.exit_code


def _model_signature(model: str, key: str, sig: Path) -> None:
    """The model file signed in OpenSSF model-signing's format beside the certificate, or why not."""
    if external_files(load_proto(model, load_external=False)):
        why = "the model keeps its weights in other files: sign its folder with model_signing itself"
    else:
        why = attest.sign_model_files(Path(model), key, sig)
    if why:
        print(f"NOTE: no model-signing signature of the model file: {why}")
        return
    pub, signed = shlex.quote(str(Path(key).with_suffix(".pub"))), shlex.quote(str(sig))
    print(
        f"wrote {sig}: the model file signed in OpenSSF model-signing's format; check it with "
        f"`model_signing verify key {shlex.quote(model)} --signature {signed} --public_key {pub}`"
    )


@app.command(
    epilog="Exit codes: 0 the outputs match the certificate bit for bit and no property broke; 1 they "
    "differ, or a property the certificate holds broke here; 2 the certificate is missing, unsigned "
    "(without --allow-unsigned), not signed by --key, modified, or of another model or inputs; 4 internal "
    "error."
)
@with_flags("verify")
def verify(
    certificate: Annotated[
        str, typer.Argument(metavar="CERT.json", help="a certificate from xbackend certify")
    ],
    model: Annotated[
        str | None, typer.Option(help="the certified model, when it is not at the path the certificate names")
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(metavar="SIGNER.pub", help="the signer's public key: the signature is checked first"),
    ] = None,
    allow_unsigned: Annotated[
        bool,
        typer.Option(
            "--allow-unsigned", help="verify a certificate whose signature is absent or not checked"
        ),
    ] = False,
    **flags: Any,
) -> int:
    """Re-run what a certificate claims on this machine; compare outputs bit for bit and the environment.
    Nothing the certificate names is run: interpreters, modules and files come from --set here."""
    if key and allow_unsigned:  # --allow-unsigned would let a stripped, edited certificate pass the key
        raise UsageError(
            "--key and --allow-unsigned exclude each other: --key checks the signature; "
            "--allow-unsigned accepts a certificate without one (drop one of them)"
        )
    public = attest.load_public_key(key) if key else None
    verification = run_verify(
        certificate,
        model,
        flags["inputs"],
        progress(flags["no_progress"]),
        public,
        allow_unsigned,
        pairs(flags["runner_options"]),
        flags["torch_module"],
        flags["trust_model_code"],
    )
    for line in verification.lines():
        print(line)
    return verification.exit_code


@app.command(epilog="Exit codes: 0 written; 2 a file of that name exists, or the folder is not writable.")
def keygen(
    output: Annotated[
        str, typer.Option("-o", "--output", metavar="NAME", help="writes NAME.key (private) and NAME.pub")
    ],
    key_type: Annotated[
        str,
        typer.Option(
            "--type",
            metavar="TYPE",
            help="ecdsa-p256 (what OpenSSF model-signing takes: certify then signs the model file too) "
            "or ed25519",
        ),
    ] = "ecdsa-p256",
) -> int:
    """Make a key pair to sign certificates with (certify --key NAME.key, verify --key NAME.pub)."""
    private, public = attest.generate_key(output, key_type)
    print(f"wrote {private} (private: keep it secret; readable by you alone) and {public} (for verifiers)")
    return 0


@app.command(
    epilog="Exit codes: 0 written; 2 the JSON is missing, damaged, or from another schema; 4 internal error."
)
def report(
    result_json: Annotated[str, typer.Argument(metavar="RESULT.json", help="a JSON report (compare --json)")],
    output: Annotated[str, typer.Option("-o", "--output", metavar="OUT.md", help="Markdown to write")],
    force: Force = False,
) -> int:
    """Re-render the Markdown report (figures and layer CSV too) from a JSON report, running no engine."""
    check_outputs(bundle_outputs("-o", output), [result_json], force)
    write_markdown_bundle(read_result(result_json), output)
    print(f"wrote {output}")
    return 0


@app.command(
    epilog="Exit codes: 0 nothing moved; 1 outputs, layers, verdicts or the environment differ; "
    "2 a report is missing or unreadable; 4 internal error."
)
def diff(
    old: Annotated[str, typer.Argument(metavar="OLD.json", help="the earlier JSON report")],
    new: Annotated[str, typer.Argument(metavar="NEW.json", help="the later JSON report")],
    output: Annotated[
        str | None, typer.Option("-o", "--output", metavar="OUT.md", help="also write the diff here")
    ] = None,
    force: Force = False,
) -> int:
    """Compare two JSON reports: environment, options, verdicts, and the first layer that moved."""
    check_outputs([("-o", output)], [old, new], force)
    report_diff = diff_results(read_result(old, "OLD.json"), read_result(new, "NEW.json"))
    text = report_diff.markdown(old, new)
    print(text, end="")
    if output:
        write_atomic(output, text)
    return 1 if report_diff.changed else 0
