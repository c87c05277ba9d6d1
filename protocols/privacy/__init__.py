"""Differential privacy composed with federated learning: DP-SGD as a local trainer, client-level
noise around an aggregation protocol, and the budget that every round is checked against."""

from fedsec.protocols.privacy.budget import AccountingMismatch, PrivacyBudget
from fedsec.protocols.privacy.client_level import ClientLevelDP
from fedsec.protocols.privacy.trainer import DPSGDTrainer

__all__ = ["AccountingMismatch", "ClientLevelDP", "DPSGDTrainer", "PrivacyBudget"]
