"""What a run leaves behind and what the command line says about it."""

from __future__ import annotations

import csv
import importlib.metadata
import json
import re
from pathlib import Path

import numpy as np
import pytest
from fedsec.fl_core import server as fl_server
from fedsec.fl_core.aggregation import AggregationProtocol, ClientUpdate
from fedsec.fl_core.errors import AggregationError
from fedsec.fl_core.history import RoundRecord
from fedsec.protocols.masked import MaskedAggregation
from PIL import Image

from fedsec.cli import main
from fedsec.config import load_config, make_config
from fedsec.diagnostics import HOPELESS_RATIO, noise_to_signal
from fedsec.experiment import build_experiment
from fedsec.plots import metric_figure, privacy_label

README = Path(__file__).resolve().parents[2] / "README.md"
FAST = ["--set", "rounds=3", "--quiet"]


def _history(path):
    with open(path / "history.csv") as handle:
        return list(csv.DictReader(handle))


def _help(capsys, argv) -> str:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_run_help_states_the_default_run(capsys):
    text = _help(capsys, ["run", "--help"])
    assert "30 rounds" in text and "20 rounds" not in text
    assert "pairwise-mask secure aggregation" in text and "DP-SGD spending at most epsilon 3" in text
    assert "Nothing is saved unless --out DIR is given" in text and "--force" in text


def test_version(capsys):
    assert _help(capsys, ["--version"]) == "fedsec 0.1.0"


