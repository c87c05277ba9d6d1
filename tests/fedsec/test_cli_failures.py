"""Every way a run can fail on the command line ends in one line and the documented exit code."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from fedsec.fl_core.aggregation import ClientUpdate
from fedsec.protocols.errors import ProtocolAbort
from fedsec.protocols.masked import MaskedAggregation
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedsec import fl_core
from fedsec.cli import main

FAST = ["--set", "rounds=2", "--quiet"]


def _one_line_error(capsys, prefix: str = "fedsec: error: ") -> str:
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith(prefix), err
    assert "\n" not in err and "Traceback" not in captured.err
    return err


@pytest.mark.parametrize("args, key", [
    (["--set", "data.clients=2"], "data.clients"),
    (["--set", "data.clients=5", "--set", "train.fraction=0.5"], "train.fraction"),
])
def test_masking_with_two_clients_a_round_exits_2_at_validation(tmp_path, capsys, args, key):
    out = tmp_path / "run"
    assert main(["run", *args, "--out", str(out), *FAST]) == 2
    err = _one_line_error(capsys)
    assert err.startswith(f"fedsec: error: {key}: masking needs >= 3 clients a round")
    assert "paillier" in err and not out.exists()


def test_two_hospitals_run_with_paillier(tmp_path, capsys):
    assert main(["run", "--set", "data.clients=2", "--set", "secure.aggregation=paillier",
                 "--set", "dp.mode=none", *FAST]) == 0
    assert json.loads(capsys.readouterr().out)["rounds_run"] == 2


def _poison(monkeypatch, client: int) -> None:
    """Make one client's features NaN: its feature statistics and its updates are NaN."""
    load = fl_core.load_federated

    def poisoned(*args, **kwargs):
        data = load(*args, **kwargs)
        clients = list(data.clients)
        x = clients[client].x.copy()
        x[:] = np.nan
        clients[client] = fl_core.ArrayDataset(x, clients[client].y)
        return fl_core.FederatedDataset(name=data.name, clients=tuple(clients), test=data.test,
                                        n_classes=data.n_classes, input_shape=data.input_shape,
                                        standardize=data.standardize, info=data.info)

    monkeypatch.setattr(fl_core, "load_federated", poisoned)


def test_one_client_of_three_sending_nan_statistics_fails_cleanly(tmp_path, capsys, monkeypatch):
    _poison(monkeypatch, client=1)
    out = tmp_path / "run"
    code = main(["run", "--set", "data.clients=3", "--out", str(out), *FAST])
    assert code == 1
    err = _one_line_error(capsys, "fedsec: run failed: ")
    assert "masking needs at least 3 valid clients" in err
    assert (out / "config.toml").is_file() and not (out / "summary.json").exists()


def test_one_client_of_three_sending_nan_updates_aborts_its_rounds(tmp_path, capsys, monkeypatch):
    _poison(monkeypatch, client=2)
    out = tmp_path / "run"
    assert main(["run", "--set", "data.clients=3", "--set", "data.standardize=false",
                 "--set", "dp.mode=none", "--out", str(out), "--set", "rounds=4", "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stop_reason"] == "aborts" and summary["aborted_rounds"] == 3
    assert [a["round"] for a in summary["aborted"]] == [1, 2, 3]
    assert all("3 valid clients" in a["reason"] for a in summary["aborted"])


def test_out_naming_a_file_exits_2(tmp_path, capsys):
    target = tmp_path / "file.txt"
    target.write_text("mine")
    assert main(["run", "--out", str(target), *FAST]) == 2
    assert "--out: " in _one_line_error(capsys) and target.read_text() == "mine"


def test_out_unwritable_exits_2(tmp_path, capsys):
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    assert main(["run", "--out", str(blocker / "sub" / "run"), *FAST]) == 2
    assert "cannot write" in _one_line_error(capsys)


def test_unreachable_target_epsilon_exits_2(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "--set", "dp.target_epsilon=0.001", "--set", "dp.accountant=prv",
                 "--out", str(out), *FAST]) == 2
    err = _one_line_error(capsys)
    assert err.startswith("fedsec: error: dp.target_epsilon: no noise") and not out.exists()


