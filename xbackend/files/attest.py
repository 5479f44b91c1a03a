"""Signed attestations: an in-toto Statement in a DSSE envelope, in a Sigstore bundle.

The layout follows the OpenSSF model-signing format for a key the user holds: a Sigstore bundle
(v0.3) whose verification material is the public key's hint and whose content is a DSSE envelope
over an in-toto Statement. The Statement's subject is the model's files and their sha256; its
predicate is what xbackend certifies. An unsigned certificate is the bare Statement.

Keys are PEM files read by `cryptography`: Ed25519 (deterministic signatures, so a certificate's
bytes are reproducible) or ECDSA P-256/P-384 (what model-signing and cosign make).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from xbackend.errors import InputError, UsageError, XbackendError
from xbackend.files.owned import file_digest, place, synced_temp
from xbackend.files.untrusted import json_loads
from xbackend.files.userfile import read_user_bytes

__all__ = [
    "BUNDLE_MEDIA_TYPE",
    "MODEL_SIGNING_PREDICATE",
    "PAYLOAD_TYPE",
    "STATEMENT_TYPE",
    "Envelope",
    "generate_key",
    "key_id",
    "load_private_key",
    "load_public_key",
    "open_attestation",
    "pae",
    "sign_model_files",
    "sign_statement",
    "statement",
]

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
PASSWORD_ENV = "XBACKEND_KEY_PASSWORD"
SIGSTORE = "sigstore"  # the signer of a bundle that carries a Fulcio certificate, not a key hint


def statement(
    subjects: Mapping[str, str], predicate_type: str, predicate: Mapping[str, Any]
) -> dict[str, Any]:
    """An in-toto Statement v1: `subjects` maps file names to their sha256."""
    return {
        "_type": STATEMENT_TYPE,
        "subject": [
            {"name": key, "digest": {"sha256": subject}} for key, subject in sorted(subjects.items())
        ],
        "predicateType": predicate_type,
        "predicate": dict(predicate),
    }


def canonical(data: Mapping[str, Any]) -> bytes:
    """`data` as canonical JSON bytes (sorted keys, no spaces): what is signed."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what is signed, so the type cannot be swapped."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


KEY_LIMIT = 1 << 16  # a PEM key is a few KiB (an RSA-16384 one, 13): /dev/zero is refused, not read


def _read_key_file(path: str | os.PathLike[str], what: str) -> bytes:
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        raise UsageError(f"{what} not found: {p}; make a key pair with `xbackend keygen -o NAME`")
    fix = "pass a PEM key file (`xbackend keygen -o NAME` makes a pair)"
    try:
        return read_user_bytes(p, f"the {what}", fix, KEY_LIMIT)
    except InputError as error:
        raise UsageError(str(error)) from None


def load_private_key(path: str | os.PathLike[str]) -> Any:
    """A PEM private key (Ed25519 or ECDSA); a password, when it has one, comes from the
    environment variable XBACKEND_KEY_PASSWORD."""

    ser = serialization
    data = _read_key_file(path, "private key")
    password = os.environ.get(PASSWORD_ENV)
    try:
        try:
            key = ser.load_pem_private_key(data, None)
        except TypeError:  # encrypted: its password from the environment
            if not password:
                raise UsageError(
                    f"the private key {path} is encrypted: set {PASSWORD_ENV} to its password"
                ) from None
            key = ser.load_pem_private_key(data, password.encode())
    except ValueError as error:
        raise UsageError(
            f"{path} is not a PEM private key xbackend can use, or its password is wrong "
            f"({str(error).splitlines()[0]}); make one with `xbackend keygen -o NAME`"
        ) from None
    if not isinstance(key, ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey):
        raise UsageError(f"{path} is a {type(key).__name__}; sign with an Ed25519 or ECDSA key")
    _curve(key, path)
    return key


