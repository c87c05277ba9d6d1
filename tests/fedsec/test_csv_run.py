"""`fedsec run` on CSV files: the data.* keys, the end-to-end run on four breast-cancer shards, and
a bad file that exits 2 with one line naming file, row and column before anything is written."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from fedsec.fl_core.csv_data import CsvSchema, load_client_csv

from fedsec.cli import main
from fedsec.config import load_config, make_config
from fedsec.errors import ConfigError
from fedsec.experiment import build_experiment
from fedsec.site_data import load_sites, schema

LABEL = "diagnosis"


def write_shards(folder, n_sites=4, *, seed=0):
    """The breast-cancer records cut into ``n_sites`` CSV files (the label in the middle column)."""
    from sklearn.datasets import load_breast_cancer

    bunch = load_breast_cancer()
    names = [n.replace(" ", "_") for n in bunch.feature_names]
    header = names[:10] + [LABEL] + names[10:]
    order = np.random.default_rng(seed).permutation(len(bunch.target))
    paths = []
    for k, part in enumerate(np.array_split(order, n_sites)):
        path = folder / f"site{k}.csv"
        with open(path, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(header)
            for i in part:
                cells = [repr(float(v)) for v in bunch.data[i]]
                writer.writerow(cells[:10] + [int(bunch.target[i])] + cells[10:])
        paths.append(path)
    return paths


def plan(folder, extra=""):
    path = folder / "plan.toml"
    path.write_text(f'rounds = 2\n[data]\ndataset = "csv"\nfiles = ["site0.csv", "site1.csv", "site2.csv", '
                    f'"site3.csv"]\nlabel = "{LABEL}"\nclasses = [0, 1]\n{extra}')
    return path


def test_config_keys_files_beside_the_plan_and_clients_from_files(tmp_path):
    write_shards(tmp_path)
    config = load_config(plan(tmp_path))
    assert config.data.clients == 4 and config.data.classes == ("0", "1")
    assert config.data.files[0] == str((tmp_path / "site0.csv").resolve())
    again = tmp_path / "again.toml"
    again.write_text(config.to_toml())
    assert load_config(again) == config


@pytest.mark.parametrize("values,key,words", [
    ({"data.files": ["a.csv"]}, "data.files", "needs data.dataset = 'csv'"),
    ({"data.label": "y"}, "data.label", "needs data.dataset = 'csv'"),
    ({"data.dataset": "csv", "data.classes": [0, 1]}, "data.label", "label column"),
    ({"data.dataset": "csv", "data.label": "y"}, "data.classes", ">= 2"),
    ({"data.dataset": "csv", "data.label": "y", "data.classes": [0, 0]}, "data.classes", "distinct"),
    ({"data.dataset": "csv", "data.label": "y", "data.classes": [0, 1], "data.columns": ["a", "y"]},
     "data.columns", "label"),
    ({"data.dataset": "csv", "data.label": "y", "data.classes": [0, 1], "data.files": ["a", "b", "c"],
      "data.clients": 4}, "data.clients", "number of data.files"),
    ({"data.dataset": "csv", "data.label": "y", "data.classes": [0, 1], "data.partition": "shards"},
     "data.partition", "does not apply"),
    ({"data.dataset": "csv", "data.label": "y", "data.classes": [0, 1], "train.algorithm": "ditto",
      "dp.mode": "none"}, "train.algorithm", "csv"),
    ({"data.files": "a.csv"}, "data.files", "list of strings"),
    ({"data.dataset": "csv", "data.label": "y", "data.classes": [0, True]}, "data.classes", "list of"),
])
def test_bad_csv_keys_name_the_key(values, key, words):
    with pytest.raises(ConfigError) as caught:
        make_config(values)
    assert caught.value.key == key and words in str(caught.value)


def test_fedsec_run_on_four_csv_shards_reports_the_federated_figures(tmp_path, capsys):
    write_shards(tmp_path)
    out = tmp_path / "run"
    code = main(["run", str(plan(tmp_path)), "--out", str(out), "--quiet",
                 "--set", "dp.mode=none", "--set", "rounds=3"])
    assert code == 0, capsys.readouterr().err
    rows = list(csv.DictReader(open(out / "history.csv")))
    held_out = sum(len(s.test) for s in load_sites(load_config(plan(tmp_path))))
    assert len(rows) == 3
    for row in rows:
        assert int(row["eval_sites"]) == 4 and int(row["eval_records"]) == held_out
        for key in ("auroc", "sensitivity", "specificity", "auroc_bound"):
            assert 0 <= float(row[key]) <= 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final_accuracy"] == float(rows[-1]["accuracy"]) > 0.85
    assert float(rows[-1]["auroc"]) > 0.9


def test_the_run_evaluates_exactly_the_sites_test_splits(tmp_path):
    """The per-round accuracy is the pooled accuracy of the sites' own held-out splits."""
    write_shards(tmp_path)
    config = load_config(plan(tmp_path), ["dp.mode=none", "secure.aggregation=none", "rounds=1",
                                          "data.standardize=false"])
    experiment = build_experiment(config)
    result = experiment.server.run()
    sites = load_sites(config)
    from fedsec.fl_core import evaluate

    x = np.concatenate([s.test.x for s in sites])
    y = np.concatenate([s.test.y for s in sites])
    accuracy, loss = evaluate(experiment.server.model, x, y)
    assert result.records[0].accuracy == accuracy
    assert result.records[0].loss == pytest.approx(loss, rel=1e-6)


