"""Enrolment: CA files, requests, signing refusals, revocation, and verify_peer against forgeries."""

from __future__ import annotations

import datetime as dt
import os
import stat

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import NameOID
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedsec.network import pki
from fedsec.network.errors import EnrolmentError, PeerRejected


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_ca_and_site_files_keys_private_and_never_overwritten(tmp_path):
    pki.init_ca(tmp_path / "ca", name="Study", passphrase=b"correct horse")
    assert _mode(tmp_path / "ca" / "ca.key") == 0o600
    assert b"ENCRYPTED" in (tmp_path / "ca" / "ca.key").read_bytes()
    with pytest.raises(EnrolmentError) as caught:
        pki.load_ca(tmp_path / "ca", b"wrong")
    assert caught.value.reason == "bad_passphrase"
    with pytest.raises(EnrolmentError, match="exists"):
        pki.init_ca(tmp_path / "ca", name="Study")
    csr = pki.init_site(tmp_path / "s", name="hosp-a", role="site")
    assert _mode(tmp_path / "s" / "hosp-a.key") == 0o600
    assert _mode(tmp_path / "s" / "hosp-a.identity.key") == 0o600
    assert csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "hosp-a"
    with pytest.raises(EnrolmentError, match="exists"):
        pki.init_site(tmp_path / "s", name="hosp-a", role="site")
    signed = pki.sign_request(tmp_path / "ca", (tmp_path / "s" / "hosp-a.csr").read_bytes(), days=30,
                              passphrase=b"correct horse")
    ca_cert = x509.load_pem_x509_certificate((tmp_path / "ca" / "ca.crt").read_bytes())
    assert ca_cert.extensions.get_extension_for_class(x509.BasicConstraints).value.path_length == 0
    assert isinstance(ca_cert.public_key(), ec.EllipticCurvePublicKey)
    # the certificate binds the identity key the site keeps
    identity = serialization.load_pem_private_key((tmp_path / "s" / "hosp-a.identity.key").read_bytes(), None)
    peer = pki.verify_peer(signed.certificate, trust=pki.Trust(ca_cert=ca_cert), roles=("site",))
    message = b"masking key bundle"
    peer.identity_key.verify(identity.sign(message), message)
    assert peer.fingerprint == signed.fingerprint and (peer.name, peer.role) == ("hosp-a", "site")
    assert (signed.certificate.not_valid_after_utc - signed.certificate.not_valid_before_utc).days == 30
    assert (tmp_path / "ca" / "issued" / f"{signed.certificate.serial_number:032x}.pem").exists()


@pytest.mark.parametrize("name", ["", "Hosp", "-a", "a" * 64, "a.b", "a b", "é"])
def test_bad_names_refused(tmp_path, name):
    with pytest.raises(EnrolmentError) as caught:
        pki.init_site(tmp_path, name=name, role="site")
    assert caught.value.reason == "bad_name"


def _csr(subject, san, *, identity=True, key=None):
    key = key or ec.generate_private_key(ec.SECP256R1())
    builder = x509.CertificateSigningRequestBuilder().subject_name(x509.Name(subject))
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(s) for s in san]),
                                        critical=False)
    if identity:
        raw = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(serialization.Encoding.Raw,
                                                                             serialization.PublicFormat.Raw)
        builder = builder.add_extension(x509.UnrecognizedExtension(pki.IDENTITY_OID, b"\x04\x20" + raw),
                                        critical=False)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def _subject(name, role):
    return [x509.NameAttribute(NameOID.COMMON_NAME, name),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role)]


@pytest.mark.parametrize("make, reason", [
    (lambda: _csr(_subject("hosp-a", "admin"), ["hosp-a.admin.fedsec"]), "unknown_role"),
    (lambda: _csr(_subject("hosp-a", "site"), ["coordinator.server.fedsec"]), "bad_name"),
    (lambda: _csr(_subject("hosp-a", "site"), ["hosp-a.site.fedsec", "x.server.fedsec"]), "bad_name"),
    (lambda: _csr(_subject("hosp-a", "site"), []), "bad_name"),
    (lambda: _csr(_subject("hosp-a", "site"), ["hosp-a.site.fedsec"], identity=False), "no_identity"),
    (lambda: _csr(_subject("hosp-a", "site"), ["hosp-a.site.fedsec"],
                  key=ec.generate_private_key(ec.SECP384R1())), "bad_key"),
    (lambda: _csr([*_subject("hosp-a", "site"), x509.NameAttribute(NameOID.ORGANIZATION_NAME, "x")],
                  ["hosp-a.site.fedsec"]), "malformed"),
    (lambda: b"not a csr", "malformed"),
])
def test_sign_refuses_bad_requests(study, make, reason):
    with pytest.raises(EnrolmentError) as caught:
        pki.sign_request(study.ca_dir, make())
    assert caught.value.reason == reason