def load_public_key(path: str | os.PathLike[str]) -> Any:
    """The public key in the PEM file at `path`; a UsageError that says what to pass where it is not one."""
    ser = serialization
    data = _read_key_file(path, "public key")
    try:
        key = ser.load_pem_public_key(data)
    except ValueError:
        raise UsageError(
            f"{path} is not a PEM public key; pass the .pub file `xbackend keygen` wrote beside the key"
        ) from None
    if not isinstance(key, ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey):
        raise UsageError(f"{path} is a {type(key).__name__}; certificates are signed with Ed25519 or ECDSA")
    _curve(key, path)
    return key


def key_id(public_key: Any) -> str:
    """sha256 of the public key's PEM SubjectPublicKeyInfo, in hex: the bundle's key hint, as
    OpenSSF model-signing writes and checks it."""
    ser = serialization
    pem = public_key.public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(pem).hexdigest()


def _legacy_key_id(public_key: Any) -> str:
    """The hint earlier xbackend releases wrote: sha256 of the DER form (still read)."""
    ser = serialization
    der = public_key.public_bytes(ser.Encoding.DER, ser.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


# P-256 and P-384, each with the hash model-signing uses for it
CURVES: dict[str, Callable[[], hashes.HashAlgorithm]] = {
    "secp256r1": hashes.SHA256,
    "secp384r1": hashes.SHA384,
}


def _curve(key: Any, path: str | os.PathLike[str]) -> None:
    if (
        isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey)
        and key.curve.name not in CURVES
    ):
        raise UsageError(
            f"{path} is an ECDSA key on curve {key.curve.name}; certificates are signed with Ed25519 or "
            "ECDSA P-256 or P-384 (make one with `xbackend keygen -o NAME`)"
        )


def _sign(key: Any, message: bytes) -> bytes:

    if isinstance(key, ec.EllipticCurvePrivateKey):
        # RFC 6979: the same statement and key sign to the same bytes, as Ed25519's do
        return bytes(key.sign(message, ec.ECDSA(CURVES[key.curve.name](), deterministic_signing=True)))
    return bytes(key.sign(message))


def _check(key: Any, signature: bytes, message: bytes) -> bool:

    # ECDSA: the curve's own hash, then SHA-256 (earlier releases signed P-384 with it)
    digests: list[Callable[[], hashes.HashAlgorithm] | None] = (
        [CURVES.get(key.curve.name, hashes.SHA256), hashes.SHA256]
        if isinstance(key, ec.EllipticCurvePublicKey)
        else [None]
    )
    for digest in digests:
        try:
            if digest is None:
                key.verify(signature, message)
            else:
                key.verify(signature, message, ec.ECDSA(digest()))
        except InvalidSignature:
            continue
        return True
    return False


def sign_statement(stmt: Mapping[str, Any], key: Any) -> dict[str, Any]:
    """The Statement signed into a Sigstore bundle (DSSE envelope, public-key hint)."""
    payload = canonical(stmt)
    kid = key_id(key.public_key())
    sig = _sign(key, pae(PAYLOAD_TYPE, payload))
    return {
        "mediaType": BUNDLE_MEDIA_TYPE,
        "verificationMaterial": {"publicKey": {"hint": kid}, "tlogEntries": []},
        "dsseEnvelope": {
            "payload": base64.b64encode(payload).decode(),
            "payloadType": PAYLOAD_TYPE,
            "signatures": [{"sig": base64.b64encode(sig).decode(), "keyid": kid}],
        },
    }


@dataclass(frozen=True)
class Envelope:
    """A Statement as read from a file, and what is known of its signature."""

    statement: dict[str, Any]
    signed: bool  # it came in a DSSE envelope with a signature
    verified_key: str  # the key id whose signature was checked, "" when none was
    signer_hint: str  # the key id the bundle names

    def describe(self) -> str:
        """What the signature says, in one line: SIGNED with a key that checks, UNCHECKED, or unsigned."""
        if self.verified_key:
            return f"SIGNED: the signature checks with key {self.verified_key[:16]}"
        if self.signed and self.signer_hint == SIGSTORE:
            return (
                "UNCHECKED: signed keylessly with Sigstore; xbackend did not check it (check the signer "
                "with `sigstore verify identity`)"
            )
        if self.signed:
            return (
                f"UNCHECKED: signed by key {self.signer_hint[:16] or '(unnamed)'}, but no --key was given; "
                "the signature was not checked"
            )
        return (
            "UNSIGNED: anyone could have written or edited this certificate; verified with --allow-unsigned"
        )


