"""Privacy random variables (Gopi, Lee and Wutschitz 2021) through Opacus' implementation; the
upper end of its error interval (eps_error 0.01) is reported.

A ledger of one Gaussian event, what a run with one cost profile keeps, goes through the cached
:mod:`dp.analysis.prv_running` engine (the same computation on a domain shared by a bucket of
step counts, composed from the few Fourier coefficients that matter where the domain is large,
plus its ``MARGIN``); any other ledger, or ``from_scratch``, through Opacus' ``PRVAccountant``."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from fedsec.dp.analysis.prv_running import running_epsilon
from fedsec.dp.errors import UnsupportedEventError
from fedsec.dp.ledger import Event, GaussianEvent
from opacus.accountants import PRVAccountant


def epsilon(events: Sequence[Event], delta: float, *, from_scratch: bool = False) -> float:
    """Epsilon at ``delta`` (module docstring); ``from_scratch`` skips the cached engine."""
    for event in events:
        if not isinstance(event, GaussianEvent):
            raise UnsupportedEventError("the PRV accountant covers the subsampled Gaussian only")
    if len(events) == 1 and not from_scratch:
        event = events[0]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                return running_epsilon(event.noise_multiplier, event.sample_rate, event.steps, delta)
        except RuntimeError:  # Opacus' own checks (the discretised mean, the search) on the
            pass              # bucket's domain: the exact computation below decides
    accountant = PRVAccountant()
    for event in events:
        accountant.history.append((event.noise_multiplier, event.sample_rate, event.steps))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # log(0) inside Opacus at q = 1, harmless
        return float(accountant.get_epsilon(delta))
