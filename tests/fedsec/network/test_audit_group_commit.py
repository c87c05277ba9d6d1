"""The party audit's group commit (durability rule): message rows are queued, but nothing that
depends on a row (a head handed to a peer, an event the caller waits for) leaves before it is
committed; a batch that fails to commit stops the log instead of skipping rows."""

from __future__ import annotations

import sqlite3
import threading

import pytest
from fedsec.secagg.keys import SigningKey

from fedsec.audit.log import read_events
from fedsec.audit.verify import verify_log
from fedsec.network.party_audit import LOG, PartyAudit


def _committed(path) -> int:
    """Rows another connection sees (committed to the WAL, synchronous FULL)."""
    db = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)
    try:
        return db.execute("SELECT COUNT(*) FROM events").fetchone()[0]
    finally:
        db.close()


def test_a_head_is_handed_out_only_after_every_row_before_it_is_committed(tmp_path):
    audit = PartyAudit(tmp_path, actor="coordinator", key=SigningKey.generate(), run_id="r")
    calls = 40

    def serve(k: int) -> None:
        for i in range(calls):
            audit.received_then_sent(f"site-{k}", "answer", bytes([k, i]), b"reply" * i, round=i)

    threads = [threading.Thread(target=serve, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    head = audit.head()
    assert head["seq"] == 4 * calls  # one row a call
    assert _committed(tmp_path / LOG) >= head["seq"]  # nothing the head names is still in memory
    audit.event("model_released", round=1, details={"sha256": "0" * 64})
    assert _committed(tmp_path / LOG) == 4 * calls + 1
    audit.close()
    events = read_events(tmp_path / LOG)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    for k in range(4):  # each thread's rows in the order it made them
        mine = [e.round for e in events if e.action == "served" and e.payload()["from"] == f"site-{k}"]
        assert mine == list(range(calls))
    assert verify_log(tmp_path / LOG).events == len(events)


def test_a_batch_that_fails_to_commit_stops_the_log(tmp_path):
    audit = PartyAudit(tmp_path, actor="site-a", key=SigningKey.generate(), run_id="r")
    audit.sent_then_received("coordinator", "poll", b"", b"job")
    assert audit.head()["seq"] == 1
    audit._call(audit.log._db.close)  # the database goes away under the writer (its own thread)
    audit.sent_then_received("coordinator", "answer", b"x", b"job")  # queued: the caller goes on
    with pytest.raises(sqlite3.ProgrammingError):
        audit.head()
    with pytest.raises(sqlite3.ProgrammingError):
        audit.event("epsilon", details={"epsilon": 1.0})
    with pytest.raises(sqlite3.ProgrammingError):
        audit.sent_then_received("coordinator", "answer", b"y", b"job")
    with pytest.raises(sqlite3.ProgrammingError):
        audit.close()
    assert _committed(tmp_path / LOG) == 1


def test_message_rows_of_many_calls_share_a_transaction_and_reach_the_disk_without_an_event(tmp_path,
                                                                                              monkeypatch):
    """A site makes one call at a time: its message rows linger (at most ``linger`` seconds) for
    the next ones, so a run of calls is a few transactions, not one per call; and they are on disk
    without any event asking for them."""
    audit = PartyAudit(tmp_path, actor="site-a", key=SigningKey.generate(), run_id="r", linger=0.5)
    batches: list[int] = []
    append = audit.log.append_many
    monkeypatch.setattr(audit.log, "append_many", lambda items: batches.append(len(items)) or append(items))
    calls = 60
    for i in range(calls):
        audit.sent_then_received("coordinator", "answer", bytes([i]), b"job", round=1)
    for _ in range(400):  # no event, no head: the lingering rows commit on their own
        if _committed(tmp_path / LOG) == calls:
            break
        threading.Event().wait(0.05)
    assert _committed(tmp_path / LOG) == calls
    assert sum(batches) == calls and len(batches) < calls
    # an event does not wait out the linger: it and every row before it commit at once
    audit.sent_then_received("coordinator", "answer", b"x", b"job", round=2)
    audit.event("epsilon", round=2, details={"epsilon": 1.0})
    assert _committed(tmp_path / LOG) == calls + 2
    audit.close()
    assert verify_log(tmp_path / LOG).events == calls + 2


def test_the_linger_is_bounded():
    for bad in (-0.1, 11.0):
        with pytest.raises(ValueError, match="linger"):
            PartyAudit("/nonexistent", actor="a", key=SigningKey.generate(), run_id="r", linger=bad)
