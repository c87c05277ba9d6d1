"""Privacy accountants behind one interface (after Opacus' ``IAccountant``).

An accountant records mechanism invocations in its :class:`~dp.ledger.PrivacyLedger` and
computes epsilon at a delta from the whole ledger with the analysis it names:

- ``pld``: privacy loss distributions (dp-accounting), tight, the default;
- ``prv``: privacy random variables (Opacus), tight, an independent implementation;
- ``rdp``: Rényi DP (dp-accounting), looser, the cross-check; the only analysis here of the
  Skellam mechanism, which every accountant therefore hands to it.

``state_dict``/``load_state_dict`` carry the ledger, so a checkpointed run resumes its budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from fedsec.dp.analysis import pld, rdp
from fedsec.dp.errors import InvalidPrivacyParameterError
from fedsec.dp.ledger import Event, GaussianEvent, PrivacyLedger, SkellamEvent

ACCOUNTANTS = ("pld", "prv", "rdp")


def _prv_epsilon(events: Sequence[Event], delta: float) -> float:
    """:func:`fedsec.dp.analysis.prv.epsilon`, imported on first use: it loads Opacus, about
    0.7 s of start-up that every process importing fedsec (each deployed site) would pay."""
    from fedsec.dp.analysis import prv

    return prv.epsilon(events, delta)


def check_delta(delta: float) -> None:
    if not (isinstance(delta, int | float) and 0 < delta < 1):
        raise InvalidPrivacyParameterError(f"delta must be in (0, 1), got {delta}")


class Accountant:
    """Tracks the privacy spent by a sequence of mechanisms.

    Args:
        mechanism: one of ``pld``, ``prv``, ``rdp``.
    """

    _ANALYSES: dict[str, Callable[[Sequence[Event], float], float]] = {
        "pld": pld.epsilon, "prv": _prv_epsilon, "rdp": rdp.epsilon}

    def __init__(self, mechanism: str = "pld") -> None:
        if mechanism not in ACCOUNTANTS:
            raise InvalidPrivacyParameterError(
                f"accountant must be one of {', '.join(ACCOUNTANTS)}, got {mechanism!r}")
        self.mechanism = mechanism
        self.ledger = PrivacyLedger()
        self._cache: dict[tuple, float] = {}

    def step(self, *, noise_multiplier: float, sample_rate: float, steps: int = 1) -> None:
        """Record ``steps`` Poisson-subsampled Gaussian mechanisms (DP-SGD steps, or rounds of
        central client-level noise)."""
        self.ledger.record(GaussianEvent(noise_multiplier, sample_rate, steps))

    def step_skellam(self, *, l1: float, l2: float, variance: float, steps: int = 1) -> None:
        """Record ``steps`` releases of a sum carrying Skellam noise of ``variance``."""
        self.ledger.record(SkellamEvent(l1, l2, variance, steps))

    def record(self, event: Event) -> None:
        self.ledger.record(event)

    def get_epsilon(self, delta: float, *, events: Sequence[Event] | None = None) -> float:
        """Epsilon at ``delta`` for the ledger (or for ``events`` instead); 0 before any event."""
        check_delta(delta)
        events = tuple(self.ledger.events if events is None else events)
        if not events:
            return 0.0
        key = (events, delta)
        if key not in self._cache:
            analysis = self._ANALYSES[self.mechanism]
            if any(isinstance(e, SkellamEvent) for e in events):
                analysis = rdp.epsilon
            self._cache[key] = analysis(events, delta)
        return self._cache[key]

    def epsilon_after(self, delta: float, *more: Event) -> float:
        """Epsilon if ``more`` events were recorded now (the ledger is unchanged)."""
        trial = self.ledger.copy()
        for event in more:
            trial.record(event)
        return self.get_epsilon(delta, events=trial.events)

    def state_dict(self) -> dict:
        return {"mechanism": self.mechanism, "ledger": self.ledger.to_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.mechanism = state["mechanism"]
        self.ledger = PrivacyLedger.from_dict(state["ledger"])
        self._cache.clear()


def epsilon(*, noise_multiplier: float, sample_rate: float, steps: int, delta: float,
            mechanism: str = "pld") -> float:
    """Epsilon of ``steps`` Poisson-subsampled Gaussian mechanisms at ``delta``."""
    accountant = Accountant(mechanism)
    accountant.step(noise_multiplier=noise_multiplier, sample_rate=sample_rate, steps=steps)
    return accountant.get_epsilon(delta)


def check_target(target_epsilon: float) -> None:
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise InvalidPrivacyParameterError(f"target epsilon must be > 0, got {target_epsilon}")
