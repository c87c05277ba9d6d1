"""Adversaries facing the auditor: ``fedsec audit reconcile`` over the parties' logs.

Every log here is written with the project's :class:`PartyAudit`, through the same calls (and
the same arguments) the honest parties make: ``Hub.handle`` for the coordinator's ``plan`` reply
and its ``accept`` reply's head, ``Site._run`` for the site's plan receipt and its ``ack`` of the
head it is handed, :meth:`RemoteRound._ack` for the coordinator's ack of the heads in the sites'
answers. Only the adversary's own choices differ (which bytes it sends, which head it hands).

- R7, the coordinator: shows two sites two different plans while its own log names a third;
  every message row pairs, so reconcile finds nothing.
- R8, a malicious site: hands the coordinator a "head" that names another, honest site; the
  coordinator acknowledges it as given and reconcile then accuses the honest site of rewriting
  its log.
- R9, the coordinator: hands the sites a head of seq 0 (or another actor's name); the sites
  acknowledge it, reconcile skips such acks, and the coordinator rewrites its own log (with its
  own key) without a mismatch.
"""

from __future__ import annotations

import hashlib
import shutil
from types import SimpleNamespace

import pytest

from fedsec.audit.log import read_events
from fedsec.audit.reconcile import reconcile_paths
from fedsec.network import demo, envelope, pki
from fedsec.network.party_audit import LOG, PartyAudit
from fedsec.network.remote import RemoteRound
from fedsec.network.site import load_identity

SITES = ("hospital-a", "hospital-b", "hospital-d")


@pytest.fixture
def keys(tmp_path):
    pki.init_ca(tmp_path / "ca", name="review study")
    parties = {"coordinator": demo.enrol(tmp_path / "ca", tmp_path / "coordinator", "coordinator", "server")}
    for name in SITES:
        parties[name] = demo.enrol(tmp_path / "ca", tmp_path / name, name, "site")
    return {name: load_identity(p.identity) for name, p in parties.items()}


@pytest.fixture
def peers(tmp_path, keys):
    """Each party's admitted certificate, as the coordinator's transport records it (``Hub.peers``)."""
    trust = pki.Trust.load(tmp_path / "ca" / "ca.crt")
    return {name: pki.verify_peer((tmp_path / name / f"{name}.crt").read_bytes(), trust=trust,
                                  roles=("site", "server")) for name in keys}


def _plan(text: str) -> tuple[bytes, bytes]:
    """A plan's bytes and the coordinator's ``plan`` reply for it (as ``Hub.handle`` builds it)."""
    plan = text.encode()
    sha = hashlib.sha256(plan).hexdigest()
    return plan, envelope.encode({"sha256": sha, "server": "coordinator"}, plan)


def _site_receives_plan(audit: PartyAudit, reply: bytes) -> None:
    """``Site._run`` up to its ``accept`` call (the rows it writes, in order)."""
    _, plan = envelope.decode(reply)
    sha = hashlib.sha256(plan).hexdigest()
    audit.event("connect", details={"server": "coordinator", "address": "127.0.0.1:1"})
    audit.sent_then_received("coordinator", "plan", b"", reply)
    audit.event("plan_received", details={"sha256": sha, "size": len(plan)})
    audit.event("plan_accepted", details={"sha256": sha, "epsilon_reserved": 3.0})


def _audit(tmp_path, name, keys, run_id="run") -> PartyAudit:
    (tmp_path / "logs" / name).mkdir(parents=True, exist_ok=True)
    return PartyAudit(tmp_path / "logs" / name, actor=name, key=keys[name], run_id=run_id)


def _paths(tmp_path, names):
    return [tmp_path / "logs" / n / LOG for n in names]


def test_reconcile_catches_a_coordinator_showing_sites_different_plans(tmp_path, keys):
    logged, _ = _plan("rounds = 30\n# the plan the coordinator's log names\n")
    _, to_a = _plan("rounds = 30\n# the plan hospital-a is shown\n")
    _, to_b = _plan("rounds = 300\n# the plan hospital-b is shown\n")
    coordinator = _audit(tmp_path, "coordinator", keys)
    coordinator.event("plan_loaded", details={"sha256": hashlib.sha256(logged).hexdigest(),
                                              "sites": list(SITES[:2])})
    for name, reply in (("hospital-a", to_a), ("hospital-b", to_b)):
        site = _audit(tmp_path, name, keys)
        coordinator.received_then_sent(name, "plan", b"", reply)  # what it sent, honestly logged
        _site_receives_plan(site, reply)
        site.close()
    coordinator.close()
    mismatches = reconcile_paths(_paths(tmp_path, ["coordinator", "hospital-a", "hospital-b"]),
                                 coordinator="coordinator")
    assert mismatches, "three different plans in one federation, and reconcile lists nothing"


