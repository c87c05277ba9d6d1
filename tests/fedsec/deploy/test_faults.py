"""Faults and adversaries against a real deployment (OS processes, gRPC + mTLS on 127.0.0.1).

One run with a roster of six: four honest sites as processes (one of them killed with SIGKILL in
the middle of round 2), one authenticated site that answers every job with garbage, and one site
whose policy refuses the plan. The run goes on to the end; the garbage site is dropped and
recorded; nothing but the refusal leaves the refusing site. Then a site whose lifetime epsilon
cap is spent refuses the next plan, in two processes in a row (its ledger survives restarts).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import signal
import threading

import pytest

from fedsec.audit.log import read_events
from fedsec.config import load_config
from fedsec.network import demo, envelope
from fedsec.network.coordinator import Hub
from fedsec.network.party_audit import PartyAudit
from fedsec.network.pki import Trust
from fedsec.network.policy import SitePolicy
from fedsec.network.site import Site, SitePaths, load_identity
from fedsec.network.transport import TransportClient, TransportError
from tests.fedsec.deploy.harness import federation, wait_for_event

pytestmark = pytest.mark.slow
HONEST, GARBAGE, REFUSER = (0, 1, 2, 3), 4, 5
KILLED = 3


def _garbage_site(d: demo.Deployment, port: int, stop: threading.Event, seen: list[str]) -> None:
    """An enrolled site on the roster that accepts the plan and then answers every job with
    random bytes (and claims to have trained)."""
    s = d.sites[GARBAGE]
    client = TransportClient(address=f"127.0.0.1:{port}", trust=Trust.load(d.ca), cert_path=s.cert,
                             key_path=s.key, server_name="coordinator", deadline=60.0)
    with client:
        _, plan = envelope.decode(client.call("plan", b""))
        client.call("accept", envelope.encode({"sha256": hashlib.sha256(plan).hexdigest(), "n_train": 100,
                                               "n_test": 20, "input_shape": [30], "n_classes": 2}))
        reply = None
        while not stop.is_set():
            try:
                header, _ = envelope.decode(reply or client.call("poll", b"", deadline=60.0))
                reply = None
                seen.append(str(header.get("kind")))
                if header["kind"] == "done":
                    return
                if header["kind"] != "wait":
                    garbage = envelope.encode({"job": header["job"], "ok": True, "noise": 0},
                                              os.urandom(1 + len(seen) % 300))
                    reply = client.call("answer", garbage, deadline=60.0)
            except TransportError:
                return


def _site(d: demo.Deployment, k: int, port: int, *, data, policy: SitePolicy, out) -> Site:
    s = d.sites[k]
    paths = SitePaths(ca=d.ca, crl=None, cert=s.cert, key=s.key, identity=s.identity, data=data,
                      state=d.state(k))
    return Site(address=f"127.0.0.1:{port}", paths=paths, policy=policy, server_name="coordinator", out=out)


@pytest.fixture(scope="module")
def chaos(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults") / "d"
    d = demo.prepare(root, 6, rounds=4, stage_timeout=90.0)  # the restarted site rejoins within it
    stop, seen = threading.Event(), []
    with federation(d) as running:
        garbage = threading.Thread(target=_garbage_site, args=(d, running.port, stop, seen), daemon=True)
        garbage.start()
        said = io.StringIO()
        refused = _site(d, REFUSER, running.port, data=root / "never-opened.csv",
                        policy=SitePolicy(models_allowed=("mlp",)), out=said).run()
        for k in HONEST:
            running.join(k)
        wait_for_event(d.state(KILLED) / "audit.db", "contribution", 2)
        os.kill(running.sites[KILLED].pid, signal.SIGKILL)
        running.sites[KILLED].wait()
        running.join(KILLED)  # restarted with the same state: it rejoins while round 2 waits for it
        code, out = running.wait()
        stop.set()
        garbage.join(timeout=30)
    return d, code, out, refused, said.getvalue(), seen


def test_the_run_goes_on_without_the_killed_site_and_the_garbage_site(chaos):
    d, code, out, _, _, seen = chaos
    assert code == 0, out
    history = list(csv.DictReader(open(d.run_dir / "history.csv")))
    assert [int(r["round"]) for r in history] == [1, 2, 3, 4]
    assert history[0]["status"] == "ok" and int(history[0]["participants"]) == 4
    # round 2 lost the killed site in the middle: it completes with the three others or aborts
    assert history[1]["status"] == "ok" or history[1]["status"].startswith("aborted")
    assert all(r["status"] == "ok" and int(r["participants"]) >= 3 for r in history[2:])
    assert int(history[-1]["participants"]) == 4  # the killed site, restarted, is back
    # the garbage site, refused in every round that got as far as a sum
    assert all(float(r["rejected"]) >= 1 for r in history if r["status"] == "ok")
    assert "layer" in seen and "done" in seen  # it was asked, answered garbage, and saw the end


def test_the_killed_site_restarted_rejoins_and_never_contributes_twice_to_a_round(chaos):
    d = chaos[0]
    name = d.sites[KILLED].name
    events = read_events(d.run_dir / "audit.db")
    assert any(e.action == "site_rejoined" and e.payload()["site"] == name for e in events)
    site = read_events(d.state(KILLED) / "audit.db")
    rounds = [e.round for e in site if e.action == "contribution"]
    assert rounds[:2] == [1, 2] and len(rounds) == len(set(rounds))
    assert max(rounds) > 2  # it trained again after its restart
    assert "the run is over" in (d.root / f"site-{KILLED}.log").read_text()


def test_the_garbage_site_and_the_killed_site_are_recorded(chaos):
    d = chaos[0]
    events = read_events(d.run_dir / "audit.db")
    names = {e.action: set() for e in events}
    for e in events:
        names[e.action].add(e.payload().get("site"))
    garbage, killed = d.sites[GARBAGE].name, d.sites[KILLED].name
    assert garbage in names["dropout"] and killed in names["dropout"]
    reasons = {e.payload()["reason"] for e in events
               if e.action == "dropout" and e.payload()["site"] == garbage}
    assert any("malformed" in r or "size" in r or "magic" in r for r in reasons), reasons


def test_a_refusing_site_sends_nothing_but_its_refusal(chaos):
    d, _, _, refused, said, _ = chaos
    assert refused == 3
    assert "models.allowed" in said
    name = d.sites[REFUSER].name
    kinds = [e.payload()["kind"] for e in read_events(d.run_dir / "audit.db")
             if e.action == "served" and e.payload().get("from") == name]
    assert kinds == ["plan", "refuse"]
    site = read_events(d.state(REFUSER) / "audit.db")
    assert [e.payload()["kind"] for e in site if e.action == "call"] == ["plan", "refuse"]
    assert any(e.action == "plan_refused" and e.payload()["rule"] == "models.allowed" for e in site)


def test_a_spent_lifetime_cap_refuses_the_next_plan_across_restarts(chaos, tmp_path):
    d = chaos[0]
    plan = tmp_path / "next.toml"
    plan.write_text(d.plan.read_text().replace("seed = 0", "seed = 1"))
    config = load_config(plan)
    c = d.coordinator
    audit = PartyAudit(tmp_path, actor="coordinator", key=load_identity(c.identity), run_id="next")
    hub = Hub(config=config, plan_bytes=plan.read_bytes(), trust=Trust.load(d.ca),
              cert_pem=c.cert.read_bytes(), key_pem=c.key.read_bytes(), audit=audit, listen="127.0.0.1:0")
    port = hub.start()
    try:
        policy = SitePolicy(max_epsilon_run=3.0, max_epsilon_lifetime=5.0)  # 3 of it spent in the run above
        for _ in range(2):  # the second Site reads the same state directory: a restarted process
            said = io.StringIO()
            assert _site(d, 0, port, data=d.data[0], policy=policy, out=said).run() == 3
            assert "dp.max_epsilon_lifetime" in said.getvalue()
    finally:
        hub.stop()
        audit.close()
    assert hub.refused == {d.sites[0].name: "dp.max_epsilon_lifetime"}
    ledger = json.dumps([e.payload() for e in read_events(d.state(0) / "audit.db")
                         if e.action == "plan_refused"])
    assert ledger.count("dp.max_epsilon_lifetime") == 2


def test_sigterm_stops_a_site_with_0_and_the_coordinator_with_130_state_flushed(tmp_path):
    d = demo.prepare(tmp_path / "d", 3, rounds=2)
    with federation(d) as running:
        site = running.join(0)
        # the site acknowledges the coordinator's head once its accept was answered: joined there too
        wait_for_event(d.state(0) / "audit.db", "ack", None)
        site.send_signal(signal.SIGTERM)
        assert site.wait(timeout=60) == 0
        running.coordinator.send_signal(signal.SIGTERM)
        assert running.coordinator.wait(timeout=60) == 130
    events = read_events(d.state(0) / "audit.db")
    assert events[-1].action == "disconnect" and events[-1].payload() == {"reason": "SIGTERM"}
    coordinator = read_events(d.run_dir / "audit.db")
    assert [e.action for e in coordinator][-1] == "interrupted"
    assert any(e.action == "site_joined" for e in coordinator)