def test_budget_exceeded_by_round_one_exits_2(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "--set", "dp.target_epsilon=0.001", "--set", "dp.noise_multiplier=0.5",
                 "--out", str(out), *FAST]) == 2
    err = _one_line_error(capsys)
    assert err.startswith("fedsec: error: dp.noise_multiplier: 0.5 spends epsilon")
    assert "round 1" in err and not out.exists()


def test_out_non_empty_refused_without_force(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "--out", str(out), *FAST, "--set", "dp.mode=none"]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    assert main(["run", "--out", str(out), *FAST, "--set", "dp.mode=none"]) == 2
    assert "--force" in _one_line_error(capsys)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_force_leaves_no_stale_file(tmp_path):
    out = tmp_path / "run"
    assert main(["run", "--out", str(out), *FAST]) == 0
    assert (out / "epsilon.png").is_file()
    (out / "notes-of-an-earlier-run.txt").write_text("stale")
    assert main(["run", "--out", str(out), "--force", *FAST, "--set", "dp.mode=none"]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["config.toml", "history.csv", "summary.json", "model.pt", "accuracy.png", "audit.db",
         "audit.key", "checkpoint.npz"])
    assert "privacy" not in json.loads((out / "summary.json").read_text())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_force_never_replaces_a_folder_that_is_not_a_run(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("precious")
    assert main(["run", "--out", str(mine), "--force", *FAST]) == 2
    assert "holds no earlier fedsec run" in _one_line_error(capsys)
    assert (mine / "thesis.tex").read_text() == "precious"


def test_empty_out_directory_is_used(tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    assert main(["run", "--out", str(out), *FAST, "--set", "dp.mode=none"]) == 0
    assert (out / "summary.json").is_file()


def test_sweep_refuses_a_non_empty_out(tmp_path, capsys):
    out = tmp_path / "sweep"
    out.mkdir()
    (out / "sweep.csv").write_text("old")
    assert main(["sweep", "--out", str(out), "--quiet", "--epsilons", "1", "--seeds", "0",
                 "--set", "rounds=2"]) == 2
    assert "--force" in _one_line_error(capsys) and (out / "sweep.csv").read_text() == "old"


BAD = {
    "nan": lambda v: np.full_like(v, np.nan),
    "inf": lambda v: np.full_like(v, np.inf),
    "shape": lambda v: np.zeros(v.size + 1, np.float32),
}


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(3, 5), lies=st.lists(st.sampled_from(sorted(BAD)), max_size=5),
       seed=st.integers(0, 2**16))
def test_lying_clients_cause_an_exact_sum_or_a_typed_abort(n, lies, seed):
    """Adversary: any subset of the n clients sends NaN, infinite or misshapen updates; the honest
    masking server either releases the valid clients' exact average or aborts with ProtocolAbort."""
    rng = np.random.default_rng(seed)
    honest = [rng.uniform(-0.5, 0.5, 6).astype(np.float32) for _ in range(n)]
    liars = rng.choice(n, size=min(len(lies), n), replace=False).tolist()
    updates = [ClientUpdate(i, BAD[lies[liars.index(i)]](v) if i in liars else v, float(1 + i))
               for i, v in enumerate(honest)]
    protocol = MaskedAggregation(max_weight=8, rng=np.random.default_rng(seed))
    # The seam's documented length rule: the length most finite updates share (a tie aborts); the
    # server loop then refuses an average whose length is not the model's.
    finite = [i for i in range(n) if i not in liars or lies[liars.index(i)] == "shape"]
    lengths = Counter(updates[i].vector.size for i in finite)
    top = lengths.most_common()
    length = top[0][0] if top and (len(top) == 1 or top[0][1] > top[1][1]) else None
    valid = [i for i in finite if updates[i].vector.size == length]
    try:
        result = protocol.aggregate(1, updates)
    except ProtocolAbort:
        assert len(valid) < 3
        return
    assert sorted(result.participants) == valid and result.metrics["rejected"] == n - len(valid)
    expected = (sum((1 + i) * updates[i].vector.astype(np.float64) for i in valid)
                / sum(1 + i for i in valid))
    np.testing.assert_allclose(result.average(), expected, atol=1e-3)
