"""The privacy ledger: every mechanism invocation a run made, in order, serialisable.

An accountant's state is its ledger; epsilon is always recomputed from the ledger, so a ledger
saved with a checkpoint (``to_dict``) and loaded back gives the same epsilon. Consecutive
identical events are merged into one with a count.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

from fedsec.dp.errors import InvalidPrivacyParameterError


@dataclass(frozen=True)
class GaussianEvent:
    """``steps`` Poisson-subsampled Gaussian mechanisms: sampling rate q in (0, 1], noise
    multiplier sigma > 0 (noise std / L2 sensitivity)."""

    noise_multiplier: float
    sample_rate: float
    steps: int

    kind = "gaussian"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0):
            raise InvalidPrivacyParameterError(
                f"noise multiplier must be a finite number > 0, got {self.noise_multiplier}")
        if not 0 < self.sample_rate <= 1:
            raise InvalidPrivacyParameterError(f"sample rate must be in (0, 1], got {self.sample_rate}")
        if self.steps < 1:
            raise InvalidPrivacyParameterError(f"steps must be >= 1, got {self.steps}")


@dataclass(frozen=True)
class SkellamEvent:
    """``steps`` releases of an integer vector sum plus symmetric Skellam noise of ``variance``
    per coordinate (Poisson(variance/2) - Poisson(variance/2)), in the sum's integer units, for
    L1 and L2 sensitivities ``l1`` and ``l2`` in the same units (no subsampling)."""

    l1: float
    l2: float
    variance: float
    steps: int

    kind = "skellam"

    def __post_init__(self) -> None:
        if not (self.l2 > 0 and self.l1 >= self.l2 and self.variance > 0):
            raise InvalidPrivacyParameterError(
                f"Skellam event needs l1 >= l2 > 0 and variance > 0, got {self.l1}, {self.l2}, "
                f"{self.variance}")
        if self.steps < 1:
            raise InvalidPrivacyParameterError(f"steps must be >= 1, got {self.steps}")


Event = GaussianEvent | SkellamEvent
_KINDS = {"gaussian": GaussianEvent, "skellam": SkellamEvent}


class PrivacyLedger:
    """An append-only list of events."""

    def __init__(self, events: list[Event] | None = None) -> None:
        self.events: list[Event] = []
        for event in events or []:
            self.record(event)

    def record(self, event: Event) -> None:
        last = self.events[-1] if self.events else None
        if last is not None and type(last) is type(event) and _same(last, event):
            self.events[-1] = with_steps(last, last.steps + event.steps)
        else:
            self.events.append(event)

    @property
    def kinds(self) -> set[str]:
        return {e.kind for e in self.events}

    def to_dict(self) -> dict:
        return {"events": [{"kind": e.kind, **asdict(e)} for e in self.events]}

    @classmethod
    def from_dict(cls, state: dict) -> PrivacyLedger:
        events = []
        for item in state.get("events", []):
            fields = dict(item)
            kind = _KINDS.get(fields.pop("kind", None))
            if kind is None:
                raise InvalidPrivacyParameterError(f"unknown ledger event {item!r}")
            events.append(kind(**fields))
        return cls(events)

    def copy(self) -> PrivacyLedger:
        return PrivacyLedger(list(self.events))


def _same(a: Event, b: Event) -> bool:
    """Whether two events of one type differ at most in their step count (field by field: the
    budget asks this every round, and ``asdict`` deep-copies)."""
    return all(getattr(a, f.name) == getattr(b, f.name) for f in fields(a) if f.name != "steps")


def with_steps(event: Event, steps: int) -> Event:
    """``event`` with its step count replaced (validated again by the event's constructor)."""
    return replace(event, steps=steps)
