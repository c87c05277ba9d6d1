"""An adversarial coordinator driving the project's UNMODIFIED site code in one process.

Each site is the code ``fedsec join`` runs for a job: :class:`~fedsec.network.site_work.SiteWork`
(its CSV shard, loaded and validated by ``SiteWork.load``), the plan's site layer
(:class:`~fedsec.network.layers.masking.MaskingSite`) and its durable ``site.db``
(:class:`~fedsec.network.site_state.SiteState`, the masked sessions record). :meth:`Ring.job`
and :meth:`Ring.layer_message` follow ``Site._jobs`` line for line: a stage message that starts
with a setup takes the site's pending contribution for the setup's (purpose, round). Only the
gRPC hop is left out (the transport is not what these tests attack).

The coordinator is the project's own :class:`MaskingCoordinator`, called by the adversary with
the subsets of sites it chooses: a coordinator may call its own code however it likes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from fedsec.fl_core.aggregation import ClientUpdate
from fedsec.fl_core.errors import AggregationError
from fedsec.protocols.errors import ClientAbort

from fedsec.config import ExperimentConfig, loads_config
from fedsec.network import demo, envelope, pki
from fedsec.network.envelope import MalformedEnvelope
from fedsec.network.errors import PolicyRefused
from fedsec.network.layers import CoordinatorContext, SiteContext, split_first
from fedsec.network.layers.masking import MaskingCoordinator, MaskingSite
from fedsec.network.site import load_identity
from fedsec.network.site_state import SiteState
from fedsec.network.site_work import SiteWork

REFUSALS = (AggregationError, ClientAbort, PolicyRefused, MalformedEnvelope)
"""What an honest party raises when it refuses; a test that sees one has met the secure outcome."""


@dataclass
class HonestSite:
    name: str
    client_id: int
    work: SiteWork
    context: SiteContext
    layer: MaskingSite | None = None


class Ring:
    """``n`` honest sites of a demo deployment under ``root`` and the adversary's coordinator."""

    def __init__(self, root: Path, n: int, *, extra: str = "", rounds: int = 3,
                 min_sites: int = 3) -> None:
        self.d = demo.prepare(root, n, rounds=rounds, extra=extra)
        if min_sites != 3:  # the demo plan's [federation] says min_sites = 3
            text = self.d.plan.read_text()
            self.d.plan.write_text(text.replace("min_sites = 3\n", f"min_sites = {min_sites}\n"))
        self.config: ExperimentConfig = loads_config(self.d.plan.read_text())
        self.trust = pki.Trust.load(self.d.ca)
        self.names = tuple(self.config.federation.sites)
        self.sites: list[HonestSite] = []
        for k, enrolled in enumerate(self.d.sites):
            work = SiteWork.load(self.config, name=enrolled.name, path=self.d.data[k])
            context = SiteContext(config=self.config, name=enrolled.name, client_id=work.client_id,
                                  names=self.names, identity=load_identity(enrolled.identity),
                                  trust=self.trust, sessions=SiteState(self.d.state(k)),
                                  state=self.d.state(k))
            self.sites.append(HonestSite(enrolled.name, work.client_id, work, context))
        self.peers = {s.name: pki.verify_peer(s.cert.read_bytes(), trust=self.trust, roles=("site",))
                      for s in self.d.sites}
        self.certificates = {s.name: s.cert.read_bytes() for s in self.d.sites}
        self.aborts: dict[int, str] = {}

    def job(self, k: int, kind: str, header: dict[str, Any], body: bytes = b"") -> None:
        """A non-layer job as ``Site._jobs`` dispatches it."""
        getattr(self.sites[k].work, kind)(header, body)

    def layer_message(self, k: int, stage: str, body: bytes) -> bytes | None:
        """A ``layer`` job as ``Site._jobs`` handles it."""
        site = self.sites[k]
        if body[:len(envelope.MAGIC)] == envelope.MAGIC:
            setup, body = split_first(body)
            vector, weight = site.work.contribution(setup.get("purpose"), setup.get("round"))
            site.layer = MaskingSite(site.context, setup=setup, vector=vector, weight=weight)
        if site.layer is None:
            raise ClientAbort("a stage message without a setup")
        return site.layer.handle(stage, body)

    def aggregate(self, ids: list[int], *, purpose: str, round_index: int, length: int,
                  max_weight: int = 1) -> Any:
        """The project's masking coordinator over the sites ``ids`` the adversary picks."""
        self.aborts = {}

        def exchange(stage: str, messages: dict[int, bytes]) -> dict[int, bytes]:
            replies = {}
            for c, message in messages.items():
                try:
                    reply = self.layer_message(c, stage, message)
                except ClientAbort as abort:
                    self.aborts[c] = abort.reason
                    self.sites[c].layer = None
                    continue
                if reply is not None:
                    replies[c] = reply
            return replies

        context = CoordinatorContext(config=self.config, rng=np.random.default_rng(), names=self.names,
                                     certificates=self.certificates, peers=self.peers,
                                     max_weight=max_weight, exchange=exchange)
        updates = [ClientUpdate(c, np.zeros(length, dtype=np.float32), 1.0) for c in ids]
        return MaskingCoordinator(context).aggregate(round_index, updates, purpose=purpose)

    def close(self) -> None:
        for s in self.sites:
            s.context.sessions.close()
