"""Adversaries that hand a peer a false log head, searched exhaustively over small lie spaces
(review findings R8, R9), against the project's unmodified acknowledging code
(:meth:`RemoteRound._ack` on the coordinator, :meth:`Site._ack` on a site) and
:func:`fedsec.audit.reconcile.reconcile_paths`.

- A malicious site answering a training job hands the coordinator any head (actor, key
  fingerprint, row, hash). Claim: reconcile never lists a mismatch against an honest party, and
  every lie is listed (a recorded misbehaviour, or the liar's own log accused).
- A malicious coordinator hands a site any head, then rewrites its log. Claim: reconcile lists a
  mismatch for every lie (the site refused it, or the acknowledged row no longer matches).
- Plans (R7): a coordinator showing each of three sites one of two plans, in every combination,
  is listed unless every site accepted the plan the coordinator loaded.
"""

from __future__ import annotations

import hashlib
import itertools
from types import SimpleNamespace

import pytest

from fedsec.audit.log import read_events
from fedsec.audit.reconcile import reconcile_paths
from fedsec.network import demo, envelope, pki
from fedsec.network.party_audit import LOG, PartyAudit, identity_fingerprint
from fedsec.network.remote import RemoteRound
from fedsec.network.site import Site, load_identity

NAMES = ("coordinator", "hospital-a", "hospital-b", "hospital-d")


@pytest.fixture(scope="module")
def parties(tmp_path_factory):
    root = tmp_path_factory.mktemp("heads")
    pki.init_ca(root / "ca", name="head study")
    trust = pki.Trust.load(root / "ca" / "ca.crt")
    out = {}
    for name in NAMES:
        role = "server" if name == "coordinator" else "site"
        enrolled = demo.enrol(root / "ca", root / name, name, role)
        out[name] = SimpleNamespace(key=load_identity(enrolled.identity), peer=pki.verify_peer(
            enrolled.cert.read_bytes(), trust=trust, roles=(role,)))
    return out


def _reply(text: str) -> bytes:
    plan = text.encode()
    return envelope.encode({"sha256": hashlib.sha256(plan).hexdigest(), "server": "coordinator"}, plan)


def _open(root, name, parties) -> PartyAudit:
    (root / name).mkdir(parents=True, exist_ok=True)
    return PartyAudit(root / name, actor=name, key=parties[name].key, run_id="run")


def _site_joins(audit: PartyAudit, reply: bytes) -> None:
    _, plan = envelope.decode(reply)
    sha = hashlib.sha256(plan).hexdigest()
    audit.sent_then_received("coordinator", "plan", b"", reply)
    audit.event("plan_accepted", details={"sha256": sha})


def _lies(true_head, parties, liar, other, seqs=None):
    actors = list(dict.fromkeys([liar, other, "coordinator", "nobody"]))
    fps = [identity_fingerprint(parties[n].peer.identity_key) for n in (liar, other)] + ["ab" * 32]
    seqs = seqs or [0, 1, true_head["seq"], 999]
    hashes = [true_head["hash"], "0" * 64]
    for actor, fp, seq, digest in itertools.product(actors, fps, seqs, hashes):
        yield {"actor": actor, "fingerprint": fp, "seq": seq, "hash": digest}


@pytest.mark.slow
def test_no_head_a_site_hands_the_coordinator_makes_reconcile_blame_an_honest_party(tmp_path, parties):
    reply = _reply("rounds = 3\n")
    checked = 0
    other_true = None
    lies = list(_lies({"seq": 4, "hash": "1" * 64}, parties, "hospital-d", "hospital-b", seqs=[0, 4, 999]))
    for case, lie in enumerate(lies):
        root = tmp_path / str(case)
        coordinator = _open(root, "coordinator", parties)
        coordinator.event("plan_loaded", details={"sha256": hashlib.sha256(b"rounds = 3\n").hexdigest()})
        for name in ("hospital-b", "hospital-d"):
            site = _open(root, name, parties)
            coordinator.received_then_sent(name, "plan", b"", reply)
            _site_joins(site, reply)
            head = site.head()
            if name == "hospital-b":
                other_true = head
            site.close()
        if lie["actor"] == "hospital-b" and lie["hash"] == "1" * 64:
            lie = {**lie, "hash": other_true["hash"]}  # the honest site's true head, replayed
        hub = SimpleNamespace(audit=coordinator, peers={n: parties[n].peer for n in NAMES})
        RemoteRound._ack(SimpleNamespace(hub=hub), 1, {"hospital-d": ({"ok": True, "head": lie}, b"")})
        coordinator.close()
        found = reconcile_paths([root / n / LOG for n in ("coordinator", "hospital-b", "hospital-d")],
                                coordinator="coordinator")
        assert not [m for m in found if m.actor == "hospital-b"], (lie, [str(m) for m in found])
        assert found, lie  # every one of these heads is false: a misbehaviour or hospital-d accused
        rows = read_events(root / "coordinator" / LOG)
        acked = [e.payload() for e in rows if e.action == "ack"]
        assert all(a["actor"] == "hospital-d" for a in acked), lie
        checked += 1
    assert checked == len(lies) == 4 * 3 * 3 * 2


