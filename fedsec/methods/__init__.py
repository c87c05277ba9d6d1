"""Runners of the seed methods that are more than a FedAvg strategy: each builds its fl_core pieces
from the configuration and reports its own figures into ``summary.json`` and the run directory."""
