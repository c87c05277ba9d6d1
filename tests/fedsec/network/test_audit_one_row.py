"""One audit row a call at each end (``call`` at the caller, ``served`` at the server): the same
facts as the two rows a call had before, reconciled against a peer's rows of either format, and a
party that lies about any call in its own (signed) log is named by ``fedsec audit reconcile``.

Adversary: one party (a site or the coordinator) writes its own log with the unmodified
:class:`PartyAudit`, but records a call other than the one that took place (another request or
reply, another round or kind, a call left out, a call that never happened); the other party is
honest. Logs of either format (one row a call, or ``send``/``receive`` rows as before) are mixed.
"""

from __future__ import annotations

from pathlib import Path

from fedsec.secagg.keys import SigningKey
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsec.audit.log import AuditLog, read_events
from fedsec.audit.reconcile import reconcile, reconcile_paths
from fedsec.audit.verify import verify_log
from fedsec.network.party_audit import LOG, PartyAudit, message

Call = tuple[str, bytes, bytes, int]
"""(topic, request, reply, round)"""
CALLS: list[Call] = [("plan", b"", b"the plan", 0), ("answer", b"masked input", b"next job", 1),
                     ("answer", b"shares", b"unmask", 1), ("answer", b"sums", b"wait", 2),
                     ("poll", b"", b"train job", 2)]


class OldLog:
    """A party's log as deployed parties wrote it before one row a call: ``send`` and ``receive``."""

    def __init__(self, directory: Path, actor: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.log = AuditLog(directory / LOG, actor=actor, key=SigningKey.generate(), run_id="s")

    def sent_then_received(self, peer: str, kind: str, request: bytes, reply: bytes, *, round: int) -> None:
        self.log.append("send", round=round, details=message("to", peer, kind, request))
        self.log.append("receive", round=round, details=message("from", peer, kind + ".reply", reply))

    def received_then_sent(self, peer: str, kind: str, request: bytes, reply: bytes, *, round: int) -> None:
        self.log.append("receive", round=round, details=message("from", peer, kind, request))
        self.log.append("send", round=round, details=message("to", peer, kind + ".reply", reply))

    def close(self) -> None:
        self.log.close()


def _party(directory: Path, actor: str, old: bool) -> PartyAudit | OldLog:
    if old:
        return OldLog(directory, actor)
    directory.mkdir(parents=True, exist_ok=True)
    return PartyAudit(directory, actor=actor, key=SigningKey.generate(), run_id="s", linger=0)


def _write(tmp: Path, site_calls: list[Call], coordinator_calls: list[Call], *, old_site: bool = False,
           old_coordinator: bool = False) -> tuple[Path, Path]:
    site = _party(tmp / "site", "site-a", old_site)
    coordinator = _party(tmp / "coordinator", "coordinator", old_coordinator)
    for topic, request, reply, round_ in site_calls:
        site.sent_then_received("coordinator", topic, request, reply, round=round_)
    for topic, request, reply, round_ in coordinator_calls:
        coordinator.received_then_sent("site-a", topic, request, reply, round=round_)
    site.close()
    coordinator.close()
    return tmp / "site" / LOG, tmp / "coordinator" / LOG


def test_one_row_a_call_at_each_end_and_the_logs_reconcile(tmp_path: Path) -> None:
    site, coordinator = _write(tmp_path, CALLS, CALLS)
    for path, action in ((site, "call"), (coordinator, "served")):
        events = read_events(path)
        assert [e.action for e in events] == [action] * len(CALLS)
        assert verify_log(path).events == len(CALLS)
        assert [(e.payload()["kind"], e.payload()["size"], e.payload()["reply"]["size"], e.round)
                for e in events] == [(t, len(q), len(r), n) for t, q, r, n in CALLS]
    assert reconcile_paths([site, coordinator], coordinator="coordinator") == []


def test_a_log_of_one_row_a_call_reconciles_with_an_older_log_of_two(tmp_path: Path) -> None:
    for k, (old_site, old_coordinator) in enumerate([(True, False), (False, True), (True, True)]):
        site, coordinator = _write(tmp_path / str(k), CALLS, CALLS, old_site=old_site,
                                   old_coordinator=old_coordinator)
        assert verify_log(site).events == len(CALLS) * (2 if old_site else 1)
        assert reconcile_paths([site, coordinator], coordinator="coordinator") == []


LIES = ("request", "reply", "round", "kind", "omit", "invent")


def _lie(calls: list[Call], index: int, how: str) -> list[Call]:
    calls = list(calls)
    topic, request, reply, round_ = calls[index]
    if how == "request":
        calls[index] = (topic, request + b"!", reply, round_)
    elif how == "reply":
        calls[index] = (topic, request, reply[:-1] + b"?", round_)
    elif how == "round":
        calls[index] = (topic, request, reply, round_ + 1)
    elif how == "kind":
        calls[index] = ("refuse", request, reply, round_)
    elif how == "omit":
        del calls[index]
    else:
        calls.insert(index, ("answer", b"never sent", b"never answered", round_))
    return calls


@settings(max_examples=30, deadline=None)
@given(liar=st.sampled_from(["site", "coordinator"]), index=st.integers(0, len(CALLS) - 1),
       how=st.sampled_from(LIES), old_site=st.booleans(), old_coordinator=st.booleans())
def test_a_party_that_records_any_call_falsely_is_listed(tmp_path_factory, liar: str, index: int, how: str,
                                                        old_site: bool, old_coordinator: bool) -> None:
    tmp = tmp_path_factory.mktemp("lie")
    lied = _lie(CALLS, index, how)
    site_calls, coordinator_calls = (lied, CALLS) if liar == "site" else (CALLS, lied)
    site, coordinator = _write(tmp, site_calls, coordinator_calls, old_site=old_site,
                               old_coordinator=old_coordinator)
    logs = {"site-a": read_events(site), "coordinator": read_events(coordinator)}
    found = reconcile(logs, coordinator="coordinator")
    assert found, (liar, index, how)
    rounds = {CALLS[index][3], CALLS[index][3] + 1}
    assert {m.round for m in found} <= rounds
    # every mismatch points at a row of one of the two logs that records the call in question
    assert all(m.actor in logs and 1 <= m.seq <= len(logs[m.actor]) for m in found)


def test_a_call_row_whose_reply_field_is_missing_or_malformed_is_a_mismatch(tmp_path: Path) -> None:
    """A lying party's row need not come from :class:`PartyAudit`: a ``call`` row whose ``reply``
    is not an object is read as a reply of unknown size and digest, and listed."""
    site = AuditLog(tmp_path / "site.db", actor="site-a", key=SigningKey.generate(), run_id="s")
    coordinator = _party(tmp_path / "c", "coordinator", old=False)
    site.append("call", round=1, details={**message("to", "coordinator", "answer", b"x"), "reply": "lost"})
    coordinator.received_then_sent("site-a", "answer", b"x", b"job", round=1)
    site.close()
    coordinator.close()
    found = reconcile({"site-a": read_events(tmp_path / "site.db"),
                       "coordinator": read_events(tmp_path / "c" / LOG)}, coordinator="coordinator")
    assert [(m.actor, m.round) for m in found] == [("site-a", 1), ("site-a", 1)]
    assert all("answer.reply from coordinator" in m.what for m in found)
