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
  (covered by the noise like any update); under DP-SGD a function of the noisy steps (per-example
  clipping gives a non-finite gradient factor 0), still named in ``not_covered`` for the errors
  training may raise;
- when it answers: named in ``not_covered``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from fedsec import fl_core
from fedsec.config import ExperimentConfig
from fedsec.dp import DPSGD, Accountant, SecureRandom, noise_multiplier_for, smallest_noise
from fedsec.dp.ledger import with_steps
from fedsec.dp.noise import MIN_NOISE_MULTIPLIER
from fedsec.fl_core.federated_eval import BINS
from fedsec.fl_core.local import PerExampleLoss
from fedsec.protocols.privacy import ClientLevelDP, DPSGDTrainer, PrivacyBudget
from fedsec.protocols.privacy.release import ChargeOnRelease
from fedsec.protocols.privacy.trainer import FULL_BATCH


@dataclass
class PrivacySetup:
    """What a private run adds: a trainer (DP-SGD) or a protocol (client level), and its budget."""

    unit: str
    noise_multiplier: float
    budget: PrivacyBudget
    trainer: DPSGDTrainer | None = None
    protocol: ClientLevelDP | ChargeOnRelease | None = None
    weighting: str = "samples"
    """The FedAvg weighting: ``samples`` (n_k) or ``equal`` (1)."""
    unit_definition: str = ""
    """The neighbouring relation epsilon is stated for, in words."""
    not_covered: list[str] = field(default_factory=list)

    @property
    def randoms(self) -> list[SecureRandom]:
        """The noise sources of this run (DP-SGD's, the client-level layer's), for checkpoints."""
        found = []
        if self.trainer is not None:
            found.append(self.trainer.optimizer.random)
        inner = self.protocol.inner if isinstance(self.protocol, ChargeOnRelease) else self.protocol
        if isinstance(inner, ClientLevelDP):
            found.append(inner.random)
        return found
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
            "dropped); under DP-SGD each step is the clipped sum plus noise, and an example whose "
            "gradient is not finite gets clip factor 0, so a non-finite model is a function of the "
            "noisy steps (post-processing) except where training raises an error (a model the "
            "per-example probe refuses), which this simulation reports as a failure; a deployed "
            "site sends a zero update answered like any other instead (under client-level DP such "
            "a client sends a zero update too, which the noise covers)")
CLIENT_TEST = ("evaluation metrics computed on held-out records of the clients are released "
               "without noise (the loss, accuracy and per-client metrics of every round)")
CLIENT_DATA_TEST = ("evaluation metrics computed on records of the clients are released without noise "
                    "(test= is, or shares memory with, a client's training data: the loss, accuracy "
                    "and per-client metrics of every round)")
SITE_EVALUATION = ("federated evaluation sums of the sites' held-out records, every round, without "
                   "noise: record count, correct predictions, summed loss and, for two classes, TP, FP, "
                   f"TN, FN and the histograms of the positive-class score ({BINS} bins) per true class; ")
SITE_EVALUATION_SECURE = ("summed through the secure layer over at least its threshold of sites, so the "
                          "coordinator sees the federation's sums, not one site's")
SITE_EVALUATION_PLAIN = ("with secure.aggregation = 'none' each site sends its own sums in the clear, "
                         "so the coordinator sees every site's figures")
REPRODUCIBLE = ("the DP noise itself: dp.reproducible = true derives it from the seed, which "
                "config.toml publishes, so whoever knows the seed can subtract it and epsilon "
                "holds only against those who do not")
WEIGHT_BOUND = ("the secure layer's public weight bound max_weight, set to the largest client "
                "size n_k (it sizes the words of the sum)")


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
    weights: str = "samples"
    """FedAvg weighting under DP-SGD: ``samples`` (n_k, sizes public) or ``equal`` (1, with a
    fixed ``sample_rate``, so sizes enter only through the mechanism)."""
    sample_rate: float = 0.0
    """A fixed Poisson rate q for every client (0: q = B / n_k)."""

    @classmethod
    def from_config(cls, config: ExperimentConfig) -> PrivacySettings:
        p, t = config.dp, config.train
        return cls(mode=p.mode, noise_multiplier=p.noise_multiplier, max_grad_norm=p.max_grad_norm,
                   target_epsilon=p.target_epsilon, delta=p.delta, accountant=p.accountant,
                   reproducible=p.reproducible, seed=config.seed, rounds=config.rounds,
                   batch_size=t.batch_size, local_epochs=t.local_epochs, lr=t.lr,
                   weights=p.weights, sample_rate=p.sample_rate)


def _random(s: PrivacySettings, purpose: str) -> SecureRandom:
    if s.reproducible:
        return SecureRandom.from_seed(s.seed, purpose)
    return SecureRandom()


