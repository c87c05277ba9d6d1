"""A hospital's own policy (``SITE.toml``), checked against a plan before any data is touched.

The file belongs to the site; the coordinator never controls it. Every key is optional and the
defaults are the protective ones (see :class:`SitePolicy`); unknown keys and wrong types are
refused with ``ValueError`` naming the key. :func:`check_plan` returns nothing or raises
:class:`~fedsec.network.errors.PolicyRefused` naming the first rule the plan breaks (exit code 3
on the command line). The rules are checked in the order of :data:`RULES`.

Example::

    [aggregation]
    allowed = ["masking", "paillier"]   # secure layers accepted ("none" = plain updates)
    min_threshold = 3                   # smallest reconstruction / decryption threshold
    min_corrupt = 0.1                   # smallest colluding fraction the plan must assume
    min_sites = 4                       # smallest number of sites per round
    require_active = true               # masking must run authenticated (against a lying server)
    peers = ["hosp-b", "hosp-c"]        # the only sites this one agrees to be summed with

    [dp]
    required = true
    max_epsilon_run = 3.0               # largest epsilon one run may spend
    max_epsilon_lifetime = 10.0         # largest epsilon over every run this site joins (ledger)
    max_delta = 1e-5                    # largest delta the plan's epsilons may be stated at

    [data]
    max_test_fraction = 0.5             # largest held-out share (evaluated without DP)

    [models]
    allowed = ["logreg", "mlp"]

    [rounds]
    max = 200
"""

from __future__ import annotations

import functools
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedsec.config import ExperimentConfig
from fedsec.network.errors import PolicyRefused
from fedsec.network.ledger import EpsilonLedger

AGGREGATIONS = ("none", "masking", "paillier")
MODELS = ("logreg", "mlp", "cnn")
RULES = ("aggregation.allowed", "aggregation.peers", "aggregation.require_active", "aggregation.min_sites",
         "aggregation.min_threshold", "aggregation.min_corrupt", "dp.required", "dp.reproducible",
         "dp.max_epsilon_run",
         "dp.max_delta", "data.max_test_fraction", "models.allowed", "rounds.max",
         "dp.max_epsilon_lifetime", "dp.ledger")
"""Rule names in the order they are checked (the last one by the :class:`EpsilonLedger`)."""


