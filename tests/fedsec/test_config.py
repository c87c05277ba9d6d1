import pytest

from fedsec.config import ExperimentConfig, key_fields, load_config, make_config, parse_override
from fedsec.errors import ConfigError


def test_defaults_are_the_hospital_experiment():
    config = load_config()
    assert config == ExperimentConfig()
    assert (config.data.dataset, config.data.clients, config.model.name, config.train.algorithm,
            config.rounds) == ("breast_cancer", 4, "logreg", "fedavg", 30)
    # the private stack: masking and DP-SGD spending epsilon = 3 at delta = 1e-5
    assert (config.secure.aggregation, config.dp.mode, config.dp.target_epsilon,
            config.dp.delta) == ("masking", "dpsgd", 3.0, 1e-5)


def test_file_then_overrides(tmp_path):
    path = tmp_path / "exp.toml"
    path.write_text('rounds = 7\n[data]\ndataset = "digits"\nclients = 12\n[train]\nlr = 1\n')
    config = load_config(path, ["data.clients=3", "train.algorithm=fedsgd", "model.name='mlp'",
                                "dp.mode=none"])
    assert config.rounds == 7 and config.data.dataset == "digits" and config.data.clients == 3
    assert config.train.lr == 1.0 and isinstance(config.train.lr, float)
    assert config.train.algorithm == "fedsgd" and config.model.name == "mlp"


def test_toml_round_trip_and_hash(tmp_path):
    config = make_config({"seed": 5, "data.partition": "dirichlet", "data.alpha": 0.3})
    path = tmp_path / "c.toml"
    path.write_text(config.to_toml())
    again = load_config(path)
    assert again == config and again.sha256() == config.sha256()
    assert make_config({"seed": 6}).sha256() != config.sha256()


def test_every_key_is_documented_with_a_default():
    keys = key_fields()
    assert {"seed", "rounds", "data.dataset", "train.fraction", "secure.aggregation",
            "dp.accountant"} <= set(keys)
    assert all(f.metadata["doc"] for _, f in keys.values())


@pytest.mark.parametrize(
    "override,key,words",
    [
        ("data.clinets=3", "data.clinets", "did you mean 'data.clients'"),
        ("bogus=1", "bogus", "unknown key"),
        ("data.clients=0", "data.clients", ">= 1"),
        ("data.clients=2.5", "data.clients", "must be int"),
        ("train.lr=-1", "train.lr", "> 0"),
        ("train.lr=nan", "train.lr", "finite"),
        ("train.fraction=0", "train.fraction", "(0, 1]"),
        ("data.partition=random", "data.partition", "must be one of"),
        ("data.dataset=mnist", "data.dataset", "must be one of"),
        ("train.lr=true", "train.lr", "must be float"),
        ("secure.custody=threshold", "secure.custody", "needs secure.aggregation = 'paillier'"),
        ("secure.key_bits=1024", "secure.key_bits", "must be one of"),
        ("secure.key_bits=3072", "secure.key_bits", "needs secure.aggregation = 'paillier'"),
        ("secure.active=1", "secure.active", "must be bool"),
        ("dp.target_epsilon=0", "dp.target_epsilon", "give dp.target_epsilon"),
        ("dp.noise_multiplier=-1", "dp.noise_multiplier", ">= 0"),
        ("train.algorithm=fedsgd", "train.algorithm", "DP-SGD trains locally"),
        ("dp.accountant=gdp", "dp.accountant", "must be one of"),
        ("data.clients=500", "data.clients", "456 training samples"),
        ("model.name=cnn", "model.name", "image data"),
        ("rounds", "rounds", "key=value"),
    ],
)
def test_bad_values_name_the_key(override, key, words):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert info.value.key == key
    assert str(info.value).startswith(f"{key}: ") and words in str(info.value)
    assert "\n" not in str(info.value)


