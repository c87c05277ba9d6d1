"""The privacy budget of a run: an accountant per kind of party, checked before every round.

Each distinct cost profile (the events one round adds for a party) gets its own accountant;
the reported epsilon is the largest over profiles, i.e. the guarantee of the worst-off party.
Every party is charged for every released round, whether or not it was sampled or stayed online
(an upper bound; exact when every client takes part in every round). A round that aborted
under a secure layer (masking, Paillier) released nothing and costs nothing; without one
(``charge_aborted``, set by ``build_privacy_layer(secure=False)``) the server saw every update of
the aborted round in the clear, so the round is charged like a released one.

Before round r the budget asks whether finishing r keeps epsilon <= target; if not, it stops
the run there, so the last model is the last one within budget. After each released round it
adds to the round's metrics: ``privacy_unit``, ``epsilon`` (the configured accountant),
``epsilon_rdp`` (the RDP cross-check), ``delta``, ``noise_multiplier``, ``sample_rate`` and
``steps`` (of the worst-off party), ``delta_truncation`` (the extra delta of the truncated
Gaussian sampler over the charged steps, :func:`dp.noise.truncation_delta`: the guarantee is
(epsilon, delta + delta_truncation)) and ``budget_remaining``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from fedsec.dp import Accountant
from fedsec.dp.errors import DPError
from fedsec.dp.ledger import Event, GaussianEvent
from fedsec.dp.noise import truncation_delta
from fedsec.fl_core.history import RoundObserver, RoundRecord
from fedsec.protocols.privacy.trainer import DPSGDTrainer

UNITS = ("example", "client")
"""What one epsilon protects, i.e. how neighbouring runs differ:

- ``example``: one record of one client added or removed. The accounting takes each client's
  size n_k as public (its sampling rate B / n_k and its steps per round are in its profile)
  unless every client runs with one fixed sampling rate, a constant number of steps and weight 1,
  when sizes enter nothing but the mechanism (docs/privacy.md, section 1).