def _b64(text: object, where: str, path: Path) -> bytes:
    try:
        return base64.b64decode(str(text), validate=True)
    except (binascii.Error, ValueError):
        raise InputError(
            f"{path}: {where} is not base64; the bundle is damaged, get the certificate again"
        ) from None


def open_attestation(
    data: Mapping[str, Any], path: Path, public_key: Any | None, allow_unsigned: bool
) -> Envelope:
    """The Statement inside `data` (a bundle, a bare DSSE envelope or a bare Statement), its
    signature checked against `public_key` first. Unsigned content needs allow_unsigned."""
    env = data.get("dsseEnvelope") if "mediaType" in data else data if "payloadType" in data else None
    if env is None:
        if data.get("_type") != STATEMENT_TYPE:
            raise InputError(
                f"{path} is neither a signed bundle nor an in-toto Statement; certify the model again"
            )
        if public_key is not None and not allow_unsigned:
            raise InputError(
                f"{path} is not signed, so --key cannot check it; certify the model again with --key "
                "PRIVATE.key, or pass --allow-unsigned to verify it unsigned"
            )
        if not allow_unsigned:
            raise InputError(
                f"{path} is not signed; pass --allow-unsigned to verify it anyway (anyone could have "
                "edited it), or certify with --key PRIVATE.key"
            )
        return Envelope(dict(data), False, "", "")
    if not isinstance(env, Mapping) or env.get("payloadType") != PAYLOAD_TYPE:
        raise InputError(
            f"{path}: its DSSE envelope does not carry an in-toto Statement; certify the model again"
        )
    payload = _b64(env.get("payload", ""), "the payload", path)
    sigs = env.get("signatures") or []
    if not isinstance(sigs, list) or not all(isinstance(sig, Mapping) for sig in sigs):
        raise InputError(f"{path}: its signatures are not a list; get the certificate again")
    material = data.get("verificationMaterial") or {}
    public = material.get("publicKey") if isinstance(material, Mapping) else None
    if not isinstance(material, Mapping) or not isinstance(public or {}, Mapping):
        raise InputError(
            f"{path}: its verificationMaterial is not an object with a publicKey object; get the "
            "certificate again"
        )
    hint = str((public or {}).get("hint", ""))
    if isinstance(material, Mapping) and ("certificate" in material or "x509CertificateChain" in material):
        hint = SIGSTORE  # a Fulcio certificate: keyless, checked by Sigstore's own tools
    verified = ""
    if public_key is not None:
        kid = key_id(public_key)
        message = pae(PAYLOAD_TYPE, payload)
        if not any(
            _check(public_key, _b64(sig.get("sig", ""), "a signature", path), message) for sig in sigs
        ):
            why = (
                "it was edited after it was signed"
                if hint in (kid, _legacy_key_id(public_key))
                else f"it names another signer, key {hint[:16] or '(unnamed)'}, or was edited"
            )
            raise InputError(
                f"{path} does not carry a valid signature by the key {kid[:16]} ({why}); do not trust it"
            )
        verified = kid
    elif not allow_unsigned:
        raise InputError(
            f"{path} is signed by key {hint[:16] or '(unnamed)'}: pass --key SIGNER.pub to check the "
            "signature (or --allow-unsigned to read it without checking)"
        )
    try:
        stmt = json_loads(payload)
    except ValueError as error:  # not UTF-8, not JSON, nested too deep
        raise InputError(f"{path}: its payload is not JSON ({error}); get the certificate again") from None
    if not isinstance(stmt, dict) or stmt.get("_type") != STATEMENT_TYPE:
        raise InputError(f"{path}: its payload is not an in-toto Statement; certify the model again")
    return Envelope(stmt, bool(sigs), verified, hint)


