"""``fedsec audit verify --ca``: the log's signing key must be the identity key a certificate of
the study's CA binds to the log's actor.

Adversary: anyone who writes a log under a party's name (a forger with a fresh key, another
enrolled party with its own key, or a party of another study whose CA enrolled the same name) and
places any certificate beside it. Searched over every (signing key, certificate) pair; only the
party's own key with its own certificate passes.
"""

from __future__ import annotations

import itertools
import sqlite3

import pytest
from fedsec.secagg.keys import SigningKey

from fedsec.audit.log import read_header
from fedsec.audit.signer import IDENTITY_OID
from fedsec.cli import main
from fedsec.network import demo, pki
from fedsec.network.party_audit import LOG, PartyAudit
from fedsec.network.site import load_identity


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("signer")
    pki.init_ca(root / "ca", name="study")
    pki.init_ca(root / "other-ca", name="another study")
    parties = {name: demo.enrol(root / "ca", root / name, name, "site")
               for name in ("hospital-a", "hospital-b")}
    parties["foreign"] = demo.enrol(root / "other-ca", root / "foreign", "hospital-a", "site")
    return root, parties


def _log(folder, actor, key, certificate):
    folder.mkdir(parents=True)
    audit = PartyAudit(folder, actor=actor, key=key, run_id="run", certificate=certificate)
    audit.event("plan_accepted", details={"sha256": "ab" * 32})
    audit.close()
    return folder / LOG


def test_the_cli_shares_the_identity_extension_with_the_pki():
    assert IDENTITY_OID == pki.IDENTITY_OID


def test_a_party_s_own_log_is_bound_and_says_so(study, tmp_path, capsys):
    root, parties = study
    a = parties["hospital-a"]
    path = _log(tmp_path / "a", "hospital-a", load_identity(a.identity), a.cert.read_bytes())
    assert (tmp_path / "a" / "hospital-a.crt").read_bytes() == a.cert.read_bytes()
    assert main(["audit", "verify", str(path), "--ca", str(root / "ca" / "ca.crt")]) == 0
    assert "bound to it by the CA's certificate" in capsys.readouterr().out
    assert main(["audit", "verify", str(path)]) == 0  # without --ca: the chain only


def test_every_forged_signer_and_certificate_fails_with_exit_4(study, tmp_path, capsys):
    root, parties = study
    keys = {"own": load_identity(parties["hospital-a"].identity),
            "other party's": load_identity(parties["hospital-b"].identity),
            "fresh": SigningKey.generate(), "foreign study's": load_identity(parties["foreign"].identity)}
    certs = {"own": parties["hospital-a"].cert, "other party's": parties["hospital-b"].cert,
             "foreign study's": parties["foreign"].cert}
    pairs = itertools.product(keys.items(), certs.items())
    for case, ((key_name, key), (cert_name, cert)) in enumerate(pairs):
        path = _log(tmp_path / str(case), "hospital-a", key, None)
        code = main(["audit", "verify", str(path), "--ca", str(root / "ca" / "ca.crt"), "--cert", str(cert)])
        err = capsys.readouterr().err
        expected = 0 if (key_name, cert_name) == ("own", "own") else 4
        assert code == expected, (key_name, cert_name, err)
        if expected:
            assert "header:" in err


def test_a_log_created_outside_the_certificate_s_validity_fails(study, tmp_path):
    root, parties = study
    a = parties["hospital-a"]
    path = _log(tmp_path / "a", "hospital-a", load_identity(a.identity), a.cert.read_bytes())
    db = sqlite3.connect(path)
    db.execute("UPDATE header SET value = '2001-01-01T00:00:00+00:00' WHERE key = 'created'")
    db.commit()
    db.close()
    assert read_header(path)["created"].startswith("2001")
    assert main(["audit", "verify", str(path), "--ca", str(root / "ca" / "ca.crt")]) == 4


def test_a_missing_certificate_or_cert_without_ca_is_a_bad_argument(study, tmp_path, capsys):
    root, parties = study
    path = _log(tmp_path / "a", "hospital-a", load_identity(parties["hospital-a"].identity), None)
    assert main(["audit", "verify", str(path), "--ca", str(root / "ca" / "ca.crt")]) == 2
    assert "--cert" in capsys.readouterr().err
    assert main(["audit", "verify", str(path), "--cert", str(parties["hospital-a"].cert)]) == 2
    assert "--cert: only with --ca" in capsys.readouterr().err
    assert main(["audit", "verify", str(path), "--ca", str(tmp_path / "none.crt")]) == 2
