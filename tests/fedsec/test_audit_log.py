"""The audit log against a party that edits its database file: every edit is named by row."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest
from fedsec.secagg.keys import SigningKey
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsec.audit.log import AuditLog, Event, canonical, read_events, read_header
from fedsec.audit.verify import LogBroken, check_ack, verify_log

FIELDS = ("time", "actor", "action", "run_id", "round", "stage", "details", "peer_ref", "key_fp",
          "prev_hash", "hash", "signature")


def _log(path: Path, rows: int = 6, key: SigningKey | None = None) -> SigningKey:
    key = key or SigningKey.generate()
    with AuditLog(path, actor="site-a", key=key, run_id="run-1") as log:
        log.append("run_start", details={"config_sha256": "ab" * 32})
        for r in range(1, rows):
            log.append("round", round=r, stage="released", details={"epsilon": 0.1 * r, "bytes": 100 * r})
    return key


def _sql(path: Path, statement: str, *args: object) -> None:
    db = sqlite3.connect(path)
    db.execute(statement, args)
    db.commit()
    db.close()


def _broken(path: Path) -> LogBroken:
    with pytest.raises(LogBroken) as caught:
        verify_log(path)
    return caught.value


def test_an_untouched_log_verifies_with_its_signer(tmp_path: Path) -> None:
    key = _log(tmp_path / "audit.db")
    ok = verify_log(tmp_path / "audit.db")
    assert ok.events == 6 and ok.actor == "site-a"
    assert ok.fingerprint == hashlib.sha256(key.public).hexdigest()
    assert ok.head.seq == 6 and ok.head.hash == read_events(tmp_path / "audit.db")[-1].hash
    assert read_header(tmp_path / "audit.db")["public_key"] == key.public.hex()
    events = read_events(tmp_path / "audit.db")
    assert [e.seq for e in events] == [1, 2, 3, 4, 5, 6]
    assert all(b.prev_hash == a.hash for a, b in zip(events, events[1:]))
    assert [e.seq for e in read_events(tmp_path / "audit.db", round=3)] == [4]


def test_reopening_continues_the_chain_and_refuses_another_key(tmp_path: Path) -> None:
    key = _log(tmp_path / "audit.db", rows=2)
    with AuditLog(tmp_path / "audit.db", actor="site-a", key=key, run_id="run-1") as log:
        assert log.append("resume").seq == 3
    assert verify_log(tmp_path / "audit.db").events == 3
    with pytest.raises(ValueError, match="path: .* another actor or key"):
        AuditLog(tmp_path / "audit.db", actor="site-a", key=SigningKey.generate(), run_id="run-1")


def test_bad_input_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    key = _log(tmp_path / "audit.db", rows=1)
    with AuditLog(tmp_path / "audit.db", actor="site-a", key=key, run_id="run-1") as log:
        with pytest.raises(ValueError, match="details"):
            log.append("x", details={"v": float("nan")})
        with pytest.raises(ValueError, match="details"):
            log.append("x", details={"v": object()})
        with pytest.raises(ValueError, match="action"):
            log.append("")
    assert verify_log(tmp_path / "audit.db").events == 1
    with pytest.raises(ValueError, match="path"):
        AuditLog(tmp_path / "nowhere" / "audit.db", actor="a", key=key, run_id="r")
    with pytest.raises(ValueError, match="path: no file"):
        verify_log(tmp_path / "missing.db")


def test_a_flipped_byte_is_named(tmp_path: Path) -> None:
    _log(tmp_path / "audit.db")
    details = read_events(tmp_path / "audit.db")[3].details
    flipped = details.replace("0.30000000000000004", "0.20000000000000004")
    assert flipped != details
    _sql(tmp_path / "audit.db", "UPDATE events SET details = ? WHERE seq = 4", flipped)
    broken = _broken(tmp_path / "audit.db")
    assert (broken.seq, broken.reason) == (4, "hash does not match the row's contents")


def test_a_deleted_middle_row_is_a_sequence_gap(tmp_path: Path) -> None:
    _log(tmp_path / "audit.db")
    _sql(tmp_path / "audit.db", "DELETE FROM events WHERE seq = 3")
    broken = _broken(tmp_path / "audit.db")
    assert broken.seq == 4 and "sequence gap: expected row 3" in broken.reason


def test_renumbering_after_a_deletion_breaks_the_chain(tmp_path: Path) -> None:
    _log(tmp_path / "audit.db")
    _sql(tmp_path / "audit.db", "DELETE FROM events WHERE seq = 3")
    _sql(tmp_path / "audit.db", "UPDATE events SET seq = seq - 1 WHERE seq > 3")
    broken = _broken(tmp_path / "audit.db")
    assert broken.seq == 3 and broken.reason.startswith("hash chain broken")


def test_bad_json_is_named(tmp_path: Path) -> None:
    _log(tmp_path / "audit.db")
    _sql(tmp_path / "audit.db", "UPDATE events SET details = '{\"epsilon\": ' WHERE seq = 2")
    assert (_broken(tmp_path / "audit.db").seq, _broken(tmp_path / "audit.db").reason) == (
        2, "bad JSON in details")


def _resign(path: Path, seq: int, key: SigningKey, *, claim_fp: str | None) -> None:
    """Rewrite row ``seq`` (new details) with a correct hash, signed by ``key``; the rows after it
    are re-chained and re-signed too (the strongest forger without the party's key)."""
    events = read_events(path)
    fp = claim_fp or hashlib.sha256(key.public).hexdigest()
    prev = events[seq - 2].hash if seq > 1 else events[0].prev_hash
    db = sqlite3.connect(path)
    for e in events[seq - 1:]:
        details = json.dumps({"forged": True}, separators=(",", ":")) if e.seq == seq else e.details
        digest = hashlib.sha256(canonical(e.seq, e.time, e.actor, e.action, e.run_id, e.round, e.stage,
                                          details, e.peer_ref, fp, prev)).digest()
        db.execute("UPDATE events SET details = ?, key_fp = ?, prev_hash = ?, hash = ?, signature = ? "
                   "WHERE seq = ?", (details, fp, prev, digest.hex(), key.sign(digest).hex(), e.seq))
        prev = digest.hex()
    db.commit()
    db.close()


def test_a_row_resigned_with_another_key_is_named(tmp_path: Path) -> None:
    _log(tmp_path / "audit.db")
    _resign(tmp_path / "audit.db", 3, SigningKey.generate(), claim_fp=None)
    broken = _broken(tmp_path / "audit.db")
    assert broken.seq == 3 and broken.reason.startswith("signed by another key")


def test_a_row_resigned_claiming_the_party_fingerprint_fails_its_signature(tmp_path: Path) -> None:
    _log(tmp_path / "audit.db")
    header_fp = read_header(tmp_path / "audit.db")["fingerprint"]
    _resign(tmp_path / "audit.db", 5, SigningKey.generate(), claim_fp=header_fp)
    broken = _broken(tmp_path / "audit.db")
    assert (broken.seq, broken.reason) == (5, "signature does not verify with the header's key")


def test_the_party_itself_can_resign_so_rewrites_need_a_peer_ack(tmp_path: Path) -> None:
    """The signer can rewrite its own log (verify passes); the ack a peer holds catches it."""
    key = _log(tmp_path / "audit.db")
    head = verify_log(tmp_path / "audit.db").head
    _resign(tmp_path / "audit.db", 2, key, claim_fp=None)
    assert verify_log(tmp_path / "audit.db").events == 6
    with pytest.raises(LogBroken, match="row 6: differs from the hash a peer acknowledged"):
        check_ack(tmp_path / "audit.db", head)


def test_a_dropped_tail_verifies_alone_but_not_against_a_peer_ack(tmp_path: Path) -> None:
    _log(tmp_path / "audit.db")
    head = verify_log(tmp_path / "audit.db").head
    _sql(tmp_path / "audit.db", "DELETE FROM events WHERE seq >= 5")
    assert verify_log(tmp_path / "audit.db").events == 4
    with pytest.raises(LogBroken, match="row 6: missing: a peer acknowledged row 6"):
        check_ack(tmp_path / "audit.db", head)


def test_a_replaced_header_key_changes_the_fingerprint(tmp_path: Path) -> None:
    """Swapping the header's key: the fingerprint check, then row 1 (the rows name the old key)."""
    key = _log(tmp_path / "audit.db")
    other = SigningKey.generate()
    _sql(tmp_path / "audit.db", "UPDATE header SET value = ? WHERE key = 'public_key'", other.public.hex())
    broken = _broken(tmp_path / "audit.db")
    assert broken.seq == 0 and broken.reason == "fingerprint does not match public_key"
    _sql(tmp_path / "audit.db", "UPDATE header SET value = ? WHERE key = 'fingerprint'",
         hashlib.sha256(other.public).hexdigest())
    broken = _broken(tmp_path / "audit.db")
    assert broken.seq == 1 and broken.reason.startswith("signed by another key")
    assert hashlib.sha256(key.public).hexdigest() != hashlib.sha256(other.public).hexdigest()


def _mutate(value: object, field: str) -> object:
    if field == "round":
        return 99 if value is None else int(value) + 1
    if field in ("stage", "peer_ref") and value is None:
        return "x"
    if field == "details":
        return '{"epsilon":9}'
    text = str(value)
    return text[:-1] + ("0" if text[-1] != "0" else "1")


@settings(max_examples=25)
@given(row=st.integers(1, 6), field=st.sampled_from(FIELDS), data=st.data())
def test_any_single_field_edit_is_named_at_its_row(tmp_path_factory: pytest.TempPathFactory, row: int,
                                                   field: str, data: st.DataObject) -> None:
    """A searching adversary: change one field of one row (any field, any row); verify names it."""
    path = tmp_path_factory.mktemp("log") / "audit.db"
    _log(path)
    event = read_events(path)[row - 1]
    new = _mutate(getattr(event, field), field)
    assert new != getattr(event, field)
    _sql(path, f"UPDATE events SET {field} = ? WHERE seq = ?", new, row)
    assert _broken(path).seq == row


def test_events_are_frozen_records() -> None:
    e = Event(1, "t", "a", "x", "r", None, None, "{}", None, "f", "p", "h", "s")
    assert e.payload() == {}