def test_a_site_splits_its_file_as_the_simulation_does(tmp_path):
    write_shards(tmp_path)
    config = load_config(plan(tmp_path), ["seed=11"])
    simulated = load_sites(config)
    alone = load_client_csv(tmp_path / "site2.csv", CsvSchema(label=LABEL, classes=[0, 1]),
                            test_fraction=0.2, seed=11, index=2)
    np.testing.assert_array_equal(simulated[2].test.x, alone.test.x)
    np.testing.assert_array_equal(simulated[2].train.y, alone.train.y)
    assert schema(config).features is None


def test_every_file_must_hold_the_first_files_columns(tmp_path):
    paths = write_shards(tmp_path)
    text = paths[3].read_text().splitlines()
    text[0] = text[0].replace("mean_radius", "radius")
    paths[3].write_text("\n".join(text) + "\n")
    with pytest.raises(Exception) as caught:
        load_sites(load_config(plan(tmp_path)))
    assert "site3.csv" in str(caught.value) and "mean_radius" in str(caught.value)


@pytest.mark.parametrize("row,column,cell,words", [
    (5, "mean_texture", "n/a", "is not a number"),
    (9, LABEL, "2", "declared classes"),
    (7, "worst_area", "", "is empty"),
])
def test_a_bad_file_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys, row, column, cell, words):
    paths = write_shards(tmp_path)
    with open(paths[1], newline="") as handle:
        table = list(csv.reader(handle))
    table[row - 1][table[0].index(column)] = cell
    with open(paths[1], "w", newline="") as handle:
        csv.writer(handle).writerows(table)
    out = tmp_path / "run"
    assert main(["run", str(plan(tmp_path)), "--out", str(out), "--quiet"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "\n" not in err and "Traceback" not in captured.err
    assert err.startswith("fedsec: error: data.files: ")
    assert str(paths[1].resolve()) in err and f"row {row}" in err and f"column {column!r}" in err
    assert words in err
    assert not out.exists()


def test_evaluation_never_moves_the_training_draws(tmp_path):
    """The evaluation layer has its own generator: the model trajectory with evaluation equals the
    one without (masking and DP-SGD, reproducible noise)."""
    from fedsec.fl_core.federated_eval import FederatedEvaluator

    write_shards(tmp_path)
    config = load_config(plan(tmp_path), ["dp.reproducible=true", "rounds=2", "dp.target_epsilon=0",
                                          "dp.noise_multiplier=1"])
    with_eval = build_experiment(config)
    evaluated = with_eval.server.run()
    without = build_experiment(config)
    without.server.evaluator = None
    without.server.observers = [o for o in without.server.observers
                                if not isinstance(o, FederatedEvaluator)]
    plain = without.server.run()
    np.testing.assert_array_equal(evaluated.vector, plain.vector)
    assert [r.metrics["eval_sites"] for r in evaluated.records] == [4, 4]


@pytest.mark.parametrize("aggregation,words", [("masking", "summed through the secure layer"),
                                               ("none", "each site sends its own sums in the clear")])
def test_the_site_evaluation_is_named_in_not_covered(tmp_path, aggregation, words):
    write_shards(tmp_path)
    config = load_config(plan(tmp_path), [f"secure.aggregation={aggregation}", "dp.target_epsilon=0",
                                          "dp.noise_multiplier=1"])
    entries = build_experiment(config).privacy.not_covered
    assert entries[0].startswith("federated evaluation sums of the sites' held-out records")
    assert words in entries[0]


def test_the_documented_csv_example_loads_and_runs(tmp_path):
    """The TOML block of docs/configuration.md's CSV section, with the shards beside it."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    section = text[text.index("### Your own data: CSV files"):]
    block = re.search(r"```toml\n(.*?)```", section, re.S).group(1)
    keep = ["mean_radius", "mean_texture", "worst_area", LABEL]
    for shard in write_shards(tmp_path):  # the example's files hold just its columns
        with open(shard, newline="") as handle:
            table = list(csv.reader(handle))
        at = [table[0].index(name) for name in keep]
        with open(shard, "w", newline="") as handle:
            csv.writer(handle).writerows([[row[i] for i in at] for row in table])
    path = tmp_path / "example.toml"
    path.write_text(block)
    config = load_config(path, ["rounds=1", "dp.mode=none"])
    assert config.data.columns == ("mean_radius", "mean_texture", "worst_area")
    result = build_experiment(config).server.run()
    assert result.records[0].metrics["eval_sites"] == 4


def test_files_given_with_set_are_taken_from_the_working_directory(tmp_path, monkeypatch):
    write_shards(tmp_path)
    monkeypatch.chdir(tmp_path)
    config = load_config(None, ["data.dataset=csv", 'data.files=["site0.csv", "site1.csv", "site2.csv"]',
                                f"data.label={LABEL}", "data.classes=[0, 1]"])
    assert config.data.files[2] == str((tmp_path / "site2.csv").resolve())
    assert config.data.clients == 3
