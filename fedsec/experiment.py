"""Turn an :class:`ExperimentConfig` into a running federation and a run directory."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import math
import platform
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedsec import fl_core
from fedsec.checkpoint import SavedState, generator_state
from fedsec.config import ExperimentConfig
from fedsec.diagnostics import hopeless_noise_warning, noise_to_signal
from fedsec.dp.errors import InvalidPrivacyParameterError
from fedsec.errors import ConfigError
from fedsec.fl_core.history import HistoryRecorder, RoundObserver, TrainingResult
from fedsec.methods import personalization
from fedsec.methods.robust import wrap_protocol
from fedsec.plots import plot_metric, privacy_label
from fedsec.privacy import PrivacySetup, build_privacy
from fedsec.progress import ProgressBar
from fedsec.rundir import RunDirectory, check_out

RUN_FILES = ("config.toml", "history.csv", "summary.json", "model.pt", "accuracy.png")
"""Files of every run directory; a private run adds ``epsilon.png``."""

LOOP_FILES = ("audit.db", "audit.key")
"""Files a run of the FedAvg server loop adds (not boosting, CoCoA, MOCHA): the signed audit log
and its key (:mod:`fedsec.audit.run`); a resumable configuration adds ``checkpoint.npz``
(:mod:`fedsec.checkpoint`)."""

VERSIONED = ("numpy", "torch", "scikit-learn", "opacus", "dp-accounting", "cryptography", "phe",
             "gmpy2")
"""Distributions whose versions decide a run's numbers (summary.json's ``versions``)."""


class RunWarning(UserWarning):
    """A run that will go ahead but is unlikely to show what it is meant to (one line)."""


@dataclass
class Experiment:
    """Everything one run needs, built and validated, nothing run yet."""

    config: ExperimentConfig
    data: fl_core.FederatedDataset
    server: fl_core.FederatedServer
    history: HistoryRecorder
    privacy: PrivacySetup | None = None
    warnings: list[str] = field(default_factory=list)
    extras: list[Callable[[TrainingResult, Path | None], dict[str, Any]]] = field(default_factory=list)
    """Method reports run after training: each returns entries for summary.json and may write
    its plots into the run directory (None when there is none)."""
    saved: list[SavedState] = field(default_factory=list)
    """Run state beyond the server loop's own that a checkpoint carries (:mod:`fedsec.checkpoint`)."""


def build_experiment(
    config: ExperimentConfig, *, observers: list[RoundObserver] | None = None
) -> Experiment:
    """Load the data, build model, strategy and protocol, and wire the server loop.

    Raises:
        ConfigError: a combination of keys that only shows up when the data are loaded.
    """
    if config.train.algorithm == "boosting":
        raise ConfigError("train.algorithm", "boosting has no FedAvg server loop: use run_experiment")
    rng = np.random.default_rng(config.seed)
    data, local_tests = load_data(config, rng)
    return assemble_experiment(config, data, rng, observers=observers, local_tests=local_tests)


def load_data(config: ExperimentConfig, rng: np.random.Generator
              ) -> tuple[fl_core.FederatedDataset, tuple[fl_core.ArrayDataset, ...]]:
    """The run's data and, for personalization, each client's local test split (drawn from ``rng``,
    the run generator, as the first thing a run does)."""
    d, t = config.data, config.train
    if d.dataset == "csv":
        data = _csv_data(config)
    else:
        data = _bundled_data(config, rng)
    if not d.standardize:
        data = dataclasses.replace(data, standardize=False)
    local_tests: tuple[fl_core.ArrayDataset, ...] = ()
    if t.algorithm in personalization.ALGORITHMS:
        try:
            data, local_tests = personalization.split(config, data, rng)
        except fl_core.InvalidParameterError as error:
            raise ConfigError("personal.holdout", str(error)) from None
    return data, local_tests


ProtocolFactory = Callable[[ExperimentConfig, fl_core.FederatedDataset, np.random.Generator],
                           fl_core.AggregationProtocol]
StrategyWrapper = Callable[[fl_core.Strategy], fl_core.Strategy]
EvaluatorFactory = Callable[[ExperimentConfig, fl_core.FederatedDataset], Any]