KEY_TYPES = ("ecdsa-p256", "ed25519")


def generate_key(stem: str | os.PathLike[str], kind: str = "ecdsa-p256") -> tuple[Path, Path]:
    """A key pair: STEM.key (owner-only) and STEM.pub. ECDSA P-256 by default (model-signing signs
    the model file with it too); Ed25519 on request. Never overwrites a file."""

    ser = serialization
    base = Path(stem)
    if base.is_dir() or not base.name or str(stem).endswith(os.sep):  # NAME.key would land beside it
        raise UsageError(f"-o {stem} is a folder; give a name in it, such as {base / 'signing'}")
    if base.exists() and not base.is_file():  # /dev/null: NAME.key would land in /dev
        raise UsageError(
            f"-o {stem} is a device or a pipe; give a NAME in a folder of yours (NAME.key, NAME.pub)"
        )
    private, public = base.with_name(base.name + ".key"), base.with_name(base.name + ".pub")
    for p in (private, public):
        if p.exists() or p.is_symlink():
            raise UsageError(f"{p} already exists; choose another -o NAME (xbackend never overwrites a key)")
    if kind not in KEY_TYPES:
        raise UsageError(f"unknown key type {kind!r}; valid: {', '.join(KEY_TYPES)}")
    key: Any = (
        ec.generate_private_key(ec.SECP256R1())
        if kind == "ecdsa-p256"
        else ed25519.Ed25519PrivateKey.generate()
    )
    pem = key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
    pub = key.public_key().public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo)
    made: list[Path] = []
    try:  # each whole or not at all: written under a temp name, then linked in (never over a file)
        for path, data, mode in ((private, pem, 0o600), (public, pub, 0o644)):
            _whole_new_file(path, data, mode)
            made.append(path)
    except OSError as error:
        for m in made:
            m.unlink(missing_ok=True)
        failed = private if not made else public
        raise UsageError(f"cannot write {failed}: {error.strerror or error}; nothing was kept") from None
    return private, public


def _whole_new_file(path: Path, data: bytes, mode: int) -> None:
    """`data` at `path`, which must not exist: written and synced under a temp name beside it, then
    hard-linked in (a file made meanwhile is never replaced), the temp name removed."""
    tmp = synced_temp(path, data, mode, ".part")
    try:
        os.link(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


MODEL_SIGNING_PREDICATE = "https://model_signing/signature/v1.0"


def sign_model_files(model: Path, key_path: str | os.PathLike[str], out: Path) -> str:
    """The model file signed in OpenSSF model-signing's own format (its predicate, its bundle) at
    `out`, so `model_signing verify key` checks the file while `xbackend verify` checks the
    judgment; '' when written, else why it was not."""
    key = load_private_key(key_path)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        return "model-signing signs with ECDSA keys (P-256, P-384), and this key is Ed25519"
    try:
        import model_signing  # optional: OpenSSF model-signing (pip install 'xbackend[sign]')
    except ImportError as error:
        return f"model-signing is not installed here ({error}; pip install 'xbackend[sign]')"
    tmp = out.with_name(f".{out.name[:200]}.{os.getpid()}.tmp")  # then placed as xbackend's own
    try:
        signing: Any = model_signing.signing  # untyped: its documented API, used as documented
        signing.Config().use_elliptic_key_signer(private_key=str(key_path)).sign(model, tmp)
        place(tmp, out, file_digest(tmp), "model signature")
    except XbackendError:
        raise
    except Exception as error:  # its own failure, said, never fatal: the certificate stands
        return f"model-signing could not sign it ({type(error).__name__}: {str(error)[:160]})"
    finally:
        tmp.unlink(missing_ok=True)
    return ""
