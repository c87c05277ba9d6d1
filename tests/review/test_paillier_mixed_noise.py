"""Review S6-1: one key-holder sum mixes honest shares drawn for DIFFERENT noise multipliers.

Adversary: the coordinator ALONE (no colluding site, no outsider; the roster holds only honest
sites). Claim attacked (docs/privacy.md section 4, docs/paillier-keyholder.md, the layer's noise
rule in :mod:`fedsec.network.client_noise`): "each honest share has variance mu / (t - c), so the
>= t - c honest shares of any released sum hold >= mu" (mu = (z D2)^2, z the noise multiplier the
site accepted and charges its ledger with). The argument needs every honest site of a sum to
have drawn for the SAME mu, but nothing binds mu (z, or the plan z was checked against) into
what the key holder decrypts: the spec binds the layout and the roster's names only, and z is a
per-site job field (``SiteWork.start(noise_multiplier=...)``), each site checking only that its
own z keeps its own plan's epsilon within target.

The lie: hosp-a is handed a noise multiplier z_a several times the one the others get. A larger z
only lowers hosp-a's epsilon, so it accepts it (and reports/charges that smaller epsilon). The
sites' encoders then differ in their noise room (``SkellamShares.slack``), which would make their
word bounds differ, but the coordinator also chooses ``max_weight`` per site (a setup field, not in
the spec): it picks z_a so that the room differs by exactly k * (2^bits - 1) and hands hosp-b and
hosp-x a max_weight k larger, so all three encoders give ONE spec (same word bound, same roster
digest). The key holder decrypts their sum: 3 >= t honest submissions under the plan's roster.

- ``same plan``: all three sites hold the same plan; hosp-b/hosp-x get the plan's calibrated z.
  hosp-a's ledger charges epsilon(z_a), but the sum holds (mu_a + 2 mu) / 3 << mu_a: the epsilon
  hosp-a reports and charges is below what it actually spent (though within the plan's target).
- ``two plans``: hosp-b/hosp-x are shown a plan with the same roster but a larger target epsilon
  (the coordinator shows sites different plans, which only ``fedsec audit reconcile`` notices
  after the fact, review R7), and take the smaller z it calibrates. hosp-a, under its own plan and
  its calibrated z, gets a sum holding less noise than its own plan's target demands: its epsilon
  exceeds its plan's target, with no colluder at all.

Honest parties, unmodified: the deployment's ``PaillierSite`` layer (key-holder custody, client
level, the noise rule ``SiteWork.start`` builds; each z passes ``SiteWork._check_epsilon``) and the
real :class:`KeyHolderService` (threshold 3) over its sqlite state; the coordinator uses the
project's :class:`PaillierServer` to ask for the decryption.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from fedsec.protocols.errors import ClientAbort, MalformedMessage, ProtocolAbort
from fedsec.protocols.paillier import DecryptionRefused, PaillierServer
from fedsec.protocols.paillier.client import OTHER_CONTEXT
from fedsec.protocols.paillier.spec import NO_CONTEXT, roster_digest
from fedsec.protocols.privacy import PrivacyBudget
from fedsec.protocols.privacy.client_level import SHIFT_STDS, distributed_round_event, sensitivity
from fedsec.protocols.wire import Writer

from fedsec.config import make_config
from fedsec.network.client_noise import noise_context, noise_rule
from fedsec.network.errors import PolicyRefused
from fedsec.network.keyholder import ANNOUNCE, DECRYPT, ENROL, REGISTER, KeyHolderService, encode_enrolment
from fedsec.network.keyholder_state import KeyHolderState
from fedsec.network.layers import SiteContext
from fedsec.network.layers import paillier as layer
from fedsec.network.pki import verify_peer
from fedsec.network.policy import SitePolicy, check_plan
from fedsec.network.site_work import SiteWork
from tests.fedsec.network.conftest import study  # noqa: F401 - fixture
from tests.fedsec.network.keyholder_helpers import Caller, identity_path, load_identity

ROSTER = ("hosp-a", "hosp-b", "hosp-x")
IDS = {name: i for i, name in enumerate(ROSTER)}
T, LENGTH, CLIP, ROUNDS = 3, 12, 0.5, 3


def _plan(target: float):
    return make_config({"data.clients": len(ROSTER), "secure.aggregation": "paillier",
                        "secure.custody": "key_holder", "secure.threshold": T, "rounds": ROUNDS,
                        "federation.sites": list(ROSTER), "federation.keyholder": "127.0.0.1:1",
                        "federation.min_sites": 3, "dp.mode": "client", "dp.max_grad_norm": CLIP,
                        "dp.target_epsilon": target, "dp.reproducible": False})


def _accepts(config, z: float) -> bool:
    """Whether a site holding ``config`` accepts noise multiplier ``z`` (``SiteWork.start``'s
    client-level budget, checked by the unmodified ``SiteWork._check_epsilon``)."""
    s, p = config.secure, config.dp
    event = distributed_round_event(z, bits=s.bits, length=LENGTH, clip_ratio=p.max_grad_norm / s.clip)
    budget = PrivacyBudget(profiles=[[event]], delta=p.delta, target_epsilon=p.target_epsilon,
                           accountant=p.accountant, unit="client", noise_multiplier=z)
    try:
        SiteWork._check_epsilon(SimpleNamespace(config=config), budget, z)
    except PolicyRefused:
        return False
    return True


def _calibrated(config) -> float:
    """The smallest z the site accepts (bisection; what an honest coordinator would send)."""
    lo, hi = 0.05, 50.0
    assert _accepts(config, hi) and not _accepts(config, lo)
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if _accepts(config, mid) else (mid, hi)
    return hi


def _room(config, z: float, colluders: int) -> int:
    """ceil(SHIFT_STDS sigma) of a share for ``z`` (the integer a site's noise room is 2 x (it + 1))."""
    rule = noise_rule(config, z, LENGTH)
    return math.ceil(SHIFT_STDS * math.sqrt(rule.total_variance / (T - colluders)))


def _matching_z(config, z_low: float, colluders: int, factor: float) -> tuple[float, int]:
    """A z_a >= ``factor`` x z_low whose noise room exceeds z_low's by exactly k (2^bits - 1), k even."""
    levels = (1 << config.secure.bits) - 1
    _, l2 = sensitivity(config.secure.bits, LENGTH, config.dp.max_grad_norm / config.secure.clip)
    base = _room(config, z_low, colluders)
    for k in range(2, 1 << 20, 2):
        target = base + k * levels // 2
        z = (target - 0.5) / SHIFT_STDS * math.sqrt(T - colluders) / l2
        if z >= factor * z_low and _room(config, z, colluders) == target:
            return z, k
    raise AssertionError("no z_a found")


@pytest.fixture
def keyholder(study, tmp_path):  # noqa: F811
    trust = study.trust()
    service = KeyHolderService(
        state=KeyHolderState(tmp_path / "kh", threshold=T), sites=None,
        identity=load_identity(identity_path(study.parties["auditor"])), name="auditor",
        trust=trust, certificate=study.parties["auditor"].cert_pem)
    coordinator = study.parties["coordinator"]
    verified = verify_peer(coordinator.cert_pem, trust=trust, roles=("server",))
    caller = Caller("coordinator", verified.identity_key)
    layer.SITE_CLIENTS.clear()
    try:
        yield service, caller, load_identity(identity_path(coordinator))
    finally:
        layer.SITE_CLIENTS.clear()
        service.close()


@pytest.mark.parametrize("bound", ["hosp-a's", "the others'", "none", "forged"])
@pytest.mark.parametrize("variant", ["same plan", "two plans"])
def test_one_sum_mixes_shares_drawn_for_different_noise(study, keyholder, tmp_path, variant, bound):  # noqa: F811
    """Fixed (S6-1): every site binds its OWN noise context (plan digest, z, D2, S, t, c) into the
    spec it submits under; the coordinator searches which context to bind (hosp-a's, the
    others', none, a forged one): some site always refuses, and fewer than t submissions are
    never decrypted."""
    service, caller, coordinator_key = keyholder
    call = lambda topic, payload: service.handle(caller, topic, payload)  # noqa: E731
    plan_a = _plan(1.0)
    plan_others = plan_a if variant == "same plan" else _plan(3.0)
    # the defaults but the peers (the roster): min_corrupt 0.1 of 3 -> c = 0; max_epsilon_run 10
    policy = SitePolicy(peers=tuple(plan_a.federation.sites))
    for plan in (plan_a, plan_others):
        check_plan(policy, plan, min_sites=plan.federation.min_sites)  # each site admits its plan
    colluders = 0
    z_others = _calibrated(plan_others)
    z_a_floor = _calibrated(plan_a)
    # same plan: z_a >= 4 x the calibrated z; two plans: z_a just above hosp-a's own calibrated z
    factor = 4.0 if variant == "same plan" else z_a_floor / z_others
    z_a, k = _matching_z(plan_a, z_others, colluders, factor)
    assert _accepts(plan_a, z_a) and _accepts(plan_others, z_others)  # each site accepts its own z
    for name, client_id in IDS.items():
        call(ENROL, encode_enrolment(client_id, study.parties[name].cert_pem))
    announcement = call(ANNOUNCE, b"").hex()
    sequence = service.holder.last_sequence + 1
    max_weight = {"hosp-a": 1, "hosp-b": 1 + k, "hosp-x": 1 + k}
    sites, rules = {}, {}
    for name in ROSTER:
        config, z = (plan_a, z_a) if name == "hosp-a" else (plan_others, z_others)
        (tmp_path / name).mkdir()
        rules[name] = noise_rule(config, z, LENGTH)
        context = SiteContext(config=config, name=name, client_id=IDS[name], names=ROSTER,
                              identity=load_identity(identity_path(study.parties[name])), trust=study.trust(),
                              state=tmp_path / name, client_noise=rules[name], policy=policy)
        setup = {"layer": "paillier", "custody": "key_holder", "purpose": "update", "round": 1,
                 "clients": len(ROSTER), "max_weight": max_weight[name], "announcement": announcement,
                 "announcer": study.parties["auditor"].cert_pem.decode()}
        sites[name] = layer.PaillierSite(context, setup=setup, vector=np.full(LENGTH, 0.05, np.float32),
                                         weight=1)
    bounds = {sites[n].encoding.encoder.word_bound for n in ROSTER}
    assert len(bounds) == 1  # the per-site max_weight hid the differing noise room
    contexts = {n: noise_context(plan_a if n == "hosp-a" else plan_others, rules[n], threshold=T,
                                 colluders=colluders) for n in ROSTER}
    assert contexts["hosp-b"] == contexts["hosp-x"] != contexts["hosp-a"]
    bind = {"hosp-a's": contexts["hosp-a"], "the others'": contexts["hosp-b"], "none": NO_CONTEXT,
            "forged": bytes(range(32))}[bound]
    spec = layer.round_spec(sequence=sequence, length=LENGTH, clients=len(ROSTER), word_bound=bounds.pop(),
                            tagged=True, roster=roster_digest(ROSTER), context=bind)
    public = service.holder.public_key
    server = PaillierServer(public, spec, expected=list(IDS.values()), threshold=T,
                            identities={IDS[n]: load_identity(identity_path(study.parties[n])).public
                                        for n in ROSTER},
                            identity=coordinator_key, roster=ROSTER)
    refused = set()
    for name in ROSTER:
        registration = sites[name].handle(layer.REGISTER, b"")
        welcome = call(REGISTER, registration) if registration else b""
        try:
            submission = sites[name].handle(layer.SUBMIT,
                                            Writer().blob(welcome).blob(spec.to_bytes()).getvalue())
        except ClientAbort as error:
            assert str(error) == OTHER_CONTEXT
            refused.add(name)
            continue
        server.receive(IDS[name], submission)
    assert refused and refused == {n for n in ROSTER if contexts[n] != bind}
    try:
        server.finish(call(DECRYPT, server.decryption_request()))
    except (DecryptionRefused, MalformedMessage, ProtocolAbort):
        return  # the secure outcome: no such sum is released
    in_sum = sum(sites[n].encoding.noise.variance for n in ROSTER)
    mu_a = rules["hosp-a"].total_variance
    if variant == "same plan":  # hosp-a charges epsilon(z_a): the sum must hold its mu
        assert in_sum >= mu_a * (1 - 1e-9), f"honest noise {in_sum / mu_a:.3f} mu_a"
    else:  # hosp-a's plan's target needs at least the noise of its calibrated z
        mu_floor = noise_rule(plan_a, z_a_floor, LENGTH).total_variance
        assert in_sum >= mu_floor * (1 - 1e-9), f"honest noise {in_sum / mu_floor:.3f} of hosp-a's floor"
