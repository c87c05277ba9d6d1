"""Bind a log's signing key to a party (``fedsec audit verify --ca CA_CERT``).

A valid log proves only that whoever holds its key wrote it; anybody can make a fresh key and
write a log under any actor name. In a deployment every party's Ed25519 identity key (the key its
log is signed with) is bound to its name by the study's CA, in the private certificate extension
:data:`IDENTITY_OID` (see ``fedsec.network.pki``). :func:`check_signer` checks that binding for one
log:

* the certificate is a leaf signed directly by the CA (``--ca``);
* it was valid when the log was created (the header's ``created`` time), so a log outlives the
  certificate's expiry;
* its subject common name is the log's ``actor``;
* its identity-key extension holds exactly the header's ``public_key``.

The certificate is the one given (``--cert``) or else the file ``ACTOR.crt`` beside the log,
which every deployed party writes next to its ``audit.db``. Revocation is not checked here: a
revoked party's earlier logs stay its own.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.x509.oid import NameOID

from fedsec.audit.verify import LogBroken

IDENTITY_OID = x509.ObjectIdentifier("2.25.5853934671152407923301955059615154498")
"""The certificate extension holding the raw identity key (the same OID as ``fedsec.network.pki``)."""


def certificate_beside(log_path: str | Path, actor: str) -> Path:
    """Where a party keeps its certificate: ``ACTOR.crt`` in the log's directory."""
    return Path(log_path).parent / f"{actor}.crt"


def load_pem(path: str | Path, key: str) -> x509.Certificate:
    """One PEM certificate; ``ValueError`` naming ``key`` when missing or unreadable."""
    try:
        return x509.load_pem_x509_certificate(Path(path).read_bytes())
    except OSError:
        raise ValueError(f"{key}: cannot read {path}") from None
    except ValueError:
        raise ValueError(f"{key}: {path} is not a PEM certificate") from None


def check_signer(header: dict[str, str], cert: x509.Certificate, ca: x509.Certificate) -> None:
    """Check that ``cert``, issued by ``ca``, binds the log ``header``'s actor to its key.

    Raises:
        LogBroken: (row 0, the header) the first check that fails.
    """
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
        raise LogBroken(0, "the certificate is not issued by this CA") from None
    try:
        created = dt.datetime.fromisoformat(header.get("created", ""))
    except ValueError:
        raise LogBroken(0, "created is not an ISO 8601 time") from None
    if created.tzinfo is None:
        created = created.replace(tzinfo=dt.UTC)
    if not cert.not_valid_before_utc <= created <= cert.not_valid_after_utc:
        raise LogBroken(0, "the certificate was not valid when the log was created")
    try:
        if cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca:
            raise LogBroken(0, "the certificate is a CA's, not a party's")
    except x509.ExtensionNotFound:
        pass
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(names) != 1 or names[0].value != header.get("actor"):
        raise LogBroken(0, f"the certificate names {[n.value for n in names]}, the log's actor is "
                           f"{header.get('actor')!r}")
    try:
        value = cert.extensions.get_extension_for_oid(IDENTITY_OID).value
    except x509.ExtensionNotFound:
        raise LogBroken(0, "the certificate binds no identity key") from None
    data = value.value if isinstance(value, x509.UnrecognizedExtension) else b""
    if len(data) != 34 or data[:2] != b"\x04\x20" or data[2:].hex() != header.get("public_key"):
        raise LogBroken(0, "the log is signed by a key the certificate does not bind to its actor")
