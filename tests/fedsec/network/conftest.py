"""A study's CA with a server, two sites and a key holder enrolled; a second, foreign CA."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from fedsec.network import pki


@dataclass
class Party:
    name: str
    role: str
    cert: Path
    key: Path

    @property
    def cert_pem(self) -> bytes:
        return self.cert.read_bytes()

    @property
    def key_pem(self) -> bytes:
        return self.key.read_bytes()


def enrol(ca_dir: Path, site_dir: Path, name: str, role: str) -> Party:
    pki.init_site(site_dir, name=name, role=role)
    signed = pki.sign_request(ca_dir, (site_dir / f"{name}.csr").read_bytes())
    cert = site_dir / f"{name}.crt"
    cert.write_bytes(signed.certificate.public_bytes(serialization.Encoding.PEM))
    return Party(name, role, cert, site_dir / f"{name}.key")


@dataclass
class Study:
    ca_dir: Path
    parties: dict[str, Party]
    foreign: Party
    foreign_ca_dir: Path

    def trust(self) -> pki.Trust:
        return pki.Trust.load(self.ca_dir / "ca.crt", self.ca_dir / "ca.crl")


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Study:
    root = tmp_path_factory.mktemp("study")
    pki.init_ca(root / "ca", name="Test study")
    pki.init_ca(root / "other-ca", name="Another study")
    parties = {name: enrol(root / "ca", root / name, name, role) for name, role in
               [("coordinator", "server"), ("hosp-a", "site"), ("hosp-b", "site"), ("auditor", "keyholder"),
                ("hosp-x", "site"), ("hosp-revoked", "site"), ("rogue-server", "server"),
                ("old-coordinator", "server")]}
    foreign = enrol(root / "other-ca", root / "foreign", "hosp-a", "site")
    pki.revoke(root / "ca", parties["hosp-revoked"].cert_pem)
    pki.revoke(root / "ca", parties["old-coordinator"].cert_pem)
    return Study(root / "ca", parties, foreign, root / "other-ca")
