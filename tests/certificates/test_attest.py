"""Signed attestations without an engine: DSSE over an in-toto Statement, the keys xbackend
reads, and what each kind of envelope says about its signature."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from xbackend.errors import InputError, UsageError
from xbackend.files import attest

pytestmark = pytest.mark.unit  # the unit tier: make check

STMT = attest.statement({"m.onnx": "ab" * 32}, "https://example.test/p", {"x": 1})


def _write(path: Path, key: object, password: bytes | None = None) -> Path:
    enc = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc)  # type: ignore[attr-defined]
    )
    return path


def test_pae_is_dsses_encoding() -> None:
    # DSSE v1's pre-authentication encoding, byte for byte
    assert attest.pae("t/x", b"hello") == b"DSSEv1 3 t/x 5 hello"


def test_keygen_makes_the_key_model_signing_takes_and_signs_reproducibly(tmp_path: Path) -> None:
    """keygen's default is ECDSA P-256 (certify's model-signing advice); --type ed25519 the other.
    Both sign the same Statement to the same bytes (ECDSA by RFC 6979)."""
    from cryptography.hazmat.primitives.asymmetric import ed25519

    for kind, cls in (("ecdsa-p256", ec.EllipticCurvePrivateKey), ("ed25519", ed25519.Ed25519PrivateKey)):
        key = attest.load_private_key(attest.generate_key(tmp_path / kind, kind)[0])
        assert isinstance(key, cls), kind
        assert attest.sign_statement(STMT, key) == attest.sign_statement(STMT, key), kind
    key = attest.load_private_key(attest.generate_key(tmp_path / "default")[0])
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1"
    with pytest.raises(UsageError, match="unknown key type 'rsa'; valid: ecdsa-p256, ed25519"):
        attest.generate_key(tmp_path / "r", "rsa")


def test_ed25519_and_ecdsa_round_trip_and_a_flipped_byte_fails(tmp_path: Path) -> None:
    priv, pub = attest.generate_key(tmp_path / "k", "ed25519")
    ec_key = _write(tmp_path / "ec.key", ec.generate_private_key(ec.SECP256R1()))
    for private in (priv, ec_key):
        key = attest.load_private_key(private)
        bundle = attest.sign_statement(STMT, key)
        env = attest.open_attestation(bundle, tmp_path / "c.json", key.public_key(), False)
        assert env.statement == STMT and env.verified_key == attest.key_id(key.public_key())
        assert env.describe().startswith("SIGNED: the signature checks with key ")
        payload = bytearray(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
        payload[-3] ^= 1
        bundle["dsseEnvelope"]["payload"] = base64.b64encode(bytes(payload)).decode()
        with pytest.raises(InputError, match="it was edited after it was signed"):
            attest.open_attestation(bundle, tmp_path / "c.json", key.public_key(), False)
    assert attest.load_public_key(pub) is not None


def test_keys_xbackend_cannot_use_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = _write(tmp_path / "enc.key", ec.generate_private_key(ec.SECP256R1()), b"pw")
    monkeypatch.delenv(attest.PASSWORD_ENV, raising=False)
    with pytest.raises(UsageError, match="is encrypted: set XBACKEND_KEY_PASSWORD"):
        attest.load_private_key(secret)
    monkeypatch.setenv(attest.PASSWORD_ENV, "pw")
    assert isinstance(attest.load_private_key(secret), ec.EllipticCurvePrivateKey)
    rsa_key = _write(tmp_path / "rsa.key", rsa.generate_private_key(public_exponent=65537, key_size=2048))
    with pytest.raises(UsageError, match="sign with an Ed25519 or ECDSA key"):
        attest.load_private_key(rsa_key)
    (tmp_path / "junk.pub").write_text("not a key")
    with pytest.raises(UsageError, match="is not a PEM public key"):
        attest.load_public_key(tmp_path / "junk.pub")
    with pytest.raises(UsageError, match="private key not found"):
        attest.load_private_key(tmp_path / "missing.key")


def test_what_an_envelope_says_of_its_signature(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    with pytest.raises(InputError, match="is not signed; pass --allow-unsigned"):
        attest.open_attestation(STMT, path, None, False)
    assert attest.open_attestation(STMT, path, None, True).describe().startswith("UNSIGNED: ")
    key = attest.load_private_key(attest.generate_key(tmp_path / "k")[0])
    bundle = attest.sign_statement(STMT, key)
    with pytest.raises(InputError, match=r"is signed by key .*: pass --key SIGNER\.pub"):
        attest.open_attestation(bundle, path, None, False)
    assert (
        attest.open_attestation(bundle, path, None, True).describe().startswith("UNCHECKED: signed by key ")
    )
    # a keyless Sigstore bundle carries a Fulcio certificate instead of a key hint
    keyless = {**bundle, "verificationMaterial": {"certificate": {"rawBytes": "MIIB"}}}
    assert "signed keylessly with Sigstore" in attest.open_attestation(keyless, path, None, True).describe()
    for broken, message in (
        ({**bundle, "dsseEnvelope": {**bundle["dsseEnvelope"], "payload": "%%%"}}, "is not base64"),
        (
            {**bundle, "dsseEnvelope": {**bundle["dsseEnvelope"], "payloadType": "x"}},
            "does not carry an in-toto",
        ),
        ({"_type": "other"}, "neither a signed bundle nor an in-toto Statement"),
    ):
        with pytest.raises(InputError, match=message):
            attest.open_attestation(broken, path, key.public_key(), True)


def test_keygen_never_overwrites(tmp_path: Path) -> None:
    (tmp_path / "k.pub").write_text("someone's")
    with pytest.raises(UsageError, match="already exists"):
        attest.generate_key(tmp_path / "k")
    assert (tmp_path / "k.pub").read_text("utf-8") == "someone's" and not (tmp_path / "k.key").exists()
    assert json.dumps(STMT, sort_keys=True)  # the Statement is plain JSON
