"""The exceptions of ``dp``."""

from __future__ import annotations


class DPError(Exception):
    """Base class of every error raised on purpose by ``dp``."""


class InvalidPrivacyParameterError(DPError, ValueError):
    """A privacy parameter is out of range (noise, sampling rate, delta, epsilon, clipping norm)."""


class UnsupportedModelError(DPError, ValueError):
    """A model DP-SGD cannot train correctly (e.g. batch normalisation mixes examples)."""


class UnsupportedEventError(DPError, ValueError):
    """An accountant was asked about a mechanism its analysis does not cover."""


class BudgetExhaustedError(DPError):
    """Continuing would spend more than the privacy budget."""
