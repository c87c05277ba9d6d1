"""The secure layers of a deployed round: one module per layer, a coordinator side and a site side.

How a layer plugs in (:mod:`fedsec.network.layers.base` holds the interface):

1. Write ``fedsec/network/layers/NAME.py`` with two classes:

   - a :class:`~fedsec.network.layers.base.CoordinatorLayer` (it *is* the coordinator's
     ``AggregationProtocol``): ``aggregate(round_index, updates, purpose=...)`` gets one
     placeholder :class:`~fedsec.fl_core.ClientUpdate` per site asked to contribute (only
     ``client_id`` and the vector's length mean anything: the vectors themselves are at the
     sites), drives the protocol's stages with ``self.context.exchange(stage, {client: message})``
     (one message per site, returns the replies that arrived before the stage deadline; a site
     that misses it, aborts or fails is simply absent) and returns an
     :class:`~fedsec.fl_core.AggregateResult` or raises ``ProtocolAbort``. It draws from
     ``self.context.rng`` exactly what the simulation's protocol draws, so that a reproducible
     plan gives the simulation's history. The first message to each site must start with the
     layer's *setup* (see :func:`~fedsec.network.layers.base.first_message`).
   - a :class:`~fedsec.network.layers.base.SiteLayer`: built by the site for one aggregation from
     the setup and its pending contribution (vector, integer weight), it answers each stage
     message with ``handle(stage, message) -> reply | None`` or raises ``ClientAbort``.

2. Register both in :data:`LAYERS` under the plan's ``secure.aggregation`` value.

Nothing else changes: the coordinator's round loop, the jobs (train, evaluate, statistics), the
audit of every message and the stage deadlines are the framework's.
"""

from __future__ import annotations

from fedsec.network.layers.base import (
    CoordinatorContext,
    CoordinatorLayer,
    Exchange,
    SiteContext,
    SiteLayer,
    first_message,
    split_first,
)
from fedsec.network.layers.masking import MaskingCoordinator, MaskingSite
from fedsec.network.layers.paillier import PaillierCoordinator, PaillierSite

LAYERS: dict[str, tuple[type[CoordinatorLayer], type[SiteLayer]]] = {
    "masking": (MaskingCoordinator, MaskingSite),
    "paillier": (PaillierCoordinator, PaillierSite),
}
"""``secure.aggregation`` -> (coordinator side, site side)."""

__all__ = ["LAYERS", "CoordinatorContext", "CoordinatorLayer", "Exchange", "SiteContext", "SiteLayer",
           "first_message", "split_first"]
