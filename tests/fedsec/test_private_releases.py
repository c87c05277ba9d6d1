"""Everything the server receives from a client in a private run, beside the update itself (the
mechanism's output), is the same when one training example changes: the canary audit of issue 10.

The adversary is the server (honest-but-curious, or any observer of history.csv and summary.json)
who wants to learn one record of one client. The clients and the server loop are the project's own,
unmodified; only a recording wrapper sits in front of the aggregation protocol, where the server
stands. The canaries are searched over: several kinds of changed record at different clients.
"""

from __future__ import annotations

import dataclasses
import math
from unittest import mock

import numpy as np
import pytest
from fedsec.fl_core.aggregation import AggregateResult, AggregationProtocol
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedsec import fl_core
from fedsec.config import make_config
from fedsec.errors import ConfigError
from fedsec.experiment import build_experiment, summarize
from fedsec.privacy import build_privacy

POST_PROCESSING = {"accuracy", "loss", "update_norm", "seconds"}
"""RoundRecord fields that are functions of the released model (or the wall clock: named)."""


class Recorder(AggregationProtocol):
    """Stands where the server stands: records every ClientUpdate before the real protocol."""

    def __init__(self, inner: AggregationProtocol) -> None:
        self.inner, self.name = inner, inner.name
        self.client_metrics = inner.client_metrics
        self.seen: list[list[tuple[int, float]]] = []

    def aggregate(self, round_index: int, updates, *, purpose="update") -> AggregateResult:
        if purpose == "update":
            self.seen.append([(u.client_id, u.weight) for u in updates])
        return self.inner.aggregate(round_index, updates, purpose=purpose)


def _canary(data: fl_core.FederatedDataset, client: int, kind: str) -> fl_core.FederatedDataset:
    """``data`` with one record of ``client`` replaced (or, for ``added``, one record added)."""
    own = data.clients[client]
    x, y = own.x.copy(), own.y.copy()
    if kind == "outlier":
        x[0] = 40.0 * np.sign(x[0] + 1e-3)
    elif kind == "flipped":
        y[0] = (y[0] + 1) % data.n_classes
        x[0] = -3.0 * x[0]
    elif kind == "added":
        x, y = np.concatenate([x, 25.0 * x[:1]]), np.concatenate([y, (y[:1] + 1) % data.n_classes])
    clients = list(data.clients)
    clients[client] = fl_core.ArrayDataset(x.astype(own.x.dtype), y.astype(own.y.dtype))
    return dataclasses.replace(data, clients=tuple(clients))


def _server_view(settings: dict, kind, client: int = 0):
    """What the server receives in a short run: updates' ids and weights, and every record field
    that is not post-processing of the released model. ``kind`` names a canary of
    :func:`_canary` or is a function that changes the data set."""
    private = {"dp.reproducible": True} if settings.get("dp.mode") != "none" else {}
    config = make_config({"rounds": 2, "data.standardize": False, "train.lr": 1e-3, **private, **settings})
    if kind is None:
        experiment = build_experiment(config)
    else:
        # The changed record is in the client's data from the start: the experiment, its privacy
        # budget (built from the clients' sizes) included, is built on the changed data set.
        change = kind if callable(kind) else (lambda data: _canary(data, client, kind))
        load = fl_core.load_federated
        with mock.patch.object(fl_core, "load_federated", lambda *a, **k: change(load(*a, **k))):
            experiment = build_experiment(config)
    server = experiment.server
    recorder = Recorder(server.protocol)
    server.protocol = recorder
    result = server.run()
    rows = []
    for record in result.records:
        fields = {k: v for k, v in dataclasses.asdict(record).items() if k not in POST_PROCESSING}
        fields["train_loss"] = "blank" if math.isnan(record.train_loss) else record.train_loss
        rows.append(fields)
    return recorder.seen, rows, experiment


PRIVATE = [
    {"dp.mode": "dpsgd", "secure.aggregation": "none", "dp.noise_multiplier": 1.0,
     "dp.target_epsilon": 0.0},
    {"dp.mode": "dpsgd", "secure.aggregation": "masking", "dp.noise_multiplier": 1.0,
     "dp.target_epsilon": 0.0},
    {"dp.mode": "client", "secure.aggregation": "none", "dp.noise_multiplier": 1.0,
     "dp.target_epsilon": 0.0},
]


@pytest.mark.parametrize("settings", PRIVATE, ids=["dpsgd-plain", "dpsgd-masking", "client-plain"])
@pytest.mark.parametrize("kind,client", [("outlier", 0), ("flipped", 2)])
def test_a_changed_record_changes_nothing_the_server_receives_but_the_update(settings, kind, client):
    before = _server_view(settings, None)
    after = _server_view(settings, kind, client)
    assert len(before[1]) == len(after[1]) == 2  # both rounds ran
    assert before[0] == after[0]  # same clients, same weights
    assert before[1] == after[1]  # same history fields, train_loss included
    assert all(row["train_loss"] == "blank" for row in before[1])


def test_the_control_without_dp_sees_the_canary_in_the_training_loss():
    """Without DP the clients report their loss, and the canary moves it: the test above can fail."""
    settings = {"dp.mode": "none", "secure.aggregation": "none"}
    before, after = _server_view(settings, None), _server_view(settings, "outlier")
    assert len(before[1]) == 2 and before[1][0]["train_loss"] != after[1][0]["train_loss"]


def test_with_sizes_public_an_added_record_shows_in_the_weights():
    """The scope of the default unit, made visible: under dp.weights = 'samples' the weight n_k
    changes when a record is added (sizes are public), which summary.json says."""
    settings = PRIVATE[0]
    before, after = _server_view(settings, None), _server_view(settings, "added")
    assert before[0] != after[0]
    summary_privacy = _summary(after[2])
    assert "sizes public" in summary_privacy["unit_definition"]
    assert any(item.startswith("client data-set sizes") for item in summary_privacy["not_covered"])