def test_paillier_checks_threshold_and_masking_only_keys():
    make_config({"secure.aggregation": "paillier", "secure.custody": "threshold",
                 "secure.key_bits": 3072, "secure.threshold": 4})
    with pytest.raises(ConfigError, match="secure.threshold: must be <= clients a round = 4"):
        make_config({"secure.aggregation": "paillier", "secure.threshold": 5})
    with pytest.raises(ConfigError, match="secure.graph: needs secure.aggregation = 'masking'"):
        make_config({"secure.aggregation": "paillier", "secure.graph": "harary"})
    with pytest.raises(ConfigError, match="train.fraction"):
        make_config({"secure.aggregation": "paillier", "train.fraction": 0.25})


def test_masking_needs_two_clients_a_round_and_a_reachable_threshold():
    make_config({"secure.aggregation": "masking", "secure.graph": "harary", "secure.active": True})
    with pytest.raises(ConfigError, match="train.fraction"):
        make_config({"secure.aggregation": "masking", "train.fraction": 0.25})
    with pytest.raises(ConfigError, match="secure.threshold: must be <= clients a round - 1 = 3"):
        make_config({"secure.aggregation": "masking", "secure.threshold": 4})
    harary = {"secure.aggregation": "masking", "secure.graph": "harary", "data.dataset": "synthetic",
              "data.clients": 100, "data.samples": 2000}
    make_config(harary | {"secure.threshold": 24})
    with pytest.raises(ConfigError, match=r"secure.threshold: must be in \[22, 32\] .*degree 32"):
        make_config(harary | {"secure.threshold": 40})
    # The floor is the clients' own rule: below it they would refuse the round.
    with pytest.raises(ConfigError, match=r"secure.threshold: must be in \[22, 32\] .*refuse less"):
        make_config(harary | {"secure.threshold": 20})
    semi_honest = harary | {"secure.active": False}
    make_config(semi_honest | {"secure.threshold": 20})
    with pytest.raises(ConfigError, match=r"must be in \[12, 22\] .*semi-honest"):
        make_config(semi_honest | {"secure.threshold": 11})
    with pytest.raises(ConfigError, match=r"must be in \[32, 42\] .*secure.corrupt = 0.2"):
        make_config(harary | {"secure.corrupt": 0.2, "secure.threshold": 31})


def test_shards_need_enough_samples():
    with pytest.raises(ConfigError, match="data.shards_per_client: .*<= 456"):
        make_config({"data.partition": "shards", "data.shards_per_client": 200})
    make_config({"data.partition": "iid", "data.shards_per_client": 200})


def test_synthetic_cross_checks():
    with pytest.raises(ConfigError, match="data.partition"):
        make_config({"data.dataset": "synthetic", "data.partition": "shards"})
    with pytest.raises(ConfigError, match="data.samples"):
        make_config({"data.dataset": "synthetic", "data.clients": 50, "data.samples": 100})
    with pytest.raises(ConfigError, match="data.clients"):
        make_config({"data.dataset": "synthetic", "data.setup": 2, "data.clients": 2})


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("rounds = = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(broken)
    nested = tmp_path / "nested.toml"
    nested.write_text("[data.extra]\nx = 1\n")
    with pytest.raises(ConfigError, match="nested"):
        load_config(nested)


def test_parse_override_values():
    assert parse_override("train.lr=0.5") == ("train.lr", 0.5)
    assert parse_override("data.dataset=digits") == ("data.dataset", "digits")
    assert parse_override('data.dataset="digits"') == ("data.dataset", "digits")
    assert parse_override("rounds = 4") == ("rounds", 4)


def test_secure_workers_is_a_masking_key_in_range_and_reaches_the_protocol():
    import numpy as np

    from fedsec.experiment import make_protocol

    assert make_config({"secure.workers": 2}).secure.workers == 2
    for bad in ("0", "65"):
        with pytest.raises(ConfigError, match="secure.workers: "):
            load_config(None, [f"secure.workers={bad}"])
    with pytest.raises(ConfigError, match="secure.workers: needs secure.aggregation = 'masking'"):
        make_config({"secure.aggregation": "paillier", "secure.workers": 2})
    protocol = make_protocol("masking", max_weight=3, n_clients=6, fraction=1.0,
                             rng=np.random.default_rng(0), workers=3)
    assert protocol.workers == 3
