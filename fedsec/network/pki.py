"""Enrolment: a small certificate authority for one study, built on ``cryptography.x509``.

Who holds what:
- the CA operator holds ``ca.key`` (ECDSA P-256, file mode 0600, optionally passphrase-encrypted)
  and signs requests; ``ca.crt`` (self-signed, path length 0: it signs leaves only) and ``ca.crl``
  (the revocation list) are public and go to every party;
- each party (site, server, key holder) makes its own TLS key ``NAME.key`` and its own Ed25519
  identity key ``NAME.identity.key`` (both 0600, neither ever leaves its machine) and sends only
  ``NAME.csr`` to the CA.

A certificate binds four things: the party's name (subject CN, and the DNS name
``NAME.ROLE.fedsec`` that TLS host-name checking matches), its role (subject OU), its TLS key and
its Ed25519 identity key (the private extension :data:`IDENTITY_OID`). The secure layers' signed
masking keys and Paillier tags are verified against that identity key, so "keys known out of band"
is the CA's signature.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedsec.network.errors import EnrolmentError, PeerRejected

ROLES = ("site", "server", "keyholder")
"""The roles a certificate can carry."""
IDENTITY_OID = x509.ObjectIdentifier("2.25.5853934671152407923301955059615154498")
"""Private extension holding the party's raw 32-byte Ed25519 identity public key (DER OCTET STRING);
an OID under the UUID arc 2.25, which needs no registration."""
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
DEFAULT_DAYS = 365
CA_DAYS = 3650


@dataclass(frozen=True)
class Peer:
    """A verified party: the name and role its certificate carries and the keys it binds.

    Attributes:
        name: the certificate's name (what the protocols call this party).
        role: one of :data:`ROLES`.
        fingerprint: ``sha256:`` + hex SHA-256 of the TLS public key (SubjectPublicKeyInfo DER).
        identity_key: the Ed25519 public key the secure layers verify signatures with.
        serial: the certificate's serial number.
    """

    name: str
    role: str
    fingerprint: str
    identity_key: ed25519.Ed25519PublicKey
    serial: int


def check_name(name: str) -> str:
    """Return ``name`` if it is 1-63 of ``a-z 0-9 -`` starting with a letter or digit (a DNS label)."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise EnrolmentError("bad_name", f"name {name!r} must be 1-63 characters of a-z, 0-9 and '-', "
                                         f"starting with a letter or digit")
    return name


def check_role(role: str) -> str:
    """Return ``role`` if it is one of :data:`ROLES`."""
    if role not in ROLES:
        raise EnrolmentError("unknown_role", f"role {role!r} is not one of {', '.join(ROLES)}")
    return role


def dns_name(name: str, role: str) -> str:
    """The DNS name a certificate for ``name`` in ``role`` carries; TLS host-name checks match it."""
    return f"{name}.{role}.fedsec"