def test_sign_refuses_a_request_whose_signature_does_not_verify(study, tmp_path):
    pki.init_site(tmp_path, name="hosp-q", role="site")
    der = bytearray(x509.load_pem_x509_csr((tmp_path / "hosp-q.csr").read_bytes()).public_bytes(
        serialization.Encoding.DER))
    der[-5] ^= 0x01  # inside the signature value
    pem = x509.load_der_x509_csr(bytes(der)).public_bytes(serialization.Encoding.PEM)
    with pytest.raises(EnrolmentError) as caught:
        pki.sign_request(study.ca_dir, pem)
    assert caught.value.reason == "bad_signature"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_tampered_requests_are_refused_or_sign_exactly_what_the_key_holder_signed(study, data):
    """Searching adversary: flip bytes anywhere in a valid request; the CA refuses with a typed error
    or (a flip the DER parser normalises away) issues exactly the request the party signed."""
    csr_pem = (study.ca_dir.parent / "hosp-a" / "hosp-a.csr").read_bytes()
    der = bytearray(x509.load_pem_x509_csr(csr_pem).public_bytes(serialization.Encoding.DER))
    for _ in range(data.draw(st.integers(1, 3))):
        der[data.draw(st.integers(0, len(der) - 1))] ^= data.draw(st.integers(1, 255))
    try:
        pem = x509.load_der_x509_csr(bytes(der)).public_bytes(serialization.Encoding.PEM)
    except (ValueError, x509.InvalidVersion):  # a flipped version field: cryptography's own type
        pem = b"-----BEGIN CERTIFICATE REQUEST-----\n" + bytes(der).hex().encode() + b"\n"
    try:
        pki.read_request(pem)
    except EnrolmentError:
        return
    original = x509.load_pem_x509_csr(csr_pem)
    accepted = x509.load_pem_x509_csr(pem)
    assert accepted.subject == original.subject and accepted.public_key() == original.public_key()
    assert list(accepted.extensions) == list(original.extensions)


def _forge(subject_name, issuer_key, *, issuer=None, ca=False, days=(-1, 30), role="site", name="hosp-a",
           identity=True):
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    raw = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(serialization.Encoding.Raw,
                                                                         serialization.PublicFormat.Raw)
    builder = (x509.CertificateBuilder().subject_name(x509.Name(_subject(name, role)))
               .issuer_name(issuer or subject_name).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now + dt.timedelta(days=days[0]))
               .not_valid_after(now + dt.timedelta(days=days[1]))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
               .add_extension(x509.SubjectAlternativeName([x509.DNSName(pki.dns_name(name, role))]),
                              critical=False))
    if identity:
        builder = builder.add_extension(x509.UnrecognizedExtension(pki.IDENTITY_OID, b"\x04\x20" + raw),
                                        critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def test_verify_peer_refuses_forgeries_expired_and_misused_certificates(study):
    trust = study.trust()
    ca_cert, ca_key = pki.load_ca(study.ca_dir)
    attacker = ec.generate_private_key(ec.SECP256R1())
    cases = {
        "chain": _forge(ca_cert.subject, attacker, issuer=ca_cert.subject),  # same issuer name, own key
        "expired": _forge(None, ca_key, issuer=ca_cert.subject, days=(-40, -1)),
        "not_yet_valid": _forge(None, ca_key, issuer=ca_cert.subject, days=(1, 40)),
        "not_leaf": _forge(None, ca_key, issuer=ca_cert.subject, ca=True),
        "malformed": _forge(None, ca_key, issuer=ca_cert.subject, identity=False),
    }
    for reason, cert in cases.items():
        with pytest.raises(PeerRejected) as caught:
            pki.verify_peer(cert, trust=trust, roles=("site",))
        assert caught.value.reason == reason
    with pytest.raises(PeerRejected) as caught:
        pki.verify_peer(study.foreign.cert_pem, trust=trust, roles=("site",))
    assert caught.value.reason == "chain"
    good = _forge(None, ca_key, issuer=ca_cert.subject)
    assert pki.verify_peer(good, trust=trust, roles=("site",), roster={"hosp-a"}).name == "hosp-a"
    for kwargs, reason in [({"roles": ("server",)}, "role"),
                           ({"roles": ("site",), "roster": {"b"}}, "roster")]:
        with pytest.raises(PeerRejected) as caught:
            pki.verify_peer(good, trust=trust, **kwargs)
        assert caught.value.reason == reason


def test_revocation_is_seen_without_restart_and_a_forged_crl_fails_closed(tmp_path):
    pki.init_ca(tmp_path / "ca", name="S")
    certs = []
    for name in ("a", "b"):
        pki.init_site(tmp_path / name, name=name, role="site")
        csr = (tmp_path / name / f"{name}.csr").read_bytes()
        certs.append(pki.sign_request(tmp_path / "ca", csr).certificate)
    trust = pki.Trust.load(tmp_path / "ca" / "ca.crt", tmp_path / "ca" / "ca.crl")
    assert pki.verify_peer(certs[0], trust=trust, roles=("site",)).name == "a"
    pem = certs[0].public_bytes(serialization.Encoding.PEM)
    pki.revoke(tmp_path / "ca", pem)
    pki.revoke(tmp_path / "ca", pem)  # idempotent
    crl = pki.revoke(tmp_path / "ca", certs[1].public_bytes(serialization.Encoding.PEM))
    assert len(crl) == 2
    for cert in certs:
        with pytest.raises(PeerRejected, match="revoked"):
            pki.verify_peer(cert, trust=trust, roles=("site",))
    pki.init_ca(tmp_path / "other", name="S")
    with pytest.raises(EnrolmentError) as caught:
        pki.revoke(tmp_path / "other", pem)
    assert caught.value.reason == "not_ours"
    (tmp_path / "other" / "ca.crl").write_bytes(b"")
    other_crl = pki.revoke(tmp_path / "other", _own_cert(tmp_path / "other"))
    (tmp_path / "ca" / "ca.crl").write_bytes(other_crl.public_bytes(serialization.Encoding.PEM))
    os.utime(tmp_path / "ca" / "ca.crl", ns=(1, 1))
    with pytest.raises(EnrolmentError) as caught:
        trust.revoked()
    assert caught.value.reason == "bad_crl"


def _own_cert(ca_dir):
    ca_dir.joinpath("ca.crl").unlink()
    pki.init_site(ca_dir / "p", name="p", role="site")
    return pki.sign_request(ca_dir, (ca_dir / "p" / "p.csr").read_bytes()).certificate.public_bytes(
        serialization.Encoding.PEM)
