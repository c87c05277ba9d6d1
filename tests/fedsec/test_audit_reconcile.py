"""Reconciling a coordinator's and sites' logs: synthetic pairs, honest and with one side lying."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest
from fedsec.secagg.keys import SigningKey
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsec.audit.log import AuditLog, read_events
from fedsec.audit.reconcile import reconcile, reconcile_paths
from fedsec.audit.verify import LogBroken

ROUNDS = 3


def _digest(round_: int, who: str) -> str:
    return hashlib.sha256(f"{who}:{round_}".encode()).hexdigest()


def _pair(tmp: Path, *, lie: tuple[str, int, str] | None = None, ack: bool = True) -> tuple[Path, Path]:
    """A coordinator and one site over ROUNDS rounds; ``lie`` = (party, round, what) changes one
    of that party's records: ``size``, ``digest``, ``skip`` (no record) or ``epsilon``."""
    coord = AuditLog(tmp / "coord.db", actor="coordinator", key=SigningKey.generate(), run_id="s")
    site = AuditLog(tmp / "site.db", actor="site-a", key=SigningKey.generate(), run_id="s")

    def bent(party: str, r: int, what: str) -> bool:
        return lie == (party, r, what)

    for r in range(1, ROUNDS + 1):
        eps = 0.25 * r
        coord.append("epsilon", round=r, details={"epsilon": eps, "party": "site-a"})
        if not bent("site", r, "skip"):
            site.append("send", round=r, details={
                "to": "coordinator", "kind": "upload", "size": 999 if bent("site", r, "size") else 640,
                "sha256": _digest(r + 100, "site-a") if bent("site", r, "digest") else _digest(r, "site-a")})
        if not bent("coord", r, "skip"):
            coord.append("receive", round=r, details={"from": "site-a", "kind": "upload", "size": 640,
                                                      "sha256": _digest(r, "site-a")})
        coord.append("send", round=r, details={"to": "site-a", "kind": "model", "size": 64,
                                               "sha256": _digest(r, "model")})
        site.append("receive", round=r, details={"from": "coordinator", "kind": "model", "size": 64,
                                                 "sha256": _digest(r, "model")})
        site.append("epsilon", round=r, details={"epsilon": eps * 1.5 if bent("site", r, "epsilon")
                                                  else eps})
        if ack:
            coord.ack(site.head(), round=r)
    coord.close()
    site.close()
    return tmp / "coord.db", tmp / "site.db"


def _logs(coord: Path, site: Path) -> dict[str, list]:
    return {"coordinator": read_events(coord), "site-a": read_events(site)}


def test_honest_logs_agree(tmp_path: Path) -> None:
    coord, site = _pair(tmp_path)
    assert reconcile_paths([coord, site], coordinator="coordinator") == []


@pytest.mark.parametrize("what", ["size", "digest", "skip", "epsilon"])
def test_a_site_that_misrecords_one_round_is_listed(tmp_path: Path, what: str) -> None:
    coord, site = _pair(tmp_path, lie=("site", 2, what))
    found = reconcile(_logs(coord, site), coordinator="coordinator")
    assert len(found) == 1 and found[0].round == 2
    expected = {"size": "received 640 bytes, site-a row", "digest": "digest differs",
                "skip": "received from site-a, which records no such send",
                "epsilon": "coordinator's ledger says 0.5"}[what]
    assert expected in found[0].what
    assert found[0].actor == ("site-a" if what == "epsilon" else "coordinator")


def test_a_coordinator_that_denies_a_receipt_is_listed(tmp_path: Path) -> None:
    coord, site = _pair(tmp_path, lie=("coord", 3, "skip"))
    found = reconcile(_logs(coord, site), coordinator="coordinator")
    assert [(m.actor, m.round) for m in found] == [("site-a", 3)]
    assert "sent to coordinator, which records no such receipt" in found[0].what


def test_a_site_that_drops_its_tail_is_caught_by_the_coordinators_acks(tmp_path: Path) -> None:
    coord, site = _pair(tmp_path)
    db = sqlite3.connect(site)
    db.execute("DELETE FROM events WHERE round = 3")
    db.commit()
    db.close()
    found = reconcile_paths([coord, site], coordinator="coordinator")
    missing = [m for m in found if "tail truncated" in m.what]
    assert missing and missing[0].actor == "site-a" and missing[0].seq == 9
    assert any("no such receipt" in m.what or "no such send" in m.what for m in found)


def test_a_broken_log_stops_reconcile_at_its_row(tmp_path: Path) -> None:
    coord, site = _pair(tmp_path)
    db = sqlite3.connect(site)
    db.execute("UPDATE events SET details = '{\"epsilon\":0.1}' WHERE seq = 3")
    db.commit()
    db.close()
    with pytest.raises(LogBroken, match="row 3"):
        reconcile_paths([coord, site], coordinator="coordinator")


def test_bad_arguments_are_named(tmp_path: Path) -> None:
    coord, site = _pair(tmp_path, ack=False)
    with pytest.raises(ValueError, match="coordinator"):
        reconcile(_logs(coord, site), coordinator="nobody")
    with pytest.raises(ValueError, match="paths"):
        reconcile_paths([coord], coordinator="coordinator")
    with pytest.raises(ValueError, match="paths: two logs"):
        reconcile_paths([coord, coord], coordinator="coordinator")


@settings(max_examples=12)
@given(party=st.sampled_from(["site", "coord"]), round_=st.integers(1, ROUNDS),
       what=st.sampled_from(["size", "digest", "skip", "epsilon"]))
def test_every_single_lie_is_found_in_its_round(tmp_path_factory: pytest.TempPathFactory, party: str,
                                                round_: int, what: str) -> None:
    """A searching liar: any one record of either party, any round, any kind of lie."""
    coord, site = _pair(tmp_path_factory.mktemp("pair"), lie=(party, round_, what))
    found = reconcile(_logs(coord, site), coordinator="coordinator")
    honest = party == "coord" and what != "skip"  # the coordinator only lies by omission here
    assert (found == []) if honest else [m.round for m in found] == [round_]