def test_a_site_cannot_make_reconcile_accuse_another_site(tmp_path, keys, peers):
    _, reply = _plan("rounds = 30\n")
    coordinator = _audit(tmp_path, "coordinator", keys)
    honest = _audit(tmp_path, "hospital-b", keys)
    coordinator.received_then_sent("hospital-b", "plan", b"", reply)
    _site_receives_plan(honest, reply)
    true_head = honest.head()
    honest.close()
    # hospital-d's training answer carries a head naming hospital-b, with a made-up hash
    forged = {**true_head, "hash": "0" * 64}
    RemoteRound._ack(SimpleNamespace(hub=SimpleNamespace(audit=coordinator, peers=peers)), 1,
                     {"hospital-d": ({"job": 7, "ok": True, "head": forged}, b"")})
    coordinator.close()
    rows = read_events(tmp_path / "logs" / "coordinator" / LOG)
    assert not [e for e in rows if e.action == "ack"]
    misbehaved = [e.payload()["site"] for e in rows if e.action == "misbehaved" and e.stage == "ack"]
    assert misbehaved == ["hospital-d"]
    mismatches = reconcile_paths(_paths(tmp_path, ["coordinator", "hospital-b"]), coordinator="coordinator")
    accused = [m for m in mismatches if m.actor == "hospital-b"]
    assert not accused, f"reconcile blames the honest site: {[str(m) for m in accused]}"


@pytest.mark.parametrize("lie", ["seq0", "other_actor"])
def test_a_coordinator_cannot_void_the_sites_acknowledgement_and_rewrite(tmp_path, keys, lie):
    _, reply = _plan("rounds = 30\n")

    def coordinator_log(folder, model_digest):
        (folder).mkdir(parents=True)
        audit = PartyAudit(folder, actor="coordinator", key=keys["coordinator"], run_id="run")
        audit.event("plan_loaded", details={"sha256": "ab" * 32, "sites": ["hospital-a"]})
        audit.received_then_sent("hospital-a", "plan", b"", reply)
        audit.event("model_released", round=1, details={"sha256": model_digest})
        return audit

    honest = coordinator_log(tmp_path / "honest", "11" * 32)
    head = honest.head()
    honest.close()
    handed = {**head, "seq": 0} if lie == "seq0" else {**head, "actor": "coordinator-2"}
    site = _audit(tmp_path, "hospital-a", keys)
    _site_receives_plan(site, reply)
    site.ack(handed)  # Site._run: self.audit.ack(answer["head"])
    site.close()
    # later the coordinator rewrites its log: another released model, same messages
    coordinator_log(tmp_path / "rewritten", "22" * 32).close()
    (tmp_path / "logs" / "coordinator").mkdir(parents=True)
    shutil.copy(tmp_path / "rewritten" / LOG, tmp_path / "logs" / "coordinator" / LOG)
    rewritten = read_events(tmp_path / "logs" / "coordinator" / LOG)
    assert rewritten[-1].hash != head["hash"]
    mismatches = reconcile_paths(_paths(tmp_path, ["coordinator", "hospital-a"]), coordinator="coordinator")
    about_the_ack = [m for m in mismatches if "acknowledged" in m.what]  # not only the plan_loaded digest
    assert about_the_ack, "the coordinator rewrote its released model's digest and reconcile lists nothing"


def test_control_an_honest_head_catches_the_same_rewrite(tmp_path, keys):
    """The control for R9 (passes today): with the true head acknowledged, the rewrite is found."""
    _, reply = _plan("rounds = 30\n")

    def coordinator_log(folder, model_digest):
        folder.mkdir(parents=True)
        audit = PartyAudit(folder, actor="coordinator", key=keys["coordinator"], run_id="run")
        audit.received_then_sent("hospital-a", "plan", b"", reply)
        audit.event("model_released", round=1, details={"sha256": model_digest})
        return audit

    honest = coordinator_log(tmp_path / "honest", "11" * 32)
    head = honest.head()
    honest.close()
    site = _audit(tmp_path, "hospital-a", keys)
    _site_receives_plan(site, reply)
    site.ack(head)
    site.close()
    coordinator_log(tmp_path / "logs" / "coordinator", "22" * 32).close()
    mismatches = reconcile_paths(_paths(tmp_path, ["coordinator", "hospital-a"]), coordinator="coordinator")
    assert any("log rewritten" in m.what for m in mismatches)