def build_privacy(config: ExperimentConfig, data: fl_core.FederatedDataset,
                  protocol: fl_core.AggregationProtocol, n_parameters: int) -> PrivacySetup | None:
    """The privacy layer the configuration asks for, with the noise calibrated if needed.

    The global test split of ``breast_cancer`` and ``digits`` is held out before the records are
    partitioned: no client holds it. ``synthetic`` pools a share of every client's own draws into
    it, so there the test metrics are computed on held-out records of the clients (named); ``csv``
    evaluates at the sites and sums their figures through the secure layer (named)."""
    secure = config.secure.aggregation != "none"
    setup = build_privacy_layer(PrivacySettings.from_config(config), data, protocol, n_parameters,
                                secure=secure, client_test=config.data.dataset == "synthetic")
    if setup is not None and config.data.dataset == "csv":
        setup.not_covered.insert(0, SITE_EVALUATION + (SITE_EVALUATION_SECURE if secure
                                                       else SITE_EVALUATION_PLAIN))
    return setup


def build_privacy_layer(settings: PrivacySettings, data: fl_core.FederatedDataset,
                        protocol: fl_core.AggregationProtocol, n_parameters: int, *,
                        loss: PerExampleLoss | None = None, secure: bool = True,
                        standardize_off: str = "data.standardize = false",
                        client_test: bool = False) -> PrivacySetup | None:
    """The privacy layer ``settings`` ask for (None for mode ``none``); ``loss`` is DP-SGD's
    per-example loss (default: the classification loss); ``secure`` says whether a secure layer
    (masking, Paillier) carries the updates (without one, an aborted round is charged: the server
    saw its updates); ``standardize_off`` is how the user turns feature standardisation off, for
    the note that its statistics carry no noise; ``client_test`` says whether the test records
    are held-out records of the clients (named in ``not_covered``)."""
    setup = _build(settings, data, protocol, n_parameters, loss)
    if setup is None:
        return None
    setup.withheld["train_loss"] = WITHHELD_LOSS
    setup.budget.charge_aborted = not secure
    setup.protocol = ChargeOnRelease(setup.protocol or protocol, budget=setup.budget)
    if settings.reproducible:
        setup.not_covered.append(REPRODUCIBLE)
        _warn_reproducible()
    if client_test:
        setup.not_covered.append(CLIENT_TEST)
    if data.standardize:
        setup.not_covered.append("feature standardisation statistics (one release of the "
                                 "federation's per-feature mean and spread, and of the clients' "
                                 f"sizes n_k as their weights, without noise; {standardize_off} "
                                 "avoids it)")
    if setup.unit == "example" and setup.weighting == "samples":
        setup.not_covered.append(SIZES)
    if secure:
        setup.not_covered.append(WEIGHT_BOUND)
    setup.not_covered.append(TIMING)
    if not setup.zero_on_failure:
        setup.not_covered.append(FAILURES)
    return setup


_warned: list[bool] = []


def _warn_reproducible() -> None:
    """Say once per process, on stderr, that reproducible noise is not secret."""
    if not _warned:
        _warned.append(True)
        print(f"fedsec: warning: {REPRODUCIBLE}", file=sys.stderr)


def _build(s: PrivacySettings, data: fl_core.FederatedDataset,
           protocol: fl_core.AggregationProtocol, n_parameters: int,
           loss: PerExampleLoss | None) -> PrivacySetup | None:
    if s.mode == "none":
        return None
    if s.mode == "dpsgd":
        fixed = s.sample_rate or None
        sizes = sorted({len(c) for c in data.clients})
        probe = DPSGDTrainer(DPSGD(noise_multiplier=0.0, max_grad_norm=s.max_grad_norm,
                                   batch_size=s.batch_size or FULL_BATCH, epochs=s.local_epochs,
                                   lr=s.lr, sample_rate=fixed))
        rates = [probe.profile(n)[0] for n in sizes]
        steps = [probe.profile(n)[1] for n in sizes]
        sigma = s.noise_multiplier or noise_multiplier_for(
            target_epsilon=s.target_epsilon, delta=s.delta, sample_rates=rates,
            steps=[s.rounds * t for t in steps], mechanism=s.accountant)
        trainer = DPSGDTrainer(DPSGD(noise_multiplier=sigma, max_grad_norm=s.max_grad_norm,
                                     batch_size=s.batch_size or FULL_BATCH, epochs=s.local_epochs,
                                     lr=s.lr, random=_random(s, "dpsgd"), sample_rate=fixed),
                               loss=loss)
        budget = PrivacyBudget.for_trainer(trainer, sizes, delta=s.delta,
                                           target_epsilon=s.target_epsilon, accountant=s.accountant)
        equal = s.weights == "equal"
        return PrivacySetup("example", sigma, budget, trainer=trainer, weighting=s.weights,
                            unit_definition=UNIT_EXAMPLE_SIZES_COVERED if equal
                            else UNIT_EXAMPLE_SIZES_PUBLIC)
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
                 if probe_dp.central else smallest_noise(epsilon_of, s.target_epsilon,
                                                         low=MIN_NOISE_MULTIPLIER))
    wrapped = ClientLevelDP(protocol, clip_norm=s.max_grad_norm, noise_multiplier=sigma,
                            random=_random(s, "client"))
    budget = PrivacyBudget(profiles=[wrapped.round_events(n_parameters)], delta=s.delta,
                           target_epsilon=s.target_epsilon, accountant=s.accountant,
                           unit="client", noise_multiplier=sigma)
    return PrivacySetup("client", sigma, budget, protocol=wrapped, weighting="equal",
                        unit_definition=UNIT_CLIENT, zero_on_failure=True)