@dataclass(frozen=True)
class SitePolicy:
    """What a site accepts. Epsilons are at the plan's delta; counts are integers.

    Attributes:
        aggregation_allowed: secure layers accepted, a subset of ``none, masking, paillier``
            (default: masking and Paillier only).
        min_threshold: smallest threshold the secure layer may use, >= 2 (default 2).
        min_corrupt: smallest fraction of the roster the plan's secure layer must assume may
            collude with the coordinator (``secure.corrupt``), in [0, 1) (default 0.1, the
            plan's default). The site derives from the larger of the two its masking threshold
            floor and quorum and the c its client-level noise shares are provisioned for
            (mu / (t - c)), at every aggregation.
        min_sites: smallest number of sites per round, >= 2 (default 3).
        require_active: masking must run in authenticated mode (default true).
        peers: the names of the sites this one agrees to be summed with (certificate names),
            or None (the default: the plan's roster, which the coordinator writes, decides; the
            site warns at join, and refuses any client-level plan, whose noise is sized for the
            colluders among peers it must name). A plan whose ``federation.sites`` holds a name
            outside these and the site's own is refused (review S6-2: a coordinator that shows a
            site a roster of itself and certified colluders would otherwise sum it with them
            alone).
        dp_required: a plan without DP is refused (default true).
        max_epsilon_run: largest epsilon of one run, > 0 (default 10).
        max_epsilon_lifetime: largest epsilon summed over the site's runs, >= max_epsilon_run
            (default 30).
        models_allowed: model names accepted (default: logreg, mlp, cnn).
        max_rounds: most rounds per run, >= 1 (default 1000).
        max_delta: largest ``dp.delta`` of a DP plan, in (0, 1) (default 1e-5). Every epsilon
            above is "at the plan's delta": without this bound a plan could state a small
            epsilon at a delta like 0.5 (which allows publishing half the records) and buy less
            noise. 1e-5 is the usual choice for datasets of up to about 10^4-10^5 records
            (delta well below 1/n); lower it for larger sites.
        max_test_fraction: largest ``data.test_fraction``, in (0, 1) (default 0.5). The held-out
            share is evaluated every round without DP noise (its sums are masked, not noised):
            this bounds how much of the site's data goes to that undefended evaluation.
    """

    aggregation_allowed: tuple[str, ...] = ("masking", "paillier")
    min_threshold: int = 2
    min_corrupt: float = 0.1
    min_sites: int = 3
    require_active: bool = True
    dp_required: bool = True
    max_epsilon_run: float = 10.0
    max_epsilon_lifetime: float = 30.0
    models_allowed: tuple[str, ...] = MODELS
    max_rounds: int = 1000
    max_delta: float = 1e-5
    max_test_fraction: float = 0.5
    peers: tuple[str, ...] | None = None
    source: str = field(default="<defaults>", compare=False)

    def __post_init__(self) -> None:
        _subset("aggregation.allowed", self.aggregation_allowed, AGGREGATIONS)
        _subset("models.allowed", self.models_allowed, MODELS)
        _int_at_least("aggregation.min_threshold", self.min_threshold, 2)
        _int_at_least("aggregation.min_sites", self.min_sites, 2)
        _int_at_least("rounds.max", self.max_rounds, 1)
        for key, value in (("aggregation.require_active", self.require_active),
                           ("dp.required", self.dp_required)):
            if not isinstance(value, bool):
                raise ValueError(f"{key}: must be true or false")
        for key, value in (("dp.max_epsilon_run", self.max_epsilon_run),
                           ("dp.max_epsilon_lifetime", self.max_epsilon_lifetime)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                    or value <= 0:
                raise ValueError(f"{key}: must be a finite number > 0")
        if isinstance(self.min_corrupt, bool) or not isinstance(self.min_corrupt, int | float) \
                or not 0 <= self.min_corrupt < 1:
            raise ValueError("aggregation.min_corrupt: must be a number in [0, 1)")
        for key, value in (("dp.max_delta", self.max_delta),
                           ("data.max_test_fraction", self.max_test_fraction)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
                raise ValueError(f"{key}: must be a number in (0, 1)")
        if self.peers is not None and (
                not isinstance(self.peers, tuple) or len(set(self.peers)) != len(self.peers)
                or any(not isinstance(p, str) or not p for p in self.peers)):
            raise ValueError("aggregation.peers: must be a list of distinct site names")
        if self.max_epsilon_lifetime < self.max_epsilon_run:
            raise ValueError("dp.max_epsilon_lifetime: must be >= dp.max_epsilon_run")


def _subset(key: str, values: Any, allowed: tuple[str, ...]) -> None:
    if not isinstance(values, tuple) or not values or any(v not in allowed for v in values):
        raise ValueError(f"{key}: must be a non-empty list of {', '.join(allowed)}")


def _int_at_least(key: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{key}: must be an integer >= {low}")


_KEYS = {"aggregation.allowed": "aggregation_allowed", "aggregation.min_threshold": "min_threshold",
         "aggregation.min_corrupt": "min_corrupt",
         "aggregation.min_sites": "min_sites", "aggregation.require_active": "require_active",
         "aggregation.peers": "peers",
         "dp.required": "dp_required", "dp.max_epsilon_run": "max_epsilon_run",
         "dp.max_epsilon_lifetime": "max_epsilon_lifetime", "models.allowed": "models_allowed",
         "rounds.max": "max_rounds", "dp.max_delta": "max_delta",
         "data.max_test_fraction": "max_test_fraction"}


def policy_from_mapping(table: Mapping[str, Any], *, source: str = "<mapping>") -> SitePolicy:
    """Build a :class:`SitePolicy` from a parsed TOML table; unknown sections or keys are errors."""
    values: dict[str, Any] = {}
    for section, body in table.items():
        if not isinstance(body, Mapping):
            raise ValueError(f"{section}: unknown key (the policy has sections aggregation, dp, "
                             f"data, models, rounds)")
        for key, value in body.items():
            dotted = f"{section}.{key}"
            if dotted not in _KEYS:
                raise ValueError(f"{dotted}: unknown key (known: {', '.join(_KEYS)})")
            values[_KEYS[dotted]] = tuple(value) if isinstance(value, list) else value
    return SitePolicy(**values, source=source)


def load_policy(path: str | Path) -> SitePolicy:
    """Read and validate ``SITE.toml``; a TOML syntax error is a ``ValueError`` naming the file."""
    path = Path(path)
    try:
        table = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"{path}: not valid TOML ({error})") from None
    return policy_from_mapping(table, source=str(path))


@dataclass(frozen=True)
class PlanFacts:
    """What a site's policy judges in a plan, read from the plan's configuration.

    Attributes:
        aggregation: the secure layer (``none``, ``masking``, ``paillier``).
        active: masking in authenticated mode.
        sites_per_round: the fewest sites a round may run with.
        threshold: the secure layer's threshold (0 for ``none``).
        corrupt: the plan's ``secure.corrupt`` (the colluding fraction its secure layer assumes).
        dp: DP noise is added (example- or client-level).
        reproducible: DP noise drawn from the seed (not private against whoever knows it).
        epsilon: the run's epsilon budget (``inf`` when DP is on with no budget, 0 without DP).
        model: the model's name.
        rounds: the number of rounds.
        delta: the plan's ``dp.delta`` (the delta its epsilons are stated at; 0 without DP).
        test_fraction: the plan's ``data.test_fraction`` (held out, evaluated without DP).
        unit: the privacy unit its epsilon is stated in: ``client`` (``dp.mode = "client"``: a
            site's whole contribution) or ``example`` (DP-SGD: one record; also without DP).
        roster: the plan's ``federation.sites`` (the sites its sums may draw on).
    """

    aggregation: str
    active: bool
    sites_per_round: int
    threshold: int
    dp: bool
    reproducible: bool
    epsilon: float
    model: str
    rounds: int
    delta: float = 0.0
    test_fraction: float = 0.0
    corrupt: float = 0.1
    unit: str = "example"
    roster: tuple[str, ...] = ()


@functools.lru_cache(maxsize=64)
def plan_facts(config: ExperimentConfig, *, min_sites: int | None = None) -> PlanFacts:
    """Read the policy-relevant facts from a plan's configuration (a pure function of its
    arguments, both immutable: computed once per plan, as a site checks them at every aggregation).

    Args:
        config: the plan's experiment configuration (already validated).
        min_sites: the federation's ``min_sites`` when the plan has one; otherwise the clients
            sampled per round (``train.fraction`` of ``data.clients``).
    """
    import numpy as np

    from fedsec.fl_core.server import clients_per_round
    from fedsec.protocols.masked import MaskedAggregation
    from fedsec.protocols.paillier.aggregation import default_threshold

    secure, dp = config.secure, config.dp
    m = clients_per_round(config.train.fraction, config.data.clients)
    sites = m if min_sites is None else min(min_sites, m)
    threshold = secure.threshold
    if secure.aggregation == "none":
        threshold = 0
    elif not threshold and secure.aggregation == "masking":
        protocol = MaskedAggregation(max_weight=1, rng=np.random.default_rng(0), graph=secure.graph,
                                     dropout=secure.dropout, active=secure.active,
                                     tolerated_corrupt=secure.corrupt)
        threshold = protocol.parameters(max(sites, 3))[1]
    elif not threshold:
        threshold = default_threshold(sites)
    uses_dp = dp.mode != "none"
    epsilon = 0.0 if not uses_dp else (dp.target_epsilon if dp.target_epsilon > 0 else math.inf)
    return PlanFacts(aggregation=secure.aggregation, active=secure.aggregation != "masking" or secure.active,
                     sites_per_round=sites, threshold=threshold, dp=uses_dp, reproducible=dp.reproducible,
                     epsilon=epsilon, model=config.model.name, rounds=config.rounds,
                     delta=dp.delta if uses_dp else 0.0, test_fraction=config.data.test_fraction,
                     corrupt=secure.corrupt,
                     unit="client" if dp.mode == "client" else "example",
                     roster=tuple(config.federation.sites))


def check_plan(policy: SitePolicy, plan: ExperimentConfig | PlanFacts, *,
               min_sites: int | None = None, name: str | None = None) -> None:
    """Raise :class:`PolicyRefused` naming the first rule of :data:`RULES` the plan breaks.

    ``name``: this site's own name (``aggregation.peers`` admits it besides the listed peers).
    The lifetime rule needs the site's history and is the :class:`EpsilonLedger`'s.
    """
    facts = plan if isinstance(plan, PlanFacts) else plan_facts(plan, min_sites=min_sites)
    if facts.aggregation not in policy.aggregation_allowed:
        raise PolicyRefused("aggregation.allowed", f"the plan uses {facts.aggregation!r}; this site accepts "
                                                   f"{', '.join(policy.aggregation_allowed)}")
    if policy.peers is None and facts.unit == "client":
        raise PolicyRefused("aggregation.peers", "client-level noise is sized for the colluders among this "
                                                 "site's peers; list them (aggregation.peers), or the "
                                                 "coordinator's plan would choose whom it is summed with")
    outside = sorted(set(facts.roster) - set(policy.peers or ()) - {name}) if policy.peers is not None else []
    if outside:
        raise PolicyRefused("aggregation.peers", f"the plan's roster lists {', '.join(outside)}, not among "
                                                 f"this site's peers")
    if policy.require_active and not facts.active:
        raise PolicyRefused("aggregation.require_active", "the plan runs masking in semi-honest mode")
    if facts.sites_per_round < policy.min_sites:
        raise PolicyRefused("aggregation.min_sites", f"the plan allows rounds with {facts.sites_per_round} "
                                                     f"sites; this site needs >= {policy.min_sites}")
    if facts.aggregation != "none" and facts.threshold < policy.min_threshold:
        raise PolicyRefused("aggregation.min_threshold", f"the plan's threshold is {facts.threshold}; "
                                                         f"this site needs >= {policy.min_threshold}")
    if facts.aggregation != "none" and facts.corrupt < policy.min_corrupt:
        raise PolicyRefused("aggregation.min_corrupt", f"the plan assumes a colluding fraction of "
                                                       f"{facts.corrupt:g} (secure.corrupt); this site "
                                                       f"needs >= {policy.min_corrupt:g}")
    if policy.dp_required and not facts.dp:
        raise PolicyRefused("dp.required", "the plan adds no differential-privacy noise")
    if policy.dp_required and facts.reproducible:
        raise PolicyRefused("dp.reproducible", "the plan draws DP noise from its seed (dp.reproducible)")
    if facts.epsilon > policy.max_epsilon_run:
        raise PolicyRefused("dp.max_epsilon_run", f"the plan may spend epsilon {facts.epsilon:g}; this "
                                                  f"site allows {policy.max_epsilon_run:g} per run")
    if facts.dp and facts.delta > policy.max_delta:
        raise PolicyRefused("dp.max_delta", f"the plan states its epsilon at delta {facts.delta:g}; this "
                                            f"site allows delta <= {policy.max_delta:g}")
    if facts.test_fraction > policy.max_test_fraction:
        raise PolicyRefused("data.max_test_fraction", f"the plan holds out {facts.test_fraction:g} of the "
                                                      f"records for evaluation without DP; this site "
                                                      f"allows <= {policy.max_test_fraction:g}")
    if facts.model not in policy.models_allowed:
        raise PolicyRefused("models.allowed", f"the plan trains {facts.model!r}; this site accepts "
                                              f"{', '.join(policy.models_allowed)}")
    if facts.rounds > policy.max_rounds:
        raise PolicyRefused("rounds.max", f"the plan runs {facts.rounds} rounds; this site allows "
                                          f"{policy.max_rounds}")


def admit_plan(policy: SitePolicy, plan: ExperimentConfig | PlanFacts, *, ledger: EpsilonLedger, run_id: str,
               min_sites: int | None = None, dry_run: bool = False, name: str | None = None) -> PlanFacts:
    """Check the plan (:func:`check_plan`), then reserve its epsilon in the site's ledger.

    Returns the plan's facts once admitted; raises :class:`PolicyRefused` otherwise, having
    written nothing. ``dry_run`` checks the ledger without reserving.
    """
    facts = plan if isinstance(plan, PlanFacts) else plan_facts(plan, min_sites=min_sites)
    check_plan(policy, facts, name=name)
    ledger.reserve(run_id, facts.epsilon, unit=facts.unit, dry_run=dry_run)
    return facts
