"""A site whose CSV file does not match the plan's schema exits 2 naming file, row and column,
and sends nothing but its request for the plan (an in-process coordinator, real gRPC + mTLS)."""

from __future__ import annotations

import io

from fedsec.audit.log import read_events
from fedsec.config import load_config
from fedsec.network import demo
from fedsec.network.coordinator import Hub
from fedsec.network.party_audit import PartyAudit
from fedsec.network.pki import Trust
from fedsec.network.policy import SitePolicy
from fedsec.network.site import Site, SitePaths, load_identity


def test_a_bad_data_file_exits_2_naming_file_row_and_column_and_sends_nothing(tmp_path):
    d = demo.prepare(tmp_path / "d", 3, rounds=2)
    lines = d.data[1].read_text().splitlines()
    cells = lines[3].split(",")
    cells[2] = "n/a"
    lines[3] = ",".join(cells)
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join(lines) + "\n")
    c, s = d.coordinator, d.sites[1]
    audit = PartyAudit(tmp_path, actor="coordinator", key=load_identity(c.identity), run_id="plan")
    hub = Hub(config=load_config(d.plan), plan_bytes=d.plan.read_bytes(), trust=Trust.load(d.ca),
              cert_pem=c.cert.read_bytes(), key_pem=c.key.read_bytes(), audit=audit, listen="127.0.0.1:0")
    port = hub.start()
    said = io.StringIO()
    try:
        paths = SitePaths(ca=d.ca, crl=None, cert=s.cert, key=s.key, identity=s.identity, data=bad,
                          state=d.state(1))
        code = Site(address=f"127.0.0.1:{port}", paths=paths, policy=SitePolicy(), server_name="coordinator",
                    out=said).run()
    finally:
        hub.stop()
        audit.close()
    assert code == 2
    column = demo.feature_columns()[2]
    assert f"{bad}, row 4, column '{column}': is not a number" in said.getvalue()
    received = [e.payload()["kind"] for e in read_events(tmp_path / "audit.db") if e.action == "served"]
    assert received == ["plan"]
    assert hub.sites == {} and hub.refused == {}
    site = read_events(d.state(1) / "audit.db")
    assert [e.payload()["kind"] for e in site if e.action == "call"] == ["plan"]
    assert any(e.action == "data_refused" and e.payload()["row"] == 4 for e in site)
