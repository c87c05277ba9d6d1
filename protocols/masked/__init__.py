"""Pairwise-mask secure aggregation: SecAgg (complete graph) and SecAgg+ (Harary graph)."""

from fedsec.protocols.masked.aggregation import MaskedAggregation
from fedsec.protocols.masked.client import ClientPolicy, MaskedClient
from fedsec.protocols.masked.graph import (
           GraphParameters,
           RingGraph,
           choose_parameters,
           shuffled_ring,
)
from fedsec.protocols.masked.server import MaskedServer
from fedsec.protocols.masked.simulation import run_round

__all__ = ["ClientPolicy", "GraphParameters", "MaskedAggregation", "MaskedClient", "MaskedServer",
           "RingGraph", "choose_parameters", "run_round", "shuffled_ring"]
