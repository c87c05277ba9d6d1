"""Review S6-2 under masking: a victim shown a roster of itself and certified colluders.

Adversary: the coordinator, colluding with two certified sites outside the study (hosp-o1,
hosp-o2 under the demo's names ``outsider-1``, ``outsider-2``). It shows one hospital a masking
plan identical to the study's but for ``federation.sites = [victim, outsider-1, outsider-2]``. A
masked site verifies every ring certificate against its own plan's roster, so the outsiders
would pass, and a sum of three whose two other inputs are the coordinator's reveals the victim's
update (with a third of the client-level noise, or none at example level). No key holder stands
in between: the site's own policy is the only defence, which is why ``aggregation.peers``
exists and ``fedsec demo deploy`` writes it.

Honest party, unmodified: the victim's join check (``Site._check``: a client-level plan is
refused without ``aggregation.peers``), the policy file ``fedsec demo deploy`` writes for
it, through the real ``fedsec site check`` command (exit 3, the rule named) and ``check_plan``.
"""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

from fedsec.config import loads_config
from fedsec.network import demo
from fedsec.network.errors import PolicyRefused
from fedsec.network.ledger import EpsilonLedger
from fedsec.network.policy import SitePolicy, check_plan, load_policy
from fedsec.network.site import Site, SitePaths

PLAN = '[secure]\naggregation = "masking"\n[dp]\nmode = "client"\nnoise_multiplier = 1.0\n' \
       'target_epsilon = 3.0\nmax_grad_norm = 0.5\n'


@pytest.mark.slow
def test_a_masked_victim_pinned_to_its_peers_refuses_a_roster_of_outsiders(tmp_path):
    d = demo.prepare(tmp_path / "d", 4, rounds=2, extra=PLAN)
    victim = d.sites[0].name
    study = d.plan.read_text()
    names = [s.name for s in d.sites]
    roster = ", ".join(f'"{n}"' for n in names)
    shown = study.replace(f"sites = [{roster}]", f'sites = ["{victim}", "outsider-1", "outsider-2"]') \
                 .replace("clients = 4", "clients = 3")
    assert shown != study
    (tmp_path / "shown.toml").write_text(shown)
    policy = load_policy(d.policies[0])
    assert set(policy.peers) == set(names) - {victim}  # what demo deploy writes for every site
    for text in (study, shown):
        config = loads_config(text)
        assert config.secure.aggregation == "masking"
        with pytest.raises(PolicyRefused) as refused:  # client-level: the defaults pin no peers
            check_plan(SitePolicy(), config, min_sites=3, name=victim)
        assert refused.value.rule == "aggregation.peers"
    check_plan(policy, loads_config(study), min_sites=3, name=victim)
    with pytest.raises(PolicyRefused) as refused:
        check_plan(policy, loads_config(shown), min_sites=3, name=victim)
    assert refused.value.rule == "aggregation.peers"
    # the site's own join check (``fedsec join``), with the demo's policy and with the defaults
    for policy, warned in ((load_policy(d.policies[0]), False), (SitePolicy(), True)):
        out = io.StringIO()
        paths = SitePaths(ca=d.ca, crl=None, cert=d.sites[0].cert, key=d.sites[0].key,
                          identity=d.sites[0].identity, data=d.data[0], state=tmp_path / f"state-{warned}")
        site = Site(address="127.0.0.1:1", paths=paths, policy=policy, server_name="coordinator", out=out)
        with EpsilonLedger(tmp_path / f"state-{warned}", lifetime_cap=policy.max_epsilon_lifetime) as ledger:
            if warned:  # the defaults: a client-level plan needs pinned peers, the study's plan too
                for text in (study, shown):
                    with pytest.raises(PolicyRefused) as refused:
                        site._check(text.encode(), "1" * 64, ledger)
                    assert refused.value.rule == "aggregation.peers"
            else:
                site._check(study.encode(), "0" * 64, ledger)
                assert "warning: this site's policy sets no aggregation.peers" not in out.getvalue()
                with pytest.raises(PolicyRefused) as refused:
                    site._check(shown.encode(), "1" * 64, ledger)
                assert refused.value.rule == "aggregation.peers"
        site.client.close()
    command = [sys.executable, "-m", "fedsec", "site", "check", str(tmp_path / "shown.toml"), "--policy",
               str(d.policies[0]), "--name", victim]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 3, result.stderr
    assert "aggregation.peers" in result.stderr and "outsider-1" in result.stderr
