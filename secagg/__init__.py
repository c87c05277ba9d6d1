"""Cryptography for secure aggregation, with no federated-learning knowledge (next issues)."""
