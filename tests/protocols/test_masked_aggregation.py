"""Masking behind the fl_core seam gives the plain weighted sum, within quantisation."""

import numpy as np
import pytest
from fedsec.protocols.errors import ProtocolAbort
from fedsec.protocols.masked import MaskedAggregation

from fedsec import fl_core


def _updates(n=6, length=40, seed=0):
    rng = np.random.default_rng(seed)
    return [fl_core.ClientUpdate(k, rng.normal(0, 0.1, length).astype(np.float32),
                                 float(rng.integers(1, 50))) for k in range(n)]


@pytest.mark.parametrize("graph,active", [("complete", False), ("harary", False), ("complete", True)])
def test_weighted_sum_matches_plain_within_quantisation(graph, active):
    updates = _updates(10)
    protocol = MaskedAggregation(max_weight=50, rng=np.random.default_rng(1), graph=graph,
                                 active=active, bits=20)
    masked = protocol.aggregate(1, updates)
    plain = fl_core.PlainAggregation().aggregate(1, updates)
    assert masked.participants == tuple(sorted(u.client_id for u in updates))
    assert masked.total_weight == plain.total_weight
    step = 2 * 1.0 / (2**20 - 1)
    assert np.abs(masked.weighted_sum - plain.weighted_sum).max() <= step * plain.total_weight
    assert masked.metrics["clipped"] == 0
    assert masked.upload_bytes > 40 * 3 * 10  # each client sent its masked words and more


def test_clipping_is_counted():
    updates = _updates(4)
    updates[0] = fl_core.ClientUpdate(0, np.full(40, 3.0, np.float32), 1.0)
    result = MaskedAggregation(max_weight=50, rng=np.random.default_rng(0), clip=1.0).aggregate(1, updates)
    assert result.metrics["clipped"] == 40


def test_dropouts_leave_the_survivors_sum():
    updates = _updates(12)
    protocol = MaskedAggregation(max_weight=50, rng=np.random.default_rng(3), dropout=0.3, bits=20)
    result = protocol.aggregate(1, updates)
    assert 0 < len(result.participants) < 12 or result.dropped == ()
    survivors = [u for u in updates if u.client_id in result.participants]
    plain = fl_core.PlainAggregation().aggregate(1, survivors)
    assert set(result.dropped) == {u.client_id for u in updates} - set(result.participants)
    assert result.total_weight == plain.total_weight
    assert np.abs(result.weighted_sum - plain.weighted_sum).max() < 1e-3


def test_invalid_updates_are_rejected_not_summed():
    updates = _updates(5)
    updates[1] = fl_core.ClientUpdate(1, np.full(40, np.nan, np.float32), 3.0)
    updates[2] = fl_core.ClientUpdate(2, updates[2].vector, 2.5)
    result = MaskedAggregation(max_weight=50, rng=np.random.default_rng(0)).aggregate(1, updates)
    assert result.metrics["rejected"] == 2 and set(result.dropped) >= {1, 2}
    assert 1 not in result.participants and 2 not in result.participants


def test_one_client_is_a_typed_abort():
    with pytest.raises(ProtocolAbort):
        MaskedAggregation(max_weight=50, rng=np.random.default_rng(0)).aggregate(1, _updates(1))


def test_statistics_purpose_handles_raw_feature_scales():
    rng = np.random.default_rng(0)
    vectors = [np.array([880.0 + rng.normal(), 0.06 + 1e-3 * rng.normal()], np.float32) for _ in range(4)]
    updates = [fl_core.ClientUpdate(k, v, 100.0) for k, v in enumerate(vectors)]
    result = MaskedAggregation(max_weight=100, rng=rng).aggregate(0, updates, purpose="statistics")
    expected = sum(100.0 * v.astype(np.float64) for v in vectors)
    step = 2 * 2.0**24 / (2.0**48 - 1)  # the statistics encoder's quantisation step
    assert np.all(np.abs(result.weighted_sum - expected) <= 400 * step)
    assert abs(result.weighted_sum[1] / 400 - expected[1] / 400) < 1e-6


def test_fedavg_with_masking_matches_plain_accuracy_with_dropouts():
    def run(protocol_factory):
        rng = np.random.default_rng(0)
        data = fl_core.load_federated("breast_cancer", n_clients=8, partition="dirichlet", alpha=0.3, rng=rng)
        model = fl_core.build_model("logreg", input_shape=data.input_shape, n_classes=2, seed=0)
        return fl_core.FederatedServer(
            model=model, data=data, rounds=25, rng=rng, protocol=protocol_factory(data),
            strategy=fl_core.FedAvg(trainer=fl_core.SGDTrainer(epochs=1, batch_size=16, lr=0.1))).run()

    plain = run(lambda data: fl_core.PlainAggregation())
    masked = run(lambda data: MaskedAggregation(max_weight=max(len(c) for c in data.clients),
                                                rng=np.random.default_rng(9)))
    dropping = run(lambda data: MaskedAggregation(max_weight=max(len(c) for c in data.clients),
                                                  rng=np.random.default_rng(9), dropout=0.2))
    assert abs(masked.final_accuracy - plain.final_accuracy) <= 0.01
    assert dropping.final_accuracy >= plain.final_accuracy - 0.02
    assert sum(r.dropped for r in dropping.records) > 0
    assert all(r.status == "ok" for r in dropping.records)
