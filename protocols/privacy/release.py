"""Charge a round's privacy cost the moment its aggregate is released, not when the round ends.

``Server.run`` treats Ctrl-C (KeyboardInterrupt) as "drop the round in flight", which happens
before the budget's ``after_round``. But once ``aggregate`` has run, the server holds the round's
release (the noisy sum, or under plain aggregation every noisy update in the clear), so a round
interrupted after that point must still be charged. :class:`ChargeOnRelease` wraps the protocol and
charges the budget (:meth:`PrivacyBudget.charge`, idempotent per round) when ``aggregate`` for an
update returns, and also when a KeyboardInterrupt leaves ``aggregate`` (it cannot tell whether the
release already happened, so it charges: an over-charge, never an under-charge). A round aborted
with an error is left to the budget's ``after_round`` rule (``charge_aborted``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fedsec.fl_core.aggregation import AggregateResult, AggregationProtocol, ClientUpdate
from fedsec.protocols.privacy.budget import PrivacyBudget


class ChargeOnRelease:
    """``inner`` with each update round charged to ``budget`` as soon as it is released.

    Every other attribute (``client_metrics``, ``min_contributions``, ``random``, ...) is the inner
    protocol's.
    """

    def __init__(self, inner: AggregationProtocol, *, budget: PrivacyBudget) -> None:
        self.inner, self.budget = inner, budget

    def aggregate(self, round_index: int, updates: Sequence[ClientUpdate], *,
                  purpose: str = "update") -> AggregateResult:
        if purpose != "update":
            return self.inner.aggregate(round_index, updates, purpose=purpose)
        try:
            result = self.inner.aggregate(round_index, updates, purpose=purpose)
        except KeyboardInterrupt:
            self.budget.charge(round_index)
            raise
        self.budget.charge(round_index)
        return result

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "budget"):
            raise AttributeError(name)
        return getattr(self.inner, name)