def assemble_experiment(
    config: ExperimentConfig, data: fl_core.FederatedDataset, rng: np.random.Generator, *,
    observers: list[RoundObserver] | None = None, local_tests: tuple[fl_core.ArrayDataset, ...] = (),
    protocol_factory: ProtocolFactory | None = None, strategy_wrapper: StrategyWrapper | None = None,
    evaluator_factory: EvaluatorFactory | None = None,
) -> Experiment:
    """Build model, strategy, protocol and privacy for ``data`` and wire the server loop, drawing
    from ``rng`` exactly as :func:`build_experiment` does after loading the data.

    A deployed coordinator (:mod:`fedsec.network`) passes its own ``protocol_factory`` (the secure
    layer over the network, in place of :func:`build_protocol`), a ``strategy_wrapper`` (local
    updates run at the sites) and an ``evaluator_factory`` (federated evaluation over its own
    instance of the secure layer; ``evaluator(model, test)`` for the server loop, and a round
    observer when it is one).
    """
    t = config.train
    model = fl_core.build_model(
        config.model.name,
        input_shape=data.input_shape,
        n_classes=data.n_classes,
        seed=int(rng.integers(0, 2**63 - 1)),
    )
    protocol = (protocol_factory or build_protocol)(config, data, rng)
    n_parameters = sum(p.numel() for p in model.parameters())
    try:
        privacy = build_privacy(config, data, protocol, n_parameters)
    except InvalidPrivacyParameterError as error:
        key = "dp.noise_multiplier" if config.dp.noise_multiplier else "dp.target_epsilon"
        raise ConfigError(key, f"{error} with dp.accountant = {config.dp.accountant!r}") from None
    notes = _check_budget(config, data, privacy, n_parameters) if privacy is not None else []
    trainer = local_trainer(config)
    if privacy is not None:
        trainer = privacy.trainer or trainer
        protocol = privacy.protocol or protocol
    protocol, robust_summary = wrap_protocol(config, protocol)
    weighting = privacy.weighting if privacy is not None else "samples"
    strategy = build_strategy(config, trainer, weighting=weighting)
    if privacy is not None and privacy.zero_on_failure:
        strategy = fl_core.ZeroOnFailure(strategy)
    if strategy_wrapper is not None:
        strategy = strategy_wrapper(strategy)
    history = HistoryRecorder()
    extra: list[RoundObserver] = [privacy.budget] if privacy is not None else []
    evaluator = None
    saved: list[SavedState] = []
    if evaluator_factory is not None:
        evaluator = evaluator_factory(config, data)
    elif config.data.dataset == "csv":
        from fedsec.site_data import EVALUATION_STREAM, build_evaluator, evaluation_protocol

        evaluation_rng = np.random.default_rng([config.seed, EVALUATION_STREAM])
        evaluator = build_evaluator(config, data, evaluation_protocol(config, data, evaluation_rng))
        saved.append(generator_state("evaluation_rng", evaluation_rng))
    if isinstance(evaluator, RoundObserver):
        extra.append(evaluator)
    runner = build_runner(config, protocol)
    server = fl_core.FederatedServer(
        model=model,
        data=data,
        strategy=strategy,
        protocol=protocol,
        rounds=config.rounds,
        fraction=t.fraction,
        rng=rng,
        target_accuracy=t.target_accuracy or None,
        stop_tol=t.stop_tol,
        observers=[history, *extra, *(observers or [])],
        evaluator=evaluator,
        runner=runner,
    )
    extras: list[Callable[[TrainingResult, Path | None], dict[str, Any]]] = []
    if robust_summary:
        extras.append(lambda result, out_dir: robust_summary)
    if local_tests:
        extras.append(lambda result, out_dir: personalization.report(config, server, local_tests,
                                                                     result, out_dir))
    return Experiment(config, data, server, history, privacy, notes, extras, saved)


def local_trainer(config: ExperimentConfig) -> fl_core.LocalTrainer:
    """The non-private local trainer ``train.*`` asks for (FedProx's proximal one, or SGD)."""
    t = config.train
    if t.algorithm == "fedprox":
        return fl_core.TorchTrainer(epochs=t.local_epochs, batch_size=t.batch_size, lr=t.lr,
                                    prox_mu=t.prox_mu)
    return fl_core.SGDTrainer(epochs=t.local_epochs, batch_size=t.batch_size, lr=t.lr)


