"""The deployed masking layer in one process (no sockets): the same sums as the simulation's
protocol, and a coordinator that lies in the setup (relayed certificates) searched; the site's
durable record against replayed and extra rounds; the site's check of the noise multiplier."""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives import serialization
from fedsec.fl_core.aggregation import ClientUpdate
from fedsec.protocols.errors import ClientAbort
from fedsec.protocols.masked import MaskedAggregation
from fedsec.protocols.masked.workers import shared_pool
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsec.config import make_config
from fedsec.network import demo, envelope, pki
from fedsec.network.errors import PolicyRefused
from fedsec.network.layers import CoordinatorContext, SiteContext, split_first
from fedsec.network.layers.masking import BAD_CERTIFICATE, NOT_OURS, MaskingCoordinator, MaskingSite
from fedsec.network.site import load_identity
from fedsec.network.site_state import MAX_TRAININGS, SiteState

N = 5


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("layers")
    pki.init_ca(root / "ca", name="layer study")
    pki.init_ca(root / "other", name="other study")
    sites = [demo.enrol(root / "ca", root / f"s{k}", f"site-{k}", "site") for k in range(N)]
    foreign = demo.enrol(root / "other", root / "foreign", "site-0", "site")
    trust = pki.Trust.load(root / "ca" / "ca.crt")
    peers = {s.name: pki.verify_peer(s.cert.read_bytes(), trust=trust, roles=("site",)) for s in sites}
    return root, sites, foreign, trust, peers


def _config(reproducible: bool = True):
    return make_config({"federation.sites": [f"site-{k}" for k in range(N)], "data.clients": N,
                        "dp.reproducible": reproducible, "seed": 3})


def _run(study, config, vectors, weights, *, purpose="update", tamper=None):
    _, sites, _, trust, peers = study
    names = tuple(config.federation.sites)
    layers: dict[int, MaskingSite] = {}
    aborts: dict[int, str] = {}

    def exchange(stage, messages):
        replies = {}
        for c, message in messages.items():
            try:
                if message[:4] == envelope.MAGIC:
                    setup, message = split_first(message)
                    if tamper is not None:
                        setup = tamper(c, setup)
                    context = SiteContext(config=config, name=names[c], client_id=c, names=names,
                                          identity=load_identity(sites[c].identity), trust=trust)
                    layers[c] = MaskingSite(context, setup=setup, vector=vectors[c], weight=weights[c])
                reply = layers[c].handle(stage, message)
            except ClientAbort as abort:
                aborts[c] = abort.reason
                continue
            if reply is not None:
                replies[c] = reply
        return replies

    rng = np.random.default_rng(11)
    certificates = {s.name: s.cert.read_bytes() for s in sites}
    context = CoordinatorContext(config=config, rng=rng, names=names, certificates=certificates, peers=peers,
                                 max_weight=max(weights), exchange=exchange)
    layer = MaskingCoordinator(context)
    updates = [ClientUpdate(c, np.zeros_like(vectors[c]), 1.0) for c in range(N)]
    return layer.aggregate(1, updates, purpose=purpose), aborts


def test_the_deployed_layer_releases_the_simulations_sum(study):
    config = _config()
    gen = np.random.default_rng(0)
    vectors = [gen.uniform(-1, 1, 300).astype(np.float32) for _ in range(N)]
    weights = [int(w) for w in gen.integers(1, 50, N)]
    deployed, aborts = _run(study, config, vectors, weights)
    assert aborts == {}
    s = config.secure
    protocol = MaskedAggregation(max_weight=max(weights), rng=np.random.default_rng(11), clip=s.clip,
                                 bits=s.bits, reproducible=True, population=N)
    simulated = protocol.aggregate(1, [ClientUpdate(c, vectors[c], float(weights[c])) for c in range(N)])
    np.testing.assert_array_equal(deployed.weighted_sum, simulated.weighted_sum)
    assert deployed.total_weight == simulated.total_weight == sum(weights)
    assert deployed.participants == simulated.participants
    assert deployed.upload_bytes == simulated.upload_bytes


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_a_coordinator_relaying_other_certificates_gets_an_abort_or_the_true_keys(study, data):
    """Adversary: the coordinator, rewriting the certificate map of each site's setup (dropping,
    swapping, repeating entries, or putting in a certificate of another study)."""
    root, sites, foreign, _, _ = study
    pems = [s.cert.read_bytes().decode() for s in sites] + [foreign.cert.read_bytes().decode()]
    choice = data.draw(st.lists(st.integers(0, N), min_size=N, max_size=N))
    keep = data.draw(st.lists(st.booleans(), min_size=N, max_size=N))
    victim = data.draw(st.integers(0, N - 1))

    def tamper(c, setup):
        if c != victim:
            return setup
        return {**setup, "certificates": {str(k): pems[choice[k]] for k in range(N) if keep[k]}}

    vectors = [np.full(20, 0.25, np.float32) for _ in range(N)]
    result, aborts = _run(study, _config(), vectors, [1] * N, tamper=tamper)
    honest = all(choice[k] == k for k in range(N) if keep[k])
    if not keep[victim] or choice[victim] != victim:
        assert aborts.get(victim) in (NOT_OURS, BAD_CERTIFICATE)
    elif not honest:
        assert aborts.get(victim) == BAD_CERTIFICATE
    if victim in aborts:
        assert victim not in result.participants
    else:  # it accepted: every key it holds is the certified one, and the sum is right
        assert honest
        np.testing.assert_allclose(result.weighted_sum, 0.25 * len(result.participants), atol=1e-3)


