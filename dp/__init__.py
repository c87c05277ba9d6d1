"""Differential privacy, with no federated-learning knowledge (next issues)."""
