"""Four sites and a coordinator as real processes (gRPC + mTLS on 127.0.0.1), masking and DP-SGD
with dp.reproducible: the deployed history is the simulation's, and the parties' signed audit
logs reconcile (and a tampered one is named). Bad certificates are refused at the handshake."""

from __future__ import annotations

import csv
import json
import math
import shutil
import sqlite3

import pytest

from fedsec.audit.reconcile import reconcile_paths
from fedsec.audit.verify import verify_log
from fedsec.config import load_config
from fedsec.experiment import run_experiment
from fedsec.network import demo, pki
from fedsec.network.transport import TransportClient, TransportError
from tests.fedsec.deploy.harness import federation

pytestmark = pytest.mark.slow
EXTRA = "[dp]\nreproducible = true\n"


def _bad_parties(d: demo.Deployment) -> dict[str, tuple[demo.Enrolled, str]]:
    """Certificates the coordinator must refuse, with the gRPC code each call must get."""
    root, ca_dir = d.root, d.ca.parent
    pki.init_ca(root / "other-ca", name="another study")
    foreign = demo.enrol(root / "other-ca", root / "bad" / "foreign", "hospital-a", "site")
    stranger = demo.enrol(ca_dir, root / "bad" / "stranger", "hospital-x", "site")
    revoked = demo.enrol(ca_dir, root / "bad" / "revoked", "hospital-b", "site")
    pki.revoke(ca_dir, revoked.cert.read_bytes())
    server = demo.enrol(ca_dir, root / "bad" / "server", "hospital-c", "server")
    return {"another CA": (foreign, "UNAVAILABLE"), "not on the roster": (stranger, "PERMISSION_DENIED"),
            "revoked": (revoked, "UNAUTHENTICATED"), "server role": (server, "PERMISSION_DENIED")}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("deploy") / "d"
    d = demo.prepare(root, 4, rounds=2, extra=EXTRA, stage_timeout=30.0)
    policy = root / "site.toml"
    policy.write_text("[dp]\nrequired = false\n")  # dp.reproducible is refused by the default policy
    bad = _bad_parties(d)
    refusals = {}
    with federation(d) as running:
        trust = pki.Trust.load(d.ca, d.ca.parent / "ca.crl")
        for why, (party, _) in bad.items():
            client = TransportClient(address=f"127.0.0.1:{running.port}", trust=trust, cert_path=party.cert,
                                     key_path=party.key, server_name="coordinator", deadline=10.0)
            client._server_checked = True  # go straight to the gRPC call: the coordinator must refuse it
            with pytest.raises(TransportError) as caught, client:
                client.call("plan", b"")
            refusals[why] = caught.value.code
        for k in range(4):
            running.join(k, policy=policy)
        code, out = running.wait()
        logs = [running.site_log(k) for k in range(4)]
    return d, code, out, logs, refusals, {k: v[1] for k, v in bad.items()}


def test_bad_certificates_are_refused_at_the_handshake(run):
    _, _, _, _, refusals, expected = run
    assert refusals == expected


def test_deployed_history_equals_the_simulation(run, tmp_path):
    d, code, out, logs, _, _ = run
    assert code == 0, out
    assert all("the run is over" in log for log in logs), logs
    files = "[" + ",".join(f'"{p}"' for p in d.data) + "]"
    config = load_config(d.plan, [f"data.files={files}"])
    summary = run_experiment(config, out=tmp_path / "sim")
    deployed = list(csv.DictReader(open(d.run_dir / "history.csv")))
    simulated = list(csv.DictReader(open(tmp_path / "sim" / "history.csv")))
    assert len(deployed) == len(simulated) == 2
    assert deployed[0].keys() == simulated[0].keys()
    for mine, theirs in zip(deployed, simulated, strict=True):
        for key in mine:
            if key == "seconds":
                continue
            if key == "loss":  # float32 sums of the same records in another memory layout
                assert math.isclose(float(mine[key]), float(theirs[key]), rel_tol=1e-6), key
            else:
                assert mine[key] == theirs[key], (mine["round"], key, mine[key], theirs[key])
    assert int(deployed[-1]["participants"]) == 4
    ours = json.loads((d.run_dir / "summary.json").read_text())
    assert ours["model_sha256"] == summary["model_sha256"]
    assert ours["epsilon"] == summary["epsilon"]
    assert ours["deployment"]["sites"] == [s.name for s in d.sites]
    for name in ("config.toml", "model.pt", "accuracy.png", "epsilon.png", "audit.db"):
        assert (d.run_dir / name).exists(), name


def _logs(d: demo.Deployment):
    return [d.run_dir / "audit.db", *(d.state(k) / "audit.db" for k in range(4))]


def test_every_partys_audit_log_verifies_and_the_logs_reconcile(run):
    d = run[0]
    for path in _logs(d):
        verify_log(path)
    assert reconcile_paths(_logs(d), coordinator="coordinator") == []
    site = {e.action for e in _events(d.state(0) / "audit.db")}
    assert {"connect", "plan_received", "plan_accepted", "contribution", "epsilon", "call", "ack",
            "run_finished"} <= site and not {"send", "receive"} & site  # one row a call
    coordinator = {e.action for e in _events(d.run_dir / "audit.db")}
    assert {"site_joined", "round", "epsilon", "model_released", "served", "ack"} <= coordinator
    assert not {"send", "receive"} & coordinator


def _events(path):
    from fedsec.audit.log import read_events

    return read_events(path)


def test_reconcile_names_a_site_log_whose_tail_was_dropped(run, tmp_path):
    d = run[0]
    copies = []
    for k, path in enumerate(_logs(d)):
        copy = tmp_path / f"{k}.db"
        shutil.copy(path, copy)
        copies.append(copy)
    site = copies[1]
    db = sqlite3.connect(site)
    first = db.execute("SELECT MIN(seq) FROM events WHERE action = 'contribution'").fetchone()[0]
    db.execute("DELETE FROM events WHERE seq > ?", (first,))
    db.commit()
    db.close()
    verify_log(site)  # a shorter chain is still a valid chain: only the peers can tell
    found = reconcile_paths(copies, coordinator="coordinator")
    assert found, "a truncated site log must not reconcile"
    assert any("which records no such receipt" in m.what and m.actor == "coordinator" for m in found), found
    assert any("tail truncated" in m.what and m.actor == d.sites[0].name for m in found), found