- ``client``: one client's whole update replaced by zero; who takes part is public.
"""


class AccountingMismatch(DPError):
    """The trainer spent something the budget was not built for (its epsilon would be wrong)."""


class PrivacyBudget(RoundObserver):
    """Tracks epsilon per round and stops the run before it exceeds ``target_epsilon``.

    Args:
        profiles: for each kind of party, the events one released round adds to its ledger.
        delta: the delta epsilon is reported at, in (0, 1).
        target_epsilon: the budget (0 = report only, never stop).
        accountant: ``pld``, ``prv`` or ``rdp``.
        unit: what one epsilon protects: ``example`` (one record of one client added or removed)
            or ``client`` (one client's update replaced by zero); see ``UNITS``.
        noise_multiplier: the noise multiplier reported with every round.
        charge_aborted: charge a round that aborted (True when the protocol shows the server the
            inputs: plain aggregation), or not (a secure layer releases nothing when it aborts).
    """

    def __init__(self, *, profiles: Sequence[Sequence[Event]], delta: float, target_epsilon: float,
                 accountant: str, unit: str, noise_multiplier: float,
                 charge_aborted: bool = False) -> None:
        if unit not in UNITS:
            raise ValueError(f"unit must be one of {UNITS}, got {unit!r}")
        self.profiles = [tuple(p) for p in dict.fromkeys(tuple(p) for p in profiles)]
        self.accountants = [Accountant(accountant) for _ in self.profiles]
        self.cross_check = Accountant("rdp")  # reads the same ledgers
        self.delta, self.target, self.unit = delta, target_epsilon, unit
        self.noise_multiplier = noise_multiplier
        self.charge_aborted = bool(charge_aborted)
        self.spent = 0.0
        self.charged: set[int] = set()
        """Rounds whose events are in the ledgers (a round is charged at most once)."""
        self.stopped: str | None = None
        self.trainer: DPSGDTrainer | None = None

    @classmethod
    def for_trainer(cls, trainer: DPSGDTrainer, client_sizes: Iterable[int], *, delta: float,
                    target_epsilon: float, accountant: str) -> PrivacyBudget:
        """The example-level budget of ``trainer`` on clients of ``client_sizes`` examples.

        The profiles are the trainer's own :meth:`DPSGDTrainer.events`, and after every round the
        budget checks that each client's training spent exactly one of them (its reports), so a
        budget cannot account for one batch size, noise or epoch count while training runs
        with another: a mismatch raises :class:`AccountingMismatch`.
        """
        budget = cls(profiles=[trainer.events(n) for n in sorted(set(client_sizes))], delta=delta,
                     target_epsilon=target_epsilon, accountant=accountant, unit="example",
                     noise_multiplier=trainer.optimizer.noise_multiplier)
        budget.trainer = trainer
        trainer.take_reports()
        return budget

    def _check_reports(self) -> None:
        if self.trainer is None:
            return
        known = {(e.noise_multiplier, e.sample_rate, e.steps) for p in self.profiles for e in p
                 if isinstance(e, GaussianEvent)}
        for report in self.trainer.take_reports():
            if report not in known:
                sigma, q, steps = report
                raise AccountingMismatch(
                    f"a client trained with noise multiplier {sigma}, sampling rate {q} and "
                    f"{steps} steps, which this budget does not account for")

    def _worst(self, extra: bool = False) -> tuple[float, int]:
        values = [a.epsilon_after(self.delta, *p) if extra else a.get_epsilon(self.delta)
                  for a, p in zip(self.accountants, self.profiles, strict=True)]
        index = max(range(len(values)), key=values.__getitem__)
        return values[index], index

    def epsilon_after_next_round(self) -> float:
        return self._worst(extra=True)[0]

    def before_round(self, round_index: int) -> str | None:
        if self.target <= 0:
            return None
        after = self.epsilon_after_next_round()
        if after > self.target:
            self.stopped = (f"privacy budget: round {round_index} would bring epsilon to "
                            f"{after:.4f} > target {self.target:g} (delta {self.delta:g}); "
                            f"stopped at epsilon {self.spent:.4f}")
            return "privacy_budget"
        return None

    def charge(self, round_index: int) -> None:
        """Record round ``round_index``'s events in every ledger, once (a second call for the same
        round does nothing), and update ``spent``; called when the round's aggregate is released
        (:class:`~fedsec.protocols.privacy.release.ChargeOnRelease`) and from ``after_round``."""
        if round_index in self.charged:
            return
        self.charged.add(round_index)
        for a, profile in zip(self.accountants, self.profiles, strict=True):
            for event in profile:
                a.record(event)
        self.spent = self._worst()[0]

    def after_round(self, record: RoundRecord) -> None:
        self._check_reports()
        if record.status == "ok" or self.charge_aborted:
            self.charge(record.round)
        self.spent, worst = self._worst()
        rdp = max(self.cross_check.get_epsilon(self.delta, events=a.ledger.events)
                  for a in self.accountants)
        events = self.accountants[worst].ledger.events
        record.metrics.update({
            "privacy_unit": self.unit,
            "epsilon": self.spent,
            "epsilon_rdp": rdp,
            "delta": self.delta,
            "noise_multiplier": self.noise_multiplier,
            "sample_rate": max((getattr(e, "sample_rate", 1.0) for e in events), default=0.0),
            "steps": float(sum(e.steps for e in events)),
            "delta_truncation": truncation_delta(
                self.noise_multiplier, sum(e.steps for e in events if isinstance(e, GaussianEvent))),
        })
        if self.target > 0:
            record.metrics["budget_remaining"] = max(self.target - self.spent, 0.0)

    def state_dict(self) -> dict:
        return {"accountants": [a.state_dict() for a in self.accountants]}

    def load_state_dict(self, state: dict) -> None:
        for a, s in zip(self.accountants, state["accountants"], strict=True):
            a.load_state_dict(s)
