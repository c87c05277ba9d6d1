"""The Paillier layer of a deployed round against the simulation's Paillier protocol, in one process:
real certificates, a real key holder behind mTLS (in-process gRPC), the sites' layers driven
through an exchange that builds them as the site framework does. Both custodies."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from fedsec.fl_core.aggregation import ClientUpdate
from fedsec.protocols.errors import ClientAbort, ProtocolAbort
from fedsec.protocols.paillier import PaillierAggregation

from fedsec.config import make_config
from fedsec.network.keyholder import KeyHolderService, OneThread, load_identity
from fedsec.network.keyholder_state import KeyHolderState
from fedsec.network.layers import LAYERS, CoordinatorContext, SiteContext, split_first
from fedsec.network.layers import paillier as layer
from fedsec.network.layers.paillier_dealer import SHARE_FILE, deal
from fedsec.network.pki import verify_peer
from fedsec.network.transport import TransportServer
from tests.fedsec.network.conftest import enrol
from tests.fedsec.network.keyholder_helpers import identity_path

NAMES = ("hosp-a", "hosp-b", "hosp-x", "hosp-c")
LENGTH = 12
MAX_WEIGHT = 40


@pytest.fixture(scope="module")
def sites(study, tmp_path_factory):
    study.parties["hosp-c"] = enrol(study.ca_dir, tmp_path_factory.mktemp("hosp-c"), "hosp-c", "site")
    return NAMES


@pytest.fixture(autouse=True)
def fresh_site_memory():
    layer.SITE_CLIENTS.clear()
    yield
    layer.SITE_CLIENTS.clear()


@pytest.fixture
def keyholder(study, tmp_path):
    auditor = study.parties["auditor"]
    identity = load_identity(identity_path(auditor))

    def build():
        return KeyHolderService(state=KeyHolderState(tmp_path / "kh", threshold=3), identity=identity,
                                name="auditor", trust=study.trust(), certificate=auditor.cert_pem)

    runner = OneThread(build)
    server = TransportServer(trust=study.trust(), cert_pem=auditor.cert_pem, key_pem=auditor.key_pem,
                             handler=runner.handle, roster={"coordinator"}, roles=("server",))
    port = server.start()
    yield f"127.0.0.1:{port}", runner
    server.stop(0)
    runner.close()


class Sites:
    """The sites' side of :data:`~fedsec.network.layers.base.Exchange`, in this process."""

    def __init__(self, study, config, names, vectors, weights, state: Path) -> None:
        self.contexts = {c: SiteContext(config=config, name=n, client_id=c, names=names,
                                        identity=load_identity(identity_path(study.parties[n])),
                                        trust=study.trust(), state=state / n) for c, n in enumerate(names)}
        for context in self.contexts.values():
            context.state.mkdir(parents=True, exist_ok=True)
        self.vectors, self.weights = vectors, weights
        self.layers: dict[int, object] = {}
        self.aborts: dict[int, str] = {}
        self.silent: set[int] = set()

    def exchange(self, stage, outgoing):
        replies = {}
        for c, message in outgoing.items():
            if c in self.silent:
                continue
            try:
                if message[:4] == b"FSJ1":  # a setup starts a new layer, as fedsec/network/site.py
                    setup, message = split_first(message)
                    site_layer = LAYERS[setup["layer"]][1]
                    self.layers[c] = site_layer(self.contexts[c], setup=setup, vector=self.vectors[c],
                                                weight=self.weights[c])
                reply = self.layers[c].handle(stage, message)
            except ClientAbort as error:
                self.aborts[c] = error.reason
                continue
            if reply is not None:
                replies[c] = reply
        return replies


def _plan_values(custody: str, address: str = "127.0.0.1:1") -> dict:
    return {"data.clients": 4, "secure.aggregation": "paillier", "secure.custody": custody,
            "federation.sites": list(NAMES), "federation.keyholder": address, "federation.min_sites": 2,
            "dp.mode": "dpsgd", "dp.reproducible": True}


def plan(custody: str, address: str = "127.0.0.1:1"):
    return make_config(_plan_values(custody, address))


def coordinator_context(study, config, sites_side: Sites, seed: int) -> CoordinatorContext:
    coordinator = study.parties["coordinator"]
    trust = study.trust()
    certificates = {n: study.parties[n].cert_pem for n in NAMES}
    return CoordinatorContext(config=config, rng=np.random.default_rng(seed), names=NAMES,
                              certificates=certificates,
                              peers={n: verify_peer(p, trust=trust, roles=("site",))
                                     for n, p in certificates.items()},
                              max_weight=MAX_WEIGHT, exchange=sites_side.exchange,
                              identity=load_identity(identity_path(coordinator)), trust=trust,
                              cert_path=coordinator.cert, key_path=coordinator.key)


