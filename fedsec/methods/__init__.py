"""Runners of the seed methods that do not go through the FedAvg server loop."""
