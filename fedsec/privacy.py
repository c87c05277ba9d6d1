"""From the ``dp`` keys of a configuration to the privacy pieces of a run: the DP-SGD trainer or
the client-level wrapper, the calibrated noise, and the budget observer; and, said in
``summary.json``, what one epsilon protects (``unit_definition``), what clients withhold
(``withheld``) and what the run releases that epsilon does not cover (``not_covered``).

Every value a client sends, per mode (docs/privacy.md has the full table):

- its update: the mechanism (DP-SGD's noisy steps, or the client-level noisy sum), in the ledger;
- its training loss: withheld in every private run (no mechanism covers it);
- its weight: n_k under ``dp.weights = "samples"`` with DP-SGD (public by the unit's definition:
  sizes are public), 1 under ``"equal"`` and under client-level DP;
- its clipped-coordinate count (masking, Paillier): summed inside the secure layer; a function
  of the noisy update under DP-SGD, always 0 under client-level DP (S <= c);
- whether its local model was finite: under client-level DP a failed client sends a zero update
  (covered by the noise like any update); under DP-SGD named in ``not_covered``;
- when it answers: named in ``not_covered``.
"""

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
    weighting: str = "samples"
    """The FedAvg weighting: ``samples`` (n_k) or ``equal`` (1)."""
    unit_definition: str = ""
    """The neighbouring relation epsilon is stated for, in words."""
    not_covered: list[str] = field(default_factory=list)
    """Releases epsilon does not account for (said in summary.json, never silently)."""
    withheld: dict[str, str] = field(default_factory=dict)
    """What clients do not report in this run, and why."""
    zero_on_failure: bool = False
    """Whether a client whose local model is not finite sends a zero update instead of leaving
    the round (client level: the zero update is clipped and noised like any other)."""


UNIT_EXAMPLE_SIZES_PUBLIC = (
    "example level, sizes public: neighbouring runs differ in one record of one client added or "
    "removed, every client's number of records n_k being public (Opacus' convention); the "
    "guarantee is for the records given the sizes")
UNIT_EXAMPLE_SIZES_COVERED = (
    "example level, sizes covered: neighbouring runs differ in one record of one client added or "
    "removed; weights (1), the sampling rate q and the steps per round are constants, so a "
    "client's size enters what it sends only through the accounted mechanism")
UNIT_CLIENT = (
    "client level: neighbouring runs differ in one client's whole update being replaced by zero; "
    "which clients take part, and how many, is public")
WITHHELD_LOSS = ("clients report no training loss: it depends on their records through no "
                 "mechanism in the ledger (history.csv leaves train_loss blank)")
SIZES = ("client data-set sizes n_k (the unit takes them as public): the FedAvg weight n_k (in the "
         "clear with plain aggregation, summed as the total weight under masking or Paillier), the "
         "ledger's sampling rates q = B / n_k and the steps per round, E round(n_k / B); "
         "dp.weights = 'equal' with dp.sample_rate covers them")
TIMING = ("timing: how long a client takes and when its messages arrive (history's seconds); "
          "local work grows with the number of records processed")
FAILURES = ("failures: a client whose local model is not finite leaves the round (failed_clients, "
            "dropped), without noise; under DP-SGD every step is bounded (clipped gradients plus "
            "finite noise), so only non-finite data or overflow can cause it (under client-level "
            "DP such a client sends a zero update instead, which the noise covers)")
WEIGHT_BOUND = ("the secure layer's public weight bound max_weight, set to the largest client "
                "size n_k (it sizes the words of the sum)")


def _random(config: ExperimentConfig, purpose: str) -> SecureRandom:
    if config.dp.reproducible:
        return SecureRandom.from_seed(config.seed, purpose)
    return SecureRandom()


def build_privacy(config: ExperimentConfig, data: fl_core.FederatedDataset,
                  protocol: fl_core.AggregationProtocol, n_parameters: int) -> PrivacySetup | None:
    """The privacy layer the configuration asks for, with the noise calibrated if needed."""
    setup = _build(config, data, protocol, n_parameters)
    if setup is None:
        return None
    setup.withheld["train_loss"] = WITHHELD_LOSS
    if data.standardize:
        setup.not_covered.append("feature standardisation statistics (one release of the "
                                 "federation's per-feature mean and spread, without noise; "
                                 "data.standardize = false avoids it)")
    if setup.unit == "example" and setup.weighting == "samples":
        setup.not_covered.append(SIZES)
    if config.secure.aggregation != "none":
        setup.not_covered.append(WEIGHT_BOUND)
    setup.not_covered.append(TIMING)
    if not setup.zero_on_failure:
        setup.not_covered.append(FAILURES)
    return setup


def _build(config: ExperimentConfig, data: fl_core.FederatedDataset,
           protocol: fl_core.AggregationProtocol, n_parameters: int) -> PrivacySetup | None:
    p, t = config.dp, config.train
    if p.mode == "none":
        return None
    if p.mode == "dpsgd":
        fixed = p.sample_rate or None
        sizes = sorted({len(c) for c in data.clients})
        probe = DPSGD(noise_multiplier=0.0, max_grad_norm=p.max_grad_norm,
                      batch_size=t.batch_size or FULL_BATCH, epochs=t.local_epochs, lr=t.lr,
                      sample_rate=fixed)
        rates = [probe.sample_rate(n) for n in sizes]
        steps = [probe.steps(n) for n in sizes]
        sigma = p.noise_multiplier or noise_multiplier_for(
            target_epsilon=p.target_epsilon, delta=p.delta, sample_rates=rates,
            steps=[config.rounds * s for s in steps], mechanism=p.accountant)
        trainer = DPSGDTrainer(DPSGD(noise_multiplier=sigma, max_grad_norm=p.max_grad_norm,
                                     batch_size=t.batch_size or FULL_BATCH, epochs=t.local_epochs,
                                     lr=t.lr, random=_random(config, "dpsgd"), sample_rate=fixed))
        profiles = [[GaussianEvent(sigma, q, s)] for q, s in zip(rates, steps, strict=True)]
        equal = p.weights == "equal"
        return PrivacySetup("example", sigma, _budget(config, profiles, sigma), trainer=trainer,
                            weighting=p.weights,
                            unit_definition=UNIT_EXAMPLE_SIZES_COVERED if equal
                            else UNIT_EXAMPLE_SIZES_PUBLIC)
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
                        protocol=wrapped, weighting="equal", unit_definition=UNIT_CLIENT,
                        zero_on_failure=True)


def _budget(config: ExperimentConfig, profiles: list[list[Event]], sigma: float) -> PrivacyBudget:
    unit = "example" if config.dp.mode == "dpsgd" else "client"
    return PrivacyBudget(profiles=profiles, delta=config.dp.delta,
                         target_epsilon=config.dp.target_epsilon, accountant=config.dp.accountant,
                         unit=unit, noise_multiplier=sigma)
