"""verify_peer's cache of verified certificates never admits what a fresh check would refuse.

Adversary: an enrolled party whose certificate was admitted before (so it is cached) and that is
then revoked, expires, presents it for another role or roster, or alters its bytes (a forged
certificate with the admitted one's name). Each call goes through the unmodified verify_peer."""

from __future__ import annotations

import base64
import datetime as dt

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from fedsec.network import pki
from fedsec.network.errors import PeerRejected

from .conftest import enrol


def test_a_cached_certificate_is_still_checked_for_time_revocation_role_and_roster(study, tmp_path):
    party = enrol(study.ca_dir, tmp_path / "late", "hosp-late", "site")
    trust = study.trust()
    pem = party.cert_pem
    peer = pki.verify_peer(pem, trust=trust, roles=("site",), roster={"hosp-late"})
    assert peer.name == "hosp-late" and pki.verify_peer(pem, trust=trust, roles=("site",)) == peer
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=20 * 365)
    with pytest.raises(PeerRejected) as caught:
        pki.verify_peer(pem, trust=trust, roles=("site",), now=later)
    assert caught.value.reason == "expired"
    for roles, roster, reason in [(("server",), None, "role"), (("site",), {"hosp-a"}, "roster")]:
        with pytest.raises(PeerRejected) as caught:
            pki.verify_peer(pem, trust=trust, roles=roles, roster=roster)
        assert caught.value.reason == reason
    pki.revoke(study.ca_dir, pem)
    with pytest.raises(PeerRejected) as caught:
        pki.verify_peer(pem, trust=trust, roles=("site",))
    assert caught.value.reason == "revoked"


def test_altered_bytes_of_an_admitted_certificate_are_verified_afresh(study):
    trust = study.trust()
    pem = study.parties["hosp-a"].cert_pem
    pki.verify_peer(pem, trust=trust, roles=("site",))
    der = bytearray(x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER))
    rejected = 0
    for index in range(40, len(der), max(1, len(der) // 60)):  # flip bytes across the certificate
        forged = bytearray(der)
        forged[index] ^= 0x01
        text = b"-----BEGIN CERTIFICATE-----\n" + base64.encodebytes(bytes(forged)) + \
            b"-----END CERTIFICATE-----\n"
        try:
            pki.verify_peer(text, trust=trust, roles=("site",))
        except PeerRejected:
            rejected += 1
            continue
        raise AssertionError(f"a certificate altered at byte {index} was admitted")
    assert rejected > 30
    with pytest.raises(PeerRejected) as caught:  # the foreign CA's certificate of the same name
        pki.verify_peer(study.foreign.cert_pem, trust=trust, roles=("site",))
    assert caught.value.reason == "chain"
