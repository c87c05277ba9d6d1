"""``fedsec serve --resume`` refuses what it cannot continue (exit 2, one line naming the key, nothing
written), and a resumed coordinator ignores, and records, an answer to a job it never posted."""

from __future__ import annotations

import hashlib

import pytest

from fedsec.audit.log import read_events
from fedsec.cli import main
from fedsec.config import loads_config
from fedsec.network import demo, envelope, pki
from fedsec.network.coordinator import Hub
from fedsec.network.mailbox import Mailboxes
from fedsec.network.party_audit import PartyAudit
from fedsec.network.site import load_identity
from tests.fedsec.network.resume_harness import Federation

EXTRA = "[dp]\nreproducible = true\n"


@pytest.fixture(scope="module")
def crashed(tmp_path_factory):
    """A run whose coordinator died in round 2 (its checkpoint: round 1)."""
    federation = Federation(tmp_path_factory.mktemp("crashed") / "d", rounds=2, extra=EXTRA)
    try:
        assert federation.coordinator(crash=(2, 1, False)) is None
    finally:
        federation.close()
    return federation


def _serve(federation: Federation, plan, out, *extra: str) -> list[str]:
    c = federation.d.coordinator
    return ["serve", str(plan), "--ca", str(federation.d.ca), "--cert", str(c.cert), "--key", str(c.key),
            "--listen", "127.0.0.1:0", "--out", str(out), *extra]


def _files(folder):
    return sorted((p.name, p.stat().st_mtime_ns) for p in folder.iterdir())


@pytest.mark.parametrize("case", ["other plan", "paillier", "no checkpoint", "force"])
def test_resume_refusals_exit_2_naming_the_key_and_write_nothing(crashed, tmp_path, capsys, case):
    out = crashed.out
    before = _files(out)
    plan = crashed.d.plan
    arguments = ["--resume"]
    key = "--resume"
    if case == "other plan":
        plan = tmp_path / "plan.toml"
        plan.write_text(crashed.d.plan.read_text().replace("seed = 0", "seed = 1"))
    elif case == "paillier":
        plan = tmp_path / "plan.toml"
        paillier = EXTRA + '[secure]\naggregation = "paillier"\ncustody = "threshold"\n'
        plan.write_text(crashed.d.plan.read_text().replace(EXTRA, paillier))
        key = "secure.aggregation"
    elif case == "no checkpoint":
        out = tmp_path / "empty"
    else:
        arguments.append("--force")
    assert main(_serve(crashed, plan, out, *arguments)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fedsec: error: {key}"), err
    assert _files(crashed.out) == before


def test_an_answer_to_an_unknown_job_is_ignored_and_recorded(tmp_path):
    d = demo.prepare(tmp_path / "d", 4, rounds=2, extra=EXTRA)
    trust = pki.Trust.load(d.ca)
    (tmp_path / "c").mkdir()
    audit = PartyAudit(tmp_path / "c", actor="coordinator", key=load_identity(d.coordinator.identity),
                       run_id="t")
    plan = d.plan.read_bytes()
    hub = Hub(config=loads_config(plan.decode()), plan_bytes=plan, trust=trust,
              cert_pem=d.coordinator.cert.read_bytes(), key_pem=d.coordinator.key.read_bytes(), audit=audit,
              listen="127.0.0.1:0", poll_wait=0.05)
    site = pki.verify_peer(d.sites[0].cert.read_bytes(), trust=trust, roles=("site",))
    number, _ = hub.job("train", 2)  # a job of this incarnation that was never posted to the site
    reply = hub.handle(site, "answer", envelope.encode({"job": number, "ok": True}))
    assert envelope.decode(reply)[0] == {"kind": "wait"}
    audit.close()
    ignored = [e for e in read_events(tmp_path / "c" / "audit.db") if e.action == "answer_ignored"]
    assert [(e.round, e.payload()) for e in ignored] == [(2, {"site": site.name, "job": number})]
    assert hashlib.sha256(plan).hexdigest() == hub.plan_sha256


def test_job_ids_differ_between_coordinator_incarnations():
    first, second = Mailboxes(("a",)), Mailboxes(("a",))
    assert first.next_id() != second.next_id()
    assert 1 <= first.next_id() <= 2**40 + 1
