"""Privacy random variables (Gopi, Lee and Wutschitz 2021) through Opacus' implementation; the
upper end of its error interval (eps_error 0.01) is reported."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from fedsec.dp.errors import UnsupportedEventError
from fedsec.dp.ledger import Event, GaussianEvent
from opacus.accountants import PRVAccountant


def epsilon(events: Sequence[Event], delta: float) -> float:
    accountant = PRVAccountant()
    for event in events:
        if not isinstance(event, GaussianEvent):
            raise UnsupportedEventError("the PRV accountant covers the subsampled Gaussian only")
        accountant.history.append((event.noise_multiplier, event.sample_rate, event.steps))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # log(0) inside Opacus at q = 1, harmless
        return float(accountant.get_epsilon(delta))
