"""``[robust]``: Byzantine-robust aggregation rules and simulated Byzantine clients.

``median`` and ``trimmed_mean`` replace the plain sum (the configuration has already refused them
with a secure layer or client-level DP); ``norm_bound`` clips each update's L2 norm on the client
before the secure layer sums it. ``byzantine`` clients, drawn from a generator of their own (so the
run's sampling is that of the same run without them), send the ``attack``'s lie.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedsec import fl_core
from fedsec.config import ExperimentConfig
from fedsec.fl_core.byzantine import ByzantineClients
from fedsec.fl_core.robust import NormBoundedAggregation, RobustAggregation

BYZANTINE_STREAM = 15
"""Mixed into the seed for the generator that picks the Byzantine clients and their noise."""


def byzantine_clients(config: ExperimentConfig) -> tuple[int, ...]:
    """The ids of the simulated Byzantine clients: ``robust.byzantine`` of them, drawn from the
    seed (the same ones for every rule)."""
    rng = np.random.default_rng([config.seed, BYZANTINE_STREAM])
    return tuple(sorted(int(k) for k in rng.choice(config.data.clients, size=config.robust.byzantine,
                                                    replace=False)))


def wrap_protocol(config: ExperimentConfig, protocol: fl_core.AggregationProtocol
                  ) -> tuple[fl_core.AggregationProtocol, dict[str, Any]]:
    """The protocol with the robust rule and the Byzantine clients of ``[robust]`` applied, and the
    summary entry that says so ({} when the section is at its defaults)."""
    r = config.robust
    if r.rule == "none" and r.byzantine == 0:
        return protocol, {}
    if r.rule in ("median", "trimmed_mean"):
        protocol = RobustAggregation(rule=r.rule, trim=r.trim)
    elif r.rule == "norm_bound":
        protocol = NormBoundedAggregation(inner=protocol, bound=r.norm_bound)
    malicious = byzantine_clients(config)
    if malicious:
        rng = np.random.default_rng([config.seed, BYZANTINE_STREAM, 1])
        protocol = ByzantineClients(inner=protocol, malicious=malicious, attack=r.attack,
                                    factor=r.factor, rng=rng)
    summary: dict[str, Any] = {"rule": r.rule}
    if r.rule == "trimmed_mean":
        summary["trim"] = r.trim
    if r.rule == "norm_bound":
        summary["norm_bound"] = r.norm_bound
    if malicious:
        summary.update(byzantine=list(malicious), attack=r.attack, factor=r.factor)
    return protocol, {"robust": summary}