def _bundled_data(config: ExperimentConfig, rng: np.random.Generator) -> fl_core.FederatedDataset:
    d = config.data
    try:
        return fl_core.load_federated(
            d.dataset,
            n_clients=d.clients,
            partition=d.partition,
            test_fraction=d.test_fraction,
            rng=rng,
            alpha=d.alpha,
            shards_per_client=d.shards_per_client,
            synthetic_setup=d.setup,
            synthetic_samples=d.samples,
            synthetic_features=d.features,
        )
    except fl_core.InvalidParameterError as error:
        raise ConfigError("data", str(error)) from None


def _csv_data(config: ExperimentConfig) -> fl_core.FederatedDataset:
    """The sites' CSV files; a file that fails validation is a bad input (key ``data.files``)."""
    from fedsec.fl_core.csv_data import SiteDataError
    from fedsec.site_data import federated_dataset, load_sites

    try:
        return federated_dataset(config, load_sites(config))
    except SiteDataError as error:
        raise ConfigError("data.files", str(error)) from None


def build_runner(config: ExperimentConfig, protocol: fl_core.AggregationProtocol
                 ) -> fl_core.ClientRunner | None:
    """Where the clients compute (``sim.backend``): None = here (local); for ``ray``, connect to
    Ray now (a failure ends the run before anything is written) and host the masking layer's
    clients there too (:mod:`fedsec.backends.ray_runner`)."""
    sim = config.sim
    if sim.backend == "local":
        return None
    from fedsec.backends import connect

    connect(address=sim.address, num_cpus=sim.num_cpus)  # ConfigError when ray is not installed
    from fedsec.backends.ray_runner import attach_ray

    return attach_ray(address=sim.address, num_cpus=sim.num_cpus, cpus_per_client=sim.cpus_per_client,
                      protocol=protocol, reproducible=config.dp.reproducible)


def _check_budget(config: ExperimentConfig, data: fl_core.FederatedDataset, privacy: PrivacySetup,
                  n_parameters: int) -> list[str]:
    """Refuse a budget that round 1 already exceeds; return a warning if the noise is hopeless."""
    p, t = config.dp, config.train
    first = privacy.budget.epsilon_after_next_round()
    if p.target_epsilon and first > p.target_epsilon:
        raise ConfigError("dp.noise_multiplier", f"{p.noise_multiplier:g} spends epsilon {first:.4g} "
                                                 f"in round 1 alone, over dp.target_epsilon = "
                                                 f"{p.target_epsilon:g} (delta {p.delta:g}); raise it, "
                                                 f"or set it to 0 to calibrate")
    m = fl_core.clients_per_round(t.fraction, data.n_clients)
    if p.mode == "dpsgd" and p.sample_rate > 0:  # public constants only: the sizes stay covered
        batch, steps = float(t.batch_size), t.local_epochs * max(1, round(1 / p.sample_rate))
    else:
        n = sum(len(c) for c in data.clients) / data.n_clients
        batch = t.batch_size if t.batch_size and t.batch_size < n else n
        steps = t.local_epochs * math.ceil(n / batch)
    ratio = noise_to_signal(mode=p.mode, noise_multiplier=privacy.noise_multiplier,
                            n_parameters=n_parameters, clients_per_round=m, rounds=config.rounds,
                            batch_size=batch, local_steps=steps)
    warning = hopeless_noise_warning(ratio, noise_multiplier=privacy.noise_multiplier)
    return [warning] if warning else []


def build_strategy(config: ExperimentConfig, trainer: fl_core.LocalTrainer, *,
                   weighting: str = "samples") -> fl_core.Strategy:
    """The strategy ``train.algorithm`` names, with the server optimiser of ``train.server_*``;
    ``weighting`` is FedAvg's (``samples``: n_k, ``equal``: 1)."""
    t = config.train
    if t.algorithm in personalization.ALGORITHMS:
        return personalization.build_strategy(config, trainer, weighting=weighting)
    if t.algorithm == "fedsgd":
        return fl_core.FedSGD(lr=t.lr)
    optimizer = (None if t.server_optimizer == "sgd" and not t.server_lr else
                 fl_core.make_server_optimizer(t.server_optimizer, lr=t.server_lr or None))
    cls = fl_core.FedProx if t.algorithm == "fedprox" else fl_core.FedAvg
    return cls(trainer=trainer, server_optimizer=optimizer, weighting=weighting)


