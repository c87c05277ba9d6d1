"""From the ``dp`` keys of a configuration to the privacy pieces of a run: the DP-SGD trainer or
the client-level wrapper, the calibrated noise, and the budget observer."""

from __future__ import annotations

from dataclasses import dataclass, field

import fl_core
from dp import DPSGD, Accountant, SecureRandom, noise_multiplier_for, smallest_noise
from dp.ledger import with_steps
from fedsec.config import ExperimentConfig
from fl_core.local import PerExampleLoss
from protocols.privacy import ClientLevelDP, DPSGDTrainer, PrivacyBudget
from protocols.privacy.trainer import FULL_BATCH


@dataclass
class PrivacySetup:
    """What a private run adds: a trainer (DP-SGD) or a protocol (client level), and its budget."""

    unit: str
    noise_multiplier: float
    budget: PrivacyBudget
    trainer: DPSGDTrainer | None = None
    protocol: ClientLevelDP | None = None
    not_covered: list[str] = field(default_factory=list)
    """Releases epsilon does not account for (said in summary.json, never silently)."""


@dataclass(frozen=True)
class PrivacySettings:
    """The privacy-relevant settings of a run, whether they come from a TOML file or the library.

    ``batch_size`` 0 means the full local batch; ``noise_multiplier`` 0 means calibrated from
    ``target_epsilon`` over ``rounds``.
    """

    mode: str
    noise_multiplier: float
    max_grad_norm: float
    target_epsilon: float
    delta: float
    accountant: str
    reproducible: bool
    seed: int
    rounds: int
    batch_size: int
    local_epochs: int
    lr: float

    @classmethod
    def from_config(cls, config: ExperimentConfig) -> PrivacySettings:
        p, t = config.dp, config.train
        return cls(mode=p.mode, noise_multiplier=p.noise_multiplier, max_grad_norm=p.max_grad_norm,
                   target_epsilon=p.target_epsilon, delta=p.delta, accountant=p.accountant,
                   reproducible=p.reproducible, seed=config.seed, rounds=config.rounds,
                   batch_size=t.batch_size, local_epochs=t.local_epochs, lr=t.lr)


def _random(s: PrivacySettings, purpose: str) -> SecureRandom:
    if s.reproducible:
        return SecureRandom.from_seed(s.seed, purpose)
    return SecureRandom()


def build_privacy(config: ExperimentConfig, data: fl_core.FederatedDataset,
                  protocol: fl_core.AggregationProtocol, n_parameters: int) -> PrivacySetup | None:
    """The privacy layer the configuration asks for, with the noise calibrated if needed."""
    return build_privacy_layer(PrivacySettings.from_config(config), data, protocol, n_parameters)


def build_privacy_layer(settings: PrivacySettings, data: fl_core.FederatedDataset,
                        protocol: fl_core.AggregationProtocol, n_parameters: int, *,
                        loss: PerExampleLoss | None = None,
                        standardize_off: str = "data.standardize = false") -> PrivacySetup | None:
    """The privacy layer ``settings`` ask for (None for mode ``none``); ``loss`` is DP-SGD's
    per-example loss (default: the classification loss); ``standardize_off`` is how the user turns
    feature standardisation off, for the note that its statistics carry no noise."""
    setup = _build(settings, data, protocol, n_parameters, loss)
    if setup is not None and data.standardize:
        setup.not_covered.append("feature standardisation statistics (one release of the "
                                 "federation's per-feature mean and spread, without noise; "
                                 f"{standardize_off} avoids it)")
    return setup


def _build(s: PrivacySettings, data: fl_core.FederatedDataset,
           protocol: fl_core.AggregationProtocol, n_parameters: int,
           loss: PerExampleLoss | None) -> PrivacySetup | None:
    if s.mode == "none":
        return None
    if s.mode == "dpsgd":
        sizes = sorted({len(c) for c in data.clients})
        probe = DPSGDTrainer(DPSGD(noise_multiplier=0.0, max_grad_norm=s.max_grad_norm,
                                   batch_size=s.batch_size or FULL_BATCH, epochs=s.local_epochs,
                                   lr=s.lr))
        rates = [probe.profile(n)[0] for n in sizes]
        steps = [probe.profile(n)[1] for n in sizes]
        sigma = s.noise_multiplier or noise_multiplier_for(
            target_epsilon=s.target_epsilon, delta=s.delta, sample_rates=rates,
            steps=[s.rounds * t for t in steps], mechanism=s.accountant)
        trainer = DPSGDTrainer(DPSGD(noise_multiplier=sigma, max_grad_norm=s.max_grad_norm,
                                     batch_size=s.batch_size or FULL_BATCH, epochs=s.local_epochs,
                                     lr=s.lr, random=_random(s, "dpsgd")), loss=loss)
        budget = PrivacyBudget.for_trainer(trainer, sizes, delta=s.delta,
                                           target_epsilon=s.target_epsilon, accountant=s.accountant)
        return PrivacySetup("example", sigma, budget, trainer=trainer)
    sigma = s.noise_multiplier
    probe_dp = ClientLevelDP(protocol, clip_norm=s.max_grad_norm, noise_multiplier=1.0,
                             random=SecureRandom(b"\x00" * 32))
    if not sigma:
        def epsilon_of(z: float) -> float:
            probe_dp.noise_multiplier = z
            return Accountant(s.accountant).get_epsilon(
                s.delta, events=[with_steps(e, e.steps * s.rounds)
                        for e in probe_dp.round_events(n_parameters)])

        sigma = (noise_multiplier_for(target_epsilon=s.target_epsilon, delta=s.delta,
                                      sample_rates=[1.0], steps=[s.rounds],
                                      mechanism=s.accountant)
                 if probe_dp.central else smallest_noise(epsilon_of, s.target_epsilon))
    wrapped = ClientLevelDP(protocol, clip_norm=s.max_grad_norm, noise_multiplier=sigma,
                            random=_random(s, "client"))
    budget = PrivacyBudget(profiles=[wrapped.round_events(n_parameters)], delta=s.delta,
                           target_epsilon=s.target_epsilon, accountant=s.accountant,
                           unit="client", noise_multiplier=sigma)
    return PrivacySetup("client", sigma, budget, protocol=wrapped)
