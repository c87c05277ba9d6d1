"""``fedsec ca`` and ``fedsec site``: files, printed facts, exit codes."""

from __future__ import annotations

import os
import stat

from cryptography import x509

from fedsec.cli import main


def test_enrolment_step_by_step_with_a_passphrase_file(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("FEDSEC_CA_PASSPHRASE", raising=False)
    secret = tmp_path / "pass.txt"
    secret.write_text("s3cret phrase\n")
    ca, site = tmp_path / "ca", tmp_path / "site"
    assert main(["ca", "init", str(ca), "--name", "Trial 7", "--passphrase-file", str(secret)]) == 0
    assert stat.S_IMODE(os.stat(ca / "ca.key").st_mode) == 0o600
    assert main(["site", "init", str(site), "--name", "hosp-a", "--role", "site"]) == 0
    capsys.readouterr()
    cert = tmp_path / "hosp-a.crt"
    assert main(["ca", "sign", str(ca), str(site / "hosp-a.csr"), "--out", str(cert), "--days", "90"]) == 2
    assert "bad_passphrase" in capsys.readouterr().err
    assert not cert.exists()
    monkeypatch.setenv("FEDSEC_CA_PASSPHRASE", "s3cret phrase")
    assert main(["ca", "sign", str(ca), str(site / "hosp-a.csr"), "--out", str(cert), "--days", "90"]) == 0
    out = capsys.readouterr().out
    assert "name hosp-a, role site, key sha256:" in out and "identity key sha256:" in out
    issued = x509.load_pem_x509_certificate(cert.read_bytes())
    assert f"{issued.serial_number:x}" in out
    assert main(["ca", "sign", str(ca), str(site / "hosp-a.csr"), "--out", str(cert)]) == 2
    assert main(["ca", "revoke", str(ca), str(cert)]) == 0
    assert "lists 1 certificate" in capsys.readouterr().out
    (tmp_path / "garbage.csr").write_bytes(b"hello")
    assert main(["ca", "sign", str(ca), str(tmp_path / "garbage.csr"), "--out", str(tmp_path / "g.crt")]) == 2
    assert "malformed" in capsys.readouterr().err
    assert main(["ca", "sign", str(ca), str(tmp_path / "missing.csr"), "--out", str(tmp_path / "m.crt")]) == 1


def test_site_check_exit_codes(tmp_path, capsys):
    policy = tmp_path / "SITE.toml"
    policy.write_text("[dp]\nmax_epsilon_run = 2\nmax_epsilon_lifetime = 4\n")
    plan = tmp_path / "plan.toml"
    plan.write_text("rounds = 3\n[dp]\ntarget_epsilon = 1.5\n")
    assert main(["site", "check", str(plan), "--policy", str(policy), "--state", str(tmp_path / "st")]) == 0
    assert "accepted" in capsys.readouterr().out
    plan.write_text("rounds = 3\n[dp]\ntarget_epsilon = 3\n")
    assert main(["site", "check", str(plan), "--policy", str(policy)]) == 3
    assert "dp.max_epsilon_run" in capsys.readouterr().err
    policy.write_text("[dp]\nmax_eps = 2\n")
    assert main(["site", "check", str(plan), "--policy", str(policy)]) == 2
    assert "dp.max_eps: unknown key" in capsys.readouterr().err