@settings(max_examples=40, deadline=None)
@given(claims=st.lists(st.tuples(st.integers(-2, 8), st.booleans(), st.booleans()), max_size=25))
def test_a_coordinator_replaying_or_adding_rounds_never_gets_more_than_the_plans(tmp_path_factory, claims):
    """Adversary: a coordinator that asks for any sequence of rounds, replays and restarts (the
    site's process too), and sets up an aggregation of the update after any training. A round is
    trained again only while its update was never consumed; the rounds trained are the plan's at
    most; no update is consumed twice."""
    folder = tmp_path_factory.mktemp("state")
    rounds, trained, consumed, counts = 5, [], [], []
    state = SiteState(folder)
    for claim, again, setup in claims:
        if again:
            state.close()
            state = SiteState(folder)
        try:
            counts.append(state.contribute("run", claim, max_rounds=rounds))
        except PolicyRefused as refusal:
            assert refusal.rule in ("rounds.invalid", "rounds.plan", "rounds.replayed", "rounds.retrained")
            assert (refusal.rule != "rounds.replayed") or claim in consumed
            assert (refusal.rule != "rounds.retrained") or trained.count(claim) == MAX_TRAININGS
            continue
        assert claim not in consumed  # a consumed round is never trained again
        trained.append(claim)
        if setup:
            state.consume("run", "update", claim)
            consumed.append(claim)
    recorded = state.contributed("run")
    state.close()
    assert sorted(set(trained)) == recorded and len(recorded) <= rounds
    assert all(1 <= r <= rounds for r in trained)
    assert len(consumed) == len(set(consumed))
    assert all(trained.count(r) <= MAX_TRAININGS for r in trained)  # retrains are bounded
    assert counts == [len(set(trained[:i + 1])) for i in range(len(trained))]
    expected: list[int] = []
    for claim, _, _ in claims:
        if 1 <= claim <= rounds and claim not in expected and len(expected) < rounds:
            expected.append(claim)
    assert recorded == sorted(expected)


def test_a_site_refuses_a_noise_multiplier_below_the_plans_epsilon(tmp_path):
    from fedsec.fl_core.csv_data import load_client_csv

    from fedsec.network.site_work import SiteWork
    from fedsec.site_data import schema

    paths = demo.breast_cancer_shards(tmp_path, 4)
    config = make_config({"data.dataset": "csv", "data.clients": 4, "data.label": demo.LABEL,
                          "data.classes": ["0", "1"], "data.columns": demo.feature_columns(), "rounds": 5,
                          "federation.sites": ["a", "b", "c", "d"]})
    data = load_client_csv(paths[0], schema(config), test_fraction=0.2, seed=0, index=0)
    with pytest.raises(PolicyRefused) as refused:
        SiteWork(config, client_id=0, data=data).start(noise_multiplier=0.5)
    assert refused.value.rule == "dp.noise"
    work = SiteWork(config, client_id=0, data=data)
    work.start(noise_multiplier=5.0)
    assert work.strategy is not None


def test_pem_roundtrip_of_the_identity_key(study):
    _, sites, _, _, peers = study
    key = load_identity(sites[0].identity)
    raw = peers["site-0"].identity_key.public_bytes(serialization.Encoding.Raw,
                                                    serialization.PublicFormat.Raw)
    assert key.public == raw


@pytest.mark.slow  # starts a worker process (once per test session)
def test_the_deployed_layer_with_worker_processes_releases_the_same_sum(study):
    config = make_config({"federation.sites": [f"site-{k}" for k in range(N)], "data.clients": N,
                          "dp.reproducible": True, "seed": 3, "secure.workers": 2})
    gen = np.random.default_rng(1)
    vectors = [gen.uniform(-1, 1, 200).astype(np.float32) for _ in range(N)]
    weights = [int(w) for w in gen.integers(1, 50, N)]
    pooled, aborts = _run(study, config, vectors, weights)
    single, _ = _run(study, _config(), vectors, weights)
    assert aborts == {} and shared_pool(2).pids()  # the coordinator started the pool
    np.testing.assert_array_equal(pooled.weighted_sum, single.weighted_sum)
    assert pooled.participants == single.participants and pooled.total_weight == single.total_weight
