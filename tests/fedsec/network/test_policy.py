"""Site policy: parsing, every rule, the rule order, and the lifetime ledger across restarts."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsec.config import make_config
from fedsec.network.errors import PolicyRefused
from fedsec.network.ledger import EpsilonLedger
from fedsec.network.policy import (
    AGGREGATIONS,
    MODELS,
    RULES,
    PlanFacts,
    SitePolicy,
    admit_plan,
    check_plan,
    load_policy,
    plan_facts,
)

STRICT = SitePolicy(aggregation_allowed=("masking",), min_threshold=3, min_sites=4, require_active=True,
                    dp_required=True, max_epsilon_run=2.0, max_epsilon_lifetime=5.0,
                    models_allowed=("logreg",),
                    max_rounds=50)
GOOD = PlanFacts(aggregation="masking", active=True, sites_per_round=6, threshold=4, dp=True,
                 reproducible=False, epsilon=1.5, model="logreg", rounds=20, delta=1e-5, test_fraction=0.2)


def test_site_toml_parsed_and_unknown_or_bad_keys_named(tmp_path):
    path = tmp_path / "SITE.toml"
    path.write_text('[aggregation]\nallowed = ["masking"]\nmin_threshold = 3\nmin_sites = 4\n'
                    '[dp]\nrequired = true\nmax_epsilon_run = 2.0\nmax_epsilon_lifetime = 5\n'
                    '[models]\nallowed = ["logreg"]\n[rounds]\nmax = 50\n')
    assert load_policy(path) == STRICT
    for text, key in [("[dp]\nmax_epsilon = 1\n", "dp.max_epsilon"), ("[network]\nx = 1\n", "network.x"),
                      ("rounds = 3\n", "rounds"),
                      ('[aggregation]\nallowed = ["plain"]\n', "aggregation.allowed"),
                      ("[aggregation]\nmin_sites = 1\n", "aggregation.min_sites"),
                      ("[aggregation]\nmin_corrupt = 1.0\n", "aggregation.min_corrupt"),
                      ('[aggregation]\nmin_corrupt = "a"\n', "aggregation.min_corrupt"),
                      ('[dp]\nrequired = "yes"\n', "dp.required"),
                      ("[dp]\nmax_epsilon_run = nan\n", "dp.max_epsilon_run"),
                      ("[dp]\nmax_epsilon_run = 5\nmax_epsilon_lifetime = 4\n", "dp.max_epsilon_lifetime"),
                      ("[rounds]\nmax = 2.5\n", "rounds.max"),
                      ("[models]\nallowed = []\n", "models.allowed")]:
        path.write_text(text)
        with pytest.raises(ValueError, match=f"^{key.replace('.', '[.]')}:"):
            load_policy(path)
    path.write_text("[dp\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_policy(path)


@pytest.mark.parametrize("change, rule", [
    ({"aggregation": "paillier"}, "aggregation.allowed"),
    ({"active": False}, "aggregation.require_active"),
    ({"sites_per_round": 3}, "aggregation.min_sites"),
    ({"threshold": 2}, "aggregation.min_threshold"),
    ({"corrupt": 0.05}, "aggregation.min_corrupt"),
    ({"dp": False, "epsilon": 0.0}, "dp.required"),
    ({"reproducible": True}, "dp.reproducible"),
    ({"epsilon": 2.5}, "dp.max_epsilon_run"),
    ({"epsilon": math.inf}, "dp.max_epsilon_run"),
    ({"delta": 2e-5}, "dp.max_delta"),
    ({"delta": 0.5, "epsilon": 0.1}, "dp.max_delta"),
    ({"test_fraction": 0.95}, "data.max_test_fraction"),
    ({"model": "mlp"}, "models.allowed"),
    ({"rounds": 51}, "rounds.max"),
])
def test_every_rule_refuses_by_name(change, rule):
    check_plan(STRICT, GOOD)
    with pytest.raises(PolicyRefused) as caught:
        check_plan(STRICT, dataclasses.replace(GOOD, **change))
    assert caught.value.rule == rule


def _oracle(policy: SitePolicy, f: PlanFacts) -> str | None:
    """The first violated rule, written independently from the rule list."""
    violated = {
        "aggregation.allowed": f.aggregation not in policy.aggregation_allowed,
        "aggregation.peers": policy.peers is not None and bool(set(f.roster) - set(policy.peers) - {ME}),
        "aggregation.require_active": policy.require_active and not f.active,
        "aggregation.min_sites": f.sites_per_round < policy.min_sites,
        "aggregation.min_threshold": f.aggregation != "none" and f.threshold < policy.min_threshold,
        "aggregation.min_corrupt": f.aggregation != "none" and f.corrupt < policy.min_corrupt,
        "dp.required": policy.dp_required and not f.dp,
        "dp.reproducible": policy.dp_required and f.reproducible,
        "dp.max_epsilon_run": f.epsilon > policy.max_epsilon_run,
        "dp.max_delta": f.dp and f.delta > policy.max_delta,
        "data.max_test_fraction": f.test_fraction > policy.max_test_fraction,
        "models.allowed": f.model not in policy.models_allowed,
        "rounds.max": f.rounds > policy.max_rounds,
    }
    return next((rule for rule in RULES if violated.get(rule)), None)


ME, NAMES = "hosp-a", ("hosp-a", "hosp-b", "hosp-c", "hosp-o1", "hosp-o2")
subsets = lambda items: st.lists(st.sampled_from(items), min_size=1, unique=True).map(tuple)  # noqa: E731


@settings(max_examples=150, deadline=None)
@given(policy=st.builds(SitePolicy, aggregation_allowed=subsets(AGGREGATIONS),
                        min_threshold=st.integers(2, 6), min_corrupt=st.sampled_from([0.0, 0.1, 0.2]),
                        min_sites=st.integers(2, 8), require_active=st.booleans(), dp_required=st.booleans(),
                        max_epsilon_run=st.floats(0.5, 4), max_epsilon_lifetime=st.just(100.0),
                        models_allowed=subsets(MODELS), max_rounds=st.integers(1, 100),
                        max_delta=st.sampled_from([1e-6, 1e-5, 1e-3]),
                        max_test_fraction=st.sampled_from([0.1, 0.3, 0.5]),
                        peers=st.none() | st.lists(st.sampled_from(NAMES), unique=True).map(tuple)),
       facts=st.builds(PlanFacts, aggregation=st.sampled_from(AGGREGATIONS), active=st.booleans(),
                       sites_per_round=st.integers(2, 10), threshold=st.integers(0, 8), dp=st.booleans(),
                       reproducible=st.booleans(),
                       epsilon=st.sampled_from([0.0, 0.5, 1.0, 3.0, 8.0, math.inf]),
                       model=st.sampled_from(MODELS), rounds=st.integers(1, 200),
                       delta=st.sampled_from([1e-7, 1e-5, 1e-4, 0.5]),
                       test_fraction=st.sampled_from([0.05, 0.2, 0.5, 0.95]),
                       corrupt=st.sampled_from([0.0, 0.1, 0.15, 0.3]),
                       roster=st.lists(st.sampled_from(NAMES), min_size=1, unique=True).map(tuple)))
def test_a_searching_coordinator_gets_nothing_past_the_policy(policy, facts):
    """Any plan a coordinator can propose: admitted exactly when no rule is broken, and the rule named is
    the first broken one."""
    expected = _oracle(policy, facts)
    if expected is None:
        check_plan(policy, facts, name=ME)
    else:
        with pytest.raises(PolicyRefused) as caught:
            check_plan(policy, facts, name=ME)
        assert caught.value.rule == expected


def test_plan_facts_read_from_a_real_configuration():
    facts = plan_facts(make_config({"data.clients": 6, "rounds": 7, "dp.target_epsilon": 1.5}))
    assert (facts.aggregation, facts.sites_per_round, facts.dp, facts.epsilon, facts.rounds) == \
        ("masking", 6, True, 1.5, 7)
    assert 2 <= facts.threshold <= 5
    assert facts.corrupt == 0.1
    with pytest.raises(PolicyRefused) as caught:
        check_plan(SitePolicy(min_corrupt=0.2),
                   make_config({"data.clients": 6, "dp.target_epsilon": 1.5, "secure.corrupt": 0.1}))
    assert caught.value.rule == "aggregation.min_corrupt"
    assert plan_facts(make_config({"data.clients": 6}), min_sites=4).sites_per_round == 4
    assert plan_facts(make_config({"dp.target_epsilon": 0, "dp.noise_multiplier": 1.0})).epsilon == math.inf
    plain = plan_facts(make_config({"secure.aggregation": "none", "dp.mode": "none"}))
    assert (plain.threshold, plain.dp, plain.epsilon) == (0, False, 0.0)
    with pytest.raises(PolicyRefused) as caught:
        check_plan(SitePolicy(), make_config({"secure.aggregation": "none"}))
    assert caught.value.rule == "aggregation.allowed"


def test_ledger_refuses_overspending_across_restarts(tmp_path):
    policy = SitePolicy(max_epsilon_run=2.0, max_epsilon_lifetime=5.0)
    plan = dataclasses.replace(GOOD, epsilon=2.0)
    with EpsilonLedger(tmp_path, lifetime_cap=5.0) as ledger:
        admit_plan(policy, plan, ledger=ledger, run_id="plan-1")
        admit_plan(policy, plan, ledger=ledger, run_id="plan-1")  # a restarted coordinator: no new charge
        assert ledger.spent() == 2.0
    with EpsilonLedger(tmp_path, lifetime_cap=5.0) as ledger:  # the site restarts
        admit_plan(policy, plan, ledger=ledger, run_id="plan-2")
        admit_plan(policy, dataclasses.replace(plan, epsilon=1.0), ledger=ledger, run_id="plan-5",
                   dry_run=True)
        assert ledger.spent() == 4.0  # a dry run writes nothing
        for dry_run in (True, False):
            with pytest.raises(PolicyRefused) as caught:
                admit_plan(policy, plan, ledger=ledger, run_id="plan-3", dry_run=dry_run)
            assert caught.value.rule == "dp.max_epsilon_lifetime"
        with pytest.raises(PolicyRefused) as caught:
            ledger.reserve("plan-1", 0.5)  # same run, different budget
        assert caught.value.rule == "dp.ledger"
        admit_plan(policy, dataclasses.replace(plan, epsilon=1.0), ledger=ledger, run_id="plan-4")
        assert ledger.spent() == 5.0 and [r for r, _, _ in ledger.runs()] == ["plan-1", "plan-2", "plan-4"]
    with pytest.raises(ValueError, match="lifetime_cap"):
        EpsilonLedger(tmp_path, lifetime_cap=math.inf)


@settings(max_examples=20, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 5), st.sampled_from([0.0, 0.5, 1.0, 1.5, 3.0]), st.booleans()),
                      min_size=1, max_size=12))
def test_a_lying_restarting_coordinator_never_overspends(tmp_path_factory, steps):
    """Searching adversary: any sequence of (run id, claimed epsilon, restart the site first)."""
    directory = tmp_path_factory.mktemp("ledger")
    reserved: dict[str, float] = {}
    ledger = EpsilonLedger(directory, lifetime_cap=4.0)
    try:
        for run, epsilon, restart in steps:
            if restart:
                ledger.close()
                ledger = EpsilonLedger(directory, lifetime_cap=4.0)
            run_id = f"run-{run}"
            fits = sum(reserved.values()) + epsilon <= 4.0
            same = run_id in reserved and reserved[run_id] == epsilon
            try:
                ledger.reserve(run_id, epsilon)
                assert same or (run_id not in reserved and fits)
                reserved.setdefault(run_id, epsilon)
            except PolicyRefused:
                assert not same and (run_id in reserved or not fits)
            assert ledger.spent() == pytest.approx(sum(reserved.values())) and ledger.spent() <= 4.0
    finally:
        ledger.close()


def test_delta_and_test_fraction_keys_parsed_and_bad_values_named(tmp_path):
    path = tmp_path / "SITE.toml"
    path.write_text("[dp]\nmax_delta = 1e-6\n[data]\nmax_test_fraction = 0.3\n")
    policy = load_policy(path)
    assert (policy.max_delta, policy.max_test_fraction) == (1e-6, 0.3)
    assert (SitePolicy().max_delta, SitePolicy().max_test_fraction) == (1e-5, 0.5)
    for text, key in (("[dp]\nmax_delta = 1.0\n", "dp.max_delta"),
                      ("[dp]\nmax_delta = 0\n", "dp.max_delta"),
                      ("[data]\nmax_test_fraction = true\n", "data.max_test_fraction"),
                      ("[data]\nshare = 0.2\n", "data.share")):
        path.write_text(text)
        with pytest.raises(ValueError, match=key):
            load_policy(path)


def test_plan_facts_carry_delta_and_test_fraction():
    config = make_config({"dp.mode": "dpsgd", "dp.delta": 1e-3, "data.test_fraction": 0.4,
                          "dp.target_epsilon": 2.0})
    facts = plan_facts(config)
    assert (facts.delta, facts.test_fraction) == (1e-3, 0.4)
    with pytest.raises(PolicyRefused) as caught:
        check_plan(SitePolicy(min_sites=2, min_threshold=2), facts)
    assert caught.value.rule == "dp.max_delta"


def test_peers_parsed_validated_and_enforced(tmp_path):
    """``aggregation.peers`` (review S6-2): the plan's roster must lie within the site's peers and
    itself, whatever the coordinator writes; absent, any roster passes (the site warns at join)."""
    path = tmp_path / "SITE.toml"
    path.write_text('[aggregation]\npeers = ["hosp-b", "hosp-c"]\n')
    policy = load_policy(path)
    assert policy.peers == ("hosp-b", "hosp-c")
    for text in ('[aggregation]\npeers = ["hosp-b", "hosp-b"]\n', '[aggregation]\npeers = [""]\n',
                 '[aggregation]\npeers = "hosp-b"\n', '[aggregation]\npeers = [1]\n'):
        path.write_text(text)
        with pytest.raises(ValueError, match="^aggregation[.]peers:"):
            load_policy(path)
    facts = dataclasses.replace(GOOD, roster=("hosp-a", "hosp-b", "hosp-c"))
    check_plan(policy, facts, name="hosp-a")
    for roster in (("hosp-a", "hosp-o1", "hosp-o2"), ("hosp-a", "hosp-b", "hosp-o1")):
        with pytest.raises(PolicyRefused) as caught:
            check_plan(policy, dataclasses.replace(GOOD, roster=roster), name="hosp-a")
        assert caught.value.rule == "aggregation.peers" and "hosp-o1" in str(caught.value)
    with pytest.raises(PolicyRefused):  # without its own name, the site itself is not a listed peer
        check_plan(policy, facts)
    check_plan(SitePolicy(), dataclasses.replace(GOOD, roster=("hosp-a", "hosp-o1", "hosp-o2")))
    plan = make_config({"data.clients": 3, "federation.sites": ["hosp-a", "hosp-b", "hosp-c"],
                        "federation.server": "coordinator"})
    assert plan_facts(plan).roster == ("hosp-a", "hosp-b", "hosp-c")