def test_summary_versions_and_integer_counters(tmp_path):
    out = tmp_path / "run"
    assert main(["run", "--out", str(out), *FAST, "--set", "secure.dropout=0.2",
                 "--set", "data.clients=6"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    for name in ("opacus", "dp-accounting", "cryptography", "phe", "gmpy2", "torch", "numpy"):
        assert summary["versions"][name] == importlib.metadata.version(name)
    rows = _history(out)
    header = list(rows[0])
    assert header.index("epsilon_rdp") == header.index("epsilon") + 1
    for column in ("round", "participants", "dropped", "upload_bytes", "clipped", "client_aborts",
                   "rejected", "secagg_degree", "secagg_threshold", "steps", "failed_clients"):
        assert all(re.fullmatch(r"\d+", r[column]) for r in rows), column
    assert all("." in r["accuracy"] and float(r["epsilon_rdp"]) >= 0 for r in rows)
    assert summary["aborted_rounds"] == sum(r["status"] != "ok" for r in rows)


def _record(number: int, status: str = "ok", accuracy: float = 0.5) -> RoundRecord:
    return RoundRecord(round=number, accuracy=accuracy, loss=1.0, train_loss=1.0, participants=3,
                       dropped=0, upload_bytes=1, seconds=0.1, update_norm=0.1, status=status,
                       metrics={"epsilon": 0.5 * number})


def test_figure_marks_aborted_rounds_and_the_target():
    records = [_record(1), _record(2, "aborted: too few"), _record(3), _record(4, "aborted: x")]
    fig = metric_figure(records, metric="epsilon", title="t", ylabel="epsilon (delta = 1e-05)",
                        target=3.0, target_label="target epsilon")
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "aborted round (2)" in labels and "target epsilon 3" in labels
    crosses = next(line for line in ax.get_lines() if line.get_label().startswith("aborted"))
    assert list(crosses.get_xdata()) == [2, 4] and list(crosses.get_ydata()) == [1.0, 2.0]
    assert ax.get_ylabel() == "epsilon (delta = 1e-05)"
    plain = metric_figure(records[:1], metric="accuracy", title="t", ylabel="a")
    assert plain.axes[0].get_legend() is None


def test_privacy_label_names_the_settings():
    config = make_config({"dp.target_epsilon": 2.0, "secure.graph": "harary"})
    assert privacy_label(config, 3.25) == ("masking (harary); DP-SGD (example level): target "
                                           "epsilon 2, delta 1e-05, sigma 3.25, clip 1")
    plain = make_config({"dp.mode": "none", "secure.aggregation": "none"})
    assert privacy_label(plain, None) == "no secure aggregation; no DP"


def test_run_plots_carry_title_target_and_aborted_rounds(tmp_path, monkeypatch):
    real = fl_server.FederatedServer._round

    def second_round_aborts(self, round_index, vector, m):
        if round_index == 2:
            class Refuse(AggregationError):
                pass

            class Refusing(AggregationProtocol):
                """Round 2's stand-in: the real protocol's contract (client_metrics), but it refuses."""

                client_metrics = self.protocol.client_metrics

                def aggregate(self, *args, **kwargs):
                    raise Refuse("refused")

            protocol = self.protocol
            self.protocol = Refusing()
            try:
                return real(self, round_index, vector, m)
            finally:
                self.protocol = protocol
        return real(self, round_index, vector, m)

    monkeypatch.setattr(fl_server.FederatedServer, "_round", second_round_aborts)
    out = tmp_path / "run"
    assert main(["run", "--out", str(out), *FAST]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["aborted_rounds"] == 1 and summary["aborted"] == [{"round": 2, "reason": "refused"}]
    for name in ("accuracy.png", "epsilon.png"):
        info = Image.open(out / name).info
        assert info["Description"] == "aborted rounds: 2"
        assert "DP-SGD (example level): target epsilon 3, delta 1e-05" in info["Title"]
    assert Image.open(out / "epsilon.png").info["Title"].startswith("privacy spent at delta = 1e-05")


def test_interrupted_run_exits_130_and_keeps_what_it_did(tmp_path, monkeypatch, capsys):
    real = fl_server.FederatedServer._round

    def interrupt_in_round_3(self, round_index, vector, m):
        if round_index == 3:
            raise KeyboardInterrupt
        return real(self, round_index, vector, m)

    monkeypatch.setattr(fl_server.FederatedServer, "_round", interrupt_in_round_3)
    out = tmp_path / "run"
    assert main(["run", "--out", str(out), *FAST]) == 130
    assert capsys.readouterr().err.strip() == "fedsec: interrupted"
    assert [r["round"] for r in _history(out)] == ["1", "2"]


def _outcomes(reproducible: bool) -> list:
    protocol = MaskedAggregation(max_weight=5, rng=np.random.default_rng(1), graph="harary",
                                 dropout=0.25, tolerated_dropout=0.05, reproducible=reproducible)
    found = []
    for round_index in range(6):
        updates = [ClientUpdate(i, np.full(4, 0.01 * i, np.float32), 1.0) for i in range(16)]
        try:
            found.append(protocol.aggregate(round_index, updates).participants)
        except AggregationError as error:
            found.append(str(error))
    return found


def test_reproducible_masking_with_dropout_repeats_every_round():
    assert _outcomes(True) == _outcomes(True) == _outcomes(True)
    # without it, the CSPRNG-shuffled ring decides which dropouts a SecAgg+ round survives
    assert len({json.dumps(_outcomes(False)) for _ in range(4)}) > 1


def test_reproducible_run_repeats_its_history(tmp_path):
    runs = []
    for name in ("a", "b"):
        assert main(["run", "--out", str(tmp_path / name), "--set", "data.clients=12",
                     "--set", "secure.graph=harary", "--set", "secure.dropout=0.3",
                     "--set", "dp.reproducible=true", *FAST]) == 0
        runs.append([{k: v for k, v in r.items() if k != "seconds"} for r in _history(tmp_path / name)])
    assert runs[0] == runs[1]


def test_noise_to_signal_formula():
    # DP-SGD: sigma sqrt(d) / (B sqrt(s m)) / sqrt(R) = 4 * 10 / (20 * 2) / 5
    assert noise_to_signal(mode="dpsgd", noise_multiplier=4.0, n_parameters=100, clients_per_round=2,
                           rounds=25, batch_size=20, local_steps=2) == pytest.approx(0.2)
    # client level: sigma sqrt(d) / m / sqrt(R) = 2 * 3 / 3 / 2
    assert noise_to_signal(mode="client", noise_multiplier=2.0, n_parameters=9, clients_per_round=3,
                           rounds=4) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="mode"):
        noise_to_signal(mode="central", noise_multiplier=1.0, n_parameters=1, clients_per_round=1,
                        rounds=1)


@pytest.mark.parametrize("epsilon, warned", [(3.0, False), (0.5, False), (0.1, True)])
def test_hopeless_noise_warning_on_the_default_run(epsilon, warned):
    experiment = build_experiment(load_config(None, [f"dp.target_epsilon={epsilon}"]))
    assert bool(experiment.warnings) == warned
    if warned:
        assert f"> {HOPELESS_RATIO:g}" in experiment.warnings[0]


def test_warning_is_one_line_on_stderr_and_in_the_summary(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "--out", str(out), "--set", "rounds=1", "--set", "dp.target_epsilon=0.02",
                 "--quiet"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedsec: warning: noise multiplier")
    assert json.loads((out / "summary.json").read_text())["warnings"] == [err[0][len("fedsec: warning: "):]]


def _readme_toml() -> str:
    text = README.read_text()
    return re.search(r"```toml\n(.*?)```", text, re.S).group(1)


def test_readme_example_reaches_its_own_target(tmp_path):
    config_file = tmp_path / "hospitals.toml"
    config_file.write_text(_readme_toml())
    config = load_config(config_file)
    assert config.dp.mode != "none" and config.secure.aggregation == "masking"
    experiment = build_experiment(config)
    assert experiment.warnings == []
    out = tmp_path / "run"
    # Reproducible noise makes the outcome a function of the seed (the README quotes this run);
    # without it the noise is fresh and the stopping round varies (README: rounds 6-18).
    assert main(["run", str(config_file), "--out", str(out), "--quiet",
                 "--set", "dp.reproducible=true"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stop_reason"] == "target_accuracy"
    assert summary["final_accuracy"] >= config.train.target_accuracy
    assert summary["privacy"]["epsilon"] <= config.dp.target_epsilon
