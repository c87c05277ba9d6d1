"""Review 10: the coordinator's side of the keys a round ahead, with the project's coordinator
(``run_coordinator``, ``Hub``) and four UNMODIFIED sites behind the crash harness's mailboxes.

1. The coordinator killed at the calls of a keys-ahead round that
``tests/review/test_resume_cut_opened_ahead.py`` leaves out, then resumed from its checkpoint.
2. A site process restarted after its next round's keys went out, or as that round begins.
3. A site (one of the c colluders) that answers the key stages of every aggregation opened ahead
with garbage: held, the draws and history are a plain run's; finding R10-3, nothing named it in
the coordinator's audit log (fixed in session 10: ``RemoteRound._record_ahead``; the test was a
strict xfail and is its regression test).
4. ``train.fraction < 1``: the draws, samples and history of a run without keys ahead.

Adversary: a crash (the coordinator process dies at the k-th exchange of a round, before the jobs
reach the sites or after they answered; ``fedsec serve --resume`` then starts from the last
checkpoint). The sites are the project's UNMODIFIED ``SiteJobs`` on real ``Site`` objects
(``test_resume_cut_opened_ahead.Federation``); rounds 2 and 3 run the 6-exchange schedule, round 3's
update keys ride in round 2's evaluation calls.

Checked (1), for a crash at round 2's unmask (call 3, before and after) and at round 3's calls 1, 4, 6:
a crash before any job of the round reached a site loses nothing (history and both generators as
the uninterrupted run's); otherwise the round is lost and only it (every other round whole, all
four sites); no site consumes a (kind, round) twice; each site's ledger charges exactly the rounds it
trained; epsilon never decreases; no site sets up more than one update session of a round before
its training (``late_update_setups``); and every site's update of the lost round was consumed by
the dead coordinator's aggregation (none went into a second one, none was trained again).
"""

from __future__ import annotations

import csv
import math
from typing import Any

import pytest

