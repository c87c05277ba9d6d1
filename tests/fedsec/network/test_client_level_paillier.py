"""Client-level DP over the deployed Paillier layer, both custodies, in one process (a real key
holder behind mTLS for ``key_holder``; a dealt key for ``threshold``): with ``dp.reproducible`` the
deployed sums equal the simulation's (:class:`ClientLevelDP` around :class:`PaillierAggregation`),
every site's share has variance mu / (t - c) for the key's threshold t and the c =
floor(0.1 x 4) = 0 sites that may collude, a coordinator that announces another number of
contributions cannot change a site's share, and a site whose own corrupt fraction leaves the key's
threshold no honest share (t - c < 1) refuses before it draws."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from fedsec.dp import SecureRandom
from fedsec.fl_core.aggregation import ClientUpdate
from fedsec.protocols.errors import ProtocolAbort
from fedsec.protocols.paillier import PaillierAggregation
from fedsec.protocols.privacy import ClientLevelDP
from fedsec.protocols.privacy.client_level import clip_update

from fedsec.config import make_config
from fedsec.network.client_noise import noise_rule
from fedsec.network.keyholder import load_identity
from fedsec.network.layers import LAYERS, first_message, split_first
from fedsec.network.layers import paillier as layer
from fedsec.network.layers.paillier_dealer import SHARE_FILE, deal
from tests.fedsec.network.keyholder_helpers import identity_path
from tests.fedsec.network.test_deploy_paillier_layer import (  # noqa: F401 (fixtures, by name)
    LENGTH,
    MAX_WEIGHT,
    NAMES,
    Sites,
    _plan_values,
    coordinator_context,
    fresh_site_memory,
    keyholder,
    sites,
)

pytestmark = [pytest.mark.slow,
              pytest.mark.usefixtures("sites", "fresh_site_memory", "fresh_accountant_engines")]
Z = 1.1
CLIP = 0.5
THRESHOLD = 3


def _plan(custody: str, address: str = "127.0.0.1:1"):
    return make_config({**_plan_values(custody, address), "dp.mode": "client", "dp.max_grad_norm": CLIP,
                        "seed": 4})


def _raw(round_index: int) -> dict[int, np.ndarray]:
    gen = np.random.default_rng(round_index)
    return {c: gen.normal(0, 0.4, LENGTH).astype(np.float32) for c in range(4)}


def _run(study, config, custody, tmp_path):
    s = config.secure
    sim = ClientLevelDP(PaillierAggregation(max_weight=MAX_WEIGHT, rng=np.random.default_rng(5), clip=s.clip,
                                            bits=s.bits, threshold=THRESHOLD, custody=custody,
                                            parties=range(4)),
                        clip_norm=CLIP, noise_multiplier=Z,
                        random=SecureRandom.from_seed(config.seed, "client"))
    side = Sites(study, config, NAMES, {}, {c: 1 for c in range(4)}, tmp_path / "sites")
    rule = noise_rule(config, Z, LENGTH)
    for context in side.contexts.values():
        context.client_noise = rule
    coordinator = LAYERS["paillier"][0](coordinator_context(study, config, side, 5))
    stream = SecureRandom.from_seed(config.seed, "client")
    for round_index in (1, 2):
        raw = _raw(round_index)
        side.vectors = {c: clip_update(v, CLIP) for c, v in raw.items()}
        coordinator.client_noise = (rule, stream)
        deployed = coordinator.aggregate(round_index, [ClientUpdate(c, np.zeros(LENGTH, np.float32), 1)
                                                       for c in range(4)])
        simulated = sim.aggregate(round_index, [ClientUpdate(c, raw[c], 1.0) for c in range(4)])
        assert side.aborts == {}
        np.testing.assert_array_equal(deployed.weighted_sum, simulated.weighted_sum)
        assert deployed.participants == simulated.participants
        assert stream.state_dict() == sim.random.state_dict()
        for c in range(4):
            assert side.layers[c].encoding.noise.variance == rule.total_variance / (THRESHOLD - 0)
    clean = np.sum(list(side.vectors.values()), axis=0)
    assert np.abs(deployed.weighted_sum - clean).max() > 1e-3  # the noise is there


def test_key_holder_custody_with_client_noise_equals_the_simulation(study, request, tmp_path):
    address, _ = request.getfixturevalue("keyholder")
    _run(study, _plan("key_holder", address), "key_holder", tmp_path)


def test_threshold_custody_with_client_noise_equals_the_simulation(study, tmp_path):
    config = _plan("threshold")
    auditor = study.parties["auditor"]
    shares, _ = deal(roster=list(NAMES), site_certificates={n: study.parties[n].cert_pem for n in NAMES},
                     threshold=THRESHOLD, trust=study.trust(), identity=load_identity(identity_path(auditor)),
                     dealer_certificate=auditor.cert_pem)
    for name, record in shares.items():
        directory = tmp_path / "sites" / name
        directory.mkdir(parents=True)
        fd = os.open(directory / SHARE_FILE, os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(record))
    _run(study, config, "threshold", tmp_path)


@pytest.mark.parametrize("clients", [1, 2, 3, 4])
def test_a_coordinator_announcing_fewer_contributions_cannot_shrink_a_share(study, request, tmp_path,
                                                                            clients):
    """The setup's ``clients`` (n) sizes the words; the share follows the key's threshold t only.
    A lie in n is refused (the spec no longer matches the site's encoder), and whatever n every
    share is mu / t."""
    address, _ = request.getfixturevalue("keyholder")
    config = _plan("key_holder", address)
    side = Sites(study, config, NAMES, {c: np.full(LENGTH, 0.05, np.float32) for c in range(4)},
                 {c: 1 for c in range(4)}, tmp_path / "sites")
    rule = noise_rule(config, Z, LENGTH)
    for context in side.contexts.values():
        context.client_noise = rule
    context = coordinator_context(study, config, side, 5)
    forward = side.exchange

    def lie(stage, outgoing):
        changed = {}
        for c, message in outgoing.items():
            if message[:4] == b"FSJ1":
                setup, body = split_first(message)
                message = first_message({**setup, "clients": clients}, body)
            changed[c] = message
        return forward(stage, changed)

    context.exchange = lie
    coordinator = LAYERS["paillier"][0](context)
    coordinator.client_noise = (rule, SecureRandom())
    updates = [ClientUpdate(c, np.zeros(LENGTH, np.float32), 1) for c in range(4)]
    if clients == 4:  # the truth: released, all four in the sum
        assert coordinator.aggregate(1, updates).participants == (0, 1, 2, 3)
    else:
        with pytest.raises(ProtocolAbort):
            coordinator.aggregate(1, updates)
        assert set(side.aborts.values()) == {layer.BAD_SPEC}
    built = [site for site in side.layers.values() if isinstance(site, layer.PaillierSite)]
    assert built
    assert all(site.encoding.noise.variance == rule.total_variance / THRESHOLD for site in built)


def test_a_site_whose_colluders_reach_the_keys_threshold_refuses_before_drawing(study, request, tmp_path):
    """The site's policy assumes 3 of the 4 sites may collude (``aggregation.min_corrupt`` 0.75),
    so the key's threshold t = 3 leaves no honest share: every site refuses (``NO_MARGIN``) and
    nothing is decrypted."""
    from fedsec.network.policy import SitePolicy

    address, _ = request.getfixturevalue("keyholder")
    config = _plan("key_holder", address)
    side = Sites(study, config, NAMES, {c: np.full(LENGTH, 0.05, np.float32) for c in range(4)},
                 {c: 1 for c in range(4)}, tmp_path / "sites")
    rule = noise_rule(config, Z, LENGTH)
    for context in side.contexts.values():
        context.client_noise, context.policy = rule, SitePolicy(min_corrupt=0.75)
    coordinator = LAYERS["paillier"][0](coordinator_context(study, config, side, 5))
    coordinator.client_noise = (rule, SecureRandom())
    with pytest.raises(ProtocolAbort):
        coordinator.aggregate(1, [ClientUpdate(c, np.zeros(LENGTH, np.float32), 1) for c in range(4)])
    assert side.aborts and set(side.aborts.values()) == {layer.NO_MARGIN}
    assert all(getattr(side.layers.get(c), "encoding", None) is None
               or side.layers[c].encoding.noise is None for c in range(4))