def inputs(seed: int):
    rng = np.random.default_rng(seed)
    vectors = {c: rng.normal(0, 0.4, LENGTH).astype(np.float32) for c in range(4)}
    weights = {c: int(rng.integers(1, MAX_WEIGHT + 1)) for c in range(4)}
    return vectors, weights


def assert_same(deployed, simulated, *, exact_upload: bool = True):
    """Equal results; under threshold custody the upload may differ by a few bytes, because the
    proofs of plaintext knowledge and of decryption hold random integers of varying byte length
    (two simulations with one seed differ the same way)."""
    assert np.array_equal(deployed.weighted_sum, simulated.weighted_sum)
    assert deployed.total_weight == simulated.total_weight
    assert deployed.participants == simulated.participants and deployed.dropped == simulated.dropped
    if exact_upload:
        assert deployed.upload_bytes == simulated.upload_bytes
    else:
        assert abs(deployed.upload_bytes - simulated.upload_bytes) <= simulated.upload_bytes // 200
    assert deployed.metrics == simulated.metrics


def run_both(study, config, custody, tmp_path, rounds):
    """Each round: the deployed layer and the simulation on the same inputs and generator seed."""
    sim = PaillierAggregation(max_weight=MAX_WEIGHT, rng=np.random.default_rng(5), clip=config.secure.clip,
                              bits=config.secure.bits, threshold=3, custody=custody, parties=range(4))
    deployed_rng_seed = 5
    side = Sites(study, config, NAMES, *inputs(0), tmp_path / "sites")
    context = coordinator_context(study, config, side, deployed_rng_seed)
    coordinator = LAYERS["paillier"][0](context)
    results = []
    for round_index, ids, purpose in rounds:
        side.vectors, side.weights = inputs(round_index)
        deployed = coordinator.aggregate(round_index, [ClientUpdate(c, np.zeros(LENGTH, np.float32), 1)
                                                       for c in ids], purpose=purpose)
        simulated = sim.aggregate(round_index, [ClientUpdate(c, side.vectors[c], side.weights[c])
                                                for c in ids], purpose=purpose)
        assert_same(deployed, simulated, exact_upload=custody == "key_holder")
        results.append(deployed)
    assert context.rng.bit_generator.state == sim.rng.bit_generator.state  # the same draws, in order
    return coordinator, side, results


@pytest.mark.slow
def test_key_holder_custody_deployed_equals_the_simulation(study, sites, keyholder, tmp_path):
    address, runner = keyholder
    config = plan("key_holder", address)
    run_both(study, config, "key_holder", tmp_path, [(1, [0, 1, 2, 3], "update"), (2, [0, 2, 3], "update"),
                                                     (3, [0, 1, 2, 3], "statistics")])
    assert runner.call(runner.service.status)["last_sequence"] == 3 and runner.service.holder.decryptions == 3
    assert [c for c, *_ in runner.call(runner.service.state.enrolled)] == [0, 1, 2, 3]


def test_key_holder_custody_a_silent_site_is_dropped_and_too_few_burn_the_number(study, sites, keyholder,
                                                                                   tmp_path):
    address, runner = keyholder
    config = plan("key_holder", address)
    side = Sites(study, config, NAMES, *inputs(0), tmp_path / "sites")
    coordinator = LAYERS["paillier"][0](coordinator_context(study, config, side, 1))
    side.silent = {3}
    result = coordinator.aggregate(1, [ClientUpdate(c, np.zeros(LENGTH, np.float32), 1) for c in range(4)])
    assert result.participants == (0, 1, 2) and result.dropped == (3,)
    assert coordinator.last_dropped == {3: "no answer before a stage deadline, or aborted"}
    side.layers, side.silent = {}, {2, 3}
    with pytest.raises(ProtocolAbort):
        coordinator.aggregate(2, [ClientUpdate(c, np.zeros(LENGTH, np.float32), 1) for c in range(4)])
    # the void request burned 2: the next aggregation is 3
    assert runner.call(runner.service.status)["last_sequence"] == 2
    side.layers, side.silent = {}, set()
    assert coordinator.aggregate(3, [ClientUpdate(c, np.zeros(LENGTH, np.float32), 1)
                                     for c in range(4)]).participants == (0, 1, 2, 3)
    assert runner.call(runner.service.status)["last_sequence"] == 3