from fedsec.network import envelope
from tests.fedsec.network import resume_harness
from tests.review.test_resume_cut_opened_ahead import (
    COLUMNS,
    ROUNDS,
    Federation,
    RealSite,
    Recorded,
    _check_sites,
    _generators,
    _history,
    crashed_and_resumed,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    federation = Federation(tmp_path_factory.mktemp("ref10") / "d")
    try:
        summary = federation.coordinator()
        return summary, _history(federation.out / "history.csv"), _generators(federation)
    finally:
        federation.close()


def _late(site) -> list[tuple[int, int]]:
    return sorted(site.state._db.execute("SELECT round, count FROM late_update_setups").fetchall())


@pytest.mark.parametrize("point", [(2, 3, False), (2, 3, True), (3, 1, False), (3, 1, True), (3, 4, True),
                                   (3, 6, True)])
def test_a_crash_at_any_call_of_a_keys_ahead_round_loses_at_most_that_round(point, uninterrupted, tmp_path):
    _, reference, generators = uninterrupted
    lost = None if point[1:] == (1, False) else point[0]
    federation = Federation(tmp_path / "d")
    try:
        history = crashed_and_resumed(federation, point)
        if lost is None:
            for a, b in zip(history, reference, strict=True):
                for key in COLUMNS:
                    if key.startswith("epsilon"):
                        assert math.isclose(float(a[key]), float(b[key]), rel_tol=1e-9, abs_tol=1e-9), key
                    else:
                        assert a[key] == b[key], (a["round"], key)
            assert _generators(federation) == generators
        for row in history:
            if int(row["round"]) == lost:
                assert row["status"].startswith("aborted") and row["participants"] == "0", row
            else:
                assert row["status"] == "ok" and row["participants"] == "4", row
        epsilons = [float(r["epsilon"]) for r in history]
        assert all(b >= a for a, b in zip(epsilons, epsilons[1:])), epsilons
        for site in federation.sites.values():
            assert site.state.contributed(site.sha) == list(range(1, ROUNDS + 1))
            assert sorted(r for kind, r in site.consumed() if kind == "update") == [1, 2, 3]
            assert all(count == 1 for _, count in _late(site)), _late(site)
            trainings = dict(site.state._db.execute("SELECT round, count FROM trainings").fetchall())
            assert trainings == {1: 1, 2: 1, 3: 1}, trainings  # the lost round was never trained again
    finally:
        federation.close()


class _Restarting(Federation):
    """Site 0's process restarts (a new ``Party`` over the same ``site.db``; its memory is lost) when
    the ``at``-th job of round ``round_index`` reaches it, ``before`` or after it answers; the hub
    sees it accept the plan again (its join count), as it does when a real site calls back."""

    def __init__(self, root, *, round_index: int, at: int, before: bool) -> None:
        super().__init__(root)
        self.hub: Any = None
        name = self.d.sites[0].name
        site, seen = self.sites[name], {"n": 0}

        def restart() -> None:
            old = self.sites[name]
            old.close()
            fresh = RealSite(self.d, 0)
            fresh.answer = patched  # type: ignore[method-assign]
            self.sites[name] = fresh
            self.hub.joins[name] = self.hub.joins.get(name, 0) + 1

        def patched(payload: bytes) -> bytes:
            header, _ = envelope.decode(payload)
            if header.get("round") == round_index:
                seen["n"] += 1
            here = header.get("round") == round_index and seen["n"] == at
            if here and before:
                restart()
            reply = RealSite.answer(self.sites[name], payload)  # the unmodified site's answer
            if here and not before:
                restart()
            return reply

        site.answer = patched  # type: ignore[method-assign]


def _capture_hub(monkeypatch: pytest.MonkeyPatch, federation: _Restarting) -> None:
    original = resume_harness.run_coordinator

    def spy(config: Any, hub: Any, *args: Any, **kwargs: Any) -> Any:
        federation.hub = hub
        return original(config, hub, *args, **kwargs)

    monkeypatch.setattr(resume_harness, "run_coordinator", spy)


def test_a_site_restarted_after_its_next_rounds_keys_went_out_is_in_that_round(uninterrupted, tmp_path,
                                                                              monkeypatch):
    """Site 0 restarts right after answering round 1's last evaluation call that carried round 2's
    keys (its share keys): round 2 does not take the aggregation opened ahead (a site in it accepted
    the plan again), opens its own with the same draws, sends site 0 the model's body, and all four
    sites are in it; the run's history and both generators are the uninterrupted run's."""
    _, reference, generators = uninterrupted
    federation = _Restarting(tmp_path / "d", round_index=1, at=7, before=False)
    try:
        _capture_hub(monkeypatch, federation)
        summary = federation.coordinator()
        assert summary is not None and summary["rounds_run"] == ROUNDS
        _check_sites(federation)
        log = [s for s, r in federation.log if r == 2]
        assert log[:2] == ["train+layer/advertise keys", "layer/share keys"]  # its own aggregation
        history = _history(federation.out / "history.csv")
        for a, b in zip(history, reference, strict=True):
            assert a["status"] == b["status"] == "ok" and a["participants"] == b["participants"] == "4", a
            assert math.isclose(float(a["epsilon"]), float(b["epsilon"]), rel_tol=1e-9)
        assert _generators(federation) == generators
        site = federation.sites[federation.d.sites[0].name]
        assert sorted(r for kind, r in site.consumed() if kind == "update") == [1, 2, 3]
    finally:
        federation.close()


def test_a_site_restarted_as_its_keys_ahead_round_begins_sits_it_out_recorded_nowhere(tmp_path, monkeypatch):
    """Site 0 restarts just before round 2's first call (train jobs naming the model it held, with
    the masked input of the aggregation opened ahead) reaches it: it refuses ``model.unknown``
    before recording the round; round 2 completes with the three others (site 0's masks removed
    with its neighbours' shares); site 0 is back in round 3; its ``site.db`` and ledger hold rounds
    1 and 3 only."""
    federation = _Restarting(tmp_path / "d", round_index=2, at=1, before=True)
    try:
        _capture_hub(monkeypatch, federation)
        summary = federation.coordinator()
        assert summary is not None and summary["rounds_run"] == ROUNDS
        _check_sites(federation)
        assert [s for s, r in federation.log if r == 2][0] == "train+layer/masked input"  # taken ahead
        history = _history(federation.out / "history.csv")
        assert [(r["status"], r["participants"]) for r in history] == [("ok", "4"), ("ok", "3"), ("ok", "4")]
        site = federation.sites[federation.d.sites[0].name]
        assert site.state.contributed(site.sha) == [1, 3]
        assert sorted(r for kind, r in site.consumed() if kind == "update") == [1, 3]
    finally:
        federation.close()


def _garbage_in_the_keys_ahead(federation: Federation, k: int) -> str:
    """Site k answers every advertise-keys stage of an update aggregation opened ahead (the ``also``
    part of the evaluation's masked-input call) with bytes that are no protocol message, and
    everything else honestly (its own site code)."""
    name = federation.d.sites[k].name
    site = federation.sites[name]
    honest = site.answer

    def answer(payload: bytes) -> bytes:
        header, _ = envelope.decode(payload)
        reply = honest(payload)
        also = header.get("also")
        second = (also.get("purpose"), also.get("stage")) if isinstance(also, dict) else None
        if second == ("update", "advertise keys"):
            head, body = envelope.decode(reply)
            junk = b"\x00not a protocol message" * 2
            size, head["also"]["size"] = head["also"]["size"], len(junk)
            return envelope.encode(head, body[:len(body) - size] + junk)
        return reply

    site.answer = answer  # type: ignore[method-assign]
    return name


def test_garbage_in_the_keys_ahead_only_costs_the_shortcut(uninterrupted, tmp_path):
    """Held: a site that breaks every update aggregation opened ahead (garbage in its key stages) and
    is honest otherwise: no round takes an aggregation opened ahead (each opens its own, 8
    exchanges), every round has all four sites, and the history and both generators are the
    uninterrupted run's (the draws are the round's own)."""
    _, reference, generators = uninterrupted
    federation = Federation(tmp_path / "d")
    try:
        _garbage_in_the_keys_ahead(federation, 3)
        summary = federation.coordinator()
        assert summary is not None and summary["rounds_run"] == ROUNDS
        assert [s for s, r in federation.log if r == 2][0] == "train+layer/advertise keys"
        history = _history(federation.out / "history.csv")
        assert [(r["status"], r["participants"]) for r in history] == [(b["status"], b["participants"])
                                                                     for b in reference]
        assert _generators(federation) == generators
    finally:
        federation.close()


def test_r10_3_a_site_removed_from_an_aggregation_opened_ahead_is_in_the_audit_log(tmp_path):
    from fedsec.audit.log import read_events

    federation = Federation(tmp_path / "d")
    try:
        name = _garbage_in_the_keys_ahead(federation, 3)
        assert federation.coordinator() is not None
        named = [(e.round, e.action, e.stage) for e in read_events(federation.out / "audit.db")
                 if e.action in ("dropout", "misbehaved") and e.payload().get("site") == name]
        # it was removed from two aggregations (round 2's and round 3's, opened during rounds 1 and
        # 2); not one row names it
        assert named, named
    finally:
        federation.close()


def _sampled(root) -> Recorded:
    """No DP noise, a quarter of the sites left out of each round (``train.fraction = 0.75``: 3 of 4
    sampled), each train job's generator state recorded."""
    return Recorded(root, extra='[dp]\nmode = "none"\n[train]\nfraction = 0.75\n')


def _rows(path: Any) -> list[dict[str, str]]:
    return list(csv.DictReader(open(path)))


def test_with_a_sample_of_the_sites_the_keys_ahead_keep_the_draws_of_a_run_without(tmp_path, monkeypatch):
    """``train.fraction < 1``: the aggregation opened ahead is over the sites the copy of the run
    generator sampled; rounds 2 and 3 take it (5 exchanges: its training speculated in the round
    before's last call since session 11) and the run's samples, training seeds,
    statuses, participants and both generators equal a run with ``open_ahead`` disabled."""
    from fedsec.network.remote import RemoteRound

    ahead = _sampled(tmp_path / "ahead")
    try:
        assert ahead.coordinator() is not None
        log, history = list(ahead.log), _rows(ahead.out / "history.csv")
        generators, training = _generators(ahead), dict(ahead.training)
    finally:
        ahead.close()
    monkeypatch.setattr(RemoteRound, "open_ahead", lambda self, round_index: None)
    plain = _sampled(tmp_path / "plain")
    try:
        assert plain.coordinator() is not None
        # session 11: the sampled sites' training and masked input rode in the round before's last
        # call (the evaluation's unmask, to every site), the round begins at its consistency check
        assert [s for s, r in log if r in (1, 2)][-1] == "layer/unmask+train"
        assert [s for s, r in log if r in (2, 3)][0] == "layer/consistency check"
        assert [s for s, r in plain.log if r in (2, 3)][0] == "train+layer/advertise keys"
        columns = ("round", "status", "participants", "dropped", "eval_sites")
        assert [{k: r[k] for k in columns} for r in history] == \
            [{k: r[k] for k in columns} for r in _rows(plain.out / "history.csv")]
        assert all(r["participants"] == "3" for r in history)
        assert generators == _generators(plain)
        assert len(training) == 9 and training == plain.training
    finally:
        plain.close()