def build_protocol(
    config: ExperimentConfig, data: fl_core.FederatedDataset, rng: np.random.Generator
) -> fl_core.AggregationProtocol:
    """The aggregation protocol that ``secure.aggregation`` names."""
    s = config.secure
    return make_protocol(
        s.aggregation, max_weight=max(len(c) for c in data.clients), n_clients=data.n_clients,
        fraction=config.train.fraction, rng=rng, clip=s.clip, bits=s.bits, graph=s.graph,
        threshold=s.threshold, dropout=s.dropout, active=s.active, key_bits=s.key_bits,
        corrupt=s.corrupt, custody=s.custody, reproducible=config.dp.reproducible, workers=s.workers)


def make_protocol(
    aggregation: str, *, max_weight: int, n_clients: int, fraction: float,
    rng: np.random.Generator, clip: float = 1.0, bits: int = 16, graph: str = "complete",
    threshold: int = 0, dropout: float = 0.0, active: bool = True, corrupt: float = 0.1,
    key_bits: int = 2048, custody: str = "key_holder", reproducible: bool = False, workers: int = 1,
) -> fl_core.AggregationProtocol:
    """The aggregation protocol ``aggregation`` (``none``, ``masking`` or ``paillier``) for
    ``n_clients`` clients of weight at most ``max_weight``, a share ``fraction`` of them a round;
    ``reproducible`` draws the masking ring's order from ``rng`` too; ``workers`` is the masking
    server's process count for its unmask stage."""
    if aggregation == "masking":
        from fedsec.protocols.masked import MaskedAggregation

        return MaskedAggregation(
            max_weight=max_weight, rng=rng, clip=clip, bits=bits, graph=graph,
            threshold=threshold, dropout=dropout, active=active, reproducible=reproducible,
            tolerated_corrupt=corrupt, population=n_clients, workers=workers)
    if aggregation == "paillier":
        from fedsec.protocols.paillier import PaillierAggregation, default_threshold

        m = fl_core.clients_per_round(fraction, n_clients)
        return PaillierAggregation(
            max_weight=max_weight, rng=rng, clip=clip, bits=bits,
            threshold=threshold or default_threshold(m), dropout=dropout,
            key_bits=key_bits, custody=custody, parties=range(n_clients), tolerated_corrupt=corrupt,
            population=n_clients)
    return fl_core.PlainAggregation()


class _RunDirectoryWriter(RoundObserver):
    """Rewrites ``history.csv`` after every round, so a crashed run keeps what it did."""

    def __init__(self, out: Path, history: HistoryRecorder) -> None:
        self.out, self.history = out, history

    def after_round(self, record: fl_core.RoundRecord) -> None:
        self.history.write_csv(self.out / "history.csv")


def versions() -> dict[str, str]:
    """Versions of fedsec and the libraries that decide a run's numbers."""
    from fedsec import __version__

    found = {"fedsec": __version__, "python": platform.python_version()}
    for name in VERSIONED:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def summarize(
    config: ExperimentConfig, result: TrainingResult, wall_seconds: float, setup_upload: int,
    privacy: PrivacySetup | None = None,
) -> dict[str, Any]:
    """The ``summary.json`` content of a finished run."""
    last = result.records[-1].metrics if result.records else {}
    aborted = [{"round": r.round, "reason": r.status.removeprefix("aborted: ")}
               for r in result.records if r.status != "ok"]
    extra: dict[str, Any] = {}
    if privacy is not None:
        budget = privacy.budget
        extra = {"privacy": {
            "unit": privacy.unit, "accountant": config.dp.accountant,
            "noise_multiplier": privacy.noise_multiplier, "epsilon": budget.spent,
            "epsilon_rdp": last.get("epsilon_rdp"), "delta": config.dp.delta,
            "target_epsilon": config.dp.target_epsilon or None,
            "budget_remaining": last.get("budget_remaining"),
            "stopped": budget.stopped,
            "unit_definition": privacy.unit_definition,
            "withheld": privacy.withheld,
            "not_covered": privacy.not_covered,
            "ledger": budget.state_dict(),
        }}
    return {
        "final_accuracy": result.final_accuracy,
        "best_accuracy": result.best_accuracy,
        "rounds_run": result.rounds_run,
        "rounds_to_target": result.rounds_to_target,
        "epsilon": last.get("epsilon"),
        "delta": last.get("delta"),
        "wall_seconds": round(wall_seconds, 3),
        "config_sha256": config.sha256(),
        "versions": versions(),
        "stop_reason": result.stop_reason,
        "setup_upload_bytes": setup_upload,
        "aborted_rounds": len(aborted),
        "aborted": aborted,
        **extra,
    }


