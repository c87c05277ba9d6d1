"""Review S6-2 under masking: a victim shown a roster of itself and certified colluders.

Adversary: the coordinator, colluding with two certified sites outside the study (hosp-o1,
hosp-o2 under the demo's names ``outsider-1``, ``outsider-2``). It shows one hospital a masking
plan identical to the study's but for ``federation.sites = [victim, outsider-1, outsider-2]``. A
masked site verifies every ring certificate against its own plan's roster, so the outsiders
would pass, and a sum of three whose two other inputs are the coordinator's reveals the victim's
update (with a third of the client-level noise, or none at example level). No key holder stands
in between: the site's own policy is the only defence, which is why ``aggregation.peers``
exists and ``fedsec demo deploy`` writes it.

Honest party, unmodified: the victim's join check, the policy file ``fedsec demo deploy`` writes for
it, through the real ``fedsec site check`` command (exit 3, the rule named) and ``check_plan``.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from fedsec.config import loads_config
from fedsec.network import demo
from fedsec.network.errors import PolicyRefused
from fedsec.network.policy import SitePolicy, check_plan, load_policy

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
        check_plan(SitePolicy(), config, min_sites=3, name=victim)  # the default policy admits both
    check_plan(policy, loads_config(study), min_sites=3, name=victim)
    with pytest.raises(PolicyRefused) as refused:
        check_plan(policy, loads_config(shown), min_sites=3, name=victim)
    assert refused.value.rule == "aggregation.peers"
    command = [sys.executable, "-m", "fedsec", "site", "check", str(tmp_path / "shown.toml"), "--policy",
               str(d.policies[0]), "--name", victim]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 3, result.stderr
    assert "aggregation.peers" in result.stderr and "outsider-1" in result.stderr
