"""``fedsec audit verify|show|reconcile``: exit codes and what they print."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from fedsec.secagg.keys import SigningKey

from fedsec.audit.log import AuditLog, fingerprint
from fedsec.cli import main


def _log(path: Path, actor: str = "coordinator", rounds: int = 3) -> SigningKey:
    key = SigningKey.generate()
    with AuditLog(path, actor=actor, key=key, run_id="r") as log:
        log.append("run_start", details={"config_sha256": "00" * 32})
        for r in range(1, rounds + 1):
            log.append("epsilon", round=r, details={"epsilon": 0.5 * r})
    return key


def test_verify_prints_count_signer_and_fingerprint(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    key = _log(tmp_path / "audit.db")
    assert main(["audit", "verify", str(tmp_path / "audit.db")]) == 0
    out = capsys.readouterr().out
    assert "4 events, signer coordinator" in out
    assert fingerprint(key.public) in out


def test_verify_exits_4_naming_the_row(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _log(tmp_path / "audit.db")
    db = sqlite3.connect(tmp_path / "audit.db")
    db.execute("UPDATE events SET round = 7 WHERE seq = 3")
    db.commit()
    db.close()
    assert main(["audit", "verify", str(tmp_path / "audit.db")]) == 4
    assert "row 3: hash does not match" in capsys.readouterr().err


def test_verify_of_no_log_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["audit", "verify", str(tmp_path / "none.db")]) == 2
    (tmp_path / "junk.db").write_text("not sqlite at all " * 100)
    assert main(["audit", "verify", str(tmp_path / "junk.db")]) == 2
    assert "not a fedsec audit log" in capsys.readouterr().err


def test_show_prints_a_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _log(tmp_path / "audit.db")
    assert main(["audit", "show", str(tmp_path / "audit.db")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["seq", "time", "(UTC)", "actor"] and len(lines) == 5
    assert main(["audit", "show", str(tmp_path / "audit.db"), "--round", "2", "--json"]) == 0
    events = json.loads(capsys.readouterr().out)
    assert [(e["seq"], e["action"], e["details"]) for e in events] == [(3, "epsilon", {"epsilon": 1.0})]


def test_reconcile_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _log(tmp_path / "c.db")
    site_key = _log(tmp_path / "s.db", actor="site-a")
    paths = [str(tmp_path / "c.db"), str(tmp_path / "s.db")]
    assert main(["audit", "reconcile", *paths, "--coordinator", "coordinator"]) == 0
    assert "0 mismatches between 2 logs" in capsys.readouterr().out
    with AuditLog(tmp_path / "s.db", actor="site-a", key=site_key, run_id="r") as log:
        log.append("epsilon", round=4, details={"epsilon": 2.0})
    assert main(["audit", "reconcile", *paths, "--coordinator", "coordinator"]) == 4
    assert "site-a row 5 (round 4): epsilon 2 recorded, none in coordinator's ledger" in \
        capsys.readouterr().out
