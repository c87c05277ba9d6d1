"""The experiment configuration: typed sections, defaults, validation, TOML in and out.

A configuration is built from (in order) the defaults, a TOML file, and ``--set key=value``
overrides. Every key is checked before any work starts: an unknown key, a wrong type, a value out
of range or a combination that cannot run raises :class:`fedsec.errors.ConfigError` naming the key.
Keys of privacy layers that have not landed yet are accepted only at their defaults.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import math
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from fedsec.dp.noise import MIN_NOISE_MULTIPLIER
from fedsec.errors import ConfigError


def _opt(default: Any, doc: str, check: Callable[[Any], bool] | None = None,
         choices: tuple[Any, ...] | None = None, available: tuple[Any, ...] | None = None) -> Any:
    """A config field: default, one-line doc of the allowed values, and its validation."""
    return field(default=default, metadata={"doc": doc, "check": check, "choices": choices,
                                            "available": available})


def _positive(v: float) -> bool:
    return v > 0


@dataclass(frozen=True)
class DataConfig:
    dataset: str = _opt("breast_cancer", "one of breast_cancer, digits, synthetic, csv",
                        choices=("breast_cancer", "digits", "synthetic", "csv"))
    clients: int = _opt(4, "an integer >= 1 (K, the number of clients)", lambda v: v >= 1)
    standardize: bool = _opt(True, "true or false (federated feature scaling where the data set "
                                   "needs it; its statistics carry no DP noise)")
    partition: str = _opt("iid", "one of iid, unbalanced, shards, dirichlet, feature_bias",
                          choices=("iid", "unbalanced", "shards", "dirichlet", "feature_bias"))
    alpha: float = _opt(0.5, "a number > 0 (Dirichlet concentration)", _positive)
    shards_per_client: int = _opt(2, "an integer >= 1", lambda v: v >= 1)
    test_fraction: float = _opt(0.2, "a number in (0, 1)", lambda v: 0 < v < 1)
    setup: int = _opt(1, "1, 2, 3 or 4 (synthetic set-up)", choices=(1, 2, 3, 4))
    samples: int = _opt(2000, "an integer >= 10 x clients (synthetic samples in all)",
                        lambda v: v >= 10)
    features: int = _opt(10, "an integer in [1, 1000] (synthetic features)",
                         lambda v: 1 <= v <= 1000)
    files: tuple[str, ...] = _opt((), "a list of CSV files, one per client (data.dataset = 'csv'; "
                                      "relative to the config file's folder, or absolute)")
    label: str = _opt("", "the label column's name (data.dataset = 'csv')")
    columns: tuple[str, ...] = _opt((), "a list of feature column names in the model's input order "
                                        "(data.dataset = 'csv'; empty = every column but the label)")
    classes: tuple[str, ...] = _opt((), "a list of >= 2 declared label values (data.dataset = 'csv'; "
                                        "class k is the k-th; with two, the second is the positive "
                                        "class)")


@dataclass(frozen=True)
class ModelConfig:
    name: str = _opt("logreg", "one of logreg, mlp, cnn", choices=("logreg", "mlp", "cnn"))


ALGORITHMS = ("fedavg", "fedsgd", "fedprox", "ditto", "perfedavg", "cocoa", "mocha", "boosting")
"""The values of train.algorithm: FedAvg-family strategies, personalization, and the seed methods
with runners of their own (fedsec.methods)."""
OWN_MODEL = ("cocoa", "mocha", "boosting")
"""Methods that fit their own model (not a torch model through FedAvg's update)."""


@dataclass(frozen=True)
class TrainConfig:
    algorithm: str = _opt("fedavg", "one of fedavg, fedsgd, fedprox, ditto, perfedavg, cocoa, mocha, "
                                    "boosting", choices=ALGORITHMS)
    prox_mu: float = _opt(0.0, "a number >= 0 (FedProx's mu; > 0 with algorithm = 'fedprox')",
                          lambda v: v >= 0)
    server_optimizer: str = _opt("sgd", "one of sgd, momentum, adam, yogi (applied to the "
                                 "released average)", choices=("sgd", "momentum", "adam", "yogi"))
    server_lr: float = _opt(0.0, "a number >= 0 (0 = the optimizer's default: 1 for sgd and "
                                 "momentum, 0.01 for adam and yogi)", lambda v: v >= 0)
    local_epochs: int = _opt(1, "an integer >= 1 (E)", lambda v: v >= 1)
    batch_size: int = _opt(16, "an integer >= 0 (B; 0 = the full local batch)", lambda v: v >= 0)
    lr: float = _opt(0.1, "a number > 0", _positive)
    fraction: float = _opt(1.0, "a number in (0, 1] (C, share of clients per round)",
                           lambda v: 0 < v <= 1)
    target_accuracy: float = _opt(0.0, "a number in [0, 1] (0 = no target)",
                                  lambda v: 0 <= v <= 1)
    stop_tol: float = _opt(0.0, "a number >= 0 (0 = never stop on the update norm)",
                           lambda v: v >= 0)


@dataclass(frozen=True)
class SecureConfig:
    aggregation: str = _opt("masking", "one of none, masking, paillier",
                            choices=("none", "masking", "paillier"))
    graph: str = _opt("complete", "one of complete, harary", choices=("complete", "harary"))
    threshold: int = _opt(0, "0 (chosen by the protocol's rule) or an integer >= 2",
                          lambda v: v == 0 or v >= 2)
    dropout: float = _opt(0.0, "a number in [0, 1) (simulated dropout fraction)",
                          lambda v: 0 <= v < 1)
    clip: float = _opt(1.0, "a number > 0 (update coordinates clipped to [-clip, clip])", _positive)
    bits: int = _opt(16, "an integer in [1, 32] (quantisation bits per coordinate)",
                     lambda v: 1 <= v <= 32)
    active: bool = _opt(True, "true or false (true: authenticated, against a lying server; false: "
                              "semi-honest opt-in, only for a server that follows the protocol)")
    corrupt: float = _opt(0.1, "a number in [0, 1) (fraction of all data.clients assumed to collude "
                               "with the server, whoever is sampled; sets the clients' threshold "
                               "floor and quorum)", lambda v: 0 <= v < 1)
    key_bits: int = _opt(2048, "2048 or 3072 (Paillier modulus bits)", choices=(2048, 3072))
    custody: str = _opt("key_holder", "one of key_holder, threshold (who can decrypt a Paillier sum)",
                        choices=("key_holder", "threshold"))
    workers: int = _opt(1, "an integer in [1, 64] (processes computing the masking server's unmask "
                           "stage, its own included; 1 = one process)", lambda v: 1 <= v <= 64)


@dataclass(frozen=True)
class DPConfig:
    mode: str = _opt("dpsgd", "one of none, dpsgd (example-level), client (client-level)",
                     choices=("none", "dpsgd", "client"))
    noise_multiplier: float = _opt(0.0, "0 (calibrated from target_epsilon) or a number >= 0.5",
                                   lambda v: v >= 0)
    max_grad_norm: float = _opt(1.0, "a number > 0 (L2 clip: per example for dpsgd, per client "
                                     "update for client)", _positive)
    target_epsilon: float = _opt(3.0, "a number >= 0 (the budget; 0 = none)", lambda v: v >= 0)
    delta: float = _opt(1e-5, "a number in (0, 1)", lambda v: 0 < v < 1)
    accountant: str = _opt("pld", "one of pld, prv, rdp", choices=("pld", "prv", "rdp"))
    reproducible: bool = _opt(False, "true or false (noise from the seed: experiments only, "
                                     "not private against whoever knows the seed)")
    weights: str = _opt("samples", "one of samples (FedAvg weight n_k: sizes public), equal "
                                   "(weight 1: sizes covered; needs dp.sample_rate)",
                        choices=("samples", "equal"))
    sample_rate: float = _opt(0.0, "a number in [0, 1] (DP-SGD sampling rate; 0 = B / n_k per "
                                   "client; > 0 = the same rate for every client)",
                              lambda v: 0 <= v <= 1)


@dataclass(frozen=True)
class PersonalConfig:
    lam: float = _opt(1.0, "a number >= 0 (Ditto's lambda: 0 = local training, large = the global "
                           "model)", lambda v: v >= 0)
    lr: float = _opt(0.1, "a number > 0 (Ditto's personal learning rate; Per-FedAvg's adaptation "
                          "step alpha)", _positive)
    epochs: int = _opt(1, "an integer >= 1 (Ditto's personal epochs per round)", lambda v: v >= 1)
    steps: int = _opt(5, "an integer >= 1 (Per-FedAvg's local meta steps per round)",
                      lambda v: v >= 1)
    adapt_steps: int = _opt(1, "an integer >= 1 (Per-FedAvg's adaptation steps before evaluation)",
                            lambda v: v >= 1)
    holdout: float = _opt(0.25, "a number in (0, 1) (share of each client's data held out as its "
                                "local test set)", lambda v: 0 < v < 1)


@dataclass(frozen=True)
class RobustConfig:
    rule: str = _opt("none", "one of none, median, trimmed_mean (plain aggregation only), "
                             "norm_bound (any secure layer)",
                     choices=("none", "median", "trimmed_mean", "norm_bound"))
    trim: float = _opt(0.1, "a number in [0, 0.5) (trimmed_mean: share cut from each end)",
                       lambda v: 0 <= v < 0.5)
    norm_bound: float = _opt(1.0, "a number > 0 (norm_bound: L2 bound on each client update)",
                             _positive)
    byzantine: int = _opt(0, "an integer >= 0 (simulated Byzantine clients, < data.clients)",
                          lambda v: v >= 0)
    attack: str = _opt("sign_flip", "one of sign_flip, scale, noise (what Byzantine clients send)",
                       choices=("sign_flip", "scale", "noise"))
    factor: float = _opt(10.0, "a number > 0 (scale: the multiplier; noise: its size relative to "
                               "the honest update)", _positive)


@dataclass(frozen=True)
class CoCoAConfig:
    loss: str = _opt("hinge", "one of hinge (linear SVM), logistic", choices=("hinge", "logistic"))
    lam: float = _opt(1e-3, "a number > 0 (lambda, the L2 regularisation of the per-sample "
                            "objective)", _positive)
    local_steps: int = _opt(100, "an integer >= 1 (H, SDCA steps per client per round)",
                            lambda v: v >= 1)
    combine: str = _opt("adding", "one of adding (CoCoA+: gamma = 1, sigma' = K), averaging "
                                  "(gamma = 1/K, sigma' = 1)", choices=("adding", "averaging"))


@dataclass(frozen=True)
class MochaConfig:
    loss: str = _opt("hinge", "one of hinge (linear SVM), logistic", choices=("hinge", "logistic"))
    lam: float = _opt(1e-3, "a number > 0 (lambda of (lambda/2) tr(W Omega W^T))", _positive)
    local_steps: int = _opt(100, "an integer >= 1 (H, the most SDCA steps per client per round)",
                            lambda v: v >= 1)
    omega_every: int = _opt(5, "an integer >= 0 (rounds between task-relationship updates; 0 = "
                               "never: independent local models)", lambda v: v >= 0)
    straggle: float = _opt(0.0, "a number in [0, 1] (chance a client straggles in a round: it does "
                                "a random number of steps in [0, H), 0 = skips)",
                           lambda v: 0 <= v <= 1)
    holdout: float = _opt(0.25, "a number in (0, 1) (share of each client's training samples held "
                                "out as its own test set)", lambda v: 0 < v < 1)


@dataclass(frozen=True)
class BoostingConfig:
    """Component-wise boosting (train.algorithm = 'boosting'); `rounds` is its mstop."""

    family: str = _opt("binomial", "one of binomial (logistic), gaussian (squared error)",
                       choices=("binomial", "gaussian"))
    learners: str = _opt("both", "one of linear, spline, both (base learners per feature)",
                         choices=("linear", "spline", "both"))
    nu: float = _opt(0.1, "a number in (0, 1] (step length)", lambda v: 0 < v <= 1)
    df: float = _opt(4.0, "a number > boosting.difference (degrees of freedom of each P-spline)",
                     _positive)
    knots: int = _opt(20, "an integer in [1, 200] (inner knots of each P-spline)",
                      lambda v: 1 <= v <= 200)
    degree: int = _opt(3, "an integer in [1, 5] (B-spline degree)", lambda v: 1 <= v <= 5)
    difference: int = _opt(2, "1, 2 or 3 (order of the difference penalty)", choices=(1, 2, 3))
    spline_range: float = _opt(3.0, "a number in (0, 1e6) (public knot range [-r, r] of the "
                                    "standardised features; values outside are clamped)",
                               lambda v: 0 < v < 1e6)


def _ray_address(v: str) -> bool:
    return v in ("", "auto") or (v.startswith("ray://") and len(v) > len("ray://")
                                 and not any(c.isspace() for c in v))


SIM_BACKENDS = ("local", "ray")
RAY_STATEFUL = ("ditto", "perfedavg", "cocoa", "mocha", "boosting")
"""train.algorithm values whose clients keep state between rounds in the driver (personal models,
dual variables) or that have no FedAvg server loop: they run on sim.backend = 'local' only."""


@dataclass(frozen=True)
class SimConfig:
    """Where a simulation's clients run (:mod:`fedsec.backends`)."""

    backend: str = _opt("local", "one of local (every client in this process), ray (clients' "
                                 "training and masking as Ray tasks and actors)", choices=SIM_BACKENDS)
    address: str = _opt("", "'' (start a local Ray), 'auto' (join the cluster of `ray start` on this "
                            "machine) or 'ray://HOST:PORT' (a Ray client server)", _ray_address)
    num_cpus: int = _opt(0, "an integer in [0, 4096] (CPUs of the local Ray that sim.address = '' "
                            "starts; 0 = all of this machine)", lambda v: 0 <= v <= 4096)
    cpus_per_client: float = _opt(1.0, "a number in (0, 64] (CPUs each worker reserves; one worker "
                                       "runs one client at a time)", lambda v: 0 < v <= 64)


@dataclass(frozen=True)
class FederationConfig:
    """A deployment plan's federation (``fedsec serve``); ignored by ``fedsec run``."""

    sites: tuple[str, ...] = _opt((), "a list of site names as in their certificates (the roster; "
                                      "site i is client i, so its length is data.clients)",
                                  lambda v: all(isinstance(s, str) and s for s in v)
                                  and len(set(v)) == len(v))
    server: str = _opt("coordinator", "the coordinator's certificate name", lambda v: bool(v))
    min_sites: int = _opt(3, "an integer >= 2 (the fewest sites that must accept the plan before "
                             "round 1; each site's policy checks it against aggregation.min_sites)",
                          lambda v: v >= 2)
    stage_timeout: float = _opt(60.0, "a number > 0 (seconds a site has to answer one stage; a "
                                      "site that misses it is a dropout for that round)",
                                lambda v: 0 < v <= 86400)
    join_timeout: float = _opt(600.0, "a number > 0 (seconds the coordinator waits for the "
                                      "roster to join before round 1)", lambda v: 0 < v <= 86400)
    keyholder: str = _opt("", "HOST:PORT of the Paillier key holder (secure.custody = 'key_holder'), "
                              "or empty", lambda v: v == "" or (":" in v and v.rpartition(":")[2].isdigit()))
    keyholder_name: str = _opt("auditor", "the Paillier key holder's certificate name (under threshold "
                                          "custody: the dealer's)", lambda v: bool(v))
    train_ahead: bool = _opt(True, "true or false (masking without DP: the next round's training "
                                   "goes with its masked input in the evaluation's last call, 5 calls "
                                   "a round instead of 6; a coordinator crash then also loses the "
                                   "round trained ahead)")


@dataclass(frozen=True)
class ExperimentConfig:
    """A fully resolved experiment; build it with :func:`load_config` or :func:`make_config`."""

    seed: int = _opt(0, "an integer in [0, 2**63)", lambda v: 0 <= v < 2**63)
    rounds: int = _opt(30, "an integer >= 1", lambda v: v >= 1)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    secure: SecureConfig = field(default_factory=SecureConfig)
    dp: DPConfig = field(default_factory=DPConfig)
    personal: PersonalConfig = field(default_factory=PersonalConfig)
    robust: RobustConfig = field(default_factory=RobustConfig)
    cocoa: CoCoAConfig = field(default_factory=CoCoAConfig)
    mocha: MochaConfig = field(default_factory=MochaConfig)
    boosting: BoostingConfig = field(default_factory=BoostingConfig)
    sim: SimConfig = field(default_factory=SimConfig)
    federation: FederationConfig = field(default_factory=FederationConfig)

    def to_toml(self) -> str:
        """The configuration as TOML text that :func:`load_config` reads back to an equal config."""
        lines = [f"{f.name} = {_toml_value(getattr(self, f.name))}" for f in _scalar_fields(self)]
        for section in _section_fields(self):
            lines.append(f"\n[{section.name}]")
            value = getattr(self, section.name)
            lines.extend(f"{f.name} = {_toml_value(getattr(value, f.name))}" for f in fields(value))
        return "\n".join(lines) + "\n"

    def sha256(self) -> str:
        """SHA-256 of :meth:`to_toml`, identifying the configuration."""
        return hashlib.sha256(self.to_toml().encode()).hexdigest()


def _scalar_fields(obj: Any) -> list[dataclasses.Field]:
    return [f for f in fields(obj) if not dataclasses.is_dataclass(f.default_factory)
            and f.default is not dataclasses.MISSING]


def _section_fields(obj: Any) -> list[dataclasses.Field]:
    return [f for f in fields(obj) if f.default is dataclasses.MISSING]


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml_value(str(v)) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def key_fields() -> dict[str, tuple[type, dataclasses.Field]]:
    """Every config key (``section.name`` or ``name``) with its type and field."""
    keys: dict[str, tuple[type, dataclasses.Field]] = {}
    for f in _scalar_fields(ExperimentConfig):
        keys[f.name] = (_type_of(ExperimentConfig, f), f)
    for section in _section_fields(ExperimentConfig):
        cls = section.default_factory
        for f in fields(cls):
            keys[f"{section.name}.{f.name}"] = (_type_of(cls, f), f)
    return keys


def _type_of(cls: type, f: dataclasses.Field) -> type:
    return {"int": int, "float": float, "str": str, "bool": bool, "tuple[str, ...]": tuple}[str(f.type)]


def _coerce(key: str, kind: type, value: Any) -> Any:
    if kind is tuple:
        if not isinstance(value, list | tuple) or any(
                isinstance(v, bool) or not isinstance(v, str | int) for v in value):
            raise ConfigError(key, f"must be a list of strings, got {value!r}")
        return tuple(str(v) for v in value)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    if type(value) is not kind:
        raise ConfigError(key, f"must be {kind.__name__}, got {type(value).__name__} {value!r}")
    if kind is float and not math.isfinite(value):
        raise ConfigError(key, f"must be a finite number, got {value!r}")
    return value


def _flatten(table: Mapping[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for name, value in table.items():
        if isinstance(value, Mapping):
            for sub, inner in value.items():
                if isinstance(inner, Mapping):
                    raise ConfigError(f"{name}.{sub}", "nested tables are not allowed")
                flat[f"{name}.{sub}"] = inner
        else:
            flat[name] = value
    return flat


def parse_override(text: str) -> tuple[str, Any]:
    """Parse ``key=value`` from ``--set``: the value as TOML, or a bare word as a string."""
    if "=" not in text:
        raise ConfigError(text, "an override must look like key=value")
    key, raw = (part.strip() for part in text.split("=", 1))
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key, value


def make_config(values: Mapping[str, Any] | None = None) -> ExperimentConfig:
    """Build and validate a configuration from flat ``{"section.key": value}`` entries."""
    keys = key_fields()
    resolved: dict[str, Any] = {}
    for key, value in (values or {}).items():
        if key not in keys:
            close = difflib.get_close_matches(key, keys, n=1)
            hint = f"did you mean {close[0]!r}?" if close else "see docs/configuration.md"
            raise ConfigError(key, f"unknown key ({hint})")
        kind, f = keys[key]
        value = _coerce(key, kind, value)
        meta = f.metadata
        if meta["choices"] is not None and value not in meta["choices"]:
            allowed = ", ".join(repr(c) for c in meta["choices"])
            raise ConfigError(key, f"must be one of {allowed}; got {value!r}")
        if meta["check"] is not None and not meta["check"](value):
            raise ConfigError(key, f"must be {meta['doc']}; got {value!r}")
        if meta["available"] is not None and value not in meta["available"]:
            allowed = ", ".join(repr(c) for c in meta["available"])
            raise ConfigError(
                key, f"{value!r} is not available yet in this version of fedsec (now: {allowed})"
            )
        resolved[key] = value
    if resolved.get("data.dataset") == "csv" and resolved.get("data.files") \
            and "data.clients" not in resolved:
        resolved["data.clients"] = len(resolved["data.files"])
    top = {k: v for k, v in resolved.items() if "." not in k}
    sections: dict[str, Any] = {}
    for section in _section_fields(ExperimentConfig):
        entries = {k.split(".", 1)[1]: v for k, v in resolved.items()
                   if k.startswith(section.name + ".")}
        sections[section.name] = section.default_factory(**entries)
    config = ExperimentConfig(**top, **sections)
    _check_combinations(config)
    return config


def loads_config(text: str) -> ExperimentConfig:
    """A configuration from TOML text (a plan a site received), validated like a file."""
    try:
        return make_config(_flatten(tomllib.loads(text)))
    except tomllib.TOMLDecodeError as error:
        raise ConfigError("config", f"not valid TOML: {error}") from None


def load_config(path: str | Path | None = None, overrides: Iterable[str] = ()) -> ExperimentConfig:
    """Defaults, then the TOML file at ``path`` (if any), then ``key=value`` overrides."""
    values: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as handle:
                values.update(_flatten(tomllib.load(handle)))
        except OSError as error:
            raise ConfigError("config", f"cannot read {path}: {error.strerror}") from None
        except tomllib.TOMLDecodeError as error:
            raise ConfigError("config", f"{path} is not valid TOML: {error}") from None
        values = _files_beside(values, Path(path).parent)
    for text in overrides:
        key, value = parse_override(text)
        values[key] = value
    return make_config(_files_beside(values, Path.cwd()))


def _files_beside(values: dict[str, Any], folder: Path) -> dict[str, Any]:
    """``data.files`` with relative paths taken from ``folder`` (the TOML file's; the working
    directory's for ``--set``), so config.toml in a run directory names absolute paths."""
    files = values.get("data.files")
    if isinstance(files, list) and all(isinstance(f, str) for f in files):
        values["data.files"] = [f if not f or Path(f).is_absolute() else str((folder / f).resolve())
                                for f in files]
    return values


CSV_KEYS = ("files", "label", "columns", "classes")
CSV_ALGORITHMS = ("fedavg", "fedsgd", "fedprox")


def _check_csv(config: ExperimentConfig) -> None:
    """``data.dataset = 'csv'``: its own keys only with it, a label and classes, one file per
    client, and the keys of bundled data sets left alone."""
    data, defaults = config.data, DataConfig()
    if data.dataset != "csv":
        for key in CSV_KEYS:
            if getattr(data, key) != getattr(defaults, key):
                raise ConfigError(f"data.{key}", "needs data.dataset = 'csv'")
        return
    if not data.label.strip():
        raise ConfigError("data.label", "data.dataset = 'csv' needs the label column's name")
    for key in ("files", "columns", "classes"):
        values = [v.strip() for v in getattr(data, key)]
        if any(not v for v in values) or len(set(values)) != len(values):
            raise ConfigError(f"data.{key}", f"must hold distinct, non-empty names; got "
                                             f"{list(getattr(data, key))}")
    if len(data.classes) < 2:
        raise ConfigError("data.classes", f"data.dataset = 'csv' needs >= 2 declared label values "
                                          f"(e.g. [0, 1]); got {list(data.classes)}")
    if data.label.strip() in [c.strip() for c in data.columns]:
        raise ConfigError("data.columns", f"must not hold the label column {data.label!r}")
    if data.files and data.clients != len(data.files):
        raise ConfigError("data.clients", f"must equal the number of data.files ({len(data.files)}), "
                                          f"one file per client; got {data.clients}")
    for key in ("partition", "alpha", "shards_per_client", "setup", "samples", "features"):
        if getattr(data, key) != getattr(defaults, key):
            raise ConfigError(f"data.{key}", "does not apply to data.dataset = 'csv' (each file is "
                                             "one client's data)")
    if config.train.algorithm not in CSV_ALGORITHMS:
        raise ConfigError("train.algorithm", f"data.dataset = 'csv' runs with "
                                             f"{', '.join(CSV_ALGORITHMS)}; got "
                                             f"{config.train.algorithm!r}")


MIN_MASKING_CLIENTS = 3
"""Pairwise masking recovers a dropout from t >= 2 of a client's k = m - 1 neighbours' shares."""


def _check_combinations(config: ExperimentConfig) -> None:
    """Cross-key checks that need no data loaded beyond the bundled label arrays."""
    data, model, secure = config.data, config.model, config.secure
    _check_csv(config)
    masking_only = (("graph", "complete"), ("active", True), ("corrupt", 0.1), ("workers", 1))
    paillier_only = (("key_bits", 2048), ("custody", "key_holder"))
    if secure.aggregation != "masking":
        _require_defaults(secure, masking_only, "masking")
    if secure.aggregation != "paillier":
        _require_defaults(secure, paillier_only, "paillier")
    if secure.aggregation == "none":
        _require_defaults(secure, (("threshold", 0), ("dropout", 0.0)), "masking' or 'paillier")
    else:
        from fedsec.fl_core.server import clients_per_round

        m = clients_per_round(config.train.fraction, data.clients)
        if m < 2:
            raise ConfigError("train.fraction", f"secure aggregation needs >= 2 clients a round; "
                                                f"{data.clients} clients x {config.train.fraction} "
                                                f"gives {m}")
        if secure.aggregation == "masking":
            if m < MIN_MASKING_CLIENTS:
                key = "data.clients" if data.clients < MIN_MASKING_CLIENTS else "train.fraction"
                raise ConfigError(key, f"masking needs >= {MIN_MASKING_CLIENTS} clients a round (with "
                                       f"2, a Shamir threshold >= 2 exceeds the 1 share holder); "
                                       f"{data.clients} x {config.train.fraction} gives {m}: use "
                                       f"secure.aggregation = 'paillier' or add clients")
            if secure.threshold > m - 1:
                raise ConfigError("secure.threshold", f"must be <= clients a round - 1 = {m - 1}; "
                                                      f"got {secure.threshold}")
            _check_threshold(secure, m, data.clients)
        elif secure.threshold > m:
            raise ConfigError("secure.threshold", f"must be <= clients a round = {m}; "
                                                  f"got {secure.threshold}")
    _check_algorithm(config)
    _check_personal(config)
    _check_robust(config)
    _check_linear_methods(config)
    _check_boosting(config)
    _check_privacy(config)
    _check_sim(config)
    _check_federation(config)
    if model.name == "cnn" and data.dataset != "digits":
        raise ConfigError("model.name", f"'cnn' needs image data (data.dataset = 'digits'), "
                                        f"got data.dataset = {data.dataset!r}")
    if data.dataset == "synthetic":
        if data.partition != "iid":
            raise ConfigError("data.partition", "does not apply to data.dataset = 'synthetic' "
                                                "(data.setup 1-4 fixes how clients differ)")
        if data.samples < 10 * data.clients:
            raise ConfigError("data.samples", f"must be >= 10 x data.clients = "
                                              f"{10 * data.clients}; got {data.samples}")
        if data.setup == 2 and data.clients < 3:
            raise ConfigError("data.clients", "synthetic set-up 2 (client 3's damaged sensor) "
                                              f"needs >= 3 clients; got {data.clients}")
        return
    if data.dataset == "csv":
        return
    n_train = training_samples(data.dataset, data.test_fraction)
    if data.clients > n_train:
        raise ConfigError("data.clients", f"must be <= the {n_train} training samples of "
                                          f"{data.dataset}; got {data.clients}")
    if data.partition == "shards" and data.clients * data.shards_per_client > n_train:
        raise ConfigError("data.shards_per_client", f"data.clients x data.shards_per_client must be "
                                                    f"<= {n_train} training samples; got "
                                                    f"{data.clients * data.shards_per_client}")


def _check_federation(config: ExperimentConfig) -> None:
    f = config.federation
    if not f.sites:
        return
    if len(f.sites) != config.data.clients:
        raise ConfigError("federation.sites", f"lists {len(f.sites)} sites; data.clients is "
                                              f"{config.data.clients} (site i is client i)")
    if f.min_sites > len(f.sites):
        raise ConfigError("federation.min_sites", f"must be <= the {len(f.sites)} sites of the roster")
    if config.secure.dropout:
        raise ConfigError("secure.dropout", "must be 0 in a deployment plan (real sites drop out)")
    s = config.secure
    if s.aggregation == "paillier" and s.custody == "key_holder" and not f.keyholder:
        raise ConfigError("federation.keyholder", "a deployment with secure.custody = 'key_holder' names "
                                                  "its key holder's HOST:PORT")


def _check_algorithm(config: ExperimentConfig) -> None:
    t = config.train
    if t.algorithm == "fedprox" and t.prox_mu == 0:
        raise ConfigError("train.prox_mu", "must be > 0 with train.algorithm = 'fedprox'")
    if t.algorithm != "fedprox" and t.prox_mu:
        raise ConfigError("train.prox_mu", "needs train.algorithm = 'fedprox'")
    if t.algorithm == "fedsgd":
        for key, default in (("server_optimizer", "sgd"), ("server_lr", 0.0)):
            if getattr(t, key) != default:
                raise ConfigError(f"train.{key}", "needs train.algorithm = 'fedavg' or 'fedprox' "
                                                  "(fedsgd steps with train.lr)")
    if t.algorithm == "fedprox" and config.dp.mode == "dpsgd":
        raise ConfigError("train.algorithm", "'fedprox' with dp.mode = 'dpsgd' is not supported "
                                             "(DP-SGD has no proximal term): use 'fedavg'")


PERSONAL_ONLY = {"ditto": ("lam", "epochs"), "perfedavg": ("steps", "adapt_steps")}


def _check_personal(config: ExperimentConfig) -> None:
    """``[personal]`` keys belong to ``train.algorithm = 'ditto'`` or ``'perfedavg'``."""
    t, p, defaults = config.train, config.personal, PersonalConfig()
    for name in ("lam", "lr", "epochs", "steps", "adapt_steps", "holdout"):
        if getattr(p, name) == getattr(defaults, name):
            continue
        owners = [a for a in PERSONAL_ONLY if name in PERSONAL_ONLY[a]] or list(PERSONAL_ONLY)
        if t.algorithm not in owners:
            raise ConfigError(f"personal.{name}", "needs train.algorithm = "
                                                  + " or ".join(repr(a) for a in owners))
    if t.algorithm != "perfedavg":
        return
    if config.dp.mode == "dpsgd":
        raise ConfigError("train.algorithm", "'perfedavg' with dp.mode = 'dpsgd' is not supported "
                                             "(its inner and outer steps are not DP-SGD steps): use "
                                             "dp.mode = 'client' or 'none', or 'ditto'")
    for key, default in (("server_optimizer", "sgd"), ("server_lr", 0.0)):
        if getattr(t, key) != default:
            raise ConfigError(f"train.{key}", "needs train.algorithm = 'fedavg' or 'fedprox' "
                                              "(perfedavg's outer step is train.lr)")


def _check_robust(config: ExperimentConfig) -> None:
    """Median and trimmed mean need individual updates: plain aggregation only."""
    r, defaults = config.robust, RobustConfig()
    if r.rule != "none" and config.train.algorithm in OWN_MODEL:
        raise ConfigError("robust.rule", f"applies to model updates (fedavg, fedprox, ditto, "
                                         f"perfedavg); train.algorithm = "
                                         f"{config.train.algorithm!r} sends sums of its own "
                                         f"statistics, which a robust rule would corrupt")
    if r.rule in ("median", "trimmed_mean"):
        if config.secure.aggregation != "none":
            raise ConfigError("robust.rule", f"{r.rule!r} needs every client's individual update, "
                                             f"which secure.aggregation = "
                                             f"{config.secure.aggregation!r} hides by design (the "
                                             f"server learns only the sum): use "
                                             f"secure.aggregation = 'none', or robust.rule = "
                                             f"'norm_bound', which works under masking and Paillier")
        if config.dp.mode == "client":
            raise ConfigError("robust.rule", f"{r.rule!r} with dp.mode = 'client' is not supported "
                                             "(the client-level noise is calibrated to a sum's "
                                             "sensitivity, not to a median's)")
    if r.rule == "norm_bound" and config.dp.mode == "client":
        raise ConfigError("robust.rule", "'norm_bound' with dp.mode = 'client' is redundant: "
                                         "client-level DP already bounds each update's L2 norm by "
                                         "dp.max_grad_norm")
    if r.trim != defaults.trim and r.rule != "trimmed_mean":
        raise ConfigError("robust.trim", "needs robust.rule = 'trimmed_mean'")
    if r.norm_bound != defaults.norm_bound and r.rule != "norm_bound":
        raise ConfigError("robust.norm_bound", "needs robust.rule = 'norm_bound'")
    if r.byzantine >= config.data.clients:
        raise ConfigError("robust.byzantine", f"must be < data.clients = {config.data.clients}; "
                                              f"got {r.byzantine}")
    if r.byzantine == 0:
        for key in ("attack", "factor"):
            if getattr(r, key) != getattr(defaults, key):
                raise ConfigError(f"robust.{key}", "needs robust.byzantine >= 1")
LINEAR_METHODS = ("cocoa", "mocha")
"""Primal-dual methods for linear models (fedsec.methods); they train no torch model."""


def _check_linear_methods(config: ExperimentConfig) -> None:
    """CoCoA and MOCHA: their own keys only with them, binary linear models, and the privacy they
    compose with (CoCoA: any secure layer, no DP; MOCHA: plain only)."""
    method = config.train.algorithm
    for name in LINEAR_METHODS:
        if method != name:
            section, defaults = getattr(config, name), type(getattr(config, name))()
            for f in fields(section):
                if getattr(section, f.name) != getattr(defaults, f.name):
                    raise ConfigError(f"{name}.{f.name}", f"needs train.algorithm = {name!r}")
    if method not in LINEAR_METHODS:
        return
    if config.model.name != "logreg":
        raise ConfigError("model.name", f"{method} trains a linear model: needs 'logreg'")
    if config.data.dataset == "digits":
        raise ConfigError("data.dataset", f"{method} is binary (hinge or logistic loss); 'digits' "
                                          f"has 10 classes")
    train, defaults = config.train, TrainConfig()
    for key in ("local_epochs", "batch_size", "lr", "server_optimizer", "server_lr",
                "target_accuracy", "stop_tol"):
        if getattr(train, key) != getattr(defaults, key):
            raise ConfigError(f"train.{key}", f"does not apply to train.algorithm = {method!r} "
                                              f"(its keys are in [{method}])")
    if config.dp.mode != "none":
        reason = ("MOCHA's server needs every client's model" if method == "mocha" else
                  "'dpsgd' clips per-example SGD gradients and CoCoA takes SDCA dual steps; "
                  "client-level noise on the summed Delta w would break w = A alpha, which every "
                  "client's dual steps rely on")
        raise ConfigError("dp.mode", f"train.algorithm = {method!r} runs without DP ({reason}): "
                                     f"set dp.mode = 'none'")
    if method == "mocha":
        if config.secure.aggregation != "none":
            raise ConfigError("secure.aggregation", "MOCHA's task-relationship update Sigma = "
                                                    "(W^T W)^(1/2) / tr(.) needs the individual "
                                                    "per-client models W, not their sum: no secure "
                                                    "layer can hide them; set secure.aggregation = "
                                                    "'none'")
        if train.fraction != 1:
            raise ConfigError("train.fraction", "MOCHA keeps every client's model each round; "
                                                "model partial participation with mocha.straggle")
BOOSTING_UNUSED = ("local_epochs", "batch_size", "lr", "server_optimizer", "server_lr", "prox_mu",
                   "stop_tol")
"""train.* keys that component-wise boosting has no use for (boosting.nu is its step)."""


def _check_boosting(config: ExperimentConfig) -> None:
    b, t = config.boosting, config.train
    if t.algorithm != "boosting":
        defaults = BoostingConfig()
        for f in fields(b):
            if getattr(b, f.name) != getattr(defaults, f.name):
                raise ConfigError(f"boosting.{f.name}", "needs train.algorithm = 'boosting'")
        return
    if config.dp.mode != "none":
        raise ConfigError("dp.mode", "boosting sends its sums (B'B, B'u) as statistics, which carry "
                                     "no DP noise and no accountant: set dp.mode = 'none'")
    defaults_t = TrainConfig()
    for key in BOOSTING_UNUSED:
        if getattr(t, key) != getattr(defaults_t, key):
            raise ConfigError(f"train.{key}", "does not apply to train.algorithm = 'boosting' "
                                              "(boosting.nu is its step length)")
    if t.fraction != 1:
        raise ConfigError("train.fraction", "boosting sums every client's statistics each iteration "
                                            "(B'B is summed once over all): needs train.fraction = 1")
    if config.secure.dropout:
        raise ConfigError("secure.dropout", "boosting needs every client's sums in every iteration "
                                            "(B'B is summed once over all; a sum of survivors would "
                                            "mix populations): set secure.dropout = 0")
    if config.model.name != "logreg":
        raise ConfigError("model.name", "boosting fits its own additive model; leave model.name "
                                        "at 'logreg'")
    if config.data.dataset == "digits":
        raise ConfigError("data.dataset", "boosting fits binary labels (0/1); 'digits' has 10 classes")
    if b.learners != "linear" and not config.data.standardize:
        raise ConfigError("boosting.learners", "P-spline knots come from the public range of the "
                                               "standardised features: needs data.standardize = true "
                                               "(or boosting.learners = 'linear')")
    if b.df <= b.difference or b.df > b.knots + b.degree + 1:
        raise ConfigError("boosting.df", f"must be in (boosting.difference, boosting.knots + "
                                         f"boosting.degree + 1] = ({b.difference}, "
                                         f"{b.knots + b.degree + 1}]; got {b.df}")


def _check_privacy(config: ExperimentConfig) -> None:
    dp, train, secure = config.dp, config.train, config.secure
    if dp.mode == "none":
        defaults = DPConfig()
        for key in ("noise_multiplier", "target_epsilon", "max_grad_norm", "accountant",
                    "reproducible", "delta", "weights", "sample_rate"):
            if getattr(dp, key) != getattr(defaults, key):
                raise ConfigError(f"dp.{key}", "needs dp.mode = 'dpsgd' or 'client'")
        return
    if dp.noise_multiplier == 0 and dp.target_epsilon == 0:
        raise ConfigError("dp.target_epsilon", "give dp.target_epsilon (noise calibrated to spend "
                                               "it over `rounds`) or dp.noise_multiplier, or both")
    if dp.mode == "dpsgd" and train.algorithm == "fedsgd":
        raise ConfigError("train.algorithm", "DP-SGD trains locally: needs 'fedavg'")
    if dp.sample_rate > 0 and dp.mode != "dpsgd":
        raise ConfigError("dp.sample_rate", "needs dp.mode = 'dpsgd' (client-level DP samples no "
                                            "records)")
    if dp.sample_rate > 0 and train.batch_size == 0:
        raise ConfigError("train.batch_size", "a fixed dp.sample_rate needs train.batch_size >= 1 "
                                              "(the expected batch size every step divides by)")
    if dp.mode == "dpsgd" and dp.weights == "equal" and dp.sample_rate == 0:
        raise ConfigError("dp.sample_rate", "dp.weights = 'equal' needs a fixed rate in (0, 1]: "
                                            "B / n_k would give every client's size away")
    if dp.mode == "dpsgd" and dp.weights == "equal" and config.data.standardize:
        raise ConfigError("data.standardize", "dp.weights = 'equal' covers the clients' sizes, but "
                                              "standardisation sends each client's statistics with "
                                              "weight n_k: set data.standardize = false")
    if 0 < dp.noise_multiplier < MIN_NOISE_MULTIPLIER:
        raise ConfigError("dp.noise_multiplier", f"must be 0 (calibrated) or >= "
                                                 f"{MIN_NOISE_MULTIPLIER:g}: the Gaussian sampler is "
                                                 "truncated at 8.57 standard deviations, which a "
                                                 "smaller noise makes a privacy failure")
    if dp.mode == "client":
        from fedsec.fl_core.server import clients_per_round

        if clients_per_round(train.fraction, config.data.clients) != config.data.clients:
            raise ConfigError("train.fraction", "client-level DP is accounted with every client in "
                                                "every round: needs train.fraction = 1")
        if secure.aggregation != "none" and secure.clip < dp.max_grad_norm:
            raise ConfigError("secure.clip", f"must be >= dp.max_grad_norm = {dp.max_grad_norm} "
                                             "(the coordinate range must hold a clipped update)")
        if secure.aggregation != "none":
            _check_honest_margin(secure, config.data.clients)


def _require_defaults(secure: SecureConfig, keys: tuple[tuple[str, Any], ...], needs: str) -> None:
    for key, default in keys:
        if getattr(secure, key) != default:
            raise ConfigError(f"secure.{key}", f"needs secure.aggregation = '{needs}'")


def _check_threshold(secure: SecureConfig, clients_per_round: int, population: int) -> None:
    """A safe threshold must exist for the rounds' size, and a configured one must lie in
    [floor, degree] for the graph the rule picks, where floor is the smallest threshold every
    client accepts (the rule clients enforce themselves: the corrupt fraction is taken of the
    whole population ``population``, not of the clients a round)."""
    import numpy as np

    from fedsec.protocols.errors import ProtocolAbort
    from fedsec.protocols.masked import MaskedAggregation
    from fedsec.protocols.masked.policy import minimum_threshold

    protocol = MaskedAggregation(max_weight=1, rng=np.random.default_rng(0), graph=secure.graph,
                                 dropout=secure.dropout, active=secure.active,
                                 tolerated_corrupt=secure.corrupt, population=population)
    try:
        degree = protocol.parameters(clients_per_round)[0]
    except ProtocolAbort as abort:
        raise ConfigError("secure.corrupt", f"no threshold is safe for {clients_per_round} clients a "
                                            f"round when a fraction {secure.corrupt} of all {population} "
                                            f"clients may collude ({abort}): sample more clients a "
                                            f"round (train.fraction) or assume fewer colluders") from None
    if not secure.threshold:
        return
    floor = minimum_threshold(clients_per_round, degree, secure.corrupt, active=secure.active,
                              population=population)
    if not floor <= secure.threshold <= degree:
        mode = "authenticated" if secure.active else "semi-honest"
        raise ConfigError("secure.threshold", f"must be in [{floor}, {degree}] for the {secure.graph} "
                                              f"graph of {clients_per_round} clients (degree {degree}, "
                                              f"{mode} mode, secure.corrupt = {secure.corrupt} of "
                                              f"{population} clients: the "
                                              f"clients refuse less); got {secure.threshold}")


def honest_margin(secure: SecureConfig, clients: int) -> tuple[int, int]:
    """(t, c) of a client-level DP run of ``clients`` clients, all sampled each round: t the
    fewest contributions a released sum holds (the masking rule's threshold, or the Paillier
    decryption threshold), c the colluders the clients provision their noise shares for
    (``tolerated_colluders`` of the simulation's protocol)."""
    import numpy as np

    from fedsec.protocols.masked import MaskedAggregation
    from fedsec.protocols.masked.policy import population_corrupt
    from fedsec.protocols.paillier.aggregation import default_threshold

    if secure.aggregation == "paillier":  # PaillierAggregation's rule, without generating a key
        return secure.threshold or default_threshold(clients), population_corrupt(clients, secure.corrupt)
    protocol = MaskedAggregation(max_weight=1, rng=np.random.default_rng(0), graph=secure.graph,
                                 threshold=secure.threshold, dropout=secure.dropout, active=secure.active,
                                 tolerated_corrupt=secure.corrupt, population=clients)
    return protocol.min_contributions(clients), protocol.tolerated_colluders(clients)


def _check_honest_margin(secure: SecureConfig, clients: int) -> None:
    """Client-level DP shares carry mu / (t - c): a run where t - c < 1 cannot promise any
    released sum an honest share, and is refused before it starts."""
    t, c = honest_margin(secure, clients)
    if t - c < 1:
        raise ConfigError("secure.threshold", f"client-level DP needs a threshold above the {c} tolerated "
                                              f"colluders (secure.corrupt = {secure.corrupt} of {clients} "
                                              f"clients), so that every released sum holds an honest "
                                              f"noise share; the threshold is {t}")


def training_samples(dataset: str, test_fraction: float) -> int:
    """Number of training samples left after the stratified test split of a bundled data set."""
    import numpy as np

    from fedsec.fl_core.data import stratified_split
    from fedsec.fl_core.datasets import load_pool

    _, y, _ = load_pool(dataset)
    train, _ = stratified_split(y, test_fraction=test_fraction, rng=np.random.default_rng(0))
    return int(train.size)


def _check_sim(config: ExperimentConfig) -> None:
    """``[sim]``: its keys only with the Ray backend, and what the Ray backend can run."""
    sim, defaults = config.sim, SimConfig()
    if sim.backend == "local":
        for f in fields(sim):
            if f.name != "backend" and getattr(sim, f.name) != getattr(defaults, f.name):
                raise ConfigError(f"sim.{f.name}", "needs sim.backend = 'ray'")
        return
    from fedsec.backends.session import INSTALL_HINT, ray_available

    if not ray_available():
        raise ConfigError("sim.backend", f"'ray' needs the ray package, which is not installed: "
                                         f"{INSTALL_HINT}")
    if config.train.algorithm in RAY_STATEFUL:
        raise ConfigError("sim.backend", f"train.algorithm = {config.train.algorithm!r} keeps its "
                                         f"clients' state in one process: use sim.backend = 'local'")
    if sim.address and sim.num_cpus:
        raise ConfigError("sim.num_cpus", "sizes the local Ray that sim.address = '' starts; a "
                                          "cluster's size is its own (leave sim.num_cpus = 0)")
    if sim.num_cpus and sim.cpus_per_client > sim.num_cpus:
        raise ConfigError("sim.cpus_per_client", f"must be <= sim.num_cpus = {sim.num_cpus}; "
                                                 f"got {sim.cpus_per_client}")
