"""Client-level DP in the deployed secure layers, in one process (no sockets).

1. With ``dp.reproducible`` the deployed masking layer (each site drawing its own share at the
   position the coordinator replays) releases exactly the simulation's noisy sum
   (:class:`ClientLevelDP` around :class:`MaskedAggregation`).
2. Adversary: the coordinator alone, wanting less noise. It runs the project's own
   :class:`MaskingCoordinator` but lies in it: any ring of 3..N sites, any announced threshold,
   its own noise rule (so its word room) for any noise multiplier, and sites it silences at any
   stage to shrink the released sum. The sites are the project's unmodified :class:`MaskingSite`
   with the noise rule each built from the noise multiplier it checked. Whatever it does, a sum
   it obtains holds site shares whose variances add up to at least mu = (z D2)^2, the noise the
   accountant charged, or it obtains nothing.
"""

from __future__ import annotations

import numpy as np
import pytest
from fedsec.dp import SecureRandom
from fedsec.fl_core.aggregation import ClientUpdate
from fedsec.protocols.errors import ClientAbort, ProtocolAbort
from fedsec.protocols.masked import MaskedAggregation
from fedsec.protocols.privacy import ClientLevelDP
from fedsec.protocols.privacy.client_level import clip_update
from hypothesis import event, given, settings
from hypothesis import strategies as st

from fedsec.config import make_config
from fedsec.network import demo, envelope, pki
from fedsec.network.client_noise import noise_rule
from fedsec.network.layers import CoordinatorContext, SiteContext, split_first
from fedsec.network.layers.masking import NO_NOISE, MaskingCoordinator, MaskingSite
from fedsec.network.site import load_identity

N = 5
LENGTH = 40
Z = 1.3
STAGES = ("keys", "shares", "masked", "consistency", "unmask")


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("client-level")
    pki.init_ca(root / "ca", name="client-level study")
    sites = [demo.enrol(root / "ca", root / f"s{k}", f"site-{k}", "site") for k in range(N)]
    trust = pki.Trust.load(root / "ca" / "ca.crt")
    peers = {s.name: pki.verify_peer(s.cert.read_bytes(), trust=trust, roles=("site",)) for s in sites}
    identities = [load_identity(s.identity) for s in sites]
    return sites, trust, peers, identities


def _config(reproducible: bool = True):
    return make_config({"federation.sites": [f"site-{k}" for k in range(N)], "data.clients": N,
                        "dp.mode": "client", "dp.reproducible": reproducible, "seed": 3,
                        "dp.max_grad_norm": 0.5})


class Ring:
    """The honest sites' side of the exchange (as ``Site._jobs`` builds a layer from a setup), and
    the project's masking coordinator, which the adversary may bend."""

    def __init__(self, study, config, vectors, *, z_sites: float = Z) -> None:
        self.sites, self.trust, self.peers, self.identities = study
        self.config, self.vectors = config, vectors
        self.names = tuple(config.federation.sites)
        self.rule = noise_rule(config, z_sites, LENGTH)
        self.layers: dict[int, MaskingSite] = {}
        self.aborts: dict[int, str] = {}
        self.silent_from: dict[int, int] = {}
        self.stage_count: dict[int, int] = {}

    def exchange(self, stage, messages):
        replies = {}
        for c, message in messages.items():
            seen = self.stage_count.get(c, 0)
            self.stage_count[c] = seen + 1
            if self.silent_from.get(c, 99) <= seen:
                continue
            try:
                if message[:4] == envelope.MAGIC:
                    setup, message = split_first(message)
                    context = SiteContext(config=self.config, name=self.names[c], client_id=c,
                                          names=self.names, identity=self.identities[c], trust=self.trust,
                                          client_noise=self.rule)
                    self.layers[c] = MaskingSite(context, setup=setup, vector=self.vectors[c], weight=1)
                reply = self.layers[c].handle(stage, message)
            except ClientAbort as abort:
                self.aborts[c] = abort.reason
                continue
            if reply is not None:
                replies[c] = reply
        return replies

    def coordinator(self, rng_seed: int = 11) -> MaskingCoordinator:
        certificates = {s.name: s.cert.read_bytes() for s in self.sites}
        context = CoordinatorContext(config=self.config, rng=np.random.default_rng(rng_seed),
                                     names=self.names, certificates=certificates, peers=self.peers,
                                     max_weight=1, exchange=self.exchange)
        return MaskingCoordinator(context)


def _liar() -> pytest.MonkeyPatch:
    """The coordinator's server without its own threshold floor (a liar runs what it likes; the
    sites' code is untouched)."""
    patch = pytest.MonkeyPatch()
    patch.setattr("fedsec.protocols.masked.server.minimum_threshold", lambda *args, **kwargs: 1)
    return patch


def _vectors(seed: int, bound: float):
    gen = np.random.default_rng(seed)
    return [clip_update(gen.normal(0, 0.4, LENGTH).astype(np.float32), bound) for _ in range(N)]


