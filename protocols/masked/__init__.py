"""Pairwise-mask secure aggregation: SecAgg (complete graph) and SecAgg+ (Harary graph)."""

from protocols.masked.aggregation import MaskedAggregation
from protocols.masked.client import ClientPolicy, MaskedClient
from protocols.masked.graph import (
           GraphParameters,
           RingGraph,
           choose_parameters,
           shuffled_ring,
)
from protocols.masked.server import MaskedServer
from protocols.masked.simulation import run_round

__all__ = ["ClientPolicy", "GraphParameters", "MaskedAggregation", "MaskedClient", "MaskedServer",
           "RingGraph", "choose_parameters", "run_round", "shuffled_ring"]