def _coordinator_log(folder, parties, reply, model_digest):
    audit = _open(folder, "coordinator", parties)
    audit.event("plan_loaded", details={"sha256": hashlib.sha256(b"rounds = 3\n").hexdigest()})
    audit.received_then_sent("hospital-a", "plan", b"", reply)
    audit.event("model_released", round=1, details={"sha256": model_digest})
    return audit


def _honest_site(audit: PartyAudit, server: pki.Peer) -> SimpleNamespace:
    """What :meth:`Site._ack` reads of the site (its log, its server's name and certificate)."""
    def event(action, details, round_index=None):
        audit.event(action, round=round_index, details=details)

    return SimpleNamespace(audit=audit, server_name="coordinator", client=SimpleNamespace(server=server),
                           _event=event)


@pytest.mark.slow
def test_every_head_a_coordinator_hands_a_site_leaves_its_rewrite_listed(tmp_path, parties):
    reply = _reply("rounds = 3\n")
    checked = 0
    for case in itertools.count():
        root = tmp_path / str(case)
        honest = _coordinator_log(root / "honest", parties, reply, "11" * 32)
        true_head = honest.head()
        honest.close()
        lies = list(_lies(true_head, parties, "coordinator", "hospital-a"))
        if case == len(lies):
            break
        lie = lies[case]
        site = _open(root / "logs", "hospital-a", parties)
        _site_joins(site, reply)
        Site._ack(_honest_site(site, parties["coordinator"].peer), lie, None)
        site.close()
        _coordinator_log(root / "logs", parties, reply, "22" * 32).close()  # the rewrite
        found = reconcile_paths([root / "logs" / n / LOG for n in ("coordinator", "hospital-a")],
                                coordinator="coordinator")
        assert found, lie
        checked += 1
    assert checked == 3 * 3 * 4 * 2


def test_a_site_refuses_a_head_below_one_it_acknowledged(tmp_path, parties):
    reply = _reply("rounds = 3\n")
    coordinator = _coordinator_log(tmp_path, parties, reply, "11" * 32)
    early = coordinator.head()
    coordinator.event("round", round=2)
    later = coordinator.head()
    coordinator.close()
    site = _open(tmp_path / "logs", "hospital-a", parties)
    _site_joins(site, reply)
    honest = _honest_site(site, parties["coordinator"].peer)
    for head in (later, later, early):
        Site._ack(honest, head, 2)
    site.close()
    rows = read_events(tmp_path / "logs" / "hospital-a" / LOG)
    assert [e.payload()["seq"] for e in rows if e.action == "ack"] == [later["seq"], later["seq"]]
    refused = [e.payload() for e in rows if e.action == "head_refused"]
    assert len(refused) == 1 and f"row {early['seq']} is below row {later['seq']}" in refused[0]["reason"]


@pytest.mark.parametrize("shown", list(itertools.product((0, 1), repeat=3)))
def test_reconcile_lists_any_site_shown_another_plan(tmp_path, parties, shown):
    plans = ["rounds = 3\n", "rounds = 300\n"]
    coordinator = _open(tmp_path, "coordinator", parties)
    coordinator.event("plan_loaded", details={"sha256": hashlib.sha256(plans[0].encode()).hexdigest()})
    sites = ("hospital-a", "hospital-b", "hospital-d")
    for name, which in zip(sites, shown):
        reply = _reply(plans[which])
        coordinator.received_then_sent(name, "plan", b"", reply)
        site = _open(tmp_path, name, parties)
        _site_joins(site, reply)
        site.close()
    coordinator.close()
    found = reconcile_paths([tmp_path / n / LOG for n in ("coordinator", *sites)], coordinator="coordinator")
    plan_rows = [m for m in found if "plan" in m.what]
    assert bool(plan_rows) == any(shown), [str(m) for m in found]
    assert {m.actor for m in plan_rows if "loaded plan" in m.what} == {
        name for name, which in zip(sites, shown) if which}