EQUAL = {**PRIVATE[0], "dp.weights": "equal",
         "dp.sample_rate": 0.05, "data.partition": "unbalanced"}


def test_equal_weights_hide_an_added_record_from_everything_but_the_update():
    before = _server_view(EQUAL, None)
    after = _server_view(EQUAL, "added")
    assert len(before[1]) == 2 and before[0] == after[0] and before[1] == after[1]
    assert {w for round_ in before[0] for _, w in round_} == {1.0}
    sizes = {len(c) for c in before[2].data.clients}
    assert len(sizes) > 1  # unbalanced: the sizes differ, yet nothing sent depends on them
    privacy = _summary(before[2])
    assert "sizes covered" in privacy["unit_definition"]
    assert not any(item.startswith("client data-set sizes") for item in privacy["not_covered"])


def test_equal_weights_make_the_ledger_and_the_noise_independent_of_the_sizes():
    config = make_config({**EQUAL, "rounds": 3, "data.standardize": False})
    experiment = build_experiment(config)
    data = experiment.data
    n_parameters = sum(p.numel() for p in experiment.server.model.parameters())
    grown = _canary(data, 1, "added")
    protocol = fl_core.PlainAggregation()
    one, two = (build_privacy(config, d, protocol, n_parameters) for d in (data, grown))
    assert one.noise_multiplier == two.noise_multiplier
    assert one.budget.profiles == two.budget.profiles and len(one.budget.profiles) == 1
    (event,) = one.budget.profiles[0]
    assert event.sample_rate == 0.05 and event.steps == 20  # round(1 / q), whatever n_k


def _summary(experiment) -> dict:
    result = fl_core.TrainingResult(np.zeros(1, np.float32), [], None, "rounds")
    return summarize(experiment.config, result, 0.0, 0, experiment.privacy)["privacy"]


def test_every_private_summary_names_the_withheld_loss_timing_and_failures():
    for private in PRIVATE:
        privacy = _summary(build_experiment(make_config({"rounds": 1, **private})))
        assert "train_loss" in privacy["withheld"]
        assert privacy["unit_definition"]
        assert any(item.startswith("timing") for item in privacy["not_covered"])
        failures_named = any(item.startswith("failures") for item in privacy["not_covered"])
        assert failures_named == (private["dp.mode"] == "dpsgd")


def _diverging(data):
    """Client 1's features scaled so that plain local SGD overflows (a non-finite local model)."""
    own = data.clients[1]
    clients = list(data.clients)
    clients[1] = fl_core.ArrayDataset(own.x * np.float32(1e30), own.y)
    return dataclasses.replace(data, clients=tuple(clients))


def test_under_client_level_dp_a_failing_client_looks_like_any_other():
    """The client's data make its local training diverge; it sends a zero update (clipped and
    noised like any other) instead of dropping out, so the server sees the same ids, weights,
    participants and failure counts as in the run without the divergence."""
    settings = {**PRIVATE[2], "train.lr": 0.5}
    before, after = _server_view(settings, None), _server_view(settings, _diverging)
    assert len(after[1]) == 2 and before[0] == after[0] and before[1] == after[1]
    assert all(row["metrics"]["failed_clients"] == 0 for row in after[1])


def test_the_control_a_failing_client_drops_out_without_client_level_dp():
    settings = {"dp.mode": "none", "secure.aggregation": "none", "train.lr": 0.5}
    before, after = _server_view(settings, None), _server_view(settings, _diverging)
    assert before[1][0]["metrics"]["failed_clients"] == 0
    assert after[1][0]["metrics"]["failed_clients"] == 1 and after[1][0]["participants"] == 3


def test_client_level_updates_leave_the_client_with_weight_one():
    seen, _, _ = _server_view(PRIVATE[2], None)
    assert {w for round_ in seen for _, w in round_} == {1.0}


@pytest.mark.parametrize("values,key", [
    ({"dp.weights": "equal"}, "dp.sample_rate"),
    ({"dp.sample_rate": 0.1, "dp.mode": "client", "train.fraction": 1.0}, "dp.sample_rate"),
    ({"dp.sample_rate": 0.1, "train.batch_size": 0}, "train.batch_size"),
    ({"dp.weights": "equal", "dp.mode": "none"}, "dp.weights"),
    ({"dp.weights": "sizes"}, "dp.weights"),
])
def test_weighting_configuration_errors_name_the_key(values, key):
    with pytest.raises(ConfigError) as error:
        make_config(values)
    assert error.value.key == key


_BASELINE: dict[str, tuple] = {}


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(client=st.integers(0, 3), index=st.integers(0, 50), scale=st.floats(-60, 60),
       label=st.integers(0, 1), seed=st.integers(0, 2**16))
def test_searched_canaries_change_nothing_the_server_receives_but_the_update(
        client, index, scale, label, seed):
    """A searching adversary: random records (features of random direction and size, either
    label) planted at a random client under DP-SGD with plain aggregation."""
    if "dpsgd" not in _BASELINE:
        _BASELINE["dpsgd"] = _server_view(PRIVATE[0], None)
    before = _BASELINE["dpsgd"]

    def plant(data):
        own = data.clients[client]
        x, y = own.x.copy(), own.y.copy()
        x[index] = scale * np.random.default_rng(seed).standard_normal(x.shape[1])
        y[index] = label
        clients = list(data.clients)
        clients[client] = fl_core.ArrayDataset(x, y)
        return dataclasses.replace(data, clients=tuple(clients))

    after = _server_view(PRIVATE[0], plant)
    assert len(after[1]) == 2 and before[0] == after[0] and before[1] == after[1]