def run_experiment(
    config: ExperimentConfig, *, out: str | Path | None = None, progress: bool = False,
    force: bool = False, audit: bool = True,
) -> dict[str, Any]:
    """Run one experiment; with ``out``, write the run directory. Returns the summary dict.

    All validation (the configuration, ``out`` itself, loading the data, the privacy budget)
    happens before anything is written. The run is written into a staging folder that replaces
    ``out`` when the run ends, also when it fails, so no file of an earlier run survives next to
    it (see :mod:`fedsec.rundir`; ``force`` allows replacing an earlier run). Warnings
    (:class:`RunWarning`, e.g. hopeless noise) are issued before the first round and listed in the
    summary. A run directory holds the signed audit log ``audit.db`` (``audit=False`` leaves it
    out: the benchmark's reference) and, for a resumable configuration, ``checkpoint.npz``.
    """
    import torch

    if config.train.algorithm in ("cocoa", "mocha"):
        from fedsec.methods.cocoa import run_cocoa
        from fedsec.methods.mocha import run_mocha

        runner = run_cocoa if config.train.algorithm == "cocoa" else run_mocha
        return runner(config, out=out, progress=progress, force=force)
    if out is not None:
        check_out(out, force=force)
    # The bundled models are tiny: one intra-op thread is faster than several on a CPU.
    torch.set_num_threads(1)
    observers: list[RoundObserver] = []
    if progress:
        observers.append(ProgressBar(target_accuracy=config.train.target_accuracy or None))
    if config.train.algorithm == "boosting":
        from fedsec.methods.boosting import prepare_boosting, run_boosting

        run = prepare_boosting(config)
        if out is None:
            return run_boosting(run, None, observers=observers)
        staging = RunDirectory(out, force=force)
        try:
            return run_boosting(run, staging.path, observers=observers)
        finally:
            staging.publish()
    experiment = build_experiment(config, observers=observers)
    for message in experiment.warnings:
        warnings.warn(message, RunWarning, stacklevel=2)
    if out is None:
        return _execute(experiment, None)
    staging = RunDirectory(out, force=force)
    try:
        return _execute(experiment, staging.path, audit=audit)
    finally:
        staging.publish()


def resume_experiment(out: str | Path, *, progress: bool = False) -> dict[str, Any]:
    """Continue the run in ``out`` (interrupted, or killed before it published) from its last
    checkpoint with its own config.toml; the privacy ledger goes on from the checkpoint's.

    Raises:
        ConfigError: (key ``--resume``) no checkpoint, a config.toml that is not the one the
            checkpoint was written with, or a configuration :func:`check_resumable` refuses.
    """
    import torch

    from fedsec.checkpoint import check_resumable, find_run, read_checkpoint
    from fedsec.config import load_config

    folder, staged = find_run(out)
    checkpoint = read_checkpoint(folder)
    config = load_config(str(folder / "config.toml"), [])
    if config.sha256() != checkpoint.meta["config_sha256"]:
        raise ConfigError("--resume", f"{folder / 'config.toml'} is not the configuration the "
                                      f"checkpoint was written with")
    check_resumable(config)
    torch.set_num_threads(1)
    observers: list[RoundObserver] = []
    if progress:
        observers.append(ProgressBar(target_accuracy=config.train.target_accuracy or None))
    experiment = build_experiment(config, observers=observers)
    directory = RunDirectory.adopt(out, folder) if staged else None
    try:
        return _execute(experiment, folder, audit=True, checkpoint=checkpoint)
    finally:
        if directory is not None:
            directory.publish()