def test_a_site_refuses_an_announcer_that_is_not_the_plans_key_holder(study, sites, keyholder, tmp_path):
    address, _ = keyholder
    config = plan("key_holder", address)
    side = Sites(study, config, NAMES, *inputs(0), tmp_path / "sites")
    context = coordinator_context(study, config, side, 1)
    coordinator = LAYERS["paillier"][0](context)
    forwarded = side.exchange

    def substitute(stage, outgoing):  # the coordinator relays another party's certificate
        if stage == layer.REGISTER:
            outgoing = {c: _with_setup(m, announcer=study.parties["coordinator"].cert_pem.decode())
                        for c, m in outgoing.items()}
        return forwarded(stage, outgoing)

    context.exchange = substitute
    with pytest.raises(ProtocolAbort):
        coordinator.aggregate(1, [ClientUpdate(c, np.zeros(LENGTH, np.float32), 1) for c in range(4)])
    assert set(side.aborts.values()) == {layer.BAD_ANNOUNCER}


def _with_setup(message: bytes, **changes) -> bytes:
    from fedsec.network.layers import first_message

    setup, body = split_first(message)
    return first_message({**setup, **changes}, body)


@pytest.mark.slow
def test_threshold_custody_deployed_equals_the_simulation(study, sites, tmp_path):
    config = plan("threshold")
    auditor = study.parties["auditor"]
    shares, public = deal(roster=list(NAMES), site_certificates={n: study.parties[n].cert_pem for n in NAMES},
                          threshold=3, trust=study.trust(), identity=load_identity(identity_path(auditor)),
                          dealer_certificate=auditor.cert_pem)
    import json

    for name, record in shares.items():
        directory = tmp_path / "sites" / name
        directory.mkdir(parents=True)
        fd = os.open(directory / SHARE_FILE, os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(record))
    assert public["parties"] == 4 and public["threshold"] == 3
    run_both(study, config, "threshold", tmp_path, [(1, [0, 1, 2, 3], "update"),
                                                    (2, [0, 1, 2, 3], "statistics")])
    assert (tmp_path / "sites" / "hosp-a" / "endorsements.db").exists()
    # A second run on the same dealing (new site processes, a new coordinator) numbers on from the
    # sites' durable record: sequence 3, not a refused reuse of 1.
    layer.SITE_CLIENTS.clear()
    side = Sites(study, config, NAMES, *inputs(7), tmp_path / "sites")
    coordinator = LAYERS["paillier"][0](coordinator_context(study, config, side, 9))
    result = coordinator.aggregate(1, [ClientUpdate(c, np.zeros(LENGTH, np.float32), 1) for c in range(4)])
    assert result.participants == (0, 1, 2, 3) and coordinator.custody._sequence == 3


@pytest.mark.slow
def test_a_site_holding_another_dealing_cannot_swap_the_key_for_the_others(study, sites, tmp_path):
    """Adversary: a site that replays an older (validly signed) dealing of the same auditor in
    ``paillier/hello``. The coordinator takes the dealing most sites hold; the odd site's
    submission (a proof under another key) is refused and the round is the others' exact sum."""
    import json

    config = make_config({**_plan_values("threshold"), "secure.threshold": 2})
    auditor = study.parties["auditor"]
    dealings = [deal(roster=list(NAMES), site_certificates={n: study.parties[n].cert_pem for n in NAMES},
                     threshold=2, trust=study.trust(), identity=load_identity(identity_path(auditor)),
                     dealer_certificate=auditor.cert_pem)[0] for _ in range(2)]
    for name in NAMES:
        directory = tmp_path / "sites" / name
        directory.mkdir(parents=True)
        record = dealings[1 if name == "hosp-a" else 0][name]  # hosp-a, the lowest id, holds the old one
        fd = os.open(directory / SHARE_FILE, os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(record))
    side = Sites(study, config, NAMES, *inputs(0), tmp_path / "sites")
    coordinator = LAYERS["paillier"][0](coordinator_context(study, config, side, 3))
    result = coordinator.aggregate(1, [ClientUpdate(c, np.zeros(LENGTH, np.float32), 1) for c in range(4)])
    assert result.participants == (1, 2, 3) and result.dropped == (0,)
    assert coordinator.last_dropped == {0: "it holds another dealing"}
    assert coordinator.custody.public_key.n == int(dealings[0]["hosp-b"]["n"], 16)
    expected = sum(side.weights[c] * np.clip(side.vectors[c].astype(np.float64), -1, 1) for c in (1, 2, 3))
    assert np.allclose(result.weighted_sum, expected, atol=4 * 3 * MAX_WEIGHT * 2 / 2**16)