def test_deployed_masking_with_client_noise_releases_the_simulations_noisy_sum(study):
    config = _config()
    s, p = config.secure, config.dp
    raw = [np.random.default_rng(k).normal(0, 0.4, LENGTH).astype(np.float32) for k in range(N)]
    stream = SecureRandom.from_seed(config.seed, "client")
    sim = ClientLevelDP(MaskedAggregation(max_weight=1, rng=np.random.default_rng(11), clip=s.clip,
                                          bits=s.bits, reproducible=True, population=N),
                        clip_norm=p.max_grad_norm, noise_multiplier=Z,
                        random=SecureRandom.from_seed(config.seed, "client"))
    ring = Ring(study, config, [clip_update(v, p.max_grad_norm) for v in raw])
    coordinator = ring.coordinator()
    for round_index in (1, 2):  # the stream moves on across rounds as the simulation's does
        ring.layers = {}
        coordinator.client_noise = (noise_rule(config, Z, LENGTH), stream)
        deployed = coordinator.aggregate(round_index, [ClientUpdate(c, np.zeros(LENGTH, np.float32), 1.0)
                                                       for c in range(N)])
        simulated = sim.aggregate(round_index, [ClientUpdate(c, raw[c], 1.0) for c in range(N)])
        assert ring.aborts == {}
        np.testing.assert_array_equal(deployed.weighted_sum, simulated.weighted_sum)
        assert deployed.participants == simulated.participants
        assert stream.state_dict() == sim.random.state_dict()
    threshold = int(deployed.metrics["secagg_threshold"])
    assert all(layer.shares.variance == ring.rule.total_variance / threshold
               for layer in ring.layers.values())
    # the noise is there: the released sum is not the clean one
    clean = np.sum([clip_update(v, p.max_grad_norm) for v in raw], axis=0)
    assert np.abs(deployed.weighted_sum - clean).max() > 1e-3


def test_a_site_without_a_checked_noise_multiplier_refuses_to_sum_an_update(study):
    config = _config()
    ring = Ring(study, config, _vectors(0, 0.5))
    ring.rule = None
    coordinator = ring.coordinator()
    coordinator.client_noise = (noise_rule(config, Z, LENGTH), SecureRandom(bytes(32)))
    with pytest.raises(ProtocolAbort):
        coordinator.aggregate(1, [ClientUpdate(c, np.zeros(LENGTH, np.float32), 1.0) for c in range(N)])
    assert set(ring.aborts.values()) == {NO_NOISE}


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_a_lying_coordinator_never_obtains_a_sum_with_less_than_the_accounted_noise(study, data):
    config = _config(reproducible=False)
    ring = Ring(study, config, _vectors(1, 0.5))
    size = data.draw(st.integers(3, N), label="ring size")
    ids = sorted(data.draw(st.permutations(range(N)), label="ring")[:size])
    coordinator = ring.coordinator()
    degree = size - 1
    claimed = data.draw(st.integers(1, degree), label="announced threshold")
    coordinator.rules.parameters = lambda n: (degree, claimed)  # the lie, in the coordinator's own code
    z_claimed = data.draw(st.sampled_from([0.5, Z / 2, Z, Z, 2 * Z, 2 * Z]), label="coordinator's z")
    coordinator.client_noise = (noise_rule(config, z_claimed, LENGTH), SecureRandom())
    for c in data.draw(st.lists(st.sampled_from(ids), max_size=2, unique=True), label="silenced"):
        ring.silent_from[c] = data.draw(st.integers(1, len(STAGES)), label=f"silent from stage of {c}")
    patch = _liar()
    try:
        result = coordinator.aggregate(1, [ClientUpdate(c, np.zeros(LENGTH, np.float32), 1.0) for c in ids])
    except ProtocolAbort:
        event("refused")
        return  # nothing released
    finally:
        patch.undo()
    event("released")
    shares = [ring.layers[c].shares for c in result.participants]
    assert all(share is not None for share in shares)
    assert sum(share.variance for share in shares) >= ring.rule.total_variance * (1 - 1e-12)


def test_exhaustive_small_rings_and_thresholds(study, monkeypatch):
    """Every ring of 3..N sites (by size) and every announced threshold 1..degree, no silence:
    released sums carry at least mu, and a threshold below the site's floor is refused."""
    monkeypatch.setattr("fedsec.protocols.masked.server.minimum_threshold", lambda *args, **kwargs: 1)
    config = _config(reproducible=False)
    released, refused = [], []
    cases = [(size, claimed, z) for size in range(3, N + 1) for claimed in range(1, size)
             for z in (Z / 2, Z, 2 * Z)]
    for size, claimed, z in cases:
        ring = Ring(study, config, _vectors(2, 0.5))
        coordinator = ring.coordinator()
        coordinator.rules.parameters = lambda n, size=size, claimed=claimed: (size - 1, claimed)
        coordinator.client_noise = (noise_rule(config, z, LENGTH), SecureRandom())
        try:
            result = coordinator.aggregate(1, [ClientUpdate(c, np.zeros(LENGTH, np.float32), 1.0)
                                               for c in range(size)])
        except ProtocolAbort:
            refused.append((size, claimed, z, set(ring.aborts.values())))
            continue
        released.append((size, claimed, z))
        assert len(result.participants) >= claimed
        total = sum(ring.layers[c].shares.variance for c in result.participants)
        assert total >= ring.rule.total_variance * (1 - 1e-12)
    assert released and refused  # both outcomes occur: the search is not vacuous
    # a word room narrower than a site's share (the coordinator's z below the sites'): refused
    assert all(z >= Z for _, _, z in released)
    assert {(3, 1), (4, 1), (5, 1)} <= {(size, claimed) for size, claimed, _, _ in refused}  # below the floor