def execute_experiment(experiment: Experiment, out_dir: Path, *, audit: bool = True,
                       checkpoints: bool = True, checkpoint: Any = None) -> dict[str, Any]:
    """Run a built experiment and write its run directory into ``out_dir`` (config, history,
    summary, model, plots; ``audit``: the run's own audit log; ``checkpoints``: checkpoints of a
    resumable configuration; ``checkpoint``: a :class:`fedsec.checkpoint.Checkpoint` to continue
    from, ``out_dir`` being the folder it was read from). Returns the summary. A deployed
    coordinator runs its server loop through this, so its run directory is the simulation's."""
    return _execute(experiment, out_dir, audit=audit, checkpoints=checkpoints, checkpoint=checkpoint)


def _execute(experiment: Experiment, out_dir: Path | None, *, audit: bool = True,
             checkpoint: Any = None, checkpoints: bool = True) -> dict[str, Any]:
    """Run the federation (from ``checkpoint`` if given); with ``out_dir``, write the run's files."""
    import torch

    from fedsec.audit.run import RunAudit, file_sha256
    from fedsec.checkpoint import CheckpointWriter, carry_released_charges, restore, resumable
    from fedsec.fl_core.parameters import get_vector

    config, server = experiment.config, experiment.server
    recorder = None
    if out_dir is not None:
        if checkpoint is None:
            (out_dir / "config.toml").write_text(config.to_toml())
        server.observers.append(_RunDirectoryWriter(out_dir, experiment.history))
        if audit:  # a round is recorded before it is checkpointed: none escapes the log
            recorder = RunAudit(out_dir, model_vector=lambda: get_vector(server.model))
            server.observers.append(recorder)
            if checkpoint is None:
                recorder.start(config.sha256(), seed=config.seed, rounds=config.rounds,
                               aggregation=config.secure.aggregation, dp_mode=config.dp.mode)
        if checkpoints and resumable(config):
            server.observers.append(CheckpointWriter(out_dir, config=config, server=server,
                                                     history=experiment.history,
                                                     privacy=experiment.privacy,
                                                     saved=tuple(experiment.saved)))
    start = time.perf_counter()
    if checkpoint is None:
        result = server.run()
    else:
        server.prepare_data()
        point = restore(checkpoint, server=server, privacy=experiment.privacy,
                        reproducible=config.dp.reproducible, saved=tuple(experiment.saved))
        result = server.run(resume=point)
    wall = time.perf_counter() - start
    if out_dir is not None and result.stop_reason == "interrupted" and checkpoints and resumable(config):
        carry_released_charges(out_dir, experiment.privacy)
    summary = summarize(config, result, wall, experiment.server.setup_upload_bytes,
                        experiment.privacy)
    summary["warnings"] = list(experiment.warnings)
    for extra in experiment.extras:
        summary.update(extra(result, out_dir))
    if out_dir is None:
        return summary
    experiment.history.write_csv(out_dir / "history.csv")
    torch.save(server.model.state_dict(), out_dir / "model.pt")
    summary["model_sha256"] = file_sha256(out_dir / "model.pt")
    if recorder is not None:
        recorder.model_saved(out_dir / "model.pt")
        summary["audit"] = recorder.summary()
        recorder.close()
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    d = config.data
    label = privacy_label(config, experiment.privacy.noise_multiplier if experiment.privacy else None)
    plot_metric(
        result.records, metric="accuracy", path=out_dir / "accuracy.png",
        title=f"{d.dataset}, {d.clients} clients ({d.partition}), {config.model.name}, "
              f"{config.train.algorithm}\n{label}",
        ylabel="test accuracy", target=config.train.target_accuracy or None)
    if experiment.privacy is not None:
        p = config.dp
        plot_metric(
            result.records, metric="epsilon", path=out_dir / "epsilon.png",
            title=f"privacy spent at delta = {p.delta:g} ({experiment.privacy.unit} level, "
                  f"{p.accountant})\n{label}",
            ylabel=f"epsilon (delta = {p.delta:g})", target=p.target_epsilon or None,
            target_label="target epsilon")
    return summary
