"""The party audit's writer is woken once per batch, not once per call: a message row queued behind
others wakes nobody; the first row of a batch (its linger clock), a row or a head someone waits
for, and MAX_LINGERING rows each wake it. The durability rule and the order of rows are those of
test_audit_group_commit.py, searched here over any sequence of queued rows, events and heads."""

from __future__ import annotations

import time

from fedsec.secagg.keys import SigningKey
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsec.audit.log import read_events
from fedsec.audit.verify import verify_log
from fedsec.network.party_audit import LOG, MAX_LINGERING, PartyAudit
from tests.fedsec.network.test_audit_group_commit import _committed


def _counting(audit: PartyAudit) -> list[int]:
    """Count the writer's wake-ups from now on (the condition's notify calls)."""
    count = [0]
    notify = audit._cond.notify  # noqa: SLF001 - the wake-ups are the point

    def counted(n: int = 1) -> None:
        count[0] += 1
        notify(n)

    audit._cond.notify = counted  # noqa: SLF001
    return count


def test_queued_rows_wake_the_writer_once_a_batch(tmp_path):
    audit = PartyAudit(tmp_path, actor="site-a", key=SigningKey.generate(), run_id="r", linger=10.0)
    wakes = _counting(audit)
    for i in range(50):
        audit.sent_then_received("coordinator", "answer", bytes([i]), b"job", round=1)
    assert wakes[0] == 1  # the first row started the batch's clock; the 49 others woke nobody
    head = audit.head()  # waited for: wakes the writer, which commits the 50 rows before the head
    assert wakes[0] == 2
    assert head["seq"] == 50 and _committed(tmp_path / LOG) == 50
    audit.event("round", round=1)
    assert wakes[0] == 3 and _committed(tmp_path / LOG) == 51
    audit.close()
    assert verify_log(tmp_path / LOG).events == 51


def test_max_lingering_rows_are_committed_without_waiting_out_the_linger(tmp_path):
    audit = PartyAudit(tmp_path, actor="coordinator", key=SigningKey.generate(), run_id="r", linger=10.0)
    for i in range(MAX_LINGERING):
        audit.received_then_sent("site-a", "answer", i.to_bytes(4, "big"), b"job", round=1)
    end = time.monotonic() + 8.0  # well below the 10 s linger
    while _committed(tmp_path / LOG) < MAX_LINGERING and time.monotonic() < end:
        time.sleep(0.01)
    assert _committed(tmp_path / LOG) == MAX_LINGERING
    audit.close()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from(["row", "ack", "event", "head"]), min_size=1, max_size=25),
       st.sampled_from([0.0, 0.01, 10.0]))
def test_any_sequence_keeps_its_order_and_every_head_names_committed_rows(tmp_path_factory, steps, linger):
    tmp = tmp_path_factory.mktemp("audit")
    audit = PartyAudit(tmp, actor="site-a", key=SigningKey.generate(), run_id="r", linger=linger)
    expected: list[str] = []
    for i, step in enumerate(steps):
        if step == "row":
            audit.sent_then_received("coordinator", "answer", i.to_bytes(2, "big"), b"job", round=i)
            expected.append("call")
        elif step == "ack":
            audit.ack({"actor": "coordinator", "fingerprint": "f" * 64, "seq": i + 1, "hash": "0" * 64},
                      round=i)
            expected.append("ack")
        elif step == "event":
            audit.event("round", round=i)
            expected.append("round")
            assert _committed(tmp / LOG) == len(expected)  # it and every row before it
        else:
            head = audit.head()
            assert head["seq"] == len(expected) == _committed(tmp / LOG)
    audit.close()
    events = read_events(tmp / LOG)
    assert [e.action for e in events] == expected
    assert [e.round for e in events] == [i for i, step in enumerate(steps) if step != "head"]
    assert verify_log(tmp / LOG).events == len(expected)
