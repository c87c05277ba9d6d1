"""From the ``dp`` keys of a configuration to the privacy pieces of a run: the DP-SGD trainer or
the client-level wrapper, the calibrated noise, and the budget observer."""

from __future__ import annotations

from dataclasses import dataclass, field

import fl_core
from dp import DPSGD, Accountant, SecureRandom, noise_multiplier_for, smallest_noise
from dp.ledger import Event, GaussianEvent, with_steps
from fedsec.config import ExperimentConfig
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


def _random(config: ExperimentConfig, purpose: str) -> SecureRandom:
    if config.dp.reproducible:
        return SecureRandom.from_seed(config.seed, purpose)
    return SecureRandom()


def build_privacy(config: ExperimentConfig, data: fl_core.FederatedDataset,
                  protocol: fl_core.AggregationProtocol, n_parameters: int) -> PrivacySetup | None:
    """The privacy layer the configuration asks for, with the noise calibrated if needed."""
    setup = _build(config, data, protocol, n_parameters)
    if setup is not None and data.standardize:
        setup.not_covered.append("feature standardisation statistics (one release of the "
                                 "federation's per-feature mean and spread, without noise; "
                                 "data.standardize = false avoids it)")
    return setup


def _build(config: ExperimentConfig, data: fl_core.FederatedDataset,
           protocol: fl_core.AggregationProtocol, n_parameters: int) -> PrivacySetup | None:
    p, t = config.dp, config.train
    if p.mode == "none":
        return None
    if p.mode == "dpsgd":
        sizes = sorted({len(c) for c in data.clients})
        probe = DPSGD(noise_multiplier=0.0, max_grad_norm=p.max_grad_norm,
                      batch_size=t.batch_size or FULL_BATCH, epochs=t.local_epochs, lr=t.lr)
        rates = [probe.sample_rate(n) for n in sizes]
        steps = [probe.steps(n) for n in sizes]
        sigma = p.noise_multiplier or noise_multiplier_for(
            target_epsilon=p.target_epsilon, delta=p.delta, sample_rates=rates,
            steps=[config.rounds * s for s in steps], mechanism=p.accountant)
        trainer = DPSGDTrainer(DPSGD(noise_multiplier=sigma, max_grad_norm=p.max_grad_norm,
                                     batch_size=t.batch_size or FULL_BATCH, epochs=t.local_epochs,
                                     lr=t.lr, random=_random(config, "dpsgd")))
        profiles = [[GaussianEvent(sigma, q, s)] for q, s in zip(rates, steps, strict=True)]
        return PrivacySetup("example", sigma, _budget(config, profiles, sigma), trainer=trainer)
    sigma = p.noise_multiplier
    probe = ClientLevelDP(protocol, clip_norm=p.max_grad_norm, noise_multiplier=1.0,
                          random=SecureRandom(b"\x00" * 32))
    if not sigma:
        def epsilon_of(z: float) -> float:
            probe.noise_multiplier = z
            return Accountant(p.accountant).get_epsilon(
                p.delta, events=[with_steps(e, e.steps * config.rounds)
                        for e in probe.round_events(n_parameters)])

        sigma = (noise_multiplier_for(target_epsilon=p.target_epsilon, delta=p.delta,
                                      sample_rates=[1.0], steps=[config.rounds],
                                      mechanism=p.accountant)
                 if probe.central else smallest_noise(epsilon_of, p.target_epsilon))
    wrapped = ClientLevelDP(protocol, clip_norm=p.max_grad_norm, noise_multiplier=sigma,
                            random=_random(config, "client"))
    return PrivacySetup("client", sigma, _budget(config, [wrapped.round_events(n_parameters)], sigma),
                        protocol=wrapped)


def _budget(config: ExperimentConfig, profiles: list[list[Event]], sigma: float) -> PrivacyBudget:
    unit = "example" if config.dp.mode == "dpsgd" else "client"
    return PrivacyBudget(profiles=profiles, delta=config.dp.delta,
                         target_epsilon=config.dp.target_epsilon, accountant=config.dp.accountant,
                         unit=unit, noise_multiplier=sigma)
