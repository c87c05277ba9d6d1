"""``data.dataset = "csv"`` for ``fedsec run``: the sites' files, their splits, and the federated
evaluator that sums the sites' test metrics through the run's secure layer.

A deployment (``fedsec join``) reads one file with the same :func:`schema` and
:func:`fedsec.fl_core.csv_data.load_client_csv` (seed = the plan's ``seed``, index = the site's
position in the roster), so the simulation and the deployment split every file the same way and
report the same figures.
"""

from __future__ import annotations

import numpy as np

from fedsec import fl_core
from fedsec.config import ExperimentConfig
from fedsec.errors import ConfigError
from fedsec.fl_core.csv_data import ClientData, CsvSchema, load_client_csv
from fedsec.fl_core.federated_eval import FederatedEvaluator, sums_length


def schema(config: ExperimentConfig, *, features: tuple[str, ...] | None = None) -> CsvSchema:
    """The plan's schema: ``data.label``, ``data.classes`` and ``data.columns`` (or ``features``
    when the plan lists none)."""
    d = config.data
    try:
        return CsvSchema(label=d.label, classes=d.classes, features=d.columns or features)
    except fl_core.InvalidParameterError as error:
        raise ConfigError("data.classes" if "classes" in str(error) else "data.columns",
                          str(error)) from None


def load_sites(config: ExperimentConfig) -> list[ClientData]:
    """Every file of ``data.files``, validated and split. Without ``data.columns`` the first
    file's header fixes the features and their order; every other file must hold the same
    columns (in any order).

    Raises:
        ConfigError: no files listed (key ``data.files``).
        SiteDataError: a file fails validation (names file, row and column).
    """
    d = config.data
    if not d.files:
        raise ConfigError("data.files", "fedsec run with data.dataset = 'csv' needs one CSV file per "
                                        "client")
    plan = schema(config)
    sites: list[ClientData] = []
    for index, path in enumerate(d.files):
        site = load_client_csv(path, plan, test_fraction=d.test_fraction, seed=config.seed,
                               index=index)
        if plan.features is None:
            plan = schema(config, features=site.features)
        sites.append(site)
    return sites


def federated_dataset(config: ExperimentConfig, sites: list[ClientData]) -> fl_core.FederatedDataset:
    """The sites as one :class:`FederatedDataset`: each client's training split, and as ``test``
    the sites' test splits concatenated in client order (the evaluator cuts them apart again)."""
    return fl_core.FederatedDataset(
        name="csv",
        clients=tuple(s.train for s in sites),
        test=fl_core.ArrayDataset(np.concatenate([s.test.x for s in sites]),
                                  np.concatenate([s.test.y for s in sites])),
        n_classes=len(config.data.classes),
        input_shape=(len(sites[0].features),),
        standardize=config.data.standardize,
        info={"features": list(sites[0].features), "classes": list(config.data.classes),
              "test_sizes": [len(s.test) for s in sites]},
    )


def statistics_error_bound(aggregation: str, *, sites: int, max_weight: int, length: int,
                           clip: float = 1.0, bits: int = 16) -> float:
    """The largest error of one entry of a sum of ``sites`` weight-1 statistics vectors of
    ``length`` values through ``aggregation`` (``none``: 0, float64 sums of whole numbers below
    2^53; ``masking``/``paillier``: each site's stochastic rounding is below one quantisation step
    2 x 2^24 / (2^b - 1) of the statistics encoder, plus the float64 decoding error)."""
    if aggregation == "none":
        return 0.0
    from fedsec.protocols.encoding import encoder_for

    encoder = encoder_for("statistics", clients=sites, length=length, max_weight=max_weight,
                          clip=clip, bits=bits)
    step = 2 * encoder.clip / encoder.levels
    decoding = 2.0 ** -50 * encoder.clip * (sites + 1)
    return sites * step + decoding


EVALUATION_STREAM = 17
"""The evaluation layer's generator is ``default_rng([seed, 17])``: its rounding and simulated
dropouts never move the training's draws (sampling, shuffling), so a run's model trajectory is
the same with or without evaluation, as in a deployment, where each site rounds with its own
randomness."""


def evaluation_protocol(config: ExperimentConfig, data: fl_core.FederatedDataset,
                        rng: np.random.Generator | None = None) -> fl_core.AggregationProtocol:
    """The secure layer ``secure.*`` configures, as its own instance for the evaluation sums (its
    own keys, its own generator: ``rng``, by default a new one of :data:`EVALUATION_STREAM`; a
    checkpoint carries its state)."""
    from fedsec.experiment import build_protocol

    if rng is None:
        rng = np.random.default_rng([config.seed, EVALUATION_STREAM])
    return build_protocol(config, data, rng)


def build_evaluator(config: ExperimentConfig, data: fl_core.FederatedDataset,
                    protocol: fl_core.AggregationProtocol) -> FederatedEvaluator:
    """The federated evaluator of a csv run over ``protocol`` (the run's secure layer).

    Raises:
        ConfigError: the secure layer's statistics encoding is too coarse for exact counts
            (key ``secure.aggregation``).
    """
    s = config.secure
    sizes = data.info["test_sizes"]
    bound = statistics_error_bound(s.aggregation, sites=len(sizes),
                                   max_weight=max(len(c) for c in data.clients),
                                   length=sums_length(data.n_classes), clip=s.clip, bits=s.bits)
    if bound >= 0.5:
        raise ConfigError("secure.aggregation", f"the statistics encoding of {len(sizes)} sites errs "
                                                f"by up to {bound:.3g} per count, too coarse for "
                                                f"exact evaluation counts")
    return FederatedEvaluator(protocol=protocol, test_sizes=sizes, n_classes=data.n_classes,
                              max_error=bound)
