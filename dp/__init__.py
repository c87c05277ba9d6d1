"""Differential privacy, with no federated-learning knowledge.

- :mod:`dp.noise`: :class:`SecureRandom`, noise and sampling from AES-256-CTR (Gaussian,
  Bernoulli, Poisson, Skellam).
- :mod:`dp.per_sample` and :mod:`dp.dpsgd`: per-example clipping and :class:`DPSGD`.
- :mod:`dp.ledger`, :mod:`dp.accountants` (PLD, PRV, RDP behind one interface) and
  :mod:`dp.analysis` (the mathematics), :mod:`dp.calibration` (target epsilon to noise).

How these compose with federated learning (DP-SGD as a local trainer, client-level noise around
an aggregation protocol, the per-round budget) lives in :mod:`protocols.privacy`.
"""

from fedsec.dp.accountants import ACCOUNTANTS, Accountant, epsilon
from fedsec.dp.calibration import noise_multiplier_for, smallest_noise
from fedsec.dp.dpsgd import DPSGD, DPSGDResult
from fedsec.dp.errors import (
    BudgetExhaustedError,
    DPError,
    InvalidPrivacyParameterError,
    UnsupportedEventError,
    UnsupportedModelError,
)
from fedsec.dp.ledger import GaussianEvent, PrivacyLedger, SkellamEvent
from fedsec.dp.noise import SecureRandom

__all__ = ["ACCOUNTANTS", "Accountant", "BudgetExhaustedError", "DPError", "DPSGD", "DPSGDResult",
           "GaussianEvent", "InvalidPrivacyParameterError", "PrivacyLedger", "SecureRandom",
           "SkellamEvent", "UnsupportedEventError", "UnsupportedModelError", "epsilon",
           "noise_multiplier_for", "smallest_noise"]