def fingerprint(public_key: ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey) -> str:
    """``sha256:`` + hex SHA-256 of the key's SubjectPublicKeyInfo DER."""
    der = public_key.public_bytes(serialization.Encoding.DER,
                                  serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(der).hexdigest()


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to a file that must not exist yet, created with ``mode`` from the start."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise EnrolmentError("exists", f"{path} exists; refusing to overwrite it") from None
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(path, mode)


def _write_replace(path: Path, data: bytes) -> None:
    """Replace ``path`` atomically (write a sibling, fsync, rename)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _encryption(passphrase: bytes | None) -> serialization.KeySerializationEncryption:
    if passphrase is None:
        return serialization.NoEncryption()
    if not passphrase:
        raise EnrolmentError("bad_passphrase", "the passphrase is empty")
    return serialization.BestAvailableEncryption(passphrase)


def _pem_key(key: ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey,
             passphrase: bytes | None = None) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             _encryption(passphrase))


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def init_ca(ca_dir: str | Path, *, name: str, passphrase: bytes | None = None,
            days: int = CA_DAYS) -> x509.Certificate:
    """Create a study's root: ``ca.key`` (0600, encrypted when ``passphrase``) and ``ca.crt``.

    Args:
        ca_dir: directory (created if missing; existing ``ca.key`` or ``ca.crt`` are refused).
        name: the study's name (any printable text, 1-64 characters).
        passphrase: encrypts ``ca.key`` (PKCS#8, best available cipher) when given.
        days: validity of the root in days, >= 1.
    """
    if not isinstance(name, str) or not 1 <= len(name) <= 64 or not name.isprintable():
        raise EnrolmentError("bad_name", "the study name must be 1-64 printable characters")
    if days < 1:
        raise ValueError("days: must be >= 1")
    directory = Path(ca_dir)
    directory.mkdir(parents=True, exist_ok=True)
    for existing in ("ca.key", "ca.crt"):
        if (directory / existing).exists():
            raise EnrolmentError("exists", f"{directory / existing} exists; refusing to overwrite it")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, name),
                         x509.NameAttribute(NameOID.COMMON_NAME, f"{name} root")])
    now = _now()
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, key_cert_sign=True, crl_sign=True,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(ski, critical=False)
            .sign(key, hashes.SHA256()))
    _write_new(directory / "ca.key", _pem_key(key, passphrase), 0o600)
    _write_new(directory / "ca.crt", cert.public_bytes(serialization.Encoding.PEM), 0o644)
    (directory / "issued").mkdir(exist_ok=True)
    return cert


def load_ca(ca_dir: str | Path, passphrase: bytes | None = None
            ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """Read ``ca.crt`` and ``ca.key`` from ``ca_dir``; a wrong or missing passphrase is refused."""
    directory = Path(ca_dir)
    cert = x509.load_pem_x509_certificate((directory / "ca.crt").read_bytes())
    try:
        key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), passphrase)
    except (TypeError, ValueError):
        raise EnrolmentError("bad_passphrase", "cannot open ca.key (wrong or missing passphrase)") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
        raise EnrolmentError("bad_ca", "ca.key does not match ca.crt")
    return cert, key


def init_site(site_dir: str | Path, *, name: str, role: str) -> x509.CertificateSigningRequest:
    """Make a party's keys and request: ``NAME.key``, ``NAME.identity.key`` (both 0600), ``NAME.csr``.

    The CSR carries the name (CN and DNS name ``NAME.ROLE.fedsec``), the role (OU) and the Ed25519
    identity public key (extension :data:`IDENTITY_OID`), and is signed with the TLS key.
    """
    check_name(name)
    check_role(role)
    directory = Path(site_dir)
    directory.mkdir(parents=True, exist_ok=True)
    for suffix in (".key", ".identity.key", ".csr"):
        if (directory / f"{name}{suffix}").exists():
            raise EnrolmentError("exists", f"{directory / (name + suffix)} exists; refusing to overwrite it")
    key = ec.generate_private_key(ec.SECP256R1())
    identity = ed25519.Ed25519PrivateKey.generate()
    raw = identity.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name),
                                    x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role)]))
           .add_extension(x509.SubjectAlternativeName([x509.DNSName(dns_name(name, role))]), critical=False)
           .add_extension(x509.UnrecognizedExtension(IDENTITY_OID, b"\x04\x20" + raw), critical=False)
           .sign(key, hashes.SHA256()))
    _write_new(directory / f"{name}.key", _pem_key(key), 0o600)
    _write_new(directory / f"{name}.identity.key", _pem_key(identity), 0o600)
    _write_new(directory / f"{name}.csr", csr.public_bytes(serialization.Encoding.PEM), 0o644)
    return csr


def _one_attribute(name: x509.Name, oid: x509.ObjectIdentifier, what: str) -> str:
    values = name.get_attributes_for_oid(oid)
    if len(values) != 1 or not isinstance(values[0].value, str):
        raise EnrolmentError("malformed", f"the subject must carry exactly one {what}")
    return values[0].value


def _identity_from(extensions: x509.Extensions) -> ed25519.Ed25519PublicKey:
    try:
        value = extensions.get_extension_for_oid(IDENTITY_OID).value
    except x509.ExtensionNotFound:
        raise EnrolmentError("no_identity", "no Ed25519 identity key extension") from None
    data = value.value if isinstance(value, x509.UnrecognizedExtension) else b""
    if len(data) != 34 or data[:2] != b"\x04\x20":
        raise EnrolmentError("no_identity", "the identity key extension is not a 32-byte key")
    return ed25519.Ed25519PublicKey.from_public_bytes(data[2:])


def _dns_names(extensions: x509.Extensions) -> list[str]:
    try:
        san = extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    if len(list(san)) != len(san.get_values_for_type(x509.DNSName)):
        return ["<other>"]
    return san.get_values_for_type(x509.DNSName)


@dataclass(frozen=True)
class Signed:
    """What :func:`sign_request` signed (printed by ``fedsec ca sign``)."""

    certificate: x509.Certificate
    name: str
    role: str
    fingerprint: str
    identity_fingerprint: str


def read_request(csr_pem: bytes) -> tuple[x509.CertificateSigningRequest, str, str]:
    """Parse and check a CSR: its signature, one valid name, a known role, the matching DNS name,
    a P-256 key and an identity key. Returns ``(csr, name, role)``."""
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
        valid = csr.is_signature_valid
        key = csr.public_key()
        subject, extensions = csr.subject, csr.extensions
    except (ValueError, TypeError, UnsupportedAlgorithm, x509.InvalidVersion):
        raise EnrolmentError("malformed", "not a well-formed certificate signing request") from None
    if not valid:
        raise EnrolmentError("bad_signature", "the request's signature does not verify")
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
        raise EnrolmentError("bad_key", "the request's key is not ECDSA P-256")
    name = check_name(_one_attribute(subject, NameOID.COMMON_NAME, "common name"))
    role = check_role(_one_attribute(subject, NameOID.ORGANIZATIONAL_UNIT_NAME, "role (OU)"))
    if len(subject) != 2:
        raise EnrolmentError("malformed", "the subject must carry only the name and the role")
    if _dns_names(extensions) != [dns_name(name, role)]:
        raise EnrolmentError("bad_name", f"the request's DNS name must be {dns_name(name, role)}")
    _identity_from(extensions)
    return csr, name, role


def sign_request(ca_dir: str | Path, csr_pem: bytes, *, days: int = DEFAULT_DAYS,
                 passphrase: bytes | None = None) -> Signed:
    """Check a CSR (:func:`read_request`) and issue its certificate, valid ``days`` (1-3650) days.

    The certificate is also kept as ``CA_DIR/issued/SERIAL.pem`` (the CA's record of what it signed).
    """
    if not 1 <= days <= CA_DAYS:
        raise ValueError(f"days: must be in [1, {CA_DAYS}]")
    csr, name, role = read_request(csr_pem)
    ca_cert, ca_key = load_ca(ca_dir, passphrase)
    now = _now()
    not_after = min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc)
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if role != "site":
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    identity = _identity_from(csr.extensions)
    raw = identity.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    cert = (x509.CertificateBuilder().subject_name(csr.subject).issuer_name(ca_cert.subject)
            .public_key(csr.public_key()).serial_number(int.from_bytes(secrets.token_bytes(16)) >> 1)
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, key_cert_sign=False, crl_sign=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(dns_name(name, role))]),
                           critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(csr.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                           critical=False)
            .add_extension(x509.UnrecognizedExtension(IDENTITY_OID, b"\x04\x20" + raw), critical=False)
            .sign(ca_key, hashes.SHA256()))
    issued = Path(ca_dir) / "issued"
    issued.mkdir(exist_ok=True)
    _write_new(issued / f"{cert.serial_number:032x}.pem", cert.public_bytes(serialization.Encoding.PEM),
               0o644)
    return Signed(cert, name, role, fingerprint(csr.public_key()), fingerprint(identity))


def revoke(ca_dir: str | Path, cert_pem: bytes, *, passphrase: bytes | None = None,
           days: int = CA_DAYS) -> x509.CertificateRevocationList:
    """Add a certificate this CA issued to ``CA_DIR/ca.crl`` (re-signed, replaced atomically)."""
    ca_cert, ca_key = load_ca(ca_dir, passphrase)
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature, x509.InvalidVersion):
        raise EnrolmentError("not_ours", "the certificate was not issued by this CA") from None
    path = Path(ca_dir) / "ca.crl"
    now = _now()
    builder = (x509.CertificateRevocationListBuilder().issuer_name(ca_cert.subject)
               .last_update(now - dt.timedelta(minutes=5)).next_update(now + dt.timedelta(days=days))
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                              critical=False))
    serials = set()
    if path.exists():
        for entry in load_crl(path, ca_cert):
            serials.add(entry.serial_number)
            builder = builder.add_revoked_certificate(entry)
    if cert.serial_number not in serials:
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(cert.serial_number).revocation_date(now).build())
    crl = builder.sign(ca_key, hashes.SHA256())
    _write_replace(path, crl.public_bytes(serialization.Encoding.PEM))
    return crl


def load_crl(path: str | Path, ca_cert: x509.Certificate) -> x509.CertificateRevocationList:
    """Read a CRL and check that ``ca_cert`` signed it (else ``EnrolmentError('bad_crl')``)."""
    try:
        crl = x509.load_pem_x509_crl(Path(path).read_bytes())
    except ValueError:
        raise EnrolmentError("bad_crl", f"{path} is not a PEM CRL") from None
    if crl.issuer != ca_cert.subject or not crl.is_signature_valid(ca_cert.public_key()):
        raise EnrolmentError("bad_crl", f"{path} is not signed by the federation's root")
    return crl


class Trust:
    """The federation's root and its revocation list, as one end of a connection sees them.

    Args:
        ca_cert: the root certificate (``ca.crt``).
        crl_path: the CA's ``ca.crl``; re-read whenever its modification time changes, so a
            revocation takes effect on the next call without a restart. ``None``: nothing revoked.
    """

    def __init__(self, *, ca_cert: x509.Certificate, crl_path: str | Path | None = None) -> None:
        self.ca_cert = ca_cert
        self.ca_id = ca_cert.fingerprint(hashes.SHA256())
        """SHA-256 of the root's DER (keys :func:`verify_peer`'s cache of verified certificates)."""
        self.crl_path = None if crl_path is None else Path(crl_path)
        self._revoked: frozenset[int] = frozenset()
        self._stamp: int | None = None
        self.revoked()

    @classmethod
    def load(cls, ca_path: str | Path, crl_path: str | Path | None = None) -> Trust:
        """Read the root from ``ca_path``; ``crl_path`` as in the constructor."""
        return cls(ca_cert=x509.load_pem_x509_certificate(Path(ca_path).read_bytes()), crl_path=crl_path)

    @property
    def ca_pem(self) -> bytes:
        return self.ca_cert.public_bytes(serialization.Encoding.PEM)

    def revoked(self) -> frozenset[int]:
        """The revoked serial numbers; the file is re-read (and its signature checked) when it changed.

        A CRL file that is missing counts as empty; one that is present but unreadable or not
        signed by the root raises ``EnrolmentError('bad_crl')`` (fail closed).
        """
        if self.crl_path is None or not self.crl_path.exists():
            return self._revoked
        stamp = self.crl_path.stat().st_mtime_ns
        if stamp != self._stamp:
            crl = load_crl(self.crl_path, self.ca_cert)
            self._revoked = frozenset(entry.serial_number for entry in crl)
            self._stamp = stamp
        return self._revoked


@dataclass(frozen=True)
class _Checked:
    """What a certificate's bytes fix once its signature by a root verified: its validity period,
    the first structural problem (reason, detail) or its name, role and keys."""

    not_before: dt.datetime
    not_after: dt.datetime
    problem: tuple[str, str] | None
    peer: Peer | None


_CHECKED: dict[tuple[bytes, bytes], _Checked] = {}
CHECKED_CACHE = 4096
"""Certificates whose chain verified, kept per (root, certificate bytes): a certificate presented
again (every call of a peer, every relayed ring) is not parsed and its signature not verified
again; what can change (time, revocation list, roles and roster asked for) is checked every time."""


def _checked(cert: x509.Certificate | bytes, trust: Trust) -> _Checked:
    key = (trust.ca_id, cert if isinstance(cert, bytes) else cert.public_bytes(serialization.Encoding.DER))
    found = _CHECKED.get(key)
    if found is not None:
        return found
    try:
        if isinstance(cert, bytes):
            cert = x509.load_pem_x509_certificate(cert)
        cert.verify_directly_issued_by(trust.ca_cert)
    except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm, x509.InvalidVersion):
        raise PeerRejected("chain") from None
    problem, peer = None, None
    try:
        if cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca:
            problem = ("not_leaf", "")
        else:
            name = check_name(_one_attribute(cert.subject, NameOID.COMMON_NAME, "common name"))
            role = check_role(_one_attribute(cert.subject, NameOID.ORGANIZATIONAL_UNIT_NAME, "role"))
            if _dns_names(cert.extensions) != [dns_name(name, role)]:
                problem = ("malformed", name)
            else:
                peer = Peer(name=name, role=role, fingerprint=fingerprint(cert.public_key()),
                            identity_key=_identity_from(cert.extensions), serial=cert.serial_number)
    except (EnrolmentError, x509.ExtensionNotFound, ValueError):
        problem = ("malformed", "")
    checked = _Checked(cert.not_valid_before_utc, cert.not_valid_after_utc, problem, peer)
    if len(_CHECKED) >= CHECKED_CACHE:
        _CHECKED.clear()
    _CHECKED[key] = checked
    return checked


def verify_peer(cert: x509.Certificate | bytes, *, trust: Trust, roles: tuple[str, ...] | frozenset[str],
                roster: frozenset[str] | set[str] | tuple[str, ...] | None = None,
                now: dt.datetime | None = None) -> Peer:
    """Admit a peer certificate or raise :class:`PeerRejected` with the first failed check.

    Checks in order: issued by the root (signature and issuer), inside its validity period, a
    leaf (not a CA), a role in ``roles``, not revoked, and its name on ``roster`` (``None``: any).
    The first check and the certificate's parsing are done once per certificate and root
    (:data:`CHECKED_CACHE`); the others on every call.
    """
    checked = _checked(cert, trust)
    moment = now or _now()
    if moment < checked.not_before:
        raise PeerRejected("not_yet_valid")
    if moment > checked.not_after:
        raise PeerRejected("expired")
    if checked.problem is not None:
        raise PeerRejected(*checked.problem)
    peer = checked.peer
    assert peer is not None
    if peer.role not in roles:
        raise PeerRejected("role", f"{peer.name} is a {peer.role}")
    if peer.serial in trust.revoked():
        raise PeerRejected("revoked", peer.name)
    if roster is not None and peer.name not in roster:
        raise PeerRejected("roster", peer.name)
    return peer
